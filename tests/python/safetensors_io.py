#!/usr/bin/env python3
"""safetensors without the safetensors package (not in Debian): the format
read and written from its spec, for lockstep's tests (Note [GPT-2 layout]).
  write-hf STATE.pt OUT.safetensors   a lockstep/nanoGPT state dict in Hugging
      Face's GPT-2 layout as OpenAI's upload has it: no "transformer." prefix,
      Conv1D weights [in, out], the causal-mask buffers attn.bias and
      attn.masked_bias, and lm_head.weight, a copy of wte
  compare-hf FILE.safetensors STATE.pt  the file holds STATE's tensors in
      GPT2LMHeadModel's layout, bit for bit; the header is padded to 8 bytes
      and the data packed in order
  equal A.pt B.pt                     two state dicts, bit for bit"""
import json
import struct
import sys

import torch

DTYPES = {"F32": torch.float32, "F64": torch.float64, "F16": torch.float16,
          "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32,
          "U8": torch.uint8, "BOOL": torch.bool}
NAMES = {v: k for k, v in DTYPES.items()}
CONV1D = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")


def read(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    assert (8 + n) % 8 == 0, "header not padded to 8 bytes"
    body = data[8 + n:]
    out, end = {}, 0
    entries = sorted((k, v) for k, v in header.items() if k != "__metadata__")
    for name, e in sorted(entries, key=lambda kv: kv[1]["data_offsets"][0]):
        b, e_ = e["data_offsets"]
        assert b == end, f"{name}: data not packed ({b} after {end})"
        end = e_
        t = torch.frombuffer(bytearray(body[b:e_]), dtype=DTYPES[e["dtype"]]) if e_ > b else \
            torch.empty(0, dtype=DTYPES[e["dtype"]])
        out[name] = t.reshape(e["shape"])
    assert end == len(body), "bytes after the last entry"
    return out, header.get("__metadata__", {})


def write(tensors, path, metadata):
    header, offset, blobs = {"__metadata__": metadata}, 0, []
    for name, t in tensors.items():
        raw = t.contiguous().numpy().tobytes() if t.dtype != torch.bfloat16 else \
            t.contiguous().view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def main():
    cmd = sys.argv[1]
    if cmd == "write-hf":
        state = torch.load(sys.argv[2])
        out = {}
        for name, t in state.items():
            short = name[len("transformer."):] if name.startswith("transformer.") else name
            out[short] = t.t().contiguous() if name.endswith(CONV1D) else t
            if name.endswith(".attn.c_attn.weight"):  # the mask buffers GPT-2's upload holds
                block = short[: -len(".c_attn.weight")]
                n = 8
                out[block + ".bias"] = torch.tril(torch.ones(n, n)).view(1, 1, n, n)
                out[block + ".masked_bias"] = torch.tensor(-1e4)
        out["lm_head.weight"] = state["transformer.wte.weight"].clone()
        write(out, sys.argv[3], {"format": "pt"})
        print("wrote", len(out), "tensors")
    elif cmd == "compare-hf":
        got, meta = read(sys.argv[2])
        state = torch.load(sys.argv[3])
        assert meta.get("format") == "pt", meta
        assert sorted(got) == sorted(state), (sorted(got), sorted(state))
        for name, t in state.items():
            want = t.t() if name.endswith(CONV1D) else t
            assert got[name].shape == want.shape and torch.equal(got[name], want), name
        print("equal", len(state), "tensors, Conv1D transposed")
    elif cmd == "equal":
        a, b = torch.load(sys.argv[2]), torch.load(sys.argv[3])
        assert sorted(a) == sorted(b), (sorted(a), sorted(b))
        for name in a:
            assert torch.equal(a[name], b[name]), name
        print("equal", len(a), "tensors")


if __name__ == "__main__":
    main()
