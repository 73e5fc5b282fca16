"""PyTorch's side of scripts/bench_peers.sh: scripts/bench_zero.sh's MLP
(784, LAYERS hidden layers of HIDDEN, 10), Adam (lr 1e-4), batch 32 per rank
of synthetic data, trained under one of PyTorch's data-parallel wrappers:

  ddp     DistributedDataParallel            (lockstep's optim.zero 0)
  zero1   DDP + ZeroRedundancyOptimizer      (optim.zero 1)
  zero2   FSDP2 fully_shard, reshard_after_forward=False  (optim.zero 2)
  zero3   FSDP2 fully_shard, reshard_after_forward=True   (optim.zero 3)

one fully_shard unit per Linear and one for the root, as lockstep's zero 3
makes one per child module. With --save dcp or dcp-async (zero3 only), the
model's and optimizer's sharded state dict is written with
torch.distributed.checkpoint's save or async_save after step --save-step:
the save's time (async: until its future completes) and the training pause
(async: the async_save call itself, which stages the state in memory).

Run under lockstep-run or torchrun. Rank 0 prints one JSON line: the
median step time (forward, backward, optimizer) after the first two, each
rank's peak resident memory (the process's VmHWM at the end) and optimizer
state bytes, and the save figures."""
import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--mode", required=True, choices=["ddp", "zero1", "zero2", "zero3"])
p.add_argument("--steps", type=int, default=10)
p.add_argument("--hidden", type=int, default=4096)
p.add_argument("--layers", type=int, default=4)
p.add_argument("--batch", type=int, default=32)
p.add_argument("--save", default="none", choices=["none", "dcp", "dcp-async"])
p.add_argument("--save-step", type=int, default=2)
p.add_argument("--save-dir", default="")
a = p.parse_args()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
sizes = [784] + [a.hidden] * a.layers + [10]
layers = []
for i in range(len(sizes) - 1):
    layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
    if i < len(sizes) - 2:
        layers.append(torch.nn.ReLU())
model = torch.nn.Sequential(*layers)

if a.mode in ("ddp", "zero1"):
    model = torch.nn.parallel.DistributedDataParallel(model)
    if a.mode == "ddp":
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    else:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-4)
else:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (world,))
    reshard = a.mode == "zero3"
    for m in model:
        if isinstance(m, torch.nn.Linear):
            fully_shard(m, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)

save_group = dist.new_group(backend="gloo") if a.save == "dcp-async" else None
gen = torch.Generator().manual_seed(1 + rank)
step_ms, save = [], {}
pending = None
for step in range(1, a.steps + 1):
    x = torch.randn(a.batch, 784, generator=gen)
    y = torch.randint(0, 10, (a.batch,), generator=gen)
    t0 = time.perf_counter()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    step_ms.append(1000 * (time.perf_counter() - t0))
    if a.save != "none" and step == a.save_step:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict
        dist.barrier()
        t0 = time.perf_counter()
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd}
        where = os.path.join(a.save_dir, f"step{step}")
        if a.save == "dcp":
            dcp.save(state, checkpoint_id=where)
            save["pause_s"] = save["save_s"] = time.perf_counter() - t0
        else:
            # Its own group: the background save's collectives must not
            # interleave with training's on the default one.
            pending = dcp.async_save(state, checkpoint_id=where, process_group=save_group)
            save["pause_s"] = time.perf_counter() - t0
            save_start = t0
if pending is not None:
    pending.result()
    save["save_s"] = time.perf_counter() - save_start

state_bytes = 0
if a.mode == "zero1":
    inner = opt.optim.state
else:
    inner = opt.state
for s in inner.values():
    for v in s.values():
        if torch.is_tensor(v):
            local = v.to_local() if hasattr(v, "to_local") else v
            state_bytes += local.numel() * local.element_size()
peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
ms = statistics.median(step_ms[2:]) if len(step_ms) > 2 else statistics.median(step_ms)
per_rank = [None] * world
dist.all_gather_object(per_rank, {"peak_mib": peak_kib / 1024, "state_mib": state_bytes / 2**20, "ms": ms,
                                  **save})
if rank == 0:
    out = {"mode": a.mode, "world": world, "torch": torch.__version__,
           "parameters": sum(p.numel() for p in model.parameters()),
           "step_ms": max(r["ms"] for r in per_rank),
           "peak_mib": [round(r["peak_mib"], 1) for r in per_rank],
           "state_mib": [round(r["state_mib"], 1) for r in per_rank]}
    if save:
        out["save_s"] = max(r["save_s"] for r in per_rank)
        out["pause_s"] = max(r["pause_s"] for r in per_rank)
    print(json.dumps(out), flush=True)
# The figures are out: leave without the interpreter's teardown. FSDP2 over
# Gloo aborted there once in 16 runs on torch 2.15 ("terminate called
# without an active exception", after this line), which made the whole run
# a failure. Both ranks pass the barrier first, so neither leaves the other
# waiting in a collective.
dist.barrier()
sys.stdout.flush()
os._exit(0)
