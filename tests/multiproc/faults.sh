#!/usr/bin/env bash
# Fault injection (LOCKSTEP_FAULT, src/check/fault.h) on real processes:
# a dead rank and a hung rank are named by the survivors within the bound
# (timeout + roll call + margin), and leave no process behind; an elastic
# restart resumes from the last checkpoint and ends bit-identical to an
# uninterrupted run.
source "$(dirname "$0")/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
runs="$WORK/runs"

# Ranks started by hand (as on separate nodes, where no launcher stops the
# survivors): each rank's stderr in $WORK/rank<r>.err.
start_ranks() {  # start_ranks N FAULT ARGS...
  local n=$1 fault=$2 p
  shift 2
  p=$(free_port)
  pids=()
  for r in $(seq 0 $((n - 1))); do
    RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$p \
      OMP_NUM_THREADS=1 LOCKSTEP_FAULT=$fault "$LOCKSTEP" train --config "$root/configs/digits.yaml" \
      --set run.dir="$runs" "$@" >"$WORK/rank$r.out" 2>"$WORK/rank$r.err" &
    pids+=($!)
  done
}

# 1. A dead rank (SIGKILL after step 10): the survivors stop and name it.
start_ranks 3 crash:rank=1:step=10 --set run.name=dead --set dist.timeout_s=10
# The bound counts from the fault, not from start-up (seconds under load).
wait_for 120 "rank 1's fault" grep -q "LOCKSTEP_FAULT: injecting" "$WORK/rank1.err"
start=$(now)
for r in 0 2; do wait "${pids[$r]}"; codes[$r]=$?; done
took=$(elapsed "$start")
wait "${pids[1]}" 2>/dev/null
expect_lt "$took" 20 "survivors of a dead rank exit within timeout + 10 s of the fault"
for r in 0 2; do
  expect_eq "${codes[$r]}" 3 "rank $r exits 3 (communication failed)"
  # within the grace, or, should rank 0 (the store's host) leave first
  # after its linger, until then
  expect_grep "$WORK/rank$r.err" "rank\(s\) 1 did not answer the roll call (within 5.00 s|in [0-9.]+ s, until the store stopped answering)" "rank $r names dead rank 1"
done

# 2. A hung rank (SIGSTOP after step 10): the others fail after the
#    collective timeout, naming the collective and the silent rank.
start_ranks 3 hang:rank=1:step=10 --set run.name=hung --set dist.timeout_s=3
wait_for 120 "rank 1's fault" grep -q "LOCKSTEP_FAULT: injecting" "$WORK/rank1.err"
start=$(now)
for r in 0 2; do wait "${pids[$r]}"; codes[$r]=$?; done
took=$(elapsed "$start")
kill -9 "${pids[1]}" 2>/dev/null
wait "${pids[1]}" 2>/dev/null
expect_lt "$took" 18 "survivors of a hung rank exit within timeout + roll call + linger + margin of the fault"
for r in 0 2; do
  expect_eq "${codes[$r]}" 3 "rank $r exits 3 after the hang"
  expect_grep "$WORK/rank$r.err" "rank $r: (gradient bucket|allreduce|fingerprint all-gather).* failed: .*rank\(s\) 1 did not answer the roll call" "rank $r names the collective and hung rank 1"
done
sleep 0.5
expect_eq "$(pgrep -f "run.name=(dead|hung)" || true)" "" "no process left after the dead and hung runs"

# 3. Under lockstep-run the dead rank is the root cause.
LOCKSTEP_FAULT=crash:rank=1:step=5 "$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 "$LOCKSTEP" train \
  --config "$root/configs/digits.yaml" --set run.dir="$runs" --set run.name=root >"$WORK/out" 2>&1
expect_eq "$?" 137 "lockstep-run exits 128+9"
expect_grep "$WORK/out" "root cause: rank 1 .* was killed by signal 9 \(SIGKILL\)" "the summary names rank 1 and SIGKILL"

# 4. Elastic restart: killed after step 25 in the first attempt, restarted by
#    lockstep-run, resumed from the step-25 checkpoint: same weights as a run
#    never interrupted.
common=(--config "$root/configs/digits.yaml" --set run.dir="$runs" --set train.max_steps=50
  --set checkpoint.every=5 --set checkpoint.resume=auto --set model.dropout=0.1)
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 "$LOCKSTEP" train "${common[@]}" \
  --set run.name=steady >"$WORK/steady.out" 2>&1
LOCKSTEP_FAULT=crash:rank=1:step=25:attempt=0 "$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 \
  --max-restarts 1 "$LOCKSTEP" train "${common[@]}" --set run.name=elastic >"$WORK/elastic.out" 2>&1
expect_eq "$?" 0 "the restarted group finishes"
expect_grep "$WORK/elastic.out" "restarting the worker group \(restart 1 of 1\)" "lockstep-run restarted it"
expect_grep "$WORK/elastic.out" "resumed from .*step_00000025 at step 25" "from the step-25 checkpoint"
w1=$(sed -n 's/.*trained .* weights \([0-9a-f]*\);.*/\1/p' "$WORK/steady.out")
w2=$(sed -n 's/.*trained .* weights \([0-9a-f]*\);.*/\1/p' "$WORK/elastic.out")
[ -n "$w1" ] && expect_eq "$w2" "$w1" "restart-and-resume ends bit-identical to the uninterrupted run"

# 5. SIGTERM with checkpoint.on_signal: every rank stops at the same step
#    after a final checkpoint; resume continues from it.
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 "$LOCKSTEP" train --config "$root/configs/digits.yaml" \
  --set run.dir="$runs" --set run.name=signal --set checkpoint.on_signal=true --set train.epochs=1000 \
  >"$WORK/signal.out" 2>&1 &
launcher=$!
wait_for 120 "step 20 before the signal" grep -q "step 20/" "$WORK/signal.out"
kill -TERM "$launcher"
wait "$launcher"
expect_eq "$?" 143 "SIGTERM with on_signal ends the launcher with 143"
expect_grep "$WORK/signal.out" "\[rank0\]: .*received signal 15: saving a checkpoint at step [0-9]+ and stopping" "rank 0 saves on the signal"
newest=$(ls -d "$runs/signal"/checkpoints/step_* 2>/dev/null | tail -1)
if [ -n "$newest" ] && (cd "$newest" && sha256sum -c --quiet MANIFEST); then
  pass "the signal checkpoint verifies"
else
  fail "no verifying checkpoint after SIGTERM"
fi
step=$((10#${newest##*step_}))
expect_grep "$WORK/signal.out" "\[rank0\]: .*stopped by signal 15 after step $step; checkpoint /[^ ]+/step_0*$step\$" "rank 0 stops at step $step, naming the checkpoint's path"
expect_grep "$WORK/signal.out" "\[rank1\]: .*stopped by signal 15 after step $step; rank 0 saved the checkpoint\$" "rank 1 stops at the same step, pointing to rank 0's (no empty path)"
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 "$LOCKSTEP" train --config "$root/configs/digits.yaml" \
  --set run.dir="$runs" --set run.name=signal --set train.epochs=1000 --set checkpoint.resume=auto \
  --set train.max_steps=$((step + 2)) >"$WORK/out" 2>&1
expect_grep "$WORK/out" "resumed from .*at step $step " "resume continues from the signal checkpoint"
sleep 0.3
expect_eq "$(pgrep -f "run.name=signal" || true)" "" "no process left after the signal"

# 6. A malformed LOCKSTEP_FAULT is bad input.
LOCKSTEP_FAULT=crash:step=x "$LOCKSTEP" train --config "$root/configs/digits.yaml" --set run.dir="$runs" \
  >"$WORK/out" 2>&1
expect_eq "$?" 2 "a malformed LOCKSTEP_FAULT exits 2"
expect_grep "$WORK/out" "LOCKSTEP_FAULT='crash:step=x': 'step=x' is not key=number" "and names it"
LOCKSTEP_FAULT=crash:rank=2:step=3 "$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 "$LOCKSTEP" train \
  --config "$root/configs/digits.yaml" --set run.dir="$runs" --set run.name=outside >"$WORK/out" 2>&1
expect_eq "$?" 2 "a LOCKSTEP_FAULT for a rank outside the job exits 2 (it would never fire)"
expect_grep "$WORK/out" "rank=2 is outside this job's 2 rank\(s\)" "naming the rank and the world"

finish
