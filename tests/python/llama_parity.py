"""lockstep's Llama against transformers' LlamaForCausalLM (tests/multiproc/llama.sh).

  llama_parity.py init DIR [llama3]        a random LlamaForCausalLM (2 layers, 4 query heads
                                           sharing 2 key/value heads, untied head, vocabulary
                                           256: bytes), save_pretrained(DIR/hf) in several
                                           shards with an index; DIR/ids.pt: token ids;
                                           llama3: with Llama 3.1's rope scaling
  llama_parity.py logits FOLDER IDS OUT    transformers' logits of FOLDER on IDS, in OUT
  llama_parity.py close A B TOL            the largest difference of two logits files
  llama_parity.py greedy FOLDER PROMPT N GENERATED
                                           transformers' greedy generate() of N bytes after
                                           PROMPT from FOLDER, against lockstep generate's text
  llama_parity.py train DIR --text F --metrics M --steps N --batch B --block T --seed S
                                           transformers trains N steps from DIR/hf on the text's
                                           windows in DistributedSampler's order (as lockstep's
                                           data.name: text), AdamW (lr 2e-3, weight decay 0.1)
                                           and clipping 1.0; per-step losses against lockstep's
"""
import json
import math
import sys

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

SHAPE = dict(vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
             rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False)


# Llama 3.1's rope scaling on the same shape (head_dim 16): with an original
# context of 64, one frequency kept, two blended, five divided.
LLAMA3_ROPE = dict(rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0,
                   high_freq_factor=4.0, original_max_position_embeddings=64)


def init(folder, rope="default"):
    torch.manual_seed(5)
    shape = dict(SHAPE, rope_parameters=LLAMA3_ROPE) if rope == "llama3" else SHAPE
    model = LlamaForCausalLM(LlamaConfig(**shape))
    model.save_pretrained(folder + "/hf", safe_serialization=True, max_shard_size="150KB")
    torch.save({"ids": torch.randint(0, 256, (3, 32))}, folder + "/ids.pt")


def logits(folder, ids_path, out):
    model = LlamaForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        result = model(input_ids=torch.load(ids_path)["ids"]).logits
    torch.save({"logits": result}, out)


def close(a, b, tolerance):
    x, y = torch.load(a)["logits"], torch.load(b)["logits"]
    diff = (x - y).abs().max().item() if x.shape == y.shape else float("inf")
    print(f"logits {tuple(x.shape)}: largest difference {diff:.3g} (tolerance {tolerance:g})")
    return 0 if diff <= tolerance else 1


def greedy(folder, prompt, n, generated):
    model = LlamaForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    ids = torch.tensor([list(prompt.encode())], dtype=torch.long)
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=0)
    python = bytes(out[0].tolist()).decode("utf-8", "replace")
    ours = open(generated, "rb").read().decode("utf-8").rstrip("\n")
    print("greedy: " + ("equal" if python == ours else f"DIFFERENT: python {python!r}, lockstep {ours!r}"))
    return 0 if python == ours else 1


def train(folder, text, metrics, steps, batch, block, seed):
    torch.manual_seed(seed)
    model = LlamaForCausalLM.from_pretrained(folder + "/hf", torch_dtype=torch.float32)
    model.train()
    data = torch.tensor(list(open(text, "rb").read()), dtype=torch.long)
    held = math.floor(len(data) * 0.1 + 0.5)  # data.validation_fraction 0.1, C++'s llround
    data = data[:len(data) - held]
    windows = (len(data) - 1) // block
    sampler = torch.utils.data.distributed.DistributedSampler(
        range(windows), num_replicas=1, rank=0, shuffle=True, seed=seed, drop_last=False)
    sampler.set_epoch(0)
    order = list(sampler)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.1)
    ours = []
    for step in range(steps):
        rows = order[step * batch:(step + 1) * batch]
        x = torch.stack([data[i * block:i * block + block] for i in rows])
        y = torch.stack([data[i * block + 1:i * block + block + 1] for i in rows])
        opt.zero_grad()
        out = model(input_ids=x).logits
        loss = F.cross_entropy(out.reshape(-1, out.size(-1)), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ours.append(loss.item())
    theirs = [json.loads(line)["loss"] for line in open(metrics) if '"loss"' in line]
    if len(theirs) != steps:
        print(f"metrics.jsonl has {len(theirs)} step records, not {steps}")
        return 1
    rel = max(abs(o - t) / abs(t) for o, t in zip(ours, theirs))
    print(f"losses: {steps} steps, first {ours[0]:.6f} (lockstep {theirs[0]:.6f}), last "
          f"{ours[-1]:.6f} (lockstep {theirs[-1]:.6f}), largest relative difference {rel:.3g}")
    return 0


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "init":
        init(*sys.argv[2:4])
    elif mode == "logits":
        logits(*sys.argv[2:5])
    elif mode == "greedy":
        sys.exit(greedy(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]))
    elif mode == "close":
        sys.exit(close(sys.argv[2], sys.argv[3], float(sys.argv[4])))
    else:
        args = dict(zip(sys.argv[3::2], sys.argv[4::2]))
        sys.exit(train(sys.argv[2], args["--text"], args["--metrics"], int(args["--steps"]),
                       int(args["--batch"]), int(args["--block"]), int(args["--seed"])))
