"""PyTorch's side of scripts/bench_resnet.sh: the ResNet of docs/models.md
(its Python block, as tests/python/rebuild.py reads it) under PyTorch's own
DistributedDataParallel, with nn.SyncBatchNorm.convert_sync_batchnorm
(--sync 1) or plain BatchNorm2d, SGD with Nesterov momentum, on images of
Fashion-MNIST's shape. Run under lockstep-run or torchrun. Prints one JSON
line on rank 0: images/s over the timed steps (the slowest rank's time).

PyTorch's SyncBatchNorm runs on GPUs only (its forward refuses CPU tensors,
its five kernels are CUDA's): on the CPU this runs PyTorch's own
SyncBatchNorm autograd function with the CPU kernels of
tests/python/sync_batchnorm_peer.py, called as nn.SyncBatchNorm.forward
calls it in training; DDP, which also refuses SyncBatchNorm layers on the
CPU, sees those layers under another class name."""
import argparse
import json
import os
import re
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.modules import _functions

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(root, "tests", "python"))
import sync_batchnorm_peer  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--backend", default="gloo")
p.add_argument("--steps", type=int, default=40)
p.add_argument("--warmup", type=int, default=10)
p.add_argument("--batch_size", type=int, default=64)
p.add_argument("--depth", type=int, default=10)
p.add_argument("--width", type=int, default=16)
p.add_argument("--sync", type=int, default=1)
a = p.parse_args()
dist.init_process_group(a.backend)
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
ns = {}
exec("\n".join(re.findall(r"```python\n(.*?)```", open(os.path.join(root, "docs", "models.md")).read(),
                          re.S)), ns)
model = ns["ResNet"]([1, 28, 28], 10, depth=a.depth, width=a.width)


class CpuSyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    """nn.SyncBatchNorm.forward in training with world_size > 1, without its device check
    (and not an nn.SyncBatchNorm to DDP, which refuses those on the CPU too)."""

    def forward(self, x):
        self.num_batches_tracked.add_(1)
        return _functions.SyncBatchNorm.apply(x, self.weight, self.bias, self.running_mean,
                                              self.running_var, self.eps, self.momentum,
                                              dist.group.WORLD, world)


if a.sync:
    lib = sync_batchnorm_peer.register_cpu_kernels()
    torch.cuda.is_current_stream_capturing = lambda: False
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    for m in model.modules():
        if isinstance(m, nn.SyncBatchNorm):
            m.__class__ = CpuSyncBatchNorm
model = nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)
images = torch.rand(4096, 1, 28, 28)
labels = torch.randint(0, 10, (4096,))
generator = torch.Generator().manual_seed(rank)
for step in range(a.warmup + a.steps):
    if step == a.warmup:
        dist.barrier()
        start = time.perf_counter()
    rows = torch.randint(0, images.shape[0], (a.batch_size,), generator=generator)
    loss = nn.functional.cross_entropy(model(images[rows]), labels[rows])
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
if rank == 0:
    print(json.dumps({"impl": "pytorch (gloo, " + ("SyncBatchNorm" if a.sync else "BatchNorm2d") + ")",
                      "images_per_s": a.steps * a.batch_size * world / elapsed.item()}), flush=True)
dist.destroy_process_group()
