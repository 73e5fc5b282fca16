"""PyTorch's own DDP on the models of `lockstep bench ddp`, same JSON lines.

Run under a launcher that sets torchrun's variables (lockstep-run or
torchrun): python3 scripts/bench_ddp_torch.py --models small,large --modes local,ddp
"""
import argparse
import json
import os
import resource
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

MODELS = {
    "small": ([784, 128, 128, 10], 32),
    "large": ([784, 1024, 1024, 10], 64),
    "xl": ([784, 4608, 4608, 10], 32),
}


def make_mlp(dims):
    layers = []
    for i in range(len(dims) - 1):
        layers.append(nn.Linear(dims[i], dims[i + 1]))
        if i + 2 < len(dims):
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(dims, batch, mode, warmup, steps, device):
    torch.manual_seed(0)
    model = make_mlp(dims).to(device)
    sgd = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(batch, dims[0]).to(device)
    y = torch.randint(0, dims[-1], (batch,)).to(device)
    run = model
    # local-amp-bf16, ddp-amp-bf16: forward and loss under bf16 autocast.
    autocast = mode.endswith("-amp-bf16")
    if not mode.startswith("local"):
        kwargs = {}
        if device.type == "cuda":
            kwargs["device_ids"] = [device.index]
        if mode.startswith("ddp-bucket"):
            kwargs["bucket_cap_mb"] = float(mode[len("ddp-bucket"):])
        if mode.startswith("ddp-powersgd"):
            # One bucket: PyTorch's powerSGD_hook chains its all-reduces from
            # completion callbacks, and with several buckets on Gloo the ranks
            # pair mismatched collectives and hang (docs/ddp.md).
            dist._DEFAULT_FIRST_BUCKET_BYTES = 1 << 40
            kwargs["bucket_cap_mb"] = 1e6
        run = DDP(model, **kwargs)
        if mode in ("ddp-fp16", "ddp-bf16"):
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            if mode == "ddp-fp16":
                run.register_comm_hook(None, default_hooks.fp16_compress_hook)
            else:
                # register_comm_hook refuses a hook *named* bf16_compress_hook
                # without CUDA/NCCL, though Gloo 2.x all-reduces bfloat16: the
                # same PyTorch hook, called through a wrapper of another name.
                def bf16_on_gloo(state, bucket):
                    return default_hooks.bf16_compress_hook(state, bucket)

                run.register_comm_hook(None, bf16_on_gloo)
        if mode.startswith("ddp-powersgd"):  # as lockstep's: compressing from the second step
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
            state = powersgd.PowerSGDState(process_group=None,
                                           matrix_approximation_rank=int(mode[len("ddp-powersgd"):]),
                                           start_powerSGD_iter=2)
            run.register_comm_hook(state, powersgd.powerSGD_hook)
    micro = 4 if mode == "ddp-accum4" else 1

    def step():
        sgd.zero_grad()
        for m in range(micro):
            if m < micro - 1:
                with run.no_sync():
                    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                        loss = F.cross_entropy(run(x), y) / micro
                    loss.backward()
            else:
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                    loss = F.cross_entropy(run(x), y) / micro
                loss.backward()
        sgd.step()

    for _ in range(warmup):
        step()
    synchronize(device)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize(device)
    ms = (time.perf_counter() - start) * 1000 / steps
    slowest = torch.tensor([ms], dtype=torch.float64, device=device if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return slowest.item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="small,large")
    parser.add_argument("--modes", default="local,ddp")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--device", default="cpu", help="cpu | cuda (GPU LOCAL_RANK)")
    parser.add_argument("--backend", default="gloo", help="gloo | nccl")
    args = parser.parse_args()
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        torch.cuda.set_device(device)
    for name in args.models.split(","):
        dims, batch = MODELS[name]
        for mode in args.modes.split(","):
            if mode.startswith("exchange-") or mode.startswith("ddp+check"):
                continue  # lockstep-only rows
            ms = time_steps(dims, batch, mode, args.warmup, args.steps, device)
            if rank == 0:
                print(json.dumps({"bench": "ddp", "impl": "pytorch", "model": name, "mode": mode,
                                  "world": world, "device": device.type, "batch": batch,
                                  "ms_per_step": round(ms, 4),
                                  "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}),
                      flush=True)
    if any(m.startswith("ddp-powersgd") for m in args.modes.split(",")):
        # After PyTorch's powerSGD_hook ran, Debian 12's torch 1.13 sometimes
        # aborts in Gloo's teardown ("terminate called without an active
        # exception"), everything printed: leave without it.
        dist.barrier()
        sys.stdout.flush()
        os._exit(0)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
