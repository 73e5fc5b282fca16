#!/usr/bin/env bash
# fp32 against bf16 autocast (train.precision: bf16), lockstep beside
# PyTorch's own DDP on the same LibTorch (Debian's python3-torch: 1.13 here,
# 2.6 with `scripts/debian13.sh scripts/bench_amp.sh`): step time and peak
# resident memory of the benchmark MLPs (`lockstep bench ddp` modes ddp and
# ddp-amp-bf16, scripts/bench_ddp_torch.py) and tokens/s of the GPT demo
# (configs/gpt-text.yaml, scripts/bench_gpt_torch.py), 2 ranks of one
# thread, each contender and precision in its own processes (so the peak
# memory is that run's), in alternation ROUNDS times. Prints medians, each
# contender's bf16 speed-up over its own fp32, and the ratio of the two.
#   scripts/bench_amp.sh     (env: ROUNDS=3 STEPS=30 WARMUP=10 MODELS=small,large GPT=1 NPROC=2)
set -euo pipefail
source "$(dirname "$0")/lib/bench.sh"
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-30}
WARMUP=${WARMUP:-10}
NPROC=${NPROC:-2}
MODELS=${MODELS-small,large}  # MODELS= : the GPT alone
GPT=${GPT:-1}
PYTHON=${PYTHON:-/usr/bin/python3}
[ -x build/lockstep ] || scripts/setup.sh
[ "$GPT" = 0 ] || [ -f data/kjv.txt ] || scripts/make_text.sh
export OMP_NUM_THREADS=1 USE_LIBUV=0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
raw="$work/raw.jsonl"
run() { build/lockstep-run --nproc-per-node "$NPROC" --master-port 0 "$@" 2>>"$work/err" | sed -n 's/^\[rank0\]: //p'; }
gpt_lockstep() {  # gpt_lockstep PRECISION: tokens/s after the warm-up, peak memory of rank 0
  build/lockstep-run --nproc-per-node "$NPROC" --master-port 0 build/lockstep train \
    --config configs/gpt-text.yaml --set run.dir="$work/runs" --set run.name="gpt-$1" --set run.overwrite=true \
    --set train.max_steps=$((WARMUP + STEPS)) --set log.every="$WARMUP" --set checkpoint.every=0 \
    --set check.every=0 --set data.validation_fraction=0.001 --set train.precision="$1" \
    >"$work/out" 2>&1 || { cat "$work/out" >&2; exit 1; }
  "$PYTHON" - "$work/runs/gpt-$1/metrics.jsonl" "$1" "$WARMUP" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"tokens_per_s"' in l]
timed = [r for r in rows if r["step"] > int(sys.argv[3])]
print(json.dumps({"bench": "gpt", "impl": "lockstep", "model": "gpt", "precision": sys.argv[2],
                  "tokens_per_s": sum(r["tokens_per_s"] for r in timed) / len(timed),
                  "peak_rss_mib": rows[-1]["peak_rss_mib"]}))
PY
  rm -rf "$work/runs/gpt-$1"
}
for round in $(seq "$ROUNDS"); do
  echo "round $round/$ROUNDS" >&2
  for model in ${MODELS//,/ }; do
    for mode in ddp ddp-amp-bf16; do
      run build/lockstep bench ddp --models "$model" --modes "$mode" --steps "$STEPS" --warmup "$WARMUP" >>"$raw"
      run "$PYTHON" scripts/bench_ddp_torch.py --models "$model" --modes "$mode" --steps "$STEPS" --warmup "$WARMUP" >>"$raw"
    done
  done
  if [ "$GPT" != 0 ]; then
    for precision in fp32 bf16; do
      gpt_lockstep "$precision" >>"$raw"
      run "$PYTHON" scripts/bench_gpt_torch.py --text data/kjv.txt --steps "$STEPS" --warmup "$WARMUP" \
        --precision "$precision" | sed 's/"impl": "pytorch (gloo)"/"bench": "gpt", "impl": "pytorch", "model": "gpt"/' >>"$raw"
    done
  fi
done
"$PYTHON" - "$raw" "$ROUNDS" <<'PY'
import json, sys
from bench_stats import median
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def precision(r):
    return r.get("precision") or ("bf16" if r.get("mode", "").endswith("-amp-bf16") else "fp32")
def med(model, impl, prec, key):
    vals = [r[key] for r in rows if r["model"] == model and r["impl"] == impl and precision(r) == prec]
    return median(vals)
print(f"fp32 vs bf16 autocast, 2 ranks x 1 thread, median of {sys.argv[2]} alternating rounds")
print("(MLPs: ms per DDP step; gpt: tokens/s of the whole job; peak: resident MiB, rank 0)")
print(f"{'model':6} {'impl':9} {'fp32':>10} {'bf16':>10} {'bf16 speed-up':>14} {'peak fp32':>10} {'peak bf16':>10}")
for model in dict.fromkeys(r["model"] for r in rows):
    gpt = model == "gpt"
    key = "tokens_per_s" if gpt else "ms_per_step"
    speedups = {}
    for impl in ("lockstep", "pytorch"):
        a, b = med(model, impl, "fp32", key), med(model, impl, "bf16", key)
        speedups[impl] = b / a if gpt else a / b
        fmt = (lambda v: f"{v:10.0f}") if gpt else (lambda v: f"{v:10.3f}")
        print(f"{model:6} {impl:9} {fmt(a)} {fmt(b)} {speedups[impl]:13.2f}x "
              f"{med(model, impl, 'fp32', 'peak_rss_mib'):10.0f} {med(model, impl, 'bf16', 'peak_rss_mib'):10.0f}")
    print(f"{model:6} lockstep's bf16 speed-up / PyTorch's: {speedups['lockstep'] / speedups['pytorch']:.2f}")
PY
