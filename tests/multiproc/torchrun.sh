#!/usr/bin/env bash
# The real torchrun (Debian's python3-torch: 1.13 on 12, 2.6 on 13) launching lockstep with
# --no-python: its agent hosts the store (TORCHELASTIC_USE_AGENT_STORE=True)
# and lockstep must join it as a client under /worker/attempt_0.
source "$(dirname "$0")/lib.sh"

TORCHRUN=${TORCHRUN:-$(dirname "$PY")/torchrun}
if [ ! -x "$TORCHRUN" ]; then
  fail "torchrun not found at $TORCHRUN (scripts/setup.sh installs python3-torch)"
  finish
  exit 1
fi
port=$(free_port)
# Debian 13's torch 2.6 lacks libuv but its TCPStore asks for it: the stock
# torchrun cannot start there. Then the same torchrun runs with the classic
# store server (torchrun_classic_store.py says why); 1.13 needs nothing.
if ! $PY -c 'import torch.distributed as d; d.TCPStore("127.0.0.1", 0, 1, True)' 2>/dev/null; then
  echo "note: this torch's TCPStore cannot start on its defaults (no libuv); torchrun with use_libuv=False"
  TORCHRUN="$PY $(dirname "$0")/torchrun_classic_store.py"
fi
# Debian's torchrun on Python 3.11 crashes with its default redirects: -r/-t
# in their mapping form avoid that path.
OMP_NUM_THREADS=1 $TORCHRUN --nproc_per_node 2 --master_port "$port" -r 0:1 -t 0:1 \
  --log_dir "$WORK/torchrun-logs" --no_python "$LOCKSTEP" check --comm --sizes 1,1001,262144 \
  >"$WORK/out" 2>&1
expect_eq "$?" 0 "torchrun --no-python lockstep check --comm on 2 ranks exits 0"
expect_grep "$WORK/out" "comm check \(shm, 2 ranks\): 55 passed, 0 failed" "rank 0's table"
expect_grep "$WORK/out" "agent store, attempt 0" "lockstep joined torchrun's agent store"

finish
