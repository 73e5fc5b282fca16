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
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
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

# The final weights' digest of the run logged in $WORK/NAME.out, and two
# runs' compared (same NAME REFERENCE WHAT).
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

# A TCP port free right now (bind to 0, read it back, release it).
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("",0)); print(s.getsockname()[1])'; }
