# Helpers for the multi-process tests. Each test script sources this file,
# gets LOCKSTEP and LOCKSTEP_RUN from its arguments, and calls check/fail.
set -u
LOCKSTEP=${1:?usage: $0 LOCKSTEP LOCKSTEP_RUN}
LOCKSTEP_RUN=${2:?usage: $0 LOCKSTEP LOCKSTEP_RUN}
# PyTorch >= 2.4 starts its TCPStore on libuv unless USE_LIBUV=0, and Debian
# 13's python3-torch 2.6 is built without libuv (torchrun would refuse to
# start). 1.13 ignores the variable. lockstep itself asks for the classic
# store server (distributed/torch_compat.h).
export USE_LIBUV=0
# The Python peer (torch, torchrun, DDP): Debian's python3-torch, or the
# platform's own (LOCKSTEP_PYTHON: scripts/test.sh sets it for pip's torch).
PY=${LOCKSTEP_PYTHON:-/usr/bin/python3}
WORK=$(mktemp -d)
# KEEP_WORK=1 keeps the work folder for a look after a failure.
trap "${KEEP_WORK:+:} rm -rf \"$WORK\"" EXIT
FAILURES=0
PASSES=0

pass() { PASSES=$((PASSES + 1)); echo "ok: $*"; }
fail() { FAILURES=$((FAILURES + 1)); echo "FAIL: $*"; }

# expect_grep FILE PATTERN WHAT
expect_grep() {
  if grep -qE -- "$2" "$1"; then pass "$3"; else fail "$3 (no line matching '$2' in:)"; sed 's/^/    /' "$1" | tail -40; fi
}

# expect_eq ACTUAL EXPECTED WHAT
expect_eq() {
  if [ "$1" = "$2" ]; then pass "$3"; else fail "$3: got '$1', expected '$2'"; fi
}

# expect_lt A B WHAT (numbers, decimal allowed)
expect_lt() {
  if awk "BEGIN{exit !($1 < $2)}"; then pass "$3 ($1 < $2)"; else fail "$3: $1 is not < $2"; fi
}

now() { date +%s.%N; }
elapsed() { awk "BEGIN{printf \"%.2f\", $(now) - $1}"; }

# Processes whose command line contains the marker (ours only).
leftovers() { pgrep -f -- "$1" | grep -v "^$$\$" || true; }

# train NAME NPROC ARGS...: `lockstep train` on NPROC ranks under
# lockstep-run, its stdout and stderr in $WORK/NAME.out (appended with
# APPEND=1, as a resumed run's log continues the first). The run is NAME in
# $RUNS (under LAUNCH, default lockstep-run), with plain progress lines, on configs/digits.yaml unless ARGS give a
# --config, then the script's own defaults (the array TRAIN_ARGS) and ARGS:
# a later --set overrides an earlier one. Returns lockstep's exit code.
RUNS="$WORK/runs"
TRAIN_ARGS=()
APPEND=0 LAUNCH=""  # not from the environment
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
train() {
  local name=$1 n=$2 config=(--config "$ROOT/configs/digits.yaml")
  shift 2
  case " $* " in *" --config "*) config=() ;; esac
  [ "${APPEND:-0}" = 1 ] || : >"$WORK/$name.out"
  "${LAUNCH:-$LOCKSTEP_RUN}" --nproc-per-node "$n" --master-port 0 "$LOCKSTEP" train "${config[@]}" \
    --set run.dir="$RUNS" --set run.name="$name" --set log.progress=plain "${TRAIN_ARGS[@]}" "$@" >>"$WORK/$name.out" 2>&1
}

# The final weights' digest of the run logged in $WORK/NAME.out (the last
# one there), and two runs' compared (same NAME REFERENCE WHAT).
weights() { grep -oE "weights [0-9a-f]{16,}" "$WORK/$1.out" | tail -1 | awk '{print $2}'; }
same() {  # same NAME REFERENCE WHAT
  local a b
  a=$(weights "$1") b=$(weights "$2")
  [ -n "$b" ] || { fail "$3: no final weights in $2's log"; tail -5 "$WORK/$2.out"; return; }
  expect_eq "${a:-missing}" "$b" "$3"
}

finish() {
  echo "$PASSES passed, $FAILURES failed"
  [ "$FAILURES" -eq 0 ]
}

# A TCP port free right now, below the kernel's ephemeral range: between
# this call and rank 0's bind (seconds under load) no other process can be
# handed it by a bind to port 0 (another test's store or Gloo listener).
free_port() {
  "$PY" - <<'PY'
import random, socket
low = int(open('/proc/sys/net/ipv4/ip_local_port_range').read().split()[0])
for _ in range(1000):
    port = random.randrange(max(1024, low - 12000), low)
    s = socket.socket()
    try:
        s.bind(("", port)); print(port); break
    except OSError:
        pass
    finally:
        s.close()
PY
}

# wait_for SECS WHAT CMD...: polls CMD (every 0.2 s) until it succeeds;
# after SECS, fails naming WHAT and returns 1, so that the caller skips
# what depends on that state instead of acting too early.
wait_for() {
  local secs=$1 what=$2 start
  shift 2
  start=$(now)
  until "$@" >/dev/null 2>&1; do
    if awk "BEGIN{exit !($(now) - $start > $secs)}"; then
      fail "timed out after $secs s waiting for $what"
      return 1
    fi
    sleep 0.2
  done
}

# by_hand OUT N ARGS...: N ranks of "$LOCKSTEP" ARGS started by hand, as on
# separate nodes: no launcher stops the others when the first one fails, so
# each rank's own output and exit code can be asserted. Rank r's stdout and
# stderr go to $WORK/OUT.r, the exit codes to $WORK/OUT.codes ("c0 c1 ...").
by_hand() {
  local out=$1 n=$2 p r pids=() codes=()
  shift 2
  p=$(free_port)
  for r in $(seq 0 $((n - 1))); do
    env RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$p \
      OMP_NUM_THREADS=1 "$LOCKSTEP" "$@" >"$WORK/$out.$r" 2>&1 &
    pids+=($!)
  done
  for r in $(seq 0 $((n - 1))); do
    wait "${pids[$r]}"
    codes+=($?)
  done
  echo "${codes[*]}" >"$WORK/$out.codes"
}
