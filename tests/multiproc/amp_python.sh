#!/usr/bin/env bash
# lockstep's GradScaler against PyTorch's own torch.amp.GradScaler("cpu")
# on one scripted fp16 run (tests/train/test_amp.cpp "amp trace", and
# tests/python/amp_parity.py): the same scale after every step, the same
# skipped steps, and bit-identical final weights. Needs CPU fp16 autocast
# and PyTorch's CPU GradScaler (2.4+, the Debian 13 root's 2.6); skipped
# (77) elsewhere, saying why.
#   amp_python.sh LOCKSTEP LOCKSTEP_RUN LOCKSTEP_TESTS
source "$(dirname "$0")/lib.sh"
TESTS=${3:?usage: $0 LOCKSTEP LOCKSTEP_RUN LOCKSTEP_TESTS}
root=$(cd "$(dirname "$0")/../.." && pwd)
export OMP_NUM_THREADS=1
LOCKSTEP_AMP_TRACE="$WORK/lockstep.trace" "$TESTS" "[.amp_trace]" >"$WORK/tests.out" 2>&1
expect_eq "$?" 0 "the scripted run in lockstep" || sed 's/^/    /' "$WORK/tests.out" | tail -20
$PY "$root/tests/python/amp_parity.py" >"$WORK/python.trace" 2>"$WORK/py.err"
py=$?
if grep -q '^unsupported' "$WORK/lockstep.trace" || [ "$py" = 77 ]; then
  echo "skipped: lockstep: $(head -1 "$WORK/lockstep.trace"); python: $(head -1 "$WORK/python.trace")"
  echo "(CPU fp16 autocast and PyTorch's CPU GradScaler need 2.4+)"
  exit 77
fi
expect_eq "$py" 0 "PyTorch's GradScaler runs the same script" || sed 's/^/    /' "$WORK/py.err" | tail -20
skips=$(grep -c 'stepped 0$' "$WORK/lockstep.trace")
expect_lt 2 "$skips" "the script skips steps (overflow at the start and at step 13): $skips"
grows=$(awk '{print $4}' "$WORK/lockstep.trace" | grep -v '^$' | uniq | wc -l)
expect_lt 3 "$grows" "and changes the scale both ways ($grows distinct runs of scales)"
if diff "$WORK/lockstep.trace" "$WORK/python.trace" >"$WORK/diff"; then
  pass "same scales, same skipped steps, bit-identical weights ($(grep -c '^step' "$WORK/lockstep.trace") steps)"
else
  fail "lockstep's trace differs from PyTorch's:"
  sed 's/^/    /' "$WORK/diff" | head -30
fi
finish
