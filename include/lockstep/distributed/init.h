// One call from the environment to a working process group, for programs of
// your own (the `lockstep` program uses it too):
//
//   auto dist = lockstep::init_distributed();      // torchrun, Slurm, mpirun or 1 process
//   lockstep::DistributedDataParallel ddp(model, dist.pg);
//   ...
//   dist.shutdown();                                // barrier, then release
//
// init_distributed reads the world (WorldInfo: torchrun > Slurm > Open MPI >
// world size 1), starts rank-tagged logging, meets the other ranks
// (rendezvous: rank 0's job store, or torchrun's agent store) and creates the
// process group. Errors are lockstep's typed exceptions with the messages the
// CLI prints: EnvError (a bad variable, named with its value), ConfigError
// (a bad option), TimeoutError/CommError (a peer that never came).
#pragma once

#include <chrono>
#include <exception>
#include <memory>
#include <string>

#include "lockstep/distributed/process_group.h"
#include "lockstep/distributed/torch_compat.h"
#include "lockstep/distributed/world.h"
#include "lockstep/util/timeouts.h"

namespace lockstep {

struct InitOptions {
  BackendKind backend = BackendKind::kAuto;
  // shm backend: bytes per step through each rank's slot.
  std::size_t shm_chunk_bytes = ShmOptions{}.chunk_bytes;
  // Per collective: a peer that misses one makes it fail after this long.
  std::chrono::milliseconds timeout{kCollectiveTimeout};
  // To reach the store and for every rank to arrive.
  std::chrono::milliseconds rendezvous_timeout{kRendezvousTimeout};
  // spdlog level (trace ... off); empty: LOCKSTEP_LOG_LEVEL or info.
  std::string log_level;
  // false: leave spdlog's default logger as the program set it.
  bool init_logging = true;
};

class Distributed {
 public:
  WorldInfo world;
  Ptr<C10dStore> store;  // the rendezvous store (HashStore at world size 1)
  std::shared_ptr<ProcessGroup> pg;

  Distributed() = default;
  Distributed(Distributed&&) = default;
  Distributed& operator=(Distributed&&) = default;
  Distributed(const Distributed&) = delete;
  Distributed& operator=(const Distributed&) = delete;
  // While an error unwinds past it, the process group and the store outlive
  // this object until the error is reported (Note [Report before teardown],
  // lockstep/util/kept_until_reported.h): a program that catches lockstep's
  // errors itself calls lockstep::release_kept() once it has reported one
  // (else the next init_distributed, or the program's exit, releases them).
  ~Distributed();

  int rank() const { return world.rank; }
  int size() const { return world.world_size; }
  // Waits for every rank (so rank 0's store outlives the others' last use),
  // then releases the process group and the store. Idempotent.
  void shutdown();

 private:
  // Exceptions in flight when this object was made: an unwinding past it
  // is one more (the idiom that ignores unwindings it was born inside).
  int uncaught_at_birth_ = std::uncaught_exceptions();
};

Distributed init_distributed(const InitOptions& options = {});

// Seconds from a config or a command line, as the timeouts above; throws
// ConfigError naming `what` unless 0 < seconds <= 1e7.
std::chrono::milliseconds timeout_from_seconds(double seconds, const std::string& what);

}  // namespace lockstep
