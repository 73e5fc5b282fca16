"""The reference tokenizers for lockstep's parity tests: tiktoken itself,
built offline from a rank file: GPT-2's (gpt2.tiktoken) with GPT-2's pattern
(tiktoken's r50k_base) and <|endoftext|> = 50256, or Llama 3's
(tokenizer.model) as Meta's tokenizer.py builds it (its pat_str and 256
special tokens from 128000). Writes the token ids of FILE to OUT, little-endian
uint16 for GPT-2, uint32 for Llama 3, and prints "<bytes> <tokens> <seconds>".

    python tiktoken_reference.py RANKS FILE OUT [--special]

--special: special tokens' names in the text are their ids
(encode(text, allowed_special="all")), for valid UTF-8.

Valid UTF-8 goes through Encoding.encode_ordinary, tiktoken's own path. A
file with invalid UTF-8 (tiktoken takes text, which cannot hold it) is read
with surrogate escapes, as lockstep's Note [Pre-tokenizers] says it reads it:
cut by the pattern (a lone surrogate is neither letter, number nor space),
each piece's bytes through tiktoken's own BPE (_encode_single_piece). Both
paths are run on valid files and must agree, so the escaped path is checked
against tiktoken wherever tiktoken can judge.
"""
import hashlib
import struct
import sys
import time

import regex
import tiktoken
from tiktoken.load import load_tiktoken_bpe
from tiktoken_ext.openai_public import r50k_pat_str

GPT2_RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
LLAMA3_RANKS_SHA256 = "82e9d31979e92ab929cd544440f129d9ecd797b69e327f80f17e1c50d5551b55"
# Meta's llama_models/llama3/tokenizer.py, word for word.
LLAMA3_PAT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
# GPT-2's pattern with \s as OpenAI's tokenizers read it (Unicode White_Space).
S = "\\t\\n\\v\\f\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000"
ESCAPED = regex.compile(
    rf"'s|'t|'re|'ve|'m|'ll|'d| ?\p{{L}}+| ?\p{{N}}+| ?[^{S}\p{{L}}\p{{N}}]+|[{S}]+(?![^{S}])|[{S}]+")


def is_llama3(ranks_path):
    return hashlib.sha256(open(ranks_path, "rb").read()).hexdigest() == LLAMA3_RANKS_SHA256


def encoding(ranks_path):
    if is_llama3(ranks_path):
        ranks = load_tiktoken_bpe(ranks_path, expected_hash=LLAMA3_RANKS_SHA256)
        names = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                 "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>",
                 "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>",
                 "<|python_tag|>", "<|image|>"]
        names += [f"<|reserved_special_token_{2 + i}|>" for i in range(256 - len(names))]
        return tiktoken.Encoding(name="llama3-offline", pat_str=LLAMA3_PAT, mergeable_ranks=ranks,
                                 special_tokens={n: len(ranks) + i for i, n in enumerate(names)})
    return tiktoken.Encoding(name="gpt2-offline", pat_str=r50k_pat_str,
                             mergeable_ranks=load_tiktoken_bpe(ranks_path,
                                                               expected_hash=GPT2_RANKS_SHA256),
                             special_tokens={"<|endoftext|>": 50256})


# Llama 3's pattern with \s as above (a lone surrogate is "other").
ESCAPED_LLAMA3 = regex.compile(
    rf"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{{L}}\p{{N}}]?\p{{L}}+|\p{{N}}{{1,3}}| ?[^{S}\p{{L}}\p{{N}}]+[\r\n]*|"
    rf"[{S}]*[\r\n]+|[{S}]+(?![^{S}])|[{S}]+")


def encode_escaped(enc, data):
    ids = []
    pattern = ESCAPED_LLAMA3 if enc.name == "llama3-offline" else ESCAPED
    for m in pattern.finditer(data.decode("utf-8", "surrogateescape")):
        ids.extend(enc._encode_single_piece(m.group(0).encode("utf-8", "surrogateescape")))
    return ids


def main():
    ranks, path, out = sys.argv[1:4]
    enc = encoding(ranks)
    data = open(path, "rb").read()
    start = time.perf_counter()
    if "--special" in sys.argv[4:]:
        ids = enc.encode(data.decode("utf-8"), allowed_special="all")
        with open(out, "wb") as f:
            f.write(struct.pack(f"<{len(ids)}{'I' if enc.name == 'llama3-offline' else 'H'}", *ids))
        print(len(data), len(ids), f"{time.perf_counter() - start:.3f}")
        return
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
        f.write(struct.pack(f"<{len(ids)}{'I' if enc.name == 'llama3-offline' else 'H'}", *ids))
    print(len(data), len(ids), f"{seconds:.3f}")


if __name__ == "__main__":
    main()
