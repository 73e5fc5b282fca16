"""PyTorch's side of scripts/bench_gpt.sh: the same GPT (tests/python/gpt.py),
batches, optimizer and clipping as configs/gpt-text.yaml, under PyTorch's
own DistributedDataParallel. Run under lockstep-run or torchrun (RANK,
WORLD_SIZE, MASTER_ADDR/PORT). Prints one JSON line on rank 0: tokens/s over
the timed steps (the slowest rank's time). --split: a profiling pass that
waits for the device after each phase and adds rank 0's mean milliseconds per
step of forward, backward, clipping and the optimizer step ("split"), as
lockstep's log.sync_timing does."""
import argparse
import json
import os
import resource
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from gpt import GPT  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--text", required=True)
p.add_argument("--backend", default="gloo")
p.add_argument("--steps", type=int, default=40)
p.add_argument("--warmup", type=int, default=10)
p.add_argument("--n_layer", type=int, default=4)
p.add_argument("--n_head", type=int, default=4)
p.add_argument("--n_embd", type=int, default=128)
p.add_argument("--block_size", type=int, default=128)
p.add_argument("--batch_size", type=int, default=16)
p.add_argument("--precision", default="fp32", help="fp32 | bf16 (autocast, as train.precision)")
p.add_argument("--device", default="cpu", help="cpu | cuda (GPU LOCAL_RANK, as lockstep's train.device)")
p.add_argument("--split", action="store_true", help="time each phase to the device's end (slower)")
a = p.parse_args()
a.vocab_size, a.dropout, a.bias = 256, 0.0, True
dist.init_process_group(a.backend)
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
if a.device == "cuda":
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    torch.cuda.set_device(device)
    model = torch.nn.parallel.DistributedDataParallel(GPT(a).to(device), device_ids=[device.index])
else:
    device = torch.device("cpu")
    model = torch.nn.parallel.DistributedDataParallel(GPT(a))


def sync():
    if device.type == "cuda":
        torch.cuda.synchronize(device)


opt = torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.9, 0.99), weight_decay=0.1)
data = torch.tensor(list(open(a.text, "rb").read()), dtype=torch.long)
t = a.block_size
windows = (len(data) - 1) // t
sampler = torch.utils.data.distributed.DistributedSampler(range(windows), world, rank, seed=0)
order = list(sampler)
start = None
PHASES = ("forward", "backward", "clip", "optimizer")
split = dict.fromkeys(PHASES, 0.0)
mark = [0.0]


def phase(name):  # with --split: the phase that ends now, to the device's end
    if not a.split:
        return
    sync()
    now = time.perf_counter()
    if start is not None and name is not None:
        split[name] += 1000 * (now - mark[0])
    mark[0] = now


for step in range(a.warmup + a.steps):
    if step == a.warmup:
        sync()
        dist.barrier()
        start = time.perf_counter()
    rows = order[step * a.batch_size:(step + 1) * a.batch_size]
    x = torch.stack([data[i * t:i * t + t] for i in rows]).to(device)
    y = torch.stack([data[i * t + 1:i * t + t + 1] for i in rows]).to(device)
    opt.zero_grad(set_to_none=True)
    phase(None)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=a.precision == "bf16"):
        _, loss = model(x, y)
    phase("forward")
    loss.backward()
    phase("backward")
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    phase("clip")
    opt.step()
    phase("optimizer")
sync()
elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
if rank == 0:
    tokens = world * a.batch_size * t * a.steps
    print(json.dumps({"impl": "pytorch (%s%s)" % (a.backend, ", cuda" if device.type == "cuda" else ""),
                      "precision": a.precision,
                      "tokens_per_s": tokens / elapsed.item(),
                      **({"split": {k: v / a.steps for k, v in split.items()}} if a.split else {}),
                      "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}),
          flush=True)
dist.destroy_process_group()
