// NCCL backend, compiled only when LibTorch was built with CUDA (CMake
// defines USE_C10D_NCCL for this file alone).
#include <torch/cuda.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "lockstep/distributed/process_group.h"
#include "lockstep/util/error.h"

namespace lockstep {

bool nccl_available() {
  return true;
}

Ptr<C10dBackend> nccl_backend_create(const Ptr<C10dStore>& store, int rank, int size,
                                     std::chrono::milliseconds timeout) {
  // Said here, as a configuration error: ProcessGroupNCCL's own refusal on
  // a machine without a GPU comes late and, in some builds, not cleanly.
  if (torch::cuda::device_count() == 0)
    throw ConfigError(
        "backend 'nccl' needs a CUDA GPU, and this machine shows none (no device, no driver, or "
        "CUDA_VISIBLE_DEVICES empty); use dist.backend: gloo or shm on the CPU");
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
}

void nccl_backend_shutdown(C10dBackend& backend) {
  if (auto* nccl = dynamic_cast<c10d::ProcessGroupNCCL*>(&backend)) shutdown_if_supported(*nccl);
}

}  // namespace lockstep
