"""Writes the reader fuzz corpus (fuzz_readers.cpp): DIR/<target>/ for each
target, valid files (valid_*) and hostile ones, each named for what it does.
Plain Python (no torch): the bytes are built by hand.

    python3 make_reader_corpus.py DIR
"""
import json
import os
import struct
import sys


def bytes_to_unicode():
    """GPT-2's byte -> printable character map (encoder.py)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def tiny_vocab():
    """256 byte tokens, then merges making 'he', 'll', 'hell', 'hello', ' w'."""
    m = bytes_to_unicode()
    encoder = {m[b]: b for b in range(256)}
    merges = []
    for a, b in [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), ("\u0120", "w")]:
        encoder[a + b] = len(encoder)
        merges.append((a, b))
    encoder["<|endoftext|>"] = len(encoder)
    return encoder, merges


def gpt2_files(encoder, merge_lines):
    return json.dumps(encoder).encode() + b"\0" + ("#version: 0.2\n" + "\n".join(merge_lines) +
                                                  "\n").encode()


def tokenizer_json(encoder, merge_pairs, **change):
    doc = {
        "version": "1.0", "added_tokens": [{"id": encoder["<|endoftext|>"],
                                             "content": "<|endoftext|>", "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "",
                  "fuse_unk": False, "vocab": encoder,
                  "merges": [" ".join(m) for m in merge_pairs]},
    }
    for key, value in change.items():
        where = doc["model"] if key in doc["model"] or key == "ignore_merges" else doc
        where[key] = value
    return json.dumps(doc).encode()


def tiktoken_file(token_ranks):
    import base64
    return b"#tiktoken\n" + b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in token_ranks)


def vocab_corpus():
    byte_ranks = [(bytes([b]), b) for b in range(256)]
    joins = [(b"he", 256), (b"ll", 257), (b"hell", 258), (b"hello", 259), (b" w", 260)]
    yield "valid_ranks.tiktoken", tiktoken_file(byte_ranks + joins)
    yield "ranks_gap.tiktoken", tiktoken_file(byte_ranks + [(b"he", 300)])
    yield "ranks_twice.tiktoken", tiktoken_file(byte_ranks + [(b"he", 256), (b"ll", 256)])
    yield "ranks_no_join.tiktoken", tiktoken_file(byte_ranks + [(b"xyz", 256)])
    yield "ranks_same_token.tiktoken", tiktoken_file(byte_ranks + [(b"he", 256), (b"he", 257)])
    yield "ranks_bad_base64.tiktoken", b"#tiktoken\nnot*base64 0\n"
    yield "ranks_huge_rank.tiktoken", b"#tiktoken\nYQ== 99999999999999999999\n"
    yield "ranks_sparse_huge.tiktoken", b"#tiktoken\nYQ== 1048575\n"
    yield "ranks_long_token.tiktoken", tiktoken_file(byte_ranks + [(b"a" * 2000, 256)])
    yield "ranks_costly.tiktoken", tiktoken_file(byte_ranks + [(bytes([97 + i % 26]) * 1000 + b"%d" % i, 256 + i) for i in range(300)])
    encoder, merges = tiny_vocab()
    lines = [" ".join(m) for m in merges]
    yield "valid_gpt2_files.bin", gpt2_files(encoder, lines)
    yield "valid_tokenizer.json", tokenizer_json(encoder, merges)
    yield "valid_tokenizer_array_merges.json", tokenizer_json(
        encoder, merges, merges=[list(m) for m in merges])
    llama3_pat = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
    yield "valid_llama3_kind.json", tokenizer_json(encoder, merges, ignore_merges=True, pre_tokenizer={
        "type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": llama3_pat}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]})
    yield "digits_pretokenizer.json", tokenizer_json(encoder, merges, pre_tokenizer={
        "type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]})
    yield "zeros_3m_values.json", b"[" + b"0," * 2999999 + b"0]"          # 6 MB, 3M values
    yield "zeros_over_limit.json", b"[" + b"0," * 3000000 + b"0]"         # one value too many
    yield "empty_strings_object.json", b"{" + b",".join(b'"":0' for _ in range(1000000)) + b"}"
    yield "deep_arrays.json", b"[" * 100000 + b"]" * 100000
    yield "deep_objects.json", b'{"a":' * 70 + b"0" + b"}" * 70
    yield "lone_surrogate.json", b'{"\\ud800": 1}'
    yield "unterminated.json", b'{"model": {"type": "BPE'
    yield "not_bpe.json", tokenizer_json(encoder, merges, type="Unigram")
    yield "prefix_space.json", tokenizer_json(encoder, merges, pre_tokenizer={
        "type": "ByteLevel", "add_prefix_space": True})
    yield "id_out_of_range.json", tokenizer_json(dict(encoder, x=10 ** 9), merges)
    yield "id_negative.bin", gpt2_files(dict(encoder, x=-1), lines)
    yield "id_twice.bin", gpt2_files(dict(encoder, x=3), lines)
    yield "merge_unknown_part.bin", gpt2_files(encoder, lines + ["q z"])
    yield "merge_twice.bin", gpt2_files(encoder, lines + [lines[0]])
    yield "merges_outnumber_tokens.bin", gpt2_files(encoder, lines + ["a b"] * 2000000)
    yield "merge_three_parts.bin", gpt2_files(encoder, ["h e l"])
    no_byte_7 = {k: v for k, v in encoder.items() if v != 7}
    no_byte_7["<|endoftext|>"] = 7  # the ids stay 0..n-1
    yield "missing_byte_token.bin", gpt2_files(no_byte_7, lines)
    yield "many_long_tokens.json", json.dumps({("t%d" % i) * 50: i for i in range(20000)}).encode()


def safetensors(header, data=b"", raw_length=None):
    text = json.dumps(header).encode() if not isinstance(header, bytes) else header
    length = len(text) if raw_length is None else raw_length
    return struct.pack("<Q", length) + text + data


def safetensors_corpus():
    two = struct.pack("<2f", 1.5, -2.0)
    ok = {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
          "__metadata__": {"format": "pt"}}
    yield "valid_f32.safetensors", safetensors(ok, two)
    yield "valid_bf16_i64.safetensors", safetensors(
        {"a": {"dtype": "BF16", "shape": [1, 2], "data_offsets": [0, 4]},
         "b": {"dtype": "I64", "shape": [], "data_offsets": [4, 12]}}, b"\0" * 12)
    yield "header_length_huge.safetensors", safetensors(ok, two, raw_length=2 ** 62)
    yield "header_length_past_end.safetensors", safetensors(ok, two, raw_length=10 ** 6)
    yield "header_not_json.safetensors", safetensors(b"{not json", two)
    yield "header_array.safetensors", safetensors(b"[1,2,3]   ", two)
    yield "dtype_unknown.safetensors", safetensors(
        {"w": {"dtype": "F99", "shape": [2], "data_offsets": [0, 8]}}, two)
    yield "shape_overflow.safetensors", safetensors(
        {"w": {"dtype": "F32", "shape": [2 ** 32, 2 ** 32, 2 ** 32], "data_offsets": [0, 8]}}, two)
    yield "offsets_past_data.safetensors", safetensors(
        {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8000000]}}, two)
    yield "offsets_overlap.safetensors", safetensors(
        {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
         "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, two * 2)
    yield "offsets_reversed.safetensors", safetensors(
        {"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 0]}}, two)
    yield "negative_shape.safetensors", safetensors(
        {"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, two)
    yield "deep_metadata.safetensors", safetensors(b'{"__metadata__":' + b"[" * 5000 +
                                                   b"]" * 5000 + b"}", two)
    yield "short_file.safetensors", b"\x08\0\0"


def shard_index(entries, files=None, world=1, end=True):
    files = files if files is not None else [("shard_00000.bin", 4096, "0" * 64)]
    out = "lockstep-sharded-checkpoint 1\nworld_size %d\nzero 0\nstep 7\n" % world
    out += "".join("file %s %d %s\n" % f for f in files)
    out += "".join("tensor %s\n" % e for e in entries)
    return (out + ("end\n" if end else "")).encode()


def shard_index_corpus():
    yield "valid_index.txt", shard_index(["model.pt/w float32 2,3 0 0 24",
                                          "model.pt/b float32 - 0 64 4"])
    yield "truncated.txt", shard_index(["model.pt/w float32 2,3 0 0 24"], end=False)
    yield "bytes_overflow.txt", shard_index(
        ["model.pt/w float32 4294967296,4294967296,16 0 0 24"])
    yield "range_past_file.txt", shard_index(["model.pt/w float32 2,3 0 4090 24"])
    yield "ranges_overlap.txt", shard_index(["model.pt/a float32 2,3 0 0 24",
                                             "model.pt/b float32 2,3 0 8 24"])
    yield "name_twice.txt", shard_index(["model.pt/a float32 2 0 0 8", "model.pt/a float32 2 0 64 8"])
    yield "unknown_dtype.txt", shard_index(["model.pt/a complex999 2 0 0 8"])
    yield "file_index_out.txt", shard_index(["model.pt/a float32 2 5 0 8"])
    yield "unknown_line.txt", shard_index(["model.pt/a float32 2 0 0 8"]).replace(b"end", b"oops")
    yield "huge_world.txt", shard_index([], world=10 ** 18)
    yield "many_dims.txt", shard_index(["model.pt/a float32 " + ",".join(["1"] * 10000) +
                                        " 0 0 4"])
    yield "valid_many_lines.txt", shard_index(["model.pt/t%d float32 1 0 %d 4" % (i, 64 * i)
                                         for i in range(60)] * 1)


def llmc(magic, version, count, tokens, width=2):
    head = struct.pack("<3i", magic, version, count) + b"\0" * (1024 - 12)
    return head + b"".join(struct.pack("<H" if width == 2 else "<I", t) for t in tokens)


def token_file_corpus():
    yield "valid_nanogpt.bin", struct.pack("<4H", 1, 2, 3, 50256)
    yield "valid_llmc.bin", llmc(20240520, 1, 3, [5, 6, 7])
    yield "valid_llmc_v2.bin", llmc(20240520, 2, 2, [5, 6])
    yield "valid_llmc32.bin", llmc(20240801, 7, 2, [128000, 9], width=4)
    yield "count_lies.bin", llmc(20240520, 1, 1000, [5, 6, 7])
    yield "count_negative.bin", llmc(20240520, 1, -5, [5, 6, 7])
    yield "unknown_magic.bin", llmc(20991231, 1, 3, [5, 6, 7])
    yield "unknown_version.bin", llmc(20240520, 9, 3, [5, 6, 7])
    yield "odd_size.bin", b"\1\0\2"
    yield "empty.bin", b""
    yield "valid_header_only.bin", llmc(20240520, 1, 0, [])


def progress_corpus():
    yield "valid_records.txt", (b"progress step=150 total=500 epoch=1 loss=1.2345 units=245760 "
                                b"unit=tokens\nprogress step=0 total=0 epoch=1 loss=-1 units=0 "
                                b"unit=samples")
    yield "step_over_total.txt", b"progress step=600 total=500 epoch=1 loss=1 units=1 unit=tokens"
    yield "repeated_key.txt", b"progress step=1 step=2 total=5 epoch=1 loss=1 units=1 unit=tokens"
    yield "huge_number.txt", (b"progress step=99999999999999999999999 total=5 epoch=1 loss=1 "
                              b"units=1 unit=tokens")
    yield "nan_loss.txt", b"progress step=1 total=5 epoch=1 loss=nan units=nan unit=tokens"
    yield "long_line.txt", b"progress step=1 " + b"x" * 100000
    yield "many_lines.txt", b"progress\n" * 100000


def main():
    out = sys.argv[1]
    for target, corpus in [("vocab", vocab_corpus), ("safetensors", safetensors_corpus),
                           ("shard_index", shard_index_corpus),
                           ("token_file", token_file_corpus), ("progress", progress_corpus)]:
        os.makedirs(os.path.join(out, target), exist_ok=True)
        for name, data in corpus():
            with open(os.path.join(out, target, name), "wb") as f:
                f.write(data)


if __name__ == "__main__":
    main()
