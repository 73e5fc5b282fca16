#!/usr/bin/env bash
# The main job on a fresh machine: set up, then the communication self-check
# on 2 ranks under lockstep-run (a training run replaces it once `lockstep
# train` lands).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec build/lockstep-run --nproc-per-node "${NPROC:-2}" --master-port 0 build/lockstep check --comm "$@"
