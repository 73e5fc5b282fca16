#!/usr/bin/env bash
# Cost of the every-step consistency check on the DDP benchmark MLPs
# (784-1024-1024-10 at batch 64, 784-128-128-10 at batch 32), 2 ranks:
# the step time with no check, with the XXH3 check and with the SHA-256 check,
# and the check's own time as a share of the step, median of ROUNDS runs.
#   ROUNDS=5 scripts/bench_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-5}
NPROC=${NPROC:-2}
[ -x build/lockstep ] || scripts/setup.sh
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
for round in $(seq "$ROUNDS"); do
  echo "round $round/$ROUNDS" >&2
  build/lockstep-run --nproc-per-node "$NPROC" --master-port 0 build/lockstep bench ddp \
    --models "${MODELS:-large,small}" --modes ddp,ddp+check,ddp+check-sha256 2>/dev/null |
    sed -n 's/^\[rank0\]: //p' >>"$raw"
done
/usr/bin/python3 - "$raw" "$ROUNDS" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(f"every-step consistency check, median of {sys.argv[2]} runs (ms/step, slowest rank)")
print(f"{'model':6} {'mode':17} {'step ms':>8} {'check ms':>9} {'share':>7}")
for model in dict.fromkeys(r["model"] for r in rows):
    for mode in dict.fromkeys(r["mode"] for r in rows):
        sel = [r for r in rows if r["model"] == model and r["mode"] == mode]
        step = statistics.median(r["ms_per_step"] for r in sel)
        check = statistics.median(r["check_ms"] for r in sel)
        share = statistics.median(r["check_share"] for r in sel)
        print(f"{model:6} {mode:17} {step:8.3f} {check:9.3f} {share*100:6.2f}%")
PY
