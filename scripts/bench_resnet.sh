#!/usr/bin/env bash
# The ResNet of configs/fashion-resnet.yaml (ResNet-10, width 16, 64 images
# of 28x28 per rank, SGD with Nesterov momentum) in lockstep beside the same
# ResNet under PyTorch's own DDP (scripts/bench_resnet_torch.py), each with
# synchronised batch normalisation and with plain BatchNorm2d, 2 ranks, one
# thread each, run in alternation ROUNDS times. Prints the median images/s
# of each contender, lockstep's ratio to PyTorch's, and what synchronising
# costs each. lockstep trains on Fashion-MNIST (dataset-fashion-mnist),
# PyTorch on random images of the same shape (the speed is the same).
#   scripts/bench_resnet.sh      (env: ROUNDS=3 STEPS=40 WARMUP=10 NPROC=2 PYTHON BUILD)
set -euo pipefail
source "$(dirname "$0")/lib/bench.sh"
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-40}
WARMUP=${WARMUP:-10}
NPROC=${NPROC:-2}
PYTHON=${PYTHON:-/usr/bin/python3}
BUILD=${BUILD:-build}
[ -x "$BUILD/lockstep" ] || scripts/setup.sh
export OMP_NUM_THREADS=1 USE_LIBUV=0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
raw="$work/raw.jsonl"
lockstep() {  # lockstep NAME LABEL ARGS...: images/s over the intervals after the warm-up
  local name=$1 label=$2
  shift 2
  "$BUILD/lockstep-run" --nproc-per-node "$NPROC" --master-port 0 "$BUILD/lockstep" train \
    --config configs/fashion-resnet.yaml --set run.dir="$work/runs" --set run.name="$name" \
    --set run.overwrite=true --set train.max_steps=$((WARMUP + STEPS)) --set log.every="$WARMUP" \
    --set checkpoint.every=0 --set check.every=0 --set train.eval_every=0 "$@" >"$work/out" 2>&1 ||
    bench_fail "$work/out"
  "$PYTHON" - "$work/runs/$name/metrics.jsonl" "$label" "$WARMUP" >>"$raw" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"samples_per_s"' in l]
timed = [r for r in rows if r["step"] > int(sys.argv[3])]
print(json.dumps({"impl": sys.argv[2], "images_per_s": sum(r["samples_per_s"] for r in timed) / len(timed)}))
PY
}
torch_run() {  # torch_run SYNC
  "$BUILD/lockstep-run" --nproc-per-node "$NPROC" --master-port 0 "$PYTHON" scripts/bench_resnet_torch.py \
    --sync "$1" --steps "$STEPS" --warmup "$WARMUP" 2>"$work/torch.err" | sed -n 's/^\[rank0\]: //p' >"$work/torch.jsonl" || true
  grep -q '"impl": "pytorch' "$work/torch.jsonl" || bench_fail "$work/torch.err"
  cat "$work/torch.jsonl" >>"$raw"
}
for round in $(seq "$ROUNDS"); do
  echo "round $round/$ROUNDS" >&2
  lockstep sync "lockstep (shm, SyncBatchNorm)"
  torch_run 1
  lockstep plain "lockstep (shm, BatchNorm2d)" --set model.sync_batchnorm=false
  torch_run 0
done
"$PYTHON" - "$raw" "$ROUNDS" "$(bench_cpu)" <<'PY'
import json, sys
from bench_stats import median, ratio
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
names = list(dict.fromkeys(r["impl"] for r in rows))
med = {n: median(r["images_per_s"] for r in rows if r["impl"] == n) for n in names}
print(f"ResNet-10 width 16, 64 images of 28x28 per rank (configs/fashion-resnet.yaml), {sys.argv[3]}, "
      f"median of {sys.argv[2]} alternating rounds, images/s in all")
for n in names:
    peer = med["pytorch (gloo, SyncBatchNorm)" if "Sync" in n else "pytorch (gloo, BatchNorm2d)"]
    print(f"{n:36} {med[n]:8.0f}   x{ratio(med[n], peer):.3f} of PyTorch's")
for who in ("lockstep (shm, ", "pytorch (gloo, "):
    s, b = med[who + "SyncBatchNorm)"], med[who + "BatchNorm2d)"]
    print(f"{who.split()[0]}: synchronising costs {100 * (1 - s / b):.1f}% of the images/s")
PY
