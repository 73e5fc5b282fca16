#!/usr/bin/env bash
# scripts/bench_ddp.sh end to end (tiny: 1 round, 3 steps): lockstep's and
# PyTorch's DDP both run under lockstep-run and the table has a ratio per
# row. This checks the benchmark works; it asserts no speed.
source "$(dirname "$0")/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
ROUNDS=1 STEPS=3 MODELS=small MODES=local,ddp,ddp-fp16 "$root/scripts/bench_ddp.sh" >"$WORK/out" 2>"$WORK/err"
expect_eq "$?" 0 "bench_ddp.sh exits 0"
for mode in local ddp ddp-fp16; do
  expect_grep "$WORK/out" "^small +$mode +2 +32 +[0-9.]+ +[0-9.]+ +[0-9.]+\$" "row with both figures and a ratio: small $mode"
done
finish
