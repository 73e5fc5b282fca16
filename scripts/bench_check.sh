#!/usr/bin/env bash
# Cost of the every-step consistency check on the DDP benchmark MLPs
# (784-1024-1024-10 at batch 64, 784-128-128-10 at batch 32), 2 ranks:
# the step time with no check, with the XXH3 check hashed on the idle thread
# (as the trainer does), hashed in place, and with the SHA-256 check; the
# time the step spent in the check as a share of the step, and the share of
# the bytes the idle thread hashed; median of ROUNDS runs, each running every
# mode REPEAT times in turn.
#   ROUNDS=5 scripts/bench_check.sh     (env: BACKEND=auto|gloo|shm REPEAT=3)
set -euo pipefail
source "$(dirname "$0")/lib/bench.sh"
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-5}
NPROC=${NPROC:-2}
[ -x build/lockstep ] || scripts/setup.sh
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
for round in $(seq "$ROUNDS"); do
  echo "round $round/$ROUNDS" >&2
  modes=$(for _ in $(seq "${REPEAT:-3}"); do printf 'ddp,ddp+check,ddp+check-inplace,ddp+check-sha256,'; done)
  build/lockstep-run --nproc-per-node "$NPROC" --master-port 0 build/lockstep bench ddp \
    --backend "${BACKEND:-auto}" --models "${MODELS:-large,small}" --modes "${modes%,}" 2>/dev/null |
    sed -n 's/^\[rank0\]: //p' >>"$raw"
done
/usr/bin/python3 - "$raw" "$ROUNDS" <<'PY'
import json, sys
from bench_stats import median
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(f"every-step consistency check, median of {sys.argv[2]} runs (ms/step, slowest rank)")
print(f"{'model':6} {'mode':17} {'step ms':>8} {'check ms':>9} {'share':>7} {'idle':>5}")
for model in dict.fromkeys(r["model"] for r in rows):
    for mode in dict.fromkeys(r["mode"] for r in rows):
        sel = [r for r in rows if r["model"] == model and r["mode"] == mode]
        step = median(r["ms_per_step"] for r in sel)
        check = median(r["check_ms"] for r in sel)
        share = median(r["check_share"] for r in sel)
        idle = median(r.get("check_idle_share", 0) for r in sel)
        print(f"{model:6} {mode:17} {step:8.3f} {check:9.3f} {share*100:6.2f}% {idle:5.2f}")
PY
