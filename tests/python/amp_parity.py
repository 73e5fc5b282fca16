"""PyTorch's own torch.amp.GradScaler("cpu") on the scripted fp16 run of
tests/train/test_amp.cpp ("amp trace"): the same layer, data, SGD and
scaler settings; prints the trace in the C++ test's format, to be compared
line for line (scales, skipped steps, the final weights' float32 bits).

    python3 tests/python/amp_parity.py > python.trace
"""
import struct
import sys

import torch


def main():
    if not hasattr(torch.amp, "GradScaler"):
        print(f"unsupported: PyTorch {torch.__version__} has no torch.amp.GradScaler")
        return 77
    torch.set_num_threads(1)
    layer = torch.nn.Linear(6, 4)
    with torch.no_grad():
        for i in range(4):
            for j in range(6):
                layer.weight[i][j] = ((i * 7 + j * 3) % 11 - 5) / 16.0
            layer.bias[i] = (i % 3 - 1) / 8.0
    sgd = torch.optim.SGD(layer.parameters(), lr=0.05, momentum=0.9, foreach=False)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**20, growth_interval=3)
    for k in range(24):
        x = torch.empty(8, 6)
        t = torch.empty(8, 4)
        for r in range(8):
            for c in range(6):
                x[r][c] = ((k * 5 + r * 3 + c * 7) % 13 - 6) / 8.0
            for i in range(4):
                t[r][i] = ((k + r + 2 * i) % 5 - 2) / 4.0
        sgd.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            y = layer(x)
            loss = (y.float() - t).pow(2).mean() * (4096.0 if k == 13 else 1.0)
        scaler.scale(loss).backward()
        scaler.unscale_(sgd)
        # found_inf as GradScaler.step reads it (skipped when non-zero).
        found = scaler._per_optimizer_states[id(sgd)]["found_inf_per_device"].values()
        skipped = sum(v.item() for v in found) > 0
        scaler.step(sgd)
        scaler.update()
        print(f"step {k} scale {scaler.get_scale():.9g} stepped {0 if skipped else 1}")
    for p in layer.parameters():
        bits = struct.unpack(f"<{p.numel()}I", p.detach().contiguous().numpy().tobytes())
        print("param" + "".join(f" {b:08x}" for b in bits))
    return 0


if __name__ == "__main__":
    sys.exit(main())
