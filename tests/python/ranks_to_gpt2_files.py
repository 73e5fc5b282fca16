"""GPT-2's files (encoder.json and vocab.bpe) from a tiktoken rank file, for
the tests that read the vocabulary in those forms: each token's merge is
recovered by merging its bytes with the ranks below its own (tiktoken's rule)
until two parts remain; tokens are written in GPT-2's byte-to-unicode
spelling, <|endoftext|> = 50256 added.

    python ranks_to_gpt2_files.py RANKS OUT_DIR
"""
import json
import os
import sys

from tiktoken.load import load_tiktoken_bpe


def byte_spelling():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def merge_of(token, rank, ranks):
    parts = [bytes([b]) for b in token]
    while len(parts) > 2:
        best = min(((ranks.get(parts[k] + parts[k + 1], rank), k) for k in range(len(parts) - 1)))
        if best[0] >= rank:
            raise SystemExit(f"rank {rank} is not a join of lower ranks")
        k = best[1]
        parts[k:k + 2] = [parts[k] + parts[k + 1]]
    return parts


def main():
    ranks = load_tiktoken_bpe(sys.argv[1])
    out = sys.argv[2]
    os.makedirs(out, exist_ok=True)
    spell = byte_spelling()
    word = lambda b: "".join(spell[x] for x in b)
    encoder = {word(t): r for t, r in ranks.items()}
    encoder["<|endoftext|>"] = len(ranks)
    merges = [merge_of(t, r, ranks) for t, r in sorted(ranks.items(), key=lambda x: x[1]) if len(t) > 1]
    with open(os.path.join(out, "encoder.json"), "w", encoding="utf-8") as f:
        json.dump(encoder, f, ensure_ascii=False)
    with open(os.path.join(out, "vocab.bpe"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "".join(f"{word(a)} {word(b)}\n" for a, b in merges))


if __name__ == "__main__":
    main()
