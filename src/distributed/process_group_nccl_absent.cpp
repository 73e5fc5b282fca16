// NCCL for a LibTorch without CUDA: asking for it is a clear error.
// (CMake compiles this file or process_group_nccl.cpp, never both.)
#include <torch/version.h>

#include "lockstep/distributed/process_group.h"
#include "lockstep/util/error.h"

namespace lockstep {

bool nccl_available() {
  return false;
}

Ptr<C10dBackend> nccl_backend_create(const Ptr<C10dStore>&, int, int, std::chrono::milliseconds) {
  throw ConfigError(
      "backend 'nccl' is not available: this lockstep was built against LibTorch " TORCH_VERSION
      " without CUDA. Use the gloo backend (dist.backend: gloo in a config, --backend gloo for "
      "check and bench), or rebuild against a CUDA LibTorch, e.g. "
      "cmake -DCMAKE_PREFIX_PATH=\"$(python3 -c 'import torch; "
      "print(torch.utils.cmake_prefix_path)')\" (docs/environment.md)");
}

void nccl_backend_shutdown(C10dBackend&) {}

}  // namespace lockstep
