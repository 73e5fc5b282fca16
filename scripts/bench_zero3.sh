#!/usr/bin/env bash
# Memory of every ZeRO stage on a GPT, measured (docs/zero.md): a GPT of
# 57M parameters (n_layer 8, n_embd 768, block 256; byte vocabulary) trained
# with AdamW by NPROC ranks, batch 4 per rank, optim.zero 0-3 each with and
# without model.activation_checkpointing. Per run and rank: the weights
# held between steps, the optimizer state, and the peak resident memory
# while training (the trainer's closing "memory:" lines, max over ranks),
# and the median step time after the first (metrics.jsonl). Then the
# capped run: every rank limited to CAP_MIB of address space (prlimit --as),
# zero 0 without checkpointing must fail cleanly (exit 5, out of memory),
# zero 3 with it must train and checkpoint.
#   scripts/bench_zero3.sh [BUILD_DIR]
#   env: NPROC (2), STEPS (4), LAYERS (8), EMBD (768), CAP_MIB (3200; 0 skips the capped
#   run, which trains at batch 8 per rank), TABLE (1; 0 skips the table)
set -euo pipefail
source "$(dirname "$0")/lib/bench.sh"
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
NPROC=${NPROC:-2} STEPS=${STEPS:-4} LAYERS=${LAYERS:-8} EMBD=${EMBD:-768} CAP_MIB=${CAP_MIB:-3200}
TABLE=${TABLE:-1}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
head -c 300000 "$root/data/kjv.txt" >"$work/text.txt"
run() {  # run NAME STAGE CHECKPOINTING BATCH [prlimit args...]
  local name=$1 z=$2 ac=$3 batch=$4
  shift 4
  "$@" "$build/lockstep-run" --nproc-per-node "$NPROC" --master-port 0 "$build/lockstep" train \
    --config "$root/configs/gpt-text.yaml" --set run.dir="$work" --set run.name="$name" \
    --set data.path="$work/text.txt" --set model.n_layer="$LAYERS" --set model.n_head=12 \
    --set model.n_embd="$EMBD" --set model.block_size=256 --set data.batch_size="$batch" \
    --set train.max_steps="$STEPS" --set checkpoint.every=0 --set log.every=1 \
    --set optim.warmup_steps=1 --set log.progress=plain --set optim.zero="$z" \
    --set model.activation_checkpointing="$ac" --set train.eval_batches=1 --set check.every=0 \
    >"$work/$name.out" 2>&1
}
echo "$(lscpu | sed -n 's/^Model name: *//p'), $(nproc --all) cores; $NPROC ranks"
for ac in false true; do
  [ "$TABLE" = 1 ] || break
  for z in 0 1 2 3; do
    run "z$z-$ac" "$z" "$ac" 4 || { echo "optim.zero $z (checkpointing $ac) failed:" >&2; tail -5 "$work/z$z-$ac.out" >&2; exit 1; }
  done
done
[ "$TABLE" = 1 ] && /usr/bin/python3 - "$work" <<'PY'
import json, re, sys
from bench_stats import median
work = sys.argv[1]
held = re.compile(r"\[rank(\d+)\].*memory: weights ([0-9.]+) MiB held")
mem = re.compile(r"\[rank(\d+)\].*memory: optimizer state ([0-9.]+) MiB .*peak resident ([0-9.]+) MiB while training")
params = re.compile(r"model: gpt with (\d+) parameters")
print("| optim.zero | activation checkpointing | weights held MiB/rank | optimizer state MiB/rank | peak resident MiB/rank | vs zero 1 | step s |")
print("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
peak1 = {}
rows = []
for ac in ("false", "true"):
    for z in range(4):
        text = open(f"{work}/z{z}-{ac}.out").read()
        n = int(params.search(text).group(1))
        w = [float(m.group(2)) for m in held.finditer(text)] or [n * 4 / 2**20]
        st = [float(m.group(2)) for m in mem.finditer(text)]
        rss = [float(m.group(3)) for m in mem.finditer(text)]
        steps = [sum(r["ms"][k] for k in ("forward", "backward", "comm_wait", "clip", "optimizer")) / 1000
                 for r in map(json.loads, open(f"{work}/z{z}-{ac}/metrics.jsonl")) if "ms" in r and r.get("step", 0) > 1]
        if z == 1: peak1[ac] = max(rss)
        rows.append((z, ac, max(w), max(st), max(rss), median(steps)))
for z, ac, w, st, rss, s in rows:
    growth = f"{rss / peak1[ac] - 1:+.0%}" if ac in peak1 else ""
    print(f"| {z} | {ac} | {w:.1f} | {st:.1f} | {rss:.1f} | {growth} | {s:.2f} |")
print(f"({n / 1e6:.1f}M parameters, AdamW, batch 4 x 256 tokens per rank)")
PY
if [ "$CAP_MIB" -gt 0 ]; then
  cap=(prlimit --as=$((CAP_MIB * 1024 * 1024)))
  set +e
  run cap0 0 false 8 "${cap[@]}"
  rc0=$?
  run cap3 3 true 8 "${cap[@]}"
  rc3=$?
  set -e
  echo "capped at $CAP_MIB MiB of address space per rank (prlimit --as), batch 8 per rank:"
  echo "  optim.zero 0: exit $rc0: $(grep -o 'out of memory: [^(]*' "$work/cap0.out" | head -1)"
  echo "  optim.zero 3 + activation checkpointing: exit $rc3; $(grep -o 'trained [0-9]* steps' "$work/cap3.out" | head -1), $(grep -o 'checkpoint: .*' "$work/cap3.out" | head -1 | sed "s|$work/||"); $(grep -o 'address space peak [0-9.]* MiB' "$work/cap3.out" | sort -k4 -n | tail -1)"
fi
