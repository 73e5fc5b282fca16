// ProcessGroup construction: the backend factory (Gloo here, NCCL and MPI in
// files of their own) and the name tables. The collectives themselves are in collectives.cpp.
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <spdlog/spdlog.h>

#include <cstdlib>
#include <sstream>

#include "hier_backend.h"
#include "lockstep/distributed/process_group.h"
#include "lockstep/distributed/shm_backend.h"
#include "lockstep/util/error.h"

namespace lockstep {
namespace {

ShmOptions shm_options_of(const ProcessGroupOptions& options) {
  ShmOptions shm;
  shm.chunk_bytes = options.shm_chunk_bytes;
  shm.timeout = options.timeout;
  return shm;
}

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

Ptr<C10dBackend> gloo_backend_create(const Ptr<C10dStore>& store, const WorldInfo& world,
                                     std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupGloo::Options::create();
  options->timeout = timeout;
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  if (ifname != nullptr && *ifname != '\0') {
    std::stringstream names(ifname);
    std::string name;
    while (std::getline(names, name, ',')) {
      try {
        options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(name));
      } catch (const std::exception& e) {
        throw ConfigError("GLOO_SOCKET_IFNAME='" + std::string(ifname) + "': interface '" + name +
                          "' cannot be used: " + what_of(e));
      }
    }
  } else if (is_loopback(world.master_addr)) {
    // Every rank is on this host: loopback needs no hostname resolution.
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  } else {
    options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, world.rank, world.world_size, options);
}

// Whether the ranks sit host by host with the same number on each:
// rank = node * local size + local rank (what torchrun, lockstep-run, srun's
// block distribution and mpirun's by-slot mapping give). Every rank calls it.
bool uniform_layout(C10dStore& store, const WorldInfo& world, std::chrono::milliseconds timeout) {
  const int local = world.local_world_size;
  const std::string mine =
      std::to_string(local) + "," + std::to_string(world.rank % local == world.local_rank);
  store.set("layout/" + std::to_string(world.rank), std::vector<uint8_t>(mine.begin(), mine.end()));
  std::vector<std::string> keys;
  for (int r = 0; r < world.world_size; ++r) keys.push_back("layout/" + std::to_string(r));
  store.wait(keys, timeout);
  for (const auto& key : keys) {
    const auto v = store.get(key);
    if (std::string(v.begin(), v.end()) != std::to_string(local) + ",1") return false;
  }
  return world.world_size % local == 0;
}

Ptr<C10dBackend> hier_backend_create(const Ptr<C10dStore>& store, const WorldInfo& world,
                                     const ProcessGroupOptions& options) {
  const int local = world.local_world_size;
  if (!uniform_layout(*store, world, options.timeout)) {
    throw ConfigError(
        "dist.backend: hierarchical needs the same number of ranks on every host, numbered host "
        "by host (rank = node x LOCAL_WORLD_SIZE + LOCAL_RANK); use gloo");
  }
  const int node = world.rank / local, nodes = world.world_size / local;
  WorldInfo host = world;
  host.rank = world.local_rank;
  host.world_size = local;
  auto inside = shm_backend_create(
      c10::make_intrusive<c10d::PrefixStore>("host" + std::to_string(node), store), host,
      shm_options_of(options));
  Ptr<C10dBackend> leaders;
  if (world.local_rank == 0) {
    WorldInfo among = world;
    among.rank = node;
    among.world_size = nodes;
    among.local_rank = 0;
    among.local_world_size = 1;
    leaders = gloo_backend_create(c10::make_intrusive<c10d::PrefixStore>("leaders", store), among,
                                  options.timeout);
  }
  return hier_backend_make(inside, leaders, world, nodes);
}

}  // namespace

const char* backend_kind_name(BackendKind kind) {
  return name_of(kBackendKindNames, kind);
}

const char* reduce_kind_name(ReduceKind kind) {
  return name_of(kReduceKindNames, kind);
}

std::shared_ptr<ProcessGroup> ProcessGroup::create(const Ptr<C10dStore>& store,
                                                   const WorldInfo& world,
                                                   const ProcessGroupOptions& options) {
  // A private prefix keeps the backend's keys apart from rendezvous keys and
  // from any other group created on the same store.
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>("lockstep/pg/" + options.name, store);
  Ptr<C10dBackend> backend;
  BackendKind kind = options.backend;
  try {
    if (kind == BackendKind::kAuto) {
      kind = BackendKind::kGloo;
      if (world.world_size > 1 && all_ranks_on_one_host(*prefixed, world, options.timeout)) {
        kind = BackendKind::kShm;
      } else if (world.world_size > world.local_world_size && world.local_world_size > 1 &&
                 uniform_layout(*prefixed, world, options.timeout)) {
        kind = BackendKind::kHier;
      }
      if (world.rank == 0 && world.world_size > 1) {
        spdlog::info("process group: auto chose {} ({} ranks, {})", backend_kind_name(kind),
                     world.world_size,
                     kind == BackendKind::kShm    ? "all on this host"
                     : kind == BackendKind::kHier ? "shm inside each host, gloo between hosts"
                                                  : "on several hosts");
      }
    }
    switch (kind) {
      case BackendKind::kAuto:
        break;  // resolved above
      case BackendKind::kShm: {
        backend = shm_backend_create(prefixed, world, shm_options_of(options));
        break;
      }
      case BackendKind::kHier:
        backend = hier_backend_create(prefixed, world, options);
        break;
      case BackendKind::kGloo:
        backend = gloo_backend_create(prefixed, world, options.timeout);
        break;
      case BackendKind::kNccl:
        backend = nccl_backend_create(prefixed, world.rank, world.world_size, options.timeout);
        break;
      case BackendKind::kMpi:
        backend = mpi_backend_create(world);
        break;
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw CommError("rank " + std::to_string(world.rank) + ": creating the " +
                    backend_kind_name(kind) + " process group (world size " +
                    std::to_string(world.world_size) + ") failed: " + what_of(e));
  }
  spdlog::debug("process group: {} over {} ranks, timeout {} ms", backend_kind_name(kind),
                world.world_size, options.timeout.count());
  auto pg =
      std::make_shared<ProcessGroup>(backend, kind, world.rank, world.world_size, world.local_rank);
  pg->enable_roll_call(
      prefixed, std::min<std::chrono::milliseconds>(options.timeout, std::chrono::seconds(5)));
  const char* debug = std::getenv("LOCKSTEP_DEBUG_COLLECTIVES");
  if (debug != nullptr && std::string(debug) == "1") {
    pg->enable_collective_check(prefixed, options.timeout);
    spdlog::warn("LOCKSTEP_DEBUG_COLLECTIVES=1: every collective is checked across ranks (slow)");
  }
  return pg;
}

ProcessGroup::ProcessGroup(Ptr<C10dBackend> backend, BackendKind kind, int rank, int size,
                           int local_rank)
    : backend_(std::move(backend)),
      kind_(kind),
      rank_(rank),
      size_(size),
      local_rank_(local_rank) {}

ProcessGroup::~ProcessGroup() {
  if (kind_ != BackendKind::kNccl || !backend_) return;
  try {
    nccl_backend_shutdown(*backend_);
  } catch (const std::exception& e) {
    spdlog::warn("process group: NCCL shutdown: {}", what_of(e));
  }
}

at::Device ProcessGroup::device() const {
  return kind_ == BackendKind::kNccl ? at::Device(at::kCUDA, local_rank_) : at::Device(at::kCPU);
}

}  // namespace lockstep
