#!/usr/bin/env bash
# lockstep-run leaves nothing behind (docs/failure-modes.md, "The launcher's
# process tree"):
# 1-3. a worker's setsid'd daemon is stopped when the job ends normally, when
#      the launcher gets SIGTERM and when the launcher is SIGKILLed;
# 4.   SIGTERM is handled at once even when the launcher's stdout is stalled
#      (a reader that never reads);
# 5.   a SIGKILLed launcher never signals a process group that is no longer
#      its own: attempt 1's worker pid is handed to a stranger (forced with
#      ns_last_pid inside a new pid namespace), and the stranger survives.
# Each process is found by its own argument (sleep's durations carry our pid).
source "$(dirname "$0")/lib.sh"

# wait_exit PID SECONDS: sets EXIT_CODE to the exit code of background job
# PID, or to "running" when it has not ended within SECONDS.
wait_exit() {
  for _ in $(seq $(($2 * 10))); do
    if ! kill -0 "$1" 2>/dev/null; then
      wait "$1"
      EXIT_CODE=$?
      return
    fi
    sleep 0.1
  done
  EXIT_CODE=running
}

# wait_count PATTERN N SECONDS: until N processes match PATTERN (N=0: none).
wait_count() {
  for _ in $(seq $(($3 * 10))); do
    [ "$(leftovers "$1" | wc -l)" -eq "$2" ] && return
    sleep 0.1
  done
}

# Case 5 runs in a pid namespace of its own: this script again, as its init.
pid_reuse_case() {
  local first stranger launcher
  # shellcheck disable=SC2016  # expanded by the worker's shell
  "$LOCKSTEP_RUN" --nproc-per-node 1 --master-port 0 --max-restarts 1 sh -c \
    'echo "pid $$ attempt $TORCHELASTIC_RESTART_COUNT"; [ "$TORCHELASTIC_RESTART_COUNT" = 1 ] || exit 1; exec sleep 296.1' \
    >"$WORK/reuse.out" 2>"$WORK/reuse.err" &
  launcher=$!
  wait_count "^sleep 296\.1\$" 1 10
  expect_eq "$(leftovers "^sleep 296\.1\$" | wc -l)" 1 "attempt 2's worker runs"
  for _ in $(seq 20); do
    first=$(sed -n 's/^\[rank0\]: pid \([0-9]*\) attempt 0$/\1/p' "$WORK/reuse.out")
    [ -n "$first" ] && break
    sleep 0.1
  done
  expect_grep "$WORK/reuse.out" "^\[rank0\]: pid [0-9]+ attempt 0\$" "attempt 1's worker said its pid"
  # The next pid handed out in this namespace is attempt 1's (its worker is
  # reaped, its process group gone): a stranger, in a group of that id.
  if ! echo $((${first:-2} - 1)) 2>/dev/null >/proc/sys/kernel/ns_last_pid; then
    echo "skipped: cannot write /proc/sys/kernel/ns_last_pid here"
    kill -9 "$launcher"
    exit 77
  fi
  setsid sleep 295.1 &
  stranger=$!
  expect_eq "$stranger" "$first" "the stranger got attempt 1's worker pid"
  leads_group() { [ "$(ps -o pgid= -p "$stranger" | tr -d ' ')" = "$first" ]; }
  wait_for 10 "the stranger's setsid" leads_group
  expect_eq "$(ps -o pgid= -p "$stranger" | tr -d ' ')" "$first" "and leads a process group of that id"
  kill -9 "$launcher"
  wait "$launcher" 2>/dev/null
  wait_count "^sleep 296\.1\$" 0 3
  sleep 0.5
  expect_eq "$(leftovers "^sleep 296\.1\$")" "" "after kill -9 of lockstep-run attempt 2's worker is gone"
  if kill -0 "$stranger" 2>/dev/null; then
    pass "the stranger in a process group of attempt 1's id survives"
  else
    fail "the stranger in a process group of attempt 1's id was killed"
  fi
}
if [ "${LAUNCHER_TREE_CASE:-}" = pid_reuse ]; then
  pid_reuse_case
  finish
  exit
fi

# 1. Normal exit: rank 0's daemon takes SIGTERM, rank 1's ignores it and is
#    SIGKILLed after the grace period; the launcher still exits 0.
daemon="^sleep 301\.$$\$"
stubborn="^sleep 302\.$$\$"
start=$(now)
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 --grace-s 1 sh -c \
  "if [ \$RANK = 0 ]; then setsid sleep 301.$$ & else setsid sh -c \"trap '' TERM; exec sleep 302.$$\" & fi; sleep 0.3; echo started" \
  >"$WORK/out" 2>"$WORK/err"
expect_eq "$?" 0 "a job whose workers leave daemons behind still exits 0"
expect_lt "$(elapsed "$start")" 6 "within the grace period + margin"
expect_eq "$(leftovers "$daemon")" "" "after a normal exit the worker's setsid'd daemon is gone"
expect_eq "$(leftovers "$stubborn")" "" "and so is one that ignores SIGTERM"
expect_grep "$WORK/err" "left 2 process\(es\) behind" "the launcher says what it stops"
expect_grep "$WORK/err" "SIGKILL to 1 process\(es\) left behind" "and that one needed SIGKILL"
pkill -9 -f -- "$daemon|$stubborn" 2>/dev/null

# 2. SIGTERM to the launcher: workers and their daemons go; exit 143.
daemon="^sleep 303\.$$\$"
worker="^sleep 304\.$$\$"
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 --grace-s 1 sh -c \
  "setsid sleep 303.$$ & exec sleep 304.$$" >"$WORK/out" 2>"$WORK/err" &
launcher=$!
wait_count "$daemon" 2 10
wait_count "$worker" 2 10
expect_eq "$(leftovers "$daemon" | wc -l)" 2 "each worker started a setsid'd daemon"
kill -TERM "$launcher"
wait_exit "$launcher" 10
expect_eq "$EXIT_CODE" 143 "SIGTERM to the launcher still ends it with 143"
wait_count "$daemon" 0 3
expect_eq "$(leftovers "$worker")" "" "after SIGTERM no worker is left"
expect_eq "$(leftovers "$daemon")" "" "and no worker's daemon either"
[ "$EXIT_CODE" = running ] && kill -9 "$launcher"
pkill -9 -f -- "$daemon|$worker" 2>/dev/null

# 3. kill -9 of the launcher: the guardian finds the daemons by the launch id.
daemon="^sleep 305\.$$\$"
worker="^sleep 306\.$$\$"
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 sh -c \
  "setsid sleep 305.$$ & exec sleep 306.$$" >"$WORK/out" 2>"$WORK/err" &
launcher=$!
wait_count "$daemon" 2 10
wait_count "$worker" 2 10
expect_eq "$(leftovers "$daemon" | wc -l)" 2 "each worker started a setsid'd daemon"
kill -9 "$launcher"
wait "$launcher" 2>/dev/null
wait_count "$daemon" 0 3
wait_count "$worker" 0 1
expect_eq "$(leftovers "$worker")" "" "after kill -9 of lockstep-run no worker is left"
expect_eq "$(leftovers "$daemon")" "" "and no worker's daemon either"
pkill -9 -f -- "$daemon|$worker" 2>/dev/null

# 4. A stalled stdout (its reader never reads) does not delay SIGTERM.
chatty="^yes lockstep-launcher-tree-$$\$"
mkfifo "$WORK/stall"
# shellcheck disable=SC2217  # on purpose: a reader that never reads
sleep 307.$$ <"$WORK/stall" &
reader=$!
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 --grace-s 1 sh -c \
  "exec yes lockstep-launcher-tree-$$" >"$WORK/stall" 2>"$WORK/err" &
launcher=$!
wait_count "$chatty" 2 10
sleep 1  # the pipe and the relay fill up
kill -TERM "$launcher"
start=$(now)
wait_count "$chatty" 0 3
expect_eq "$(leftovers "$chatty")" "" "with stdout stalled, SIGTERM stops the workers within 3 s"
wait_exit "$launcher" 6
expect_eq "$EXIT_CODE" 143 "and the launcher exits 143 within seconds"
expect_grep "$WORK/err" "received SIGTERM: forwarding it to every worker" "signal forwarded"
[ "$EXIT_CODE" = running ] && kill -9 "$launcher" && wait "$launcher" 2>/dev/null
kill "$reader" 2>/dev/null
pkill -9 -f -- "$chatty" 2>/dev/null

# 5. Pid reuse: needs a pid namespace (root, or an unprivileged user
#    namespace); skipped where neither exists.
ns=""
for flags in "--pid --fork --mount-proc" "--user --map-root-user --pid --fork --mount-proc"; do
  # shellcheck disable=SC2086
  if unshare $flags true 2>/dev/null; then ns=$flags && break; fi
done
if [ -z "$ns" ]; then
  echo "skipped: pid reuse (cannot make a pid namespace here)"
else
  # shellcheck disable=SC2086
  LAUNCHER_TREE_CASE=pid_reuse unshare $ns bash "$0" "$LOCKSTEP" "$LOCKSTEP_RUN" >"$WORK/reuse.log" 2>&1
  code=$?
  sed 's/^/  [pid namespace] /' "$WORK/reuse.log"
  if [ "$code" -ne 77 ]; then
    expect_eq "$code" 0 "pid reuse: no process outside the current attempt is signalled"
  fi
fi
finish
