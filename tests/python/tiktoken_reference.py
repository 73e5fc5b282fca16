"""The reference GPT-2 tokenizer for lockstep's parity test: tiktoken itself,
built offline from a rank file (gpt2.tiktoken) with GPT-2's pattern
(tiktoken's r50k_base) and <|endoftext|> = 50256. Writes the token ids of
FILE as little-endian uint16 to OUT and prints "<bytes> <tokens> <seconds>".

    python tiktoken_reference.py RANKS FILE OUT

Valid UTF-8 goes through Encoding.encode_ordinary, tiktoken's own path. A
file with invalid UTF-8 (tiktoken takes text, which cannot hold it) is read
with surrogate escapes, as lockstep's Note [GPT-2 BPE] says it reads it: cut
by GPT-2's pattern (a lone surrogate is neither letter, number nor space),
each piece's bytes through tiktoken's own BPE (_encode_single_piece). Both
paths are run on valid files and must agree, so the escaped path is checked
against tiktoken wherever tiktoken can judge.
"""
import struct
import sys
import time

import regex
import tiktoken
from tiktoken.load import load_tiktoken_bpe
from tiktoken_ext.openai_public import r50k_pat_str

GPT2_RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
# GPT-2's pattern with \s as OpenAI's tokenizers read it (Unicode White_Space).
S = "\\t\\n\\v\\f\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000"
ESCAPED = regex.compile(
    rf"'s|'t|'re|'ve|'m|'ll|'d| ?\p{{L}}+| ?\p{{N}}+| ?[^{S}\p{{L}}\p{{N}}]+|[{S}]+(?![^{S}])|[{S}]+")


def encoding(ranks_path):
    return tiktoken.Encoding(name="gpt2-offline", pat_str=r50k_pat_str,
                             mergeable_ranks=load_tiktoken_bpe(ranks_path,
                                                               expected_hash=GPT2_RANKS_SHA256),
                             special_tokens={"<|endoftext|>": 50256})


def encode_escaped(enc, data):
    ids = []
    for m in ESCAPED.finditer(data.decode("utf-8", "surrogateescape")):
        ids.extend(enc._encode_single_piece(m.group(0).encode("utf-8", "surrogateescape")))
    return ids


def main():
    ranks, path, out = sys.argv[1:4]
    enc = encoding(ranks)
    data = open(path, "rb").read()
    start = time.perf_counter()
    try:
        ids = enc.encode_ordinary(data.decode("utf-8"))
        valid = True
    except UnicodeDecodeError:
        ids = encode_escaped(enc, data)
        valid = False
    seconds = time.perf_counter() - start
    if valid and encode_escaped(enc, data) != ids:
        sys.exit("tiktoken_reference: the escaped path disagrees with tiktoken on " + path)
    with open(out, "wb") as f:
        f.write(struct.pack(f"<{len(ids)}H", *ids))
    print(len(data), len(ids), f"{seconds:.3f}")


if __name__ == "__main__":
    main()
