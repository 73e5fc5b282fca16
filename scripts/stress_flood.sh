#!/usr/bin/env bash
# The store's admission under load (Note [Store admission]): 20 two-rank jobs
# in a row start through lockstep-run while 300 stray sockets connect,
# reconnect and sit idle on the store's port and two CPU-bound processes keep
# both cores busy. Exit 0 only if all 20 started and passed.
#   scripts/stress_flood.sh [TRIES [BURNERS]]     (defaults 20 and 2)
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1
exec bash tests/multiproc/store_flood.sh build/lockstep build/lockstep-run "${1:-20}" "${2:-2}"
