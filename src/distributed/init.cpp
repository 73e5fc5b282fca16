#include "lockstep/distributed/init.h"

#include <spdlog/spdlog.h>

#include <exception>
#include <memory>
#include <utility>

#include "lockstep/distributed/rendezvous.h"
#include "lockstep/util/blas_probe.h"
#include "lockstep/util/error.h"
#include "lockstep/util/kept_until_reported.h"
#include "lockstep/util/log.h"

namespace lockstep {

std::chrono::milliseconds timeout_from_seconds(double seconds, const std::string& what) {
  if (!(seconds > 0) || seconds > 1e7) {
    throw ConfigError(what + "=" + std::to_string(seconds) + " must be in (0, 1e7] seconds");
  }
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

Distributed init_distributed(const InitOptions& options) {
  release_kept();  // what an earlier world's error kept (Note [Report before teardown])
  Distributed dist;
  // Logging with rank 0's tag before the world is known would mislabel
  // errors: read the world first, and log with rank -1 if that fails.
  try {
    dist.world = world_from_env();
  } catch (const Error&) {
    if (options.init_logging) log_init(-1, options.log_level);
    throw;
  }
  if (options.init_logging) log_init(dist.world.rank, options.log_level);
  spdlog::info("lockstep: {}", dist.world.describe());
  if (dist.world.local_rank == 0) {
    if (const std::string blas = blas_core_warning(); !blas.empty()) spdlog::warn("{}", blas);
  }
  if (options.backend == BackendKind::kMpi) mpi_check_world(dist.world);
  RendezvousOptions rdzv;
  rdzv.timeout = options.rendezvous_timeout;
  dist.store = rendezvous_connect(dist.world, rdzv);
  ProcessGroupOptions pg_options;
  pg_options.backend = options.backend;
  pg_options.shm_chunk_bytes = options.shm_chunk_bytes;
  pg_options.timeout = options.timeout;
  dist.pg = ProcessGroup::create(dist.store, dist.world, pg_options);
  return dist;
}

Distributed::~Distributed() {
  if (std::uncaught_exceptions() <= uncaught_at_birth_) return;
  // Note [Report before teardown]: the group first, then the store it uses.
  // Should holding them fail (memory), they go now, as without the note.
  try {
    if (pg) keep_until_reported(std::move(pg));
    if (store) keep_until_reported(std::make_shared<Ptr<C10dStore>>(std::move(store)));
  } catch (...) {
  }
}

void Distributed::shutdown() {
  if (pg && pg->size() > 1) pg->barrier();
  pg.reset();
  store.reset();
}

}  // namespace lockstep
