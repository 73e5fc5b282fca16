#!/usr/bin/env bash
# The final-weights digests a restructure must leave unchanged: run it
# before and after, and compare the two outputs (they must be equal).
#   digits      configs/digits.yaml on 2 ranks
#   gpt-text    configs/gpt-text.yaml on 2 ranks, 100 steps
#   zero2-bf16  the digits MLP, optim.zero 2, bf16, accumulation 2, clipping
#   zero3-gpt   configs/gpt-text.yaml with optim.zero 3, 30 steps
#   resharded   the digits MLP, sharded checkpoints, 2 ranks to step 20, then
#               resumed on 3 ranks to step 40
#   scripts/behaviour_digests.sh [BUILD_DIR]      (about 4 minutes on 2 cores)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1 USE_LIBUV=0
[ -f "$root/data/kjv.txt" ] || "$root/scripts/make_text.sh"
run() {  # run NAME NPROC CONFIG ARGS...: prints "NAME DIGEST"
  local name=$1 n=$2 config=$3
  shift 3
  "$build/lockstep-run" --nproc-per-node "$n" --master-port 0 "$build/lockstep" train \
    --config "$root/configs/$config.yaml" --set run.dir="$work" --set run.name="$name" \
    --set log.progress=plain --set checkpoint.every=0 "$@" >>"$work/$name.out" 2>&1 || {
    echo "$name failed:" >&2
    tail -n 20 "$work/$name.out" >&2
    exit 1
  }
}
digest() { echo "$1 $(grep -oE "weights [0-9a-f]{16,}" "$work/$1.out" | tail -n 1 | awk '{print $2}')"; }
run digits 2 digits
digest digits
run gpt-text 2 gpt-text --set data.path="$root/data/kjv.txt" --set train.max_steps=100
digest gpt-text
run zero2-bf16 2 digits --set optim.zero=2 --set train.precision=bf16 --set train.accumulation_steps=2 \
  --set train.clip_grad_norm=1.0 --set train.max_steps=40
digest zero2-bf16
run zero3-gpt 2 gpt-text --set data.path="$root/data/kjv.txt" --set optim.zero=3 --set train.max_steps=30
digest zero3-gpt
run resharded 2 digits --set checkpoint.format=sharded --set optim.zero=1 --set train.max_steps=20 \
  --set checkpoint.every=20
run resharded 3 digits --set checkpoint.format=sharded --set optim.zero=1 --set train.max_steps=40 \
  --set checkpoint.resume=auto --set checkpoint.every=20
grep -q "resumed from .*step_00000020" "$work/resharded.out" || { echo "resharded: no resume" >&2; exit 1; }
digest resharded
