#!/usr/bin/env bash
# One live job per run directory (Note [One live job per run directory]):
# 1. two jobs started together with one run.name: exactly one trains, the
#    other exits 2, and the folder holds one run's records (before: both
#    exited 0 into one folder, each rotating the other's checkpoints away);
# 2. while a 2-rank job is live, a second job into its folder, fresh or
#    resuming, exits 2 naming the holder (its host and rank 0's pid);
# 3. the holder killed with SIGKILL, its own restart resumes at once: the
#    kernel dropped the lock with the process.
source "$(dirname "$0")/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
digits=(--config "$root/configs/digits.yaml" --set run.dir="$WORK/runs" --set log.every=10)

# 1. Two at once, three times (a race won by either).
for round in 1 2 3; do
  name=race$round
  "$LOCKSTEP" train "${digits[@]}" --set run.name=$name --set train.epochs=2 >"$WORK/a.out" 2>&1 &
  a=$!
  "$LOCKSTEP" train "${digits[@]}" --set run.name=$name --set train.epochs=2 >"$WORK/b.out" 2>&1 &
  b=$!
  wait $a; ra=$?
  wait $b; rb=$?
  codes=$(printf '%s\n' "$ra" "$rb" | sort | tr '\n' ' ')
  expect_eq "$codes" "0 2 " "round $round: of two jobs started together into one folder, one trains and one exits 2"
  loser=$([ "$ra" = 2 ] && echo a || echo b)
  expect_grep "$WORK/$loser.out" "is in use by a live job|holds another run's results" "round $round: the refused job says why"
  steps=$(grep -c '^{"step": 10,' "$WORK/runs/$name/metrics.jsonl" 2>/dev/null || true)
  expect_eq "${steps:-0}" 1 "round $round: metrics.jsonl holds one run's record of step 10"
done

# A lock file that is no regular file is refused at once, never followed
# or waited on (a FIFO would block a reader forever).
mkdir -p "$WORK/runs/fifo" "$WORK/runs/link"
mkfifo "$WORK/runs/fifo/.lockstep-lock"
ln -s /etc/hostname "$WORK/runs/link/.lockstep-lock"
timeout 60 "$LOCKSTEP" train "${digits[@]}" --set run.name=fifo --set train.max_steps=2 >"$WORK/fifo.out" 2>&1
expect_eq "$?" 2 "a FIFO as the lock file: exit 2, no hang"
expect_grep "$WORK/fifo.out" "lock file '.*/fifo/.lockstep-lock' is not a regular file" "saying what it is"
timeout 60 "$LOCKSTEP" train "${digits[@]}" --set run.name=link --set train.max_steps=2 >"$WORK/link.out" 2>&1
expect_eq "$?" 2 "a symbolic link as the lock file: exit 2"
expect_grep "$WORK/link.out" "is a symbolic link; lockstep does not follow it" "saying so"

# 2. A live 2-rank job, long enough to be asked about.
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 "$LOCKSTEP" train "${digits[@]}" \
  --set run.name=live --set train.epochs=20000 --set checkpoint.every=50 >"$WORK/live.out" 2>&1 &
live=$!
for _ in $(seq 1 300); do
  [ -s "$WORK/runs/live/.lockstep-lock" ] && ls "$WORK/runs/live/checkpoints" 2>/dev/null | grep -q '^step_' && break
  sleep 0.2
done
holder=$(cat "$WORK/runs/live/.lockstep-lock" 2>/dev/null)
pid=$(sed -n 's/.*pid \([0-9]*\),.*/\1/p' <<<"$holder")
[ -n "$pid" ] && grep -q lockstep "/proc/$pid/cmdline" 2>/dev/null &&
  pass "the lock file names the live rank 0 (pid $pid): $holder" || fail "the lock file says '$holder'"
"$LOCKSTEP" train "${digits[@]}" --set run.name=live --set run.overwrite=true >"$WORK/second.out" 2>&1
expect_eq "$?" 2 "a second job into the live job's folder exits 2, even with run.overwrite"
expect_grep "$WORK/second.out" "run directory '.*/runs/live' is in use by a live job \(host $(hostname), pid $pid, " "naming the holder's host and pid"
"$LOCKSTEP" train "${digits[@]}" --set run.name=live --set checkpoint.resume=auto >"$WORK/resume.out" 2>&1
expect_eq "$?" 2 "a second job resuming the live job's folder exits 2"
[ -d "$WORK/runs/live/checkpoints" ] && [ -z "$(ls "$WORK/runs/live" | grep overwritten-)" ] &&
  pass "the live job's results were not moved aside" || fail "the live job's folder was changed: $(ls "$WORK/runs/live")"

# 3. SIGKILL the holder's whole tree; its restart resumes without waiting.
kill -9 "$pid" 2>/dev/null
wait $live 2>/dev/null
sleep 0.5
newest=$(ls "$WORK/runs/live/checkpoints" | sed -n 's/^step_0*\([0-9][0-9]*\)$/\1/p' | sort -n | tail -1)
"$LOCKSTEP" train "${digits[@]}" --set run.name=live --set checkpoint.resume=auto --set train.epochs=20000 \
  --set train.max_steps=$((newest + 20)) >"$WORK/restart.out" 2>&1
expect_eq "$?" 0 "after the holder was killed, its restart with resume: auto trains"
# A kill between a save's two renames leaves the newest set complete under
# .tmp-step_N-<pid>; the restart restores it (and says so) and resumes there.
restored=$(sed -n 's/.*checkpoints: restored .*\/step_0*\([0-9][0-9]*\) from .*\/\.tmp-step_.*/\1/p' "$WORK/restart.out" | tail -1)
[ -n "$restored" ] && [ "$restored" -gt "$newest" ] && newest=$restored
expect_grep "$WORK/restart.out" "resumed from .*step_0*$newest " "resuming from the killed job's newest checkpoint (step $newest)"
finish
