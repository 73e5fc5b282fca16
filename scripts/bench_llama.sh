#!/usr/bin/env bash
# A small Llama (model.name: llama; 4 layers, 128 wide, 4 query heads
# sharing 2 key/value heads, MLP 384, untied head, the bytes of the King
# James text, 128-byte windows, 16 per rank) in lockstep beside
# transformers' LlamaForCausalLM of the same shape under PyTorch's own DDP
# (scripts/bench_llama_torch.py): same batches, AdamW and clipping, 2 ranks,
# one thread each, alternated ROUNDS times. Prints the median tokens/s and
# the ratio. PYTHON must have transformers (the pip platform's).
#   scripts/bench_llama.sh      (env: ROUNDS=3 STEPS=40 WARMUP=10 NPROC=2 PYTHON BUILD)
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
[ -f data/kjv.txt ] || scripts/make_text.sh
"$PYTHON" -c 'import transformers' 2>/dev/null ||
  { echo "bench_llama: $PYTHON has no transformers (scripts/test_pip.sh makes one that has)" >&2; exit 2; }
export OMP_NUM_THREADS=1 USE_LIBUV=0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
raw="$work/raw.jsonl"
for round in $(seq "$ROUNDS"); do
  echo "round $round/$ROUNDS" >&2
  "$BUILD/lockstep-run" --nproc-per-node "$NPROC" --master-port 0 "$BUILD/lockstep" train \
    --config configs/gpt-text.yaml --set model.name=llama --set model.n_kv_head=2 \
    --set model.intermediate_size=384 --set run.dir="$work/runs" --set run.name=llama \
    --set run.overwrite=true --set train.max_steps=$((WARMUP + STEPS)) --set log.every="$WARMUP" \
    --set checkpoint.every=0 --set check.every=0 --set data.validation_fraction=0.001 \
    >"$work/out" 2>&1 || bench_fail "$work/out"
  "$PYTHON" - "$work/runs/llama/metrics.jsonl" "$WARMUP" >>"$raw" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"tokens_per_s"' in l]
timed = [r for r in rows if r["step"] > int(sys.argv[2])]
print(json.dumps({"impl": "lockstep (shm)", "tokens_per_s": sum(r["tokens_per_s"] for r in timed) / len(timed)}))
PY
  "$BUILD/lockstep-run" --nproc-per-node "$NPROC" --master-port 0 "$PYTHON" scripts/bench_llama_torch.py \
    --text data/kjv.txt --steps "$STEPS" --warmup "$WARMUP" 2>"$work/torch.err" |
    sed -n 's/^\[rank0\]: //p' >"$work/torch.jsonl" || true
  grep -q '"impl": "pytorch' "$work/torch.jsonl" || bench_fail "$work/torch.err"
  cat "$work/torch.jsonl" >>"$raw"
done
"$PYTHON" - "$raw" "$ROUNDS" "$(bench_cpu)" <<'PY'
import json, sys
from bench_stats import median, ratio
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
names = list(dict.fromkeys(r["impl"] for r in rows))
med = {n: median(r["tokens_per_s"] for r in rows if r["impl"] == n) for n in names}
torch = next(v for n, v in med.items() if n.startswith("pytorch"))
print(f"Llama (4 layers, 128 wide, 4 heads / 2 key-value heads, MLP 384, bytes, block 128, 16 per rank), "
      f"{sys.argv[3]}, median of {sys.argv[2]} alternating rounds, tokens/s in all")
for n in names:
    print(f"{n:36} {med[n]:10.0f}   x{ratio(med[n], torch):.3f} of PyTorch's")
PY
