#!/usr/bin/env bash
# lockstep's DDP beside PyTorch's own DDP (Debian's python3-torch, the same
# LibTorch and Gloo: 1.13 on Debian 12, 2.6 on Debian 13, where
# `scripts/debian13.sh scripts/bench_ddp.sh` runs it), same models, same launcher, same ranks, run in
# alternation ROUNDS times; prints the median ms/step of each row and the
# ratio lockstep/PyTorch. Absolute figures depend on the machine; the ratio
# is the point.
#
#   scripts/bench_ddp.sh      (env: NPROC=2 ROUNDS=5 STEPS=30 WARMUP=10 MODELS=small,large (xl: 24.9M)
#                              MODES=local,ddp,ddp-fp16,ddp-bf16 (2.x),ddp-bucket{1,5,25,100},ddp-accum4,
#                                    ddp-powersgd{1,2,4} (PyTorch's powerSGD_hook beside lockstep's),
#                                    exchange-bucketed,exchange-flat)
# exchange-* rows time the gradient exchange alone (no compute): DDP's
# buckets vs one flat all-reduce of all gradients; they have no PyTorch peer.
#   JSON=out.jsonl scripts/bench_ddp.sh   # also keep every raw row
#   BACKEND=gloo scripts/bench_ddp.sh     # lockstep's backend (default auto: shm on one host;
#                                         # PyTorch's DDP runs on TORCH_BACKEND, default gloo)
#   DEVICE=cuda BACKEND=nccl TORCH_BACKEND=nccl NPROC=1 scripts/bench_ddp.sh   # on a GPU
#   BUILD=build-gpu PYTHON=python3 ...    # another build folder, another Python (a GPU machine)
#   ERRLOG=FILE scripts/bench_ddp.sh      # keep the contenders' stderr (default: dropped)
#   ERRLOG=FILE                           # keep the contenders' stderr (default: dropped)
set -euo pipefail
source "$(dirname "$0")/lib/bench.sh"
cd "$(dirname "$0")/.."
NPROC=${NPROC:-2}
ROUNDS=${ROUNDS:-5}
STEPS=${STEPS:-30}
WARMUP=${WARMUP:-10}
# Gloo all-reduces bfloat16 from PyTorch 2.0 on: the bf16 hook's row only there.
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-/usr/bin/python3}
DEVICE=${DEVICE:-cpu}
bf16=$("$PYTHON" -c 'import torch; print(",ddp-bf16" if int(torch.__version__.split(".")[0]) >= 2 else "")')
MODES=${MODES:-local,ddp,ddp-fp16$bf16,ddp-bucket1,ddp-bucket5,ddp-bucket25,ddp-bucket100,ddp-accum4,exchange-bucketed,exchange-flat}
MODELS=${MODELS:-small,large}
[ -x "$BUILD/lockstep" ] || scripts/setup.sh
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export USE_LIBUV=0  # PyTorch 2.6 from Debian has no libuv TCPStore (tests/multiproc/lib.sh)
for round in $(seq "$ROUNDS"); do
  echo "round $round/$ROUNDS" >&2
  "$BUILD/lockstep-run" --nproc-per-node "$NPROC" --master-port 0 \
    "$BUILD/lockstep" bench ddp --backend "${BACKEND:-auto}" --device "$DEVICE" --models "$MODELS" --modes "$MODES" --steps "$STEPS" --warmup "$WARMUP" 2>>"${ERRLOG:-/dev/null}" |
    sed -n 's/^\[rank0\]: //p' >>"$raw"
  "$BUILD/lockstep-run" --nproc-per-node "$NPROC" --master-port 0 \
    "$PYTHON" scripts/bench_ddp_torch.py --backend "${TORCH_BACKEND:-gloo}" --device "$DEVICE" --models "$MODELS" --modes "$MODES" --steps "$STEPS" --warmup "$WARMUP" 2>>"${ERRLOG:-/dev/null}" |
    sed -n 's/^\[rank0\]: //p' >>"$raw"
done
[ -n "${JSON:-}" ] && cp "$raw" "$JSON"
"$PYTHON" - "$raw" "$ROUNDS" <<'PY'
import json, sys
from bench_stats import median, ratio
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
keys = []
for r in rows:
    k = (r["model"], r["mode"], r["world"], r["batch"])
    if k not in keys:
        keys.append(k)
print(f"DDP step time, median of {sys.argv[2]} alternating rounds (ms/step, slowest rank)")
print(f"{'model':8} {'mode':17} {'ranks':>5} {'batch':>5} {'lockstep':>9} {'pytorch':>9} {'ratio':>6}")
for k in keys:
    med = {}
    for impl in ("lockstep", "pytorch"):
        v = [r["ms_per_step"] for r in rows if r["impl"] == impl and (r["model"], r["mode"], r["world"], r["batch"]) == k]
        med[impl] = median(v)
    quotient = ratio(med['lockstep'], med['pytorch'])
    print(f"{k[0]:8} {k[1]:17} {k[2]:>5} {k[3]:>5} {med['lockstep']:9.3f} {med['pytorch']:9.3f} {quotient:6.3f}")
for model in dict.fromkeys(k[0] for k in keys):
    flat = [r["ms_per_step"] for r in rows if r["model"] == model and r["mode"] == "exchange-flat"]
    buck = [r["ms_per_step"] for r in rows if r["model"] == model and r["mode"] == "exchange-bucketed"]
    if flat and buck:
        print(f"{model}: bucketed exchange / one flat all-reduce = {median(buck) / median(flat):.3f}")
PY
