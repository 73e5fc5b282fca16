"""lockstep's GPT against PyTorch's (tests/python/gpt.py), step for step.

  gpt_parity.py init OUT.pt ARGS        the initial weights, for model.init_from
  gpt_parity.py compare INIT.pt ARGS --text F --metrics M --checkpoint C --generated G --prompt P

compare trains the Python GPT from the same initial weights on the same
batches (the text's windows in DistributedSampler's order, as lockstep's
data.name: text reads them) with the same AdamW, clipping and learning rate,
and prints one line per check: the largest relative difference between its
per-step losses and lockstep's metrics.jsonl, the largest difference between
its final weights and lockstep's checkpoint (loaded with strict=True), and
whether its greedy continuation of the prompt from that checkpoint equals
what `lockstep generate --temperature 0` printed."""
import argparse
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt import GPT  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("mode", choices=["init", "compare"])
p.add_argument("out", nargs="?")
for name, kind in [("n_layer", int), ("n_head", int), ("n_embd", int), ("block_size", int),
                   ("batch_size", int), ("steps", int), ("seed", int), ("lr", float),
                   ("weight_decay", float), ("clip", float), ("validation_fraction", float)]:
    p.add_argument("--" + name, type=kind, required=True)
for name in ["text", "metrics", "checkpoint", "generated", "prompt"]:
    p.add_argument("--" + name)
p.add_argument("--device", default="cpu", help="where Python trains (cpu | cuda): lockstep's train.device")
a = p.parse_args()
a.vocab_size, a.dropout, a.bias = 256, 0.0, True
torch.manual_seed(a.seed)
model = GPT(a)
if a.mode == "init":
    torch.save(model.state_dict(), a.out)
    sys.exit(0)

model.load_state_dict(torch.load(a.out, map_location="cpu"), strict=True)  # init.pt
device = torch.device(a.device)
model.to(device)
data = torch.tensor(list(open(a.text, "rb").read()), dtype=torch.long)
n = len(data)
held = math.floor(n * a.validation_fraction + 0.5)  # C++'s llround for a positive number
train = data[:n - held]
t = a.block_size
windows = (len(train) - 1) // t
sampler = torch.utils.data.distributed.DistributedSampler(
    range(windows), num_replicas=1, rank=0, shuffle=True, seed=a.seed, drop_last=False)
sampler.set_epoch(0)
order = list(sampler)
opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=a.weight_decay)
ours = []
model.train()
for step in range(a.steps):
    rows = order[step * a.batch_size:(step + 1) * a.batch_size]
    x = torch.stack([train[i * t:i * t + t] for i in rows]).to(device)
    y = torch.stack([train[i * t + 1:i * t + t + 1] for i in rows]).to(device)
    opt.zero_grad()
    _, loss = model(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
    opt.step()
    ours.append(loss.item())
theirs = [json.loads(line)["loss"] for line in open(a.metrics) if '"loss"' in line]
assert len(theirs) == a.steps, "metrics.jsonl has %d step records, not %d" % (len(theirs), a.steps)
rel = max(abs(o - l) / abs(l) for o, l in zip(ours, theirs))
print("losses: %d steps, first %.6f (lockstep %.6f), last %.6f (lockstep %.6f), "
      "largest relative difference %.3g" % (a.steps, ours[0], theirs[0], ours[-1], theirs[-1], rel))
trained = GPT(a)
trained.load_state_dict(torch.load(a.checkpoint, map_location="cpu"), strict=True)
model.to("cpu")
diff = max((p1 - p2).abs().max().item()
           for p1, p2 in zip(model.state_dict().values(), trained.state_dict().values()))
print("weights: largest difference after %d steps %.3g" % (a.steps, diff))
trained.eval()
prompt = torch.tensor([list(a.prompt.encode())], dtype=torch.long)
generated = open(a.generated, "rb").read().decode("utf-8").rstrip("\n")
python = bytes(trained.greedy(prompt, 40)[0].tolist()).decode("utf-8", "replace")
print("greedy: %s" % ("equal" if python == generated else
                      "DIFFERENT: python %r, lockstep %r" % (python, generated)))
