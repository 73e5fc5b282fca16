#!/usr/bin/env bash
# lockstep-run: rank prefixes, the environment contract, a failing worker, a
# worker killed by a signal, no survivors, log files, restarts, bad options.
source "$(dirname "$0")/lib.sh"
marker="lockstep-launcher-test-$$"

# 1. Output prefixes and torchrun's environment contract.
env -u OMP_NUM_THREADS "$LOCKSTEP_RUN" --nproc-per-node 3 --master-port 0 sh -c \
  'echo "env $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR $TORCHELASTIC_RESTART_COUNT $TORCHELASTIC_USE_AGENT_STORE $OMP_NUM_THREADS"; echo "err $RANK" >&2' \
  >"$WORK/out" 2>"$WORK/err"
expect_eq "$?" 0 "three healthy workers exit 0"
for r in 0 1 2; do
  expect_grep "$WORK/out" "^\[rank$r\]: env $r 3 $r 3 0 127.0.0.1 0 False 1\$" "rank $r gets torchrun's variables, prefixed on stdout"
  expect_grep "$WORK/err" "^\[rank$r\]: err $r\$" "rank $r's stderr is prefixed on stderr"
done

# 2. A worker that exits 3: non-zero within seconds, summary names it, others gone.
start=$(now)
"$LOCKSTEP_RUN" --nproc-per-node 3 --master-port 0 sh -c \
  "echo started; if [ \$RANK = 1 ]; then echo 'about to fail' >&2; exit 3; fi; exec sleep 60 # $marker" \
  >"$WORK/out" 2>"$WORK/err"
code=$?
took=$(elapsed "$start")
expect_eq "$code" 3 "the launcher exits with the failed worker's code"
expect_lt "$took" 10 "failure reported within seconds"
expect_grep "$WORK/err" "root cause: rank 1 \(local rank 1, pid [0-9]+\) exited with code 3" "summary names rank 1 and code 3"
expect_grep "$WORK/err" "^    about to fail\$" "summary shows the failed rank's last lines"
expect_grep "$WORK/err" "rank 0: stopped by lockstep-run" "summary says the others were stopped"
sleep 0.5
expect_eq "$(leftovers "$marker")" "" "no worker survives the failure"

# 3. A worker killed by a signal is reported as such.
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 sh -c \
  "if [ \$RANK = 0 ]; then kill -9 \$\$; fi; exec sleep 60 # $marker" >"$WORK/out" 2>"$WORK/err"
code=$?
expect_eq "$code" 137 "a SIGKILLed worker makes the launcher exit 128+9"
expect_grep "$WORK/err" "root cause: rank 0 .* was killed by signal 9 \(SIGKILL\)" "summary names the signal"
sleep 0.5
expect_eq "$(leftovers "$marker")" "" "no worker survives the kill"

# 4. A worker that ignores SIGTERM is SIGKILLed after the grace period.
start=$(now)
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 --grace-s 1 sh -c \
  "trap '' TERM; if [ \$RANK = 0 ]; then sleep 0.5; exit 5; fi; while :; do sleep 0.1; done # $marker" \
  >"$WORK/out" 2>"$WORK/err"
expect_eq "$?" 5 "exit code of the first failure"
expect_grep "$WORK/err" "grace period of 1.00 s is over: SIGKILL" "stubborn worker is SIGKILLed"
expect_lt "$(elapsed "$start")" 8 "stubborn worker gone within grace + margin"
sleep 0.5
expect_eq "$(leftovers "$marker")" "" "no stubborn worker survives"

# 5. SIGTERM to the launcher is forwarded; it exits 128+15.
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 sh -c "exec sleep 60 # $marker" \
  >"$WORK/out" 2>"$WORK/err" &
launcher=$!
sleep 1
kill -TERM "$launcher"
wait "$launcher"
expect_eq "$?" 143 "SIGTERM to the launcher ends it with 143"
expect_grep "$WORK/err" "received SIGTERM: forwarding it to every worker" "signal forwarded"
sleep 0.5
expect_eq "$(leftovers "$marker")" "" "no worker survives SIGTERM to the launcher"

# 6. --log-dir keeps each rank's output; --max-restarts restarts the group.
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 --max-restarts 2 --log-dir "$WORK/logs" sh -c \
  'echo "attempt $TORCHELASTIC_RESTART_COUNT"; [ "$TORCHELASTIC_RESTART_COUNT" = 2 ] || exit 4' \
  >"$WORK/out" 2>"$WORK/err"
expect_eq "$?" 0 "the third attempt succeeds"
expect_grep "$WORK/err" "restarting the worker group \(restart 2 of 2\)" "two restarts announced"
expect_grep "$WORK/logs/attempt_2/rank_1.log" "^attempt 2\$" "log file of rank 1, attempt 2"
expect_grep "$WORK/logs/attempt_2/rank_0.log" "^attempt 2\$" "log file of rank 0, attempt 2"
expect_eq "$(ls "$WORK/logs")" "$(printf 'attempt_0\nattempt_1\nattempt_2')" "one log folder per attempt"

# 7. Bad options and a missing program.
"$LOCKSTEP_RUN" --nproc-per-node 0 true 2>"$WORK/err"
expect_eq "$?" 2 "--nproc-per-node 0 is rejected"
expect_grep "$WORK/err" "nproc-per-node=0 must be >= 1" "the message names the flag"
"$LOCKSTEP_RUN" --nnodes 2 --node-rank 2 true 2>"$WORK/err"
expect_grep "$WORK/err" "node-rank=2 must be in \[0, --nnodes=2\)" "node rank out of range named"
"$LOCKSTEP_RUN" --nproc_per_node 1 --master-port 0 /nonexistent/program >"$WORK/out" 2>"$WORK/err"
expect_eq "$?" 127 "a program that cannot be executed gives 127"
expect_grep "$WORK/err" "cannot execute '/nonexistent/program'" "and says why"

# Bad grace periods are refused up front (1e10 s used to overflow into an
# immediate SIGKILL).
"$LOCKSTEP_RUN" --nproc-per-node 1 --grace-s 1e10 true >"$WORK/out" 2>&1
expect_eq "$?" 2 "--grace-s 1e10 exits 2"
expect_grep "$WORK/out" "grace-s=10000000000.000000 must be in \[0, 86400\] seconds" "naming the range"
# 64 MB without a newline: relayed in 64 KB pieces, every byte of it, with
# the launcher's memory bounded (it used to hold the whole line: ~200 MB).
"$LOCKSTEP_RUN" --nproc-per-node 1 --master-port 0 sh -c 'head -c 67108864 /dev/zero | tr "\\0" x' \
  >"$WORK/out" 2>"$WORK/err" &
relay=$!
peak=0
while kill -0 "$relay" 2>/dev/null; do
  kb=$(awk '/VmRSS/ {print $2}' "/proc/$relay/status" 2>/dev/null || echo 0)
  [ "${kb:-0}" -gt "$peak" ] && peak=$kb
  sleep 0.05
done
wait "$relay"
expect_eq "$?" 0 "a worker printing 64 MB without a newline exits 0"
expect_eq "$(tr -d '\n' <"$WORK/out" | sed 's/\[rank0\]: //g' | wc -c)" 67108864 "every byte relayed"
expect_eq "$(grep -c '' "$WORK/out")" 1024 "in 1024 pieces of 64 KB"
expect_lt "$peak" 65536 "launcher's resident memory stays under 64 MB (peak ${peak} kB)"
# SIGKILL of the launcher takes the whole worker tree along: the workers
# (PDEATHSIG) and what they spawned (the guardian, Note [Guardian]). Each
# process is found by its own argument (sleep's durations carry our pid).
worker="^sleep 298\.$$\$"
grandchild="^sleep 299\.$$\$"
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 sh -c "sleep 299.$$ & exec sleep 298.$$" \
  >"$WORK/out" 2>&1 &
launcher=$!
all_started() { [ "$(leftovers "$grandchild" | wc -l)" -ge 2 ] && [ "$(leftovers "$worker" | wc -l)" -ge 2 ]; }
wait_for 60 "both workers and their children" all_started
expect_eq "$(leftovers "$grandchild" | wc -l)" 2 "each worker started a child of its own"
expect_eq "$(leftovers "$worker" | wc -l)" 2 "both workers run"
kill -9 "$launcher"
wait "$launcher" 2>/dev/null
for _ in $(seq 30); do [ -z "$(leftovers "$grandchild")$(leftovers "$worker")" ] && break; sleep 0.1; done
expect_eq "$(leftovers "$worker")" "" "after kill -9 of lockstep-run no worker is left"
expect_eq "$(leftovers "$grandchild")" "" "and no worker's child either"
pkill -9 -f -- "$grandchild" 2>/dev/null
finish
