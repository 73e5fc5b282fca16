#!/usr/bin/env bash
# Installs what lockstep needs from Debian 12's packages (only when missing),
# points BLAS at OpenBLAS, and builds in Release into build/. Idempotent:
# a second run installs nothing and rebuilds only what changed.
#
#   scripts/setup.sh            install + build
#   LOCKSTEP_SKIP_INSTALL=1     build only
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libtorch-dev          # LibTorch 1.13 (CPU, with Gloo)
  libgloo-dev           # headers for c10d::ProcessGroupGloo
  libopenblas0-openmp   # without it LibTorch falls back to the ~17x slower reference BLAS
  libyaml-cpp-dev libcxxopts-dev libspdlog-dev zlib1g-dev
  libxxhash-dev libssl-dev  # weight fingerprints: XXH3-128 and SHA-256
  catch2                # v2.13, the test framework
  python3-torch         # PyTorch's torchrun and DDP, the peers we test and benchmark against
  python3-matplotlib    # scripts/plot_metrics.py
  iproute2 procps       # pgrep and ip, used by the multi-process tests
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${LOCKSTEP_SKIP_INSTALL:-0}" != 1 ] && [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# LibTorch links libblas.so.3: make sure it resolves to OpenBLAS.
blas=/usr/lib/x86_64-linux-gnu/openblas-openmp/libblas.so.3
if [ -e "$blas" ] && command -v update-alternatives >/dev/null; then
  current=$(readlink -f /etc/alternatives/libblas.so.3-x86_64-linux-gnu 2>/dev/null || true)
  if [ "$current" != "$(readlink -f "$blas")" ] && [ "$(id -u)" -eq 0 ]; then
    update-alternatives --set libblas.so.3-x86_64-linux-gnu "$blas"
  fi
fi

jobs=$(nproc)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release ${LOCKSTEP_CMAKE_ARGS:-}
cmake --build build -j "$jobs"
echo "setup: built build/lockstep and build/lockstep-run"
