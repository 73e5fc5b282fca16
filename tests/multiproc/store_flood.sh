#!/usr/bin/env bash
# A flood: 300 idle sockets kept open on the store's port (reopened as soon
# as the store closes them) while 2-rank jobs start through lockstep-run.
# Every job gets in (Note [Store admission]).
#   store_flood.sh LOCKSTEP LOCKSTEP_RUN [TRIES [BURNERS]]
# TRIES jobs in a row (default 3); BURNERS CPU-bound processes run
# meanwhile (default 0; scripts/stress_flood.sh runs 20 jobs beside 2).
source "$(dirname "$0")/lib.sh"
tries=${3:-3}
burners=${4:-0}

burning=()
flooders=()
trap 'kill "${flooders[@]}" "${burning[@]}" 2>/dev/null; rm -rf "$WORK"' EXIT
for _ in $(seq "$burners"); do
  $PY -c 'while True: pass' &
  burning+=($!)
done
# The flood starts before the store listens, so its port must be one no
# other process can be handed meanwhile: below the kernel's ephemeral range
# (an ephemeral port could go to another test's Gloo listener, which the
# flood would then hit: unit.gloo_forced failed so once on Debian 13).
flood_port=$(free_port)  # lib.sh: below the ephemeral range
flood() {  # 4 processes of 75 sockets each: 300 in all
  exec $PY - "$flood_port" <<'PY'
import select, socket, sys, time
port, socks, end = int(sys.argv[1]), [], time.time() + 1800
while time.time() < end:
    if socks:
        gone, _, _ = select.select(socks, [], [], 0)
        for s in gone: s.close()
        socks = [s for s in socks if s not in gone]
    while len(socks) < 75:
        try:
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=0.5))
        except OSError:
            time.sleep(0.001)
            break
PY
}
for _ in 1 2 3 4; do flood & flooders+=($!); done
sleep 0.5
failed=0
for try in $(seq "$tries"); do
  start=$(now)
  "$LOCKSTEP_RUN" --nproc-per-node 2 --master-port "$flood_port" "$LOCKSTEP" check --comm \
    --rdzv-timeout-s 60 >"$WORK/flooded$try.out" 2>&1
  code=$?
  expect_eq "$code" 0 "job $try of $tries starts and passes under a flood of 300 sockets ($(elapsed "$start") s)"
  [ "$code" = 0 ] || { failed=$((failed + 1)); tail -15 "$WORK/flooded$try.out" | sed 's/^/    /'; }
done
kill "${flooders[@]}" "${burning[@]}" 2>/dev/null
wait "${flooders[@]}" "${burning[@]}" 2>/dev/null
expect_grep "$WORK/flooded$tries.out" "comm check \(shm, 2 ranks\): 55 passed, 0 failed" "and its comm check passes"
echo "flood: $((tries - failed)) of $tries jobs started beside $burners CPU-bound processes"
finish
