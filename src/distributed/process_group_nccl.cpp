// NCCL backend, compiled only when LibTorch was built with CUDA (CMake
// defines USE_C10D_NCCL for this file alone).
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "lockstep/distributed/process_group.h"

namespace lockstep {

bool nccl_available() {
  return true;
}

Ptr<C10dBackend> nccl_backend_create(const Ptr<C10dStore>& store, int rank, int size,
                                     std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
}

void nccl_backend_shutdown(C10dBackend& backend) {
  if (auto* nccl = dynamic_cast<c10d::ProcessGroupNCCL*>(&backend)) shutdown_if_supported(*nccl);
}

}  // namespace lockstep
