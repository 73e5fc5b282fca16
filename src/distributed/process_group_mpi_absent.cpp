// MPI for a LibTorch built without it (Debian 12's 1.13, pip's wheels):
// asking for it is a clear error. (CMake compiles this file or
// process_group_mpi.cpp, never both.)
#include <torch/version.h>

#include "lockstep/distributed/process_group.h"
#include "lockstep/util/error.h"

namespace lockstep {

bool mpi_available() {
  return false;
}

void mpi_check_world(const WorldInfo& world) {
  mpi_backend_create(world);  // throws: not available
}

Ptr<C10dBackend> mpi_backend_create(const WorldInfo&) {
  throw ConfigError(
      "backend 'mpi' is not available: this lockstep was built against LibTorch " TORCH_VERSION
      ", which has no c10d::ProcessGroupMPI. It needs a LibTorch built with MPI (Debian 13's "
      "libtorch-dev has it, with libopenmpi-dev) and lockstep rebuilt against it; or use "
      "the gloo backend (dist.backend: gloo in a config, --backend gloo for check and bench; "
      "docs/compatibility.md)");
}

}  // namespace lockstep
