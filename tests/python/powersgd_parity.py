"""PyTorch's own PowerSGD hook beside lockstep's (tests/multiproc/powersgd.sh).

  powersgd_parity.py prepare DIR            init.pt: an MLP's weights and every step's data
  powersgd_parity.py torch DIR VARIANT      2 processes, PyTorch's DDP + powerSGD_hook:
                                            torch_<VARIANT>.pt (final weights) and .bytes
  powersgd_parity.py compare DIR VARIANT    against lockstep_<VARIANT>.pt / .bytes (written
                                            by lockstep_tests "[.powersgd_parity]")

VARIANT: r<rank>[-batch][-buckets]: matrix_approximation_rank, then
batch_tensors_with_same_shape, then one bucket per parameter (else one
bucket for all). The run: Linear(12, 32), Linear(32, 32), Linear(32, 12),
Linear(12, 32), Linear(32, 5) with ReLUs (two [32, 12] weights apart: Qs are
laid out by shape in order of appearance); SGD lr 0.1 momentum 0.9; 10
steps of 8 rows per rank; PowerSGDState(start_powerSGD_iter=2, the other
settings PyTorch's defaults).
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

STEPS, ROWS, WORLD = 10, 8, 2


def model():
    return nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                         nn.Linear(32, 12), nn.ReLU(), nn.Linear(12, 32), nn.ReLU(),
                         nn.Linear(32, 5))


def parse(variant):
    parts = variant.split("-")
    return int(parts[0][1:]), "batch" in parts, "buckets" in parts


def prepare(folder):
    torch.manual_seed(17)
    state = {k: v.clone() for k, v in model().state_dict().items()}
    for step in range(STEPS):
        for rank in range(WORLD):
            state[f"x.{step}.{rank}"] = torch.randn(ROWS, 12)
            state[f"y.{step}.{rank}"] = torch.randint(0, 5, (ROWS,))
    torch.save(state, os.path.join(folder, "init.pt"))


def worker(rank, folder, variant):
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

    approx_rank, batch, buckets = parse(variant)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + os.path.join(folder, f"store-{variant}"),
                            rank=rank, world_size=WORLD)
    sent = [0]
    real = dist.all_reduce

    def counting(tensor, *args, **kwargs):  # the hook's exchanges, in bytes
        sent[0] += tensor.numel() * tensor.element_size()
        return real(tensor, *args, **kwargs)

    dist.all_reduce = counting
    init = torch.load(os.path.join(folder, "init.pt"))
    net = model()
    net.load_state_dict({k: v for k, v in init.items() if not k.startswith(("x.", "y."))})
    if buckets:  # one parameter per bucket, the first bucket too
        dist._DEFAULT_FIRST_BUCKET_BYTES = 1
    ddp = nn.parallel.DistributedDataParallel(net, bucket_cap_mb=1e-6 if buckets else 25)
    state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=approx_rank,
                                   start_powerSGD_iter=2, batch_tensors_with_same_shape=batch)
    ddp.register_comm_hook(state, powersgd.powerSGD_hook)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    per_step = []
    for step in range(STEPS):
        opt.zero_grad()
        before = sent[0]
        out = ddp(init[f"x.{step}.{rank}"])
        nn.functional.cross_entropy(out, init[f"y.{step}.{rank}"]).backward()
        opt.step()
        per_step.append(sent[0] - before)
    if rank == 0:
        torch.save(net.state_dict(), os.path.join(folder, f"torch_{variant}.pt"))
        with open(os.path.join(folder, f"torch_{variant}.bytes"), "w") as f:
            f.write(" ".join(str(b) for b in per_step) + "\n")
    dist.barrier()
    # Debian 12's torch 1.13 sometimes aborts in Gloo's teardown ("terminate
    # called without an active exception") after everything is written:
    # leave without it.
    os._exit(0)


def compare(folder, variant):
    theirs = torch.load(os.path.join(folder, f"torch_{variant}.pt"))
    ours = torch.load(os.path.join(folder, f"lockstep_{variant}.pt"))
    init = torch.load(os.path.join(folder, "init.pt"))
    worst, moved = 0.0, 0.0
    for k, v in theirs.items():
        worst = max(worst, (ours[k] - v).abs().max().item())
        moved = max(moved, (v - init[k]).abs().max().item())
    same = all(torch.equal(ours[k], v) for k, v in theirs.items())
    tb = open(os.path.join(folder, f"torch_{variant}.bytes")).read().split()
    lb = open(os.path.join(folder, f"lockstep_{variant}.bytes")).read().split()
    print(f"{variant}: weights {'bit-identical' if same else 'differ'}, "
          f"max |diff| {worst:.3g} (training moved them by up to {moved:.3g}); "
          f"bytes per step torch {' '.join(tb)} lockstep {' '.join(lb)}")
    return 0 if same and tb == lb and moved > 1e-3 else 1


if __name__ == "__main__":
    what, folder = sys.argv[1], sys.argv[2]
    if what == "prepare":
        prepare(folder)
    elif what == "torch":
        import torch.multiprocessing as mp

        store = os.path.join(folder, f"store-{sys.argv[3]}")
        if os.path.exists(store):  # a FileStore is for one job only
            os.remove(store)
        mp.spawn(worker, args=(folder, sys.argv[3]), nprocs=WORLD)
    else:
        sys.exit(compare(folder, sys.argv[3]))
