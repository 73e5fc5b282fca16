#!/usr/bin/env bash
# The NCCL backend is only built against a CUDA LibTorch, which this machine
# lacks. This compiles process_group_nccl.cpp for syntax against the local
# LibTorch's ProcessGroupNCCL.hpp and CUDA's NCCL headers, so an API slip
# shows up here rather than on a GPU machine. Exit 77 (skipped) without them.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
cuda=${CUDA_HOME:-/usr/local/cuda}
torch_inc=${TORCH_INCLUDE:-/usr/include}
if [ ! -f "$cuda/include/nccl.h" ] || [ ! -f "$torch_inc/torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp" ]; then
  echo "skipped: no NCCL headers in $cuda/include or no ProcessGroupNCCL.hpp under $torch_inc"
  exit 77
fi
shim=$(mktemp -d)
trap 'rm -rf "$shim"' EXIT
# Debian's CPU LibTorch ships c10/cuda headers without the generated macros file.
if [ ! -f "$torch_inc/c10/cuda/impl/cuda_cmake_macros.h" ]; then
  mkdir -p "$shim/c10/cuda/impl"
  echo '#define C10_CUDA_BUILD_SHARED_LIBS' >"$shim/c10/cuda/impl/cuda_cmake_macros.h"
fi
if g++ -std=c++17 -fsyntax-only -DUSE_C10D_NCCL -DUSE_C10D_GLOO -I"$root/include" -I"$shim" \
  -I"$torch_inc" -I"$torch_inc/torch/csrc/api/include" -I"$cuda/include" \
  "$root/src/distributed/process_group_nccl.cpp"; then
  echo "1 passed, 0 failed"
else
  echo "0 passed, 1 failed"
  exit 1
fi
