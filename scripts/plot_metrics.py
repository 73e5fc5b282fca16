"""Plots a run's metrics.jsonl as PNG files.

    /usr/bin/python3 scripts/plot_metrics.py RUN_DIR [OUT_DIR]

Writes OUT_DIR (default RUN_DIR/plots)/loss.png (training loss per step and
validation accuracy per epoch), step_time.png (per-step milliseconds split
into forward, backward, waiting for communication, optimizer and check,
stacked), comm_share.png (the share of the step spent waiting for
communication, with the 20% line past which lockstep warns) and
training.png (learning rate, gradient norm before clipping, the fp16 loss
scale with its skipped steps, and rank 0's peak resident memory: those the
run recorded). Validation points include the evaluations every
train.eval_every steps.
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PHASES = ["forward", "backward", "comm_wait", "clip", "optimizer", "check"]


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    run = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(run, "plots")
    path = os.path.join(run, "metrics.jsonl")
    try:
        rows = [json.loads(line) for line in open(path) if line.strip()]
    except OSError as e:
        sys.exit(f"plot_metrics: cannot read {path}: {e.strerror}")
    except json.JSONDecodeError as e:
        sys.exit(f"plot_metrics: {path}:{e.lineno}: not JSON: {e.msg}")
    # A run directory reused by a fresh run appends to metrics.jsonl: plot the
    # newest run (a resumed run continues the step count, so it stays whole).
    start = 0
    for i in range(1, len(rows)):
        if rows[i]["step"] < rows[i - 1]["step"]:
            start = i
    rows = rows[start:]
    steps = [r for r in rows if "loss" in r]
    evals = [r for r in rows if "val_accuracy" in r]
    if not steps:
        sys.exit(f"plot_metrics: {path} has no training rows")
    os.makedirs(out, exist_ok=True)
    x = [r["step"] for r in steps]

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(x, [r["loss"] for r in steps], label="training loss (global mean)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    if evals:
        ax2 = ax.twinx()
        ax2.plot([r["step"] for r in evals], [r["val_accuracy"] for r in evals], "o-",
                 color="tab:green", label="validation accuracy")
        ax2.set_ylabel("validation accuracy")
        ax2.set_ylim(0, 1)
    ax.set_title(os.path.basename(os.path.normpath(run)))
    fig.legend(loc="upper center")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "loss.png"), dpi=100)

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.stackplot(x, *[[r["ms"].get(p, 0) for r in steps] for p in PHASES], labels=PHASES)
    ax.set_xlabel("step")
    ax.set_ylabel("ms per step (rank 0)")
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "step_time.png"), dpi=100)

    fig, ax = plt.subplots(figsize=(7, 4))
    share = [100 * r["ms"]["comm_wait"] / max(1e-9, sum(r["ms"].get(p, 0) for p in PHASES)) for r in steps]
    ax.plot(x, share, label="waiting for communication")
    ax.axhline(20, color="tab:red", linestyle="--", label="20%: lockstep warns")
    ax.set_xlabel("step")
    ax.set_ylabel("% of step time")
    ax.set_ylim(0, 100)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "comm_share.png"), dpi=100)
    panels = [("lr", "learning rate"), ("grad_norm", "gradient norm (before clipping)"),
              ("loss_scale", "loss scale (fp16)"), ("peak_rss_mib", "peak resident MiB (rank 0)")]
    panels = [(k, t) for k, t in panels if any(k in r for r in steps)]
    fig, axes = plt.subplots(len(panels), 1, figsize=(7, 2.2 * len(panels)), sharex=True, squeeze=False)
    for ax, (key, title) in zip(axes[:, 0], panels):
        ax.plot([r["step"] for r in steps if key in r], [r[key] for r in steps if key in r])
        ax.set_ylabel(title, fontsize=8)
        if key == "loss_scale":
            ax.set_yscale("log")
            skipped = [r["step"] for r in steps if r.get("skipped_steps", 0) > 0]
            for s in skipped:
                ax.axvline(s, color="tab:red", alpha=0.3)
    axes[-1, 0].set_xlabel("step")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "training.png"), dpi=100)
    print(f"plots in {out}: loss.png step_time.png comm_share.png training.png")


if __name__ == "__main__":
    main()
