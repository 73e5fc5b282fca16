#!/usr/bin/env bash
# scripts/bench_ddp.sh end to end (tiny: 1 round, 3 steps): lockstep's and
# PyTorch's DDP both run under lockstep-run and the table has a ratio per
# row. This checks the benchmark works; it asserts no speed.
source "$(dirname "$0")/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
# bf16 on Gloo needs LibTorch 2.x (both peers are the same release here).
bf16=$($PY -c 'import torch; print("ddp-bf16" if int(torch.__version__.split(".")[0]) >= 2 else "")')
modes="local ddp ddp-fp16 $bf16 ddp-bucket1 ddp-accum4 ddp-powersgd1"
# The platform's own build and Python peer (build/ and Debian's python3 by default).
ROUNDS=1 STEPS=3 WARMUP=1 MODELS=small MODES="$(echo $modes | tr ' ' ,),exchange-bucketed,exchange-flat" \
  BUILD="$(dirname "$LOCKSTEP")" PYTHON="$PY" "$root/scripts/bench_ddp.sh" >"$WORK/out" 2>"$WORK/err"
expect_eq "$?" 0 "bench_ddp.sh exits 0"
for mode in $modes; do
  expect_grep "$WORK/out" "^small +$mode +2 +32 +[0-9.]+ +[0-9.]+ +[0-9.]+\$" "row with both figures and a ratio: small $mode"
done
expect_grep "$WORK/out" "^small: bucketed exchange / one flat all-reduce = [0-9.]+\$" "the exchange comparison"
# local+barrier (lockstep's own: the model alone and a barrier per step).
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 "$LOCKSTEP" bench ddp --models small \
  --modes local,local+barrier --steps 3 --warmup 1 >"$WORK/out" 2>"$WORK/err"
expect_eq "$?" 0 "bench ddp local+barrier exits 0"
expect_grep "$WORK/out" '^\[rank0\]: \{"bench": "ddp", .*"mode": "local\+barrier", "world": 2, .*"comm_bytes_per_step": 0, "interleave": 0\}$' "a local+barrier row, nothing exchanged"
# --interleave: every mode built at once and timed in turn, a row per mode
# (the gradient bytes show that the ddp row is DDP's and the local one not).
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 "$LOCKSTEP" bench ddp --models small \
  --modes local,local+barrier,ddp,ddp+check --steps 7 --warmup 1 --interleave 3 --log-level debug \
  >"$WORK/out" 2>"$WORK/err"
expect_eq "$?" 0 "bench ddp --interleave exits 0"
# 7 steps in blocks of 3: 3, 3, 1, the order reversed in the second round.
order=$(sed -n 's/^\[rank1\]: .*bench: round \([0-9]\), \([0-9]\) steps of \(.*\)$/\1:\2:\3/p' "$WORK/out" "$WORK/err" | tr '\n' ' ')
expect_eq "$order" "0:3:local 0:3:local+barrier 0:3:ddp 0:3:ddp+check 1:3:ddp+check 1:3:ddp 1:3:local+barrier 1:3:local 2:1:local 2:1:local+barrier 2:1:ddp 2:1:ddp+check " "the blocks' order and sizes"
ran=$(sed -n 's/^\[rank1\]: .*bench: \(.*\) ran \([0-9]*\) timed steps$/\1:\2/p' "$WORK/out" "$WORK/err" | tr '\n' ' ')
expect_eq "$ran" "local:7 local+barrier:7 ddp:7 ddp+check:7 " "each mode ran --steps timed steps"
expect_eq "$(grep -c '"bench": "ddp"' "$WORK/out")" 4 "one row per mode"
expect_grep "$WORK/out" '"mode": "local", .*"ms_per_step": [0-9.]+, .*"comm_bytes_per_step": 0, "interleave": 3\}$' "the local row"
expect_grep "$WORK/out" '"mode": "ddp", .*"comm_bytes_per_step": 473128, "interleave": 3\}$' "the ddp row: the small rung's 118,282 gradients exchanged"
expect_grep "$WORK/out" '"mode": "ddp\+check", .*"check_ms": ([1-9][0-9]*\.[0-9]+|0\.[0-9]*[1-9][0-9]*), .*"interleave": 3\}$' "the check mode's check was timed"
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 "$LOCKSTEP" bench ddp --models small \
  --modes local,exchange-flat --steps 2 --interleave 2 >"$WORK/out" 2>"$WORK/err"
expect_eq "$?" 2 "--interleave with a communication-only mode: bad input"
expect_grep "$WORK/err" "interleave: mode 'exchange-flat' times communication alone" "says which mode"
"$LOCKSTEP" bench ddp --models small --modes local --steps 2 --interleave -1 >"$WORK/out" 2>"$WORK/err"
expect_eq "$?" 2 "--interleave -1: bad input"
expect_grep "$WORK/err" "interleave must be 0 or a number of steps" "says what --interleave takes"
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 "$LOCKSTEP" bench allreduce --max-bytes 4096 --iters 2 \
  >"$WORK/out" 2>"$WORK/err"
expect_eq "$?" 0 "bench allreduce exits 0"
expect_grep "$WORK/out" "^\[rank0\]: +bytes +elements \| +gloo us +busbw \| +shm us +busbw \| +shm-bkt us +busbw \| +ring us +busbw \| check\$" "gloo, shm (private and bucket memory) and the ring side by side"
expect_grep "$WORK/out" "^\[rank0\]: +4096 +1024( \| +[0-9.]+ +[0-9.]+){4} \| ok\$" "a checked row for 4096 bytes"
expect_grep "$WORK/out" "memory copy bandwidth of this machine \(one 1048576-byte tensor copy\): [0-9]+\.[0-9]+ GB/s" "the memory-copy reference"
if [ "$(uname -m)" = x86_64 ]; then  # SSE2's streaming stores: every x86-64
  expect_grep "$WORK/out" "streaming copy bandwidth of this machine \(the same copy, streaming stores\): [0-9]+\.[0-9]+ GB/s" "the streaming-copy reference beside it"
fi
# --shm-chunk-mb: 64 KiB chunks, so a 256 KiB message crosses the segment in
# four, each row checked against the closed-form sum; the flag reaches the
# segment (ranks given different chunks cannot share it: exit 2, saying so);
# out of range: exit 2.
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 "$LOCKSTEP" bench allreduce --backends shm \
  --shm-chunk-mb 0.0625 --min-bytes 262144 --max-bytes 262144 --iters 2 >"$WORK/out" 2>"$WORK/err"
expect_eq "$?" 0 "bench allreduce --shm-chunk-mb 0.0625 exits 0"
expect_grep "$WORK/out" "^\[rank0\]: +262144 +65536( \| +[0-9.]+ +[0-9.]+){2} \| ok\$" "a 256 KiB message through 64 KiB chunks, checked"
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 sh -c \
  "exec \"$LOCKSTEP\" bench allreduce --backends shm --max-bytes 4096 --iters 2 --shm-chunk-mb \$((RANK + 1))" \
  >"$WORK/out" 2>&1
expect_eq "$?" 2 "ranks given different --shm-chunk-mb: exit 2"
expect_grep "$WORK/out" "the ranks were given different dist.shm_chunk_mb" "saying why"
"$LOCKSTEP" bench allreduce --shm-chunk-mb 0.01 >"$WORK/out" 2>"$WORK/err"
expect_eq "$?" 2 "--shm-chunk-mb 0.01: bad input"
expect_grep "$WORK/err" "shm-chunk-mb must be in \[0.0625, 1024\]" "says the range"
# LOCKSTEP_SHM_STREAMING (Note [Choosing the stores]): a bad value is bad input.
LOCKSTEP_SHM_STREAMING=sometimes "$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 "$LOCKSTEP" \
  bench allreduce --backends shm --max-bytes 4096 --iters 2 >"$WORK/out" 2>&1
expect_eq "$?" 2 "LOCKSTEP_SHM_STREAMING=sometimes: exit 2"
expect_grep "$WORK/out" "LOCKSTEP_SHM_STREAMING='sometimes': expected auto, on \(1\) or off \(0\)" "naming the variable"
# scripts/bench_cross_core.sh: every copy method's rates, both processes
# (an x86-64 program with AVX2 loops).
if command -v gcc >/dev/null && [ "$(uname -m)" = x86_64 ] && grep -qw avx2 /proc/cpuinfo; then
  "$root/scripts/bench_cross_core.sh" 20 >"$WORK/out" 2>"$WORK/err"
  expect_eq "$?" 0 "bench_cross_core.sh exits 0"
  for method in memcpy "avx2 loop" "rep movsb" streaming; do
    expect_eq "$(grep -cE "^$method +process [01]: into its slot [0-9.]+ GB/s, out of the other's slot [0-9.]+ GB/s\$" "$WORK/out")" 2 "$method: both processes' rates"
  done
fi
finish
