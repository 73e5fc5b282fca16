#!/usr/bin/env bash
# Sets up (installs what is missing, builds) and runs the whole test suite.
#   scripts/test.sh                 everything
#   scripts/test.sh -L unit         only the unit tests (any ctest arguments)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# Multi-rank tests run several processes each; on 2 cores, two at a time.
export OMP_NUM_THREADS=1
ctest --test-dir build --output-on-failure -j 2 "$@"
