#!/usr/bin/env bash
# `lockstep check --comm` as real processes meeting through rank 0's store,
# on 2, 3 and 4 ranks (shm, the default on one host) and 2 (gloo); a corrupted rank fails the check on every rank.
source "$(dirname "$0")/lib.sh"

# The default (auto) is the shm backend on one host; gloo once more by name.
for run in "2 auto shm" "3 auto shm" "4 auto shm" "2 gloo gloo"; do
  read -r n backend kind <<<"$run"
  "$LOCKSTEP_RUN" --nproc-per-node $n --master-port 0 "$LOCKSTEP" check --comm --backend $backend \
    >"$WORK/out" 2>"$WORK/err"
  expect_eq "$?" 0 "comm check on $n ranks ($backend) exits 0"
  expect_grep "$WORK/out" "^\[rank0\]: comm check \($kind, $n ranks\): 55 passed, 0 failed\$" "table summary on $n ranks ($kind)"
  expect_grep "$WORK/out" "^\[rank0\]: allreduce product +int64 +1048576 +[0-9.]+ +ok\$" "several-MB row present on $n ranks"
  passed=$(grep -c "comm check passed: 55 cases on $n ranks" "$WORK/err")
  expect_eq "$passed" "$n" "every one of the $n ranks reports the pass"
done

"$LOCKSTEP_RUN" --nproc-per-node 3 --master-port 0 "$LOCKSTEP" check --comm --sizes 1,7 \
  --corrupt-rank 2 >"$WORK/out" 2>"$WORK/err"
code=$?
expect_eq "$code" 1 "a corrupted rank makes the job fail with code 1"
expect_grep "$WORK/out" "allreduce sum +float32 +1 .* FAIL on rank 0, 1, 2" "every rank sees the corrupted sum"
# Each rank's own verdict, started by hand: under lockstep-run the first
# rank to exit 1 has the others stopped, one maybe before it printed.
by_hand corrupt 3 check --comm --sizes 1,7 --corrupt-rank 2
expect_eq "$(cat "$WORK/corrupt.codes")" "1 1 1" "every rank exits 1"
failed=$(cat "$WORK"/corrupt.[012] | grep -c "comm check FAILED")
expect_eq "$failed" 3 "all three ranks agree that the check failed"

# A single process needs no launcher at all.
env -u RANK -u WORLD_SIZE "$LOCKSTEP" check --comm --sizes 1,3 >"$WORK/out" 2>"$WORK/err"
expect_eq "$?" 0 "world size 1 without a launcher"
expect_grep "$WORK/out" "comm check \(gloo, 1 ranks\): 35 passed, 0 failed" "single-process table"

finish
