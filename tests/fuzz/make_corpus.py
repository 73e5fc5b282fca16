"""Writes the state-dict fuzz corpus into a folder: valid files and the
hostile ones of issue 16 (each named for what it does).

    python3 make_corpus.py DIR
"""
import collections
import io
import os
import sys
import zipfile

import torch


def save(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def with_pickle(template, pickle_bytes):
    """template's archive with data.pkl replaced."""
    src = zipfile.ZipFile(io.BytesIO(template))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = src.read(info.filename)
            if info.filename.endswith("/data.pkl"):
                data = pickle_bytes
            dst.writestr(info.filename, data)
    return out.getvalue()


def rewritten(template, change):
    """template's archive with change(name, data) -> (data, compression)."""
    src = zipfile.ZipFile(io.BytesIO(template))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            data, method = change(info.filename, src.read(info.filename))
            dst.writestr(info.filename, data, compress_type=method)
    return out.getvalue()


def main(folder):
    os.makedirs(folder, exist_ok=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    valid = save(model.state_dict())
    big = save(collections.OrderedDict(w=torch.zeros(1024, 1024)))
    shared = torch.arange(10.0)
    files = {
        "valid_state_dict.pt": valid,
        "valid_plain_dict.pt": save({"a": torch.arange(6.0).reshape(2, 3), "b": torch.ones(2)}),
        "valid_shared_storage.pt": save(collections.OrderedDict(a=shared, b=shared[2:5])),
        "valid_tensor.pt": save(torch.arange(5)),
        "empty_file.pt": b"",
        "not_a_zip.pt": b"\x80\x02}q\x00." * 10,
        "truncated.pt": valid[: len(valid) // 2],
        "binput_empty_stack.pt": with_pickle(valid, b"\x80\x02q\x00."),
        "tuple1_empty_stack.pt": with_pickle(valid, b"\x80\x02\x85."),
        "tuple2_short_stack.pt": with_pickle(valid, b"\x80\x02N\x86."),
        "nested_tuple1_million.pt": with_pickle(valid, b"\x80\x02N" + b"\x85" * 1_000_000 + b"."),
        "nested_lists.pt": with_pickle(valid, b"\x80\x02" + b"]" * 100_000 + b"a" * 99_999 + b"."),
        "self_append.pt": with_pickle(valid, b"\x80\x02]q\x00h\x00a" + b"h\x00h\x00a" * 100 + b"."),
        "odd_setitems.pt": with_pickle(valid, b"\x80\x02}(K\x01u."),
        "long1_too_wide.pt": with_pickle(valid, b"\x80\x02\x8a\x10" + b"\xff" * 16 + b"."),
        "unknown_global.pt": with_pickle(valid, b"\x80\x02cos\nsystem\nX\x02\x00\x00\x00ls\x85R."),
        "stride0_blowup.pt": save(collections.OrderedDict(w=torch.zeros(1).expand(16384, 16384))),
        "storage_truncated.pt": rewritten(big, lambda n, d: (
            d[: len(d) // 2] if n.endswith("/data/0") else d, zipfile.ZIP_STORED)),
        "deflated_record.pt": rewritten(big, lambda n, d: (
            d, zipfile.ZIP_DEFLATED if n.endswith("/data/0") else zipfile.ZIP_STORED)),
    }
    for name, data in files.items():
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main(sys.argv[1])
