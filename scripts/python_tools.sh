#!/usr/bin/env bash
# The Python the tests use as a judge of interop: a virtual environment of
# Debian's python3 (its site packages visible: python3-torch stays the
# peer) with pinned PyPI packages: tiktoken (the tokenizer's reference).
# Made once in BUILD_DIR/venv-tools; a second run installs nothing.
# Without PyPI it says so and exits 0: the tests that need it skip saying why.
#   scripts/python_tools.sh [BUILD_DIR]     make it
#   BUILD_DIR/venv-tools/bin/python         use it
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
venv="$build/venv-tools"
packages=(tiktoken==0.14.0)
stamp="$venv/.lockstep-packages"
if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "${packages[*]}" ]; then exit 0; fi
rm -rf "$venv"
if ! /usr/bin/python3 -m venv --system-site-packages "$venv" >"$build/venv-tools.log" 2>&1 ||
   ! "$venv/bin/python" -m pip install -q "${packages[@]}" >>"$build/venv-tools.log" 2>&1; then
  echo "setup: could not make $venv with ${packages[*]} ($(tail -1 "$build/venv-tools.log")):" \
       "the tests that need them skip" >&2
  rm -rf "$venv"
  exit 0
fi
echo "${packages[*]}" >"$stamp"
echo "setup: $venv holds ${packages[*]}"
