#!/usr/bin/env bash
# ZeRO's memory and step time, measured (docs/zero.md, docs/performance.md):
# an MLP of ~54M parameters (784, four hidden layers of 4096, 10) trained
# with Adam on synthetic data by NPROC ranks, optim.zero 0, 1 and 2
# alternated over ROUNDS rounds. Per stage and rank: the optimizer state it
# holds and its peak resident memory while training, before the run's last
# checkpoint (the trainer's closing "memory:" line),
# and the mean step time (metrics.jsonl: forward + backward + comm_wait +
# clip + optimizer) over the steps after the first two.
#   scripts/bench_zero.sh [BUILD_DIR]
#   env: ROUNDS (2), STEPS (10), NPROC (2), HIDDEN (4096), LAYERS (4), BACKEND (auto)
set -euo pipefail
source "$(dirname "$0")/lib/bench.sh"
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
ROUNDS=${ROUNDS:-2} STEPS=${STEPS:-10} NPROC=${NPROC:-2} HIDDEN=${HIDDEN:-4096}
LAYERS=${LAYERS:-4} BACKEND=${BACKEND:-auto}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
run() {  # run STAGE ROUND
  "$build/lockstep-run" --nproc-per-node "$NPROC" --master-port 0 "$build/lockstep" train \
    --config "$root/configs/synthetic.yaml" --set run.dir="$work" --set run.name="z$1-$2" \
    --set model.name=mlp --set model.hidden="$HIDDEN" --set model.layers="$LAYERS" \
    --set data.name=synthetic --set data.synthetic_features=784 --set data.synthetic_size=4096 \
    --set data.batch_size=32 --set optim.name=adam --set optim.lr=0.0001 --set optim.zero="$1" \
    --set train.max_steps="$STEPS" --set train.epochs=100 --set log.every=1 \
    --set log.progress=plain --set check.every=0 --set checkpoint.every=0 \
    --set dist.backend="$BACKEND" >"$work/z$1-$2.out" 2>&1 || {
    echo "optim.zero $1 failed:" >&2
    tail -20 "$work/z$1-$2.out" >&2
    exit 1
  }
}
for round in $(seq 1 "$ROUNDS"); do
  stages="0 1 2"
  [ $((round % 2)) = 0 ] && stages="2 1 0"
  for z in $stages; do run "$z" "$round"; done
done
/usr/bin/python3 - "$work" "$ROUNDS" "$NPROC" <<'PY'
import glob, json, re, sys
from bench_stats import median
work, rounds, nproc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
mem = re.compile(r"\[rank(\d+)\].*memory: optimizer state ([0-9.]+) MiB .*peak resident ([0-9.]+) MiB while training")
params = re.compile(r"model: mlp with (\d+) parameters")
print(f"{'optim.zero':>10} | {'state MiB/rank':>22} | {'peak RSS MiB/rank':>22} | {'step ms':>8} | {'vs zero 0':>9}")
base = None
for z in (0, 1, 2):
    state, rss, steps = {}, {}, []
    for r in range(1, rounds + 1):
        text = open(f"{work}/z{z}-{r}.out").read()
        n = params.search(text)
        for m in mem.finditer(text):
            state.setdefault(int(m.group(1)), []).append(float(m.group(2)))
            rss.setdefault(int(m.group(1)), []).append(float(m.group(3)))
        for line in open(f"{work}/z{z}-{r}/metrics.jsonl"):
            rec = json.loads(line)
            if "ms" in rec and rec.get("step", 0) > 2:
                steps.append(sum(rec["ms"][k] for k in ("forward", "backward", "comm_wait", "clip", "optimizer")))
    ms = median(steps)
    base = base or ms
    fmt = lambda d: " / ".join(f"{max(d[k]):.1f}" for k in sorted(d))
    print(f"{z:>10} | {fmt(state):>22} | {fmt(rss):>22} | {ms:8.1f} | {ms / base:8.2f}x")
print(f"({n.group(1) if n else '?'} parameters, Adam, {nproc} ranks, median step over {rounds} rounds)")
PY
