"""The libraries users trust, as judges of what lockstep writes and reads
(tests/multiproc/real_clients.sh). Each subcommand prints what it checked and
exits 1 naming the first difference.

    real_clients.py hf-logits FOLDER LOGITS IDS       transformers' GPT2LMHeadModel on
                                                      lockstep's export == lockstep's logits
    real_clients.py hf-random OUT_DIR LAYERS HEADS EMBD BLOCK VOCAB
                                                      a random GPT2LMHeadModel, save_pretrained
    real_clients.py hf-compare FOLDER LOGITS IDS      its logits == lockstep's (after init_from)
    real_clients.py hf-greedy FOLDER IDS N GENERATED  generate(do_sample=False) == lockstep's
    real_clients.py st-write DIR                      safetensors' save_file, every dtype
    real_clients.py st-read DIR                       safe_open/load_file of lockstep's files
    real_clients.py tb EVENTS METRICS                 tensorboard's reader == metrics.jsonl
"""
import json
import os
import sys

import numpy as np

TOLERANCE = 1e-5


def ids_of(text):
    return [int(x) for x in text.split(",")]


def lockstep_logits(path, n_ids):
    raw = np.fromfile(path, dtype="<f4")
    return raw.reshape(n_ids, -1)


def hf_logits(folder, ids):
    import torch
    from transformers import GPT2LMHeadModel
    model = GPT2LMHeadModel.from_pretrained(folder, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy(), model


def compare(folder, logits_path, ids_text):
    ids = ids_of(ids_text)
    ours = lockstep_logits(logits_path, len(ids))
    theirs, _ = hf_logits(folder, ids)
    if ours.shape != theirs.shape:
        sys.exit(f"shapes differ: lockstep {ours.shape}, transformers {theirs.shape}")
    diff = float(np.abs(ours - theirs).max())
    scale = float(np.abs(theirs).max())
    print(f"{ours.shape[0]} positions x {ours.shape[1]} logits: largest difference {diff:.3g} "
          f"(logits up to {scale:.3g}); argmax equal at every position: "
          f"{bool((ours.argmax(1) == theirs.argmax(1)).all())}")
    if not diff <= TOLERANCE * max(1.0, scale):
        sys.exit(f"logits differ by {diff} > {TOLERANCE}")


def hf_random(out, layers, heads, embd, block, vocab):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(7)
    # lockstep's GELU is the exact one (Note [GPT-2 layout]): gelu, not gelu_new.
    config = GPT2Config(n_layer=int(layers), n_head=int(heads), n_embd=int(embd),
                        n_positions=int(block), vocab_size=int(vocab), activation_function="gelu",
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    GPT2LMHeadModel(config).save_pretrained(out, safe_serialization=True)
    print("saved", sorted(os.listdir(out)))


def greedy(folder, ids_text, n, generated_path):
    import torch
    ids = ids_of(ids_text)
    _, model = hf_logits(folder, ids)
    out = model.generate(torch.tensor([ids]), max_new_tokens=int(n), do_sample=False,
                         pad_token_id=0, attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    theirs = out[0].tolist()
    ours = [int(x) for x in open(generated_path).read().split()]
    print(f"transformers: {theirs[len(ids):]}")
    if ours != theirs:
        sys.exit(f"greedy continuations differ: lockstep {ours[len(ids):]}, transformers "
                 f"{theirs[len(ids):]}")
    print(f"greedy continuation of {n} tokens equal")


# Every dtype lockstep's safetensors reader and writer support, with the
# values each side writes: arange(12) as [3, 4], cast (bool: odd entries).
DTYPES = ["F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL"]


def expected(dtype):
    import torch
    torch_dtype = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
                   "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32,
                   "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
                   "BOOL": torch.bool}[dtype]
    base = torch.arange(12).reshape(3, 4)
    return (base % 2 == 1) if dtype == "BOOL" else (base - 5).to(torch_dtype) if dtype not in (
        "U8",) else base.to(torch_dtype)


def st_write(out):
    from safetensors.torch import save_file
    os.makedirs(out, exist_ok=True)
    for dtype in DTYPES:
        save_file({"t": expected(dtype), "scalar": expected(dtype).reshape(-1)[:1].reshape(())},
                  os.path.join(out, f"py_{dtype}.safetensors"), metadata={"writer": "safetensors"})
    print(f"save_file wrote {len(DTYPES)} files")


def st_read(folder):
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file
    checked = 0
    for dtype in DTYPES:
        path = os.path.join(folder, f"lockstep_{dtype}.safetensors")
        tensors = load_file(path)
        with safe_open(path, framework="pt") as f:
            meta = f.metadata()
            keys = list(f.keys())
        want = expected(dtype)
        got = tensors["t"]
        if got.dtype != want.dtype or not torch.equal(got, want):
            sys.exit(f"{path}: 't' is {got.dtype} {got.tolist()}, expected {want.dtype} {want.tolist()}")
        if meta.get("writer") != "lockstep" or sorted(keys) != ["scalar", "t"]:
            sys.exit(f"{path}: metadata {meta}, keys {keys}")
        checked += 1
    print(f"load_file and safe_open read {checked} lockstep files, every value and dtype equal")


def tensorboard(events, metrics_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(events, size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    tags = acc.Tags()["scalars"]
    scalars = {(tag, e.step): e.value for tag in tags for e in acc.Scalars(tag)}
    checked = 0

    def same(a, text):
        # Within what metrics.jsonl printed (its last digit) and float32's
        # rounding (TensorBoard keeps scalars as float32).
        mantissa, _, exponent = text.lower().partition("e")
        decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
        last_digit = 0.5 * 10.0 ** (int(exponent or 0) - decimals)
        return abs(a - float(text)) <= last_digit + 1e-7 * abs(float(text))

    # Every tag against its metrics.jsonl key: train/X is X, val/X is val_X.
    keys = {tag: (tag[len("train/"):] if tag.startswith("train/") else "val_" + tag[len("val/"):])
            for tag in tags}
    records = 0
    for line in open(metrics_path):
        m = json.loads(line, parse_float=str, parse_int=str)
        pairs = [(tag, key) for tag, key in keys.items() if isinstance(m.get(key), str)]
        records += 1 if pairs else 0
        if "loss" in m and ("train/loss", "loss") not in pairs:
            sys.exit(f"step {m['step']}: no train/loss in the event file")
        for tag, key in pairs:
            step = int(m["step"])
            if (tag, step) not in scalars:
                sys.exit(f"tensorboard has no {tag} at step {m['step']} (it has {sorted(tags)})")
            if not same(scalars[(tag, step)], m[key]):
                sys.exit(f"{tag} at step {step}: tensorboard {scalars[(tag, step)]}, "
                         f"metrics.jsonl {m[key]}")
            checked += 1
    if checked == 0:
        sys.exit("nothing compared")
    print(f"tensorboard's EventAccumulator: {checked} scalars of {records} records equal "
          f"metrics.jsonl's ({len(tags)} tags)")


def main():
    command, args = sys.argv[1], sys.argv[2:]
    {"hf-logits": compare, "hf-compare": compare, "hf-random": hf_random, "hf-greedy": greedy,
     "st-write": st_write, "st-read": st_read, "tb": tensorboard}[command](*args)


if __name__ == "__main__":
    main()
