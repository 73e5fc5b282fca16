#!/usr/bin/env bash
# The main job on a fresh machine: set up (packages + build), then train the
# MLP of configs/digits.yaml on the embedded 8x8 digits with 2 ranks under
# lockstep-run, every step checked for bit-identical weights across ranks.
# Extra arguments go to `lockstep train` (e.g. --set optim.lr=0.1). Run
# again, it moves the last run's results into runs/digits/overwritten-<time>/
# (run.overwrite) rather than mix the two.
set -euo pipefail
cd "$(dirname "$0")/.."
# Only the two programs the job runs (the test suite is scripts/test.sh's).
LOCKSTEP_TARGETS="lockstep-bin lockstep-run" scripts/setup.sh
exec build/lockstep-run --nproc-per-node "${NPROC:-2}" --master-port 0 \
  build/lockstep train --config configs/digits.yaml --set run.overwrite=true "$@"
