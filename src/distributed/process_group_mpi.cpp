// MPI backend through c10d::ProcessGroupMPI, compiled only when LibTorch was
// built with MPI (CMake checks libtorch_cpu for the symbol and defines
// USE_C10D_MPI for this file alone). mpirun wires the ranks: MPI's own rank
// and size must match the world lockstep read from Open MPI's variables.
#include <torch/csrc/distributed/c10d/ProcessGroupMPI.hpp>

#include "lockstep/distributed/process_group.h"
#include "lockstep/util/error.h"

namespace lockstep {

bool mpi_available() {
  return true;
}

void mpi_check_world(const WorldInfo& world) {
  if (world.source != WorldSource::kOpenMpi && world.world_size > 1) {
    throw ConfigError(
        "backend 'mpi' needs ranks started by mpirun (OMPI_COMM_WORLD_RANK is not set;"
        " this world comes from " +
        std::string(world_source_name(world.source)) +
        "): run e.g. mpirun -np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29500 "
        "lockstep ... --backend mpi, or use the gloo backend (dist.backend: gloo, --backend gloo)");
  }
}

Ptr<C10dBackend> mpi_backend_create(const WorldInfo& world) {
  mpi_check_world(world);
  auto backend = c10d::ProcessGroupMPI::createProcessGroupMPI();
  if (backend->getRank() != world.rank || backend->getSize() != world.world_size) {
    throw EnvError("MPI says rank " + std::to_string(backend->getRank()) + " of " +
                   std::to_string(backend->getSize()) + ", the environment rank " +
                   std::to_string(world.rank) + " of " + std::to_string(world.world_size) +
                   " (were the Open MPI variables set by hand?)");
  }
  return backend;
}

}  // namespace lockstep
