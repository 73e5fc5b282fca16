"""PyTorch's own SyncBatchNorm beside lockstep's (tests/multiproc/sync_batchnorm.sh).

  sync_batchnorm_peer.py prepare DIR ROWS      data.pt: 3 steps of a batch [sum(ROWS), 3, 5, 4]
                                               (double), output gradients, weight, bias, and
                                               each rank's rows (ROWS: "5,3" or "4,0,3")
  sync_batchnorm_peer.py torch DIR             len(ROWS) processes (Gloo): PyTorch's
                                               SyncBatchNorm autograd function, as
                                               nn.SyncBatchNorm.forward calls it:
                                               torch_r<rank>.pt
  sync_batchnorm_peer.py compare DIR TOL       against lockstep_r<rank>.pt (written by
                                               lockstep_tests "[.sync_bn_peer]")

Each rank's file: y<s>, gx<s> (its rows' output and input gradient), gw<s>,
gb<s> (its own weight and bias gradients, before DDP averages them),
running_mean, running_var after the 3 steps (momentum 0.1).

PyTorch's SyncBatchNorm runs on GPUs only: nn.SyncBatchNorm.forward refuses
a CPU tensor, and its five ATen kernels (batch_norm_stats,
batch_norm_gather_stats_with_counts, batch_norm_elemt,
batch_norm_backward_reduce, batch_norm_backward_elemt) have CUDA
implementations only. So this peer registers CPU implementations of those
five, written after the CUDA kernels (aten/src/ATen/native/cuda/
Normalization.cuh: gather_stats_with_counts merges the ranks one by one as
batch_norm_reduce_statistics_kernel does), and calls the autograd function
torch.nn.modules._functions.SyncBatchNorm itself: PyTorch's own exchange
(what is all-gathered, the masking of empty ranks, the all-reduce in
backward, which gradients stay local) with kernels of the same arithmetic.
On a CPU-only build torch.cuda.is_current_stream_capturing raises rather
than say no: it is made to say no.
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.modules import _functions

STEPS, SAMPLE, EPS, MOMENTUM = 3, (3, 5, 4), 1e-5, 0.1


def dims(x):
    return [0] + list(range(2, x.dim()))


def per_channel(v, x):
    return v.view([1, -1] + [1] * (x.dim() - 2))


def stats(x, eps):
    mean = x.mean(dims(x))
    var = ((x - per_channel(mean, x)) ** 2).mean(dims(x))
    return mean, 1.0 / torch.sqrt(var + eps)


def gather_stats_with_counts(x, means, invstds, running_mean, running_var, momentum, eps, counts):
    channels = means.shape[1]
    avg = torch.zeros(channels, dtype=means.dtype)
    var_n = torch.zeros(channels, dtype=means.dtype)
    n = 0.0
    for j in range(means.shape[0]):  # batch_norm_reduce_statistics_kernel's order
        count = float(counts[j])
        m = means[j]
        v = 1.0 / invstds[j]
        v = (v * v - eps) * count
        factor = 1.0 / (n + count)
        var_n = var_n + v + (avg - m) * (avg - m) * n * count * factor
        avg = n * factor * avg + count * factor * m
        n += count
    if running_mean is not None:
        running_mean.copy_((1 - momentum) * running_mean + momentum * avg)
    if running_var is not None:
        running_var.copy_((1 - momentum) * running_var + momentum * var_n / (n - 1))
    return avg, 1.0 / torch.sqrt(var_n / n + eps)


def elemt(x, weight, bias, mean, invstd, eps):
    y = (x - per_channel(mean, x)) * per_channel(invstd, x)
    return y * per_channel(weight, x) + per_channel(bias, x) if weight is not None else y


def backward_reduce(dy, x, mean, invstd, weight, input_g, weight_g, bias_g):
    xmu = x - per_channel(mean, x)
    sum_dy = dy.sum(dims(x))
    sum_dy_xmu = (dy * xmu).sum(dims(x))
    return sum_dy, sum_dy_xmu, sum_dy_xmu * invstd, sum_dy


def backward_elemt(dy, x, mean, invstd, weight, sum_dy, sum_dy_xmu, count):
    total = float(count.sum())
    xmu = x - per_channel(mean, x)
    scale = invstd * weight if weight is not None else invstd
    return (dy - per_channel(sum_dy / total, x) -
            xmu * per_channel(invstd * invstd * sum_dy_xmu / total, x)) * per_channel(scale, x)


def register_cpu_kernels():
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("batch_norm_stats", stats, "CPU")
    lib.impl("batch_norm_gather_stats_with_counts", gather_stats_with_counts, "CPU")
    lib.impl("batch_norm_elemt", elemt, "CPU")
    lib.impl("batch_norm_backward_reduce", backward_reduce, "CPU")
    lib.impl("batch_norm_backward_elemt", backward_elemt, "CPU")
    return lib


def prepare(folder, rows):
    torch.manual_seed(11)
    total = sum(rows)
    data = {"rows": torch.tensor(rows, dtype=torch.long),
            "weight": torch.rand(SAMPLE[0], dtype=torch.double) + 0.5,
            "bias": torch.randn(SAMPLE[0], dtype=torch.double)}
    for s in range(STEPS):
        data[f"x{s}"] = torch.randn(total, *SAMPLE, dtype=torch.double) * (1 + s) + 0.5 * s
        data[f"g{s}"] = torch.randn(total, *SAMPLE, dtype=torch.double)
    torch.save(data, os.path.join(folder, "data.pt"))


def rank_main(rank, world, folder):
    dist.init_process_group("gloo", init_method="file://" + os.path.join(folder, "store"),
                            rank=rank, world_size=world)
    lib = register_cpu_kernels()  # noqa: F841 (kept alive)
    # The function asks whether a CUDA graph is being captured; a CPU-only
    # build (Debian's 1.13) raises there instead of answering no.
    torch.cuda.is_current_stream_capturing = lambda: False
    data = torch.load(os.path.join(folder, "data.pt"))
    rows = data["rows"].tolist()
    first, mine = sum(rows[:rank]), rows[rank]
    weight = data["weight"].clone().requires_grad_(True)
    bias = data["bias"].clone().requires_grad_(True)
    running_mean = torch.zeros(SAMPLE[0], dtype=torch.double)
    running_var = torch.ones(SAMPLE[0], dtype=torch.double)
    out = {}
    for s in range(STEPS):
        x = data[f"x{s}"][first:first + mine].clone().requires_grad_(True)
        weight.grad, bias.grad = None, None
        # nn.SyncBatchNorm.forward's call in training with world_size > 1.
        y = _functions.SyncBatchNorm.apply(x, weight, bias, running_mean, running_var, EPS,
                                           MOMENTUM, dist.group.WORLD, world)
        (y * data[f"g{s}"][first:first + mine]).sum().backward()
        out[f"y{s}"], out[f"gx{s}"] = y.detach(), x.grad
        out[f"gw{s}"], out[f"gb{s}"] = weight.grad, bias.grad
    out["running_mean"], out["running_var"] = running_mean, running_var
    torch.save(out, os.path.join(folder, f"torch_r{rank}.pt"))
    dist.destroy_process_group()


def compare(folder, tolerance):
    rows = torch.load(os.path.join(folder, "data.pt"))["rows"].tolist()
    worst, bad = 0.0, []
    for rank in range(len(rows)):
        ours = torch.load(os.path.join(folder, f"lockstep_r{rank}.pt"))
        theirs = torch.load(os.path.join(folder, f"torch_r{rank}.pt"))
        for key, want in theirs.items():
            got = ours.get(key)
            if want is None and got is not None:
                # A rank with an empty batch: PyTorch leaves its weight and
                # bias gradients None, lockstep gives zeros (DDP then
                # averages the same thing).
                want = torch.zeros_like(got)
            if got is None or got.shape != want.shape:
                bad.append(f"rank {rank} {key}: shape {None if got is None else tuple(got.shape)}"
                           f" against {tuple(want.shape)}")
                continue
            if want.numel() == 0:
                continue
            diff = ((got - want).abs() / (want.abs() + 1)).max().item()
            worst = max(worst, diff)
            if diff > tolerance:
                bad.append(f"rank {rank} {key}: differs by {diff:.3g}")
    for line in bad:
        print(line)
    print(f"ranks {len(rows)} (rows {rows}): largest difference {worst:.3g} "
          f"(relative to |PyTorch's| + 1), tolerance {tolerance:g}")
    return 1 if bad else 0


if __name__ == "__main__":
    command, folder = sys.argv[1], sys.argv[2]
    if command == "prepare":
        prepare(folder, [int(r) for r in sys.argv[3].split(",")])
    elif command == "torch":
        world = len(torch.load(os.path.join(folder, "data.pt"))["rows"])
        torch.set_num_threads(1)
        mp.spawn(rank_main, args=(world, folder), nprocs=world)
    else:
        sys.exit(compare(folder, float(sys.argv[3])))
