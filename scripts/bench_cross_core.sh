#!/usr/bin/env bash
# Cross-core copy rates on this machine (scripts/lib/cross_core_copy.c):
# what the shm backend's private-tensor path pays per line that crosses
# cores, beside a one-process copy. Usage: scripts/bench_cross_core.sh [STEPS]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
gcc -O2 -mavx2 -o "$out/cross_core_copy" "$here/lib/cross_core_copy.c"
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p')"
"$out/cross_core_copy" "${1:-4000}"
