// WorldInfo: who this process is in the job, read once from the environment.
//
// Sources, in precedence order (the first one present wins):
//   1. torchrun / lockstep-run: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
//      GROUP_RANK, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE,
//      TORCHELASTIC_RESTART_COUNT
//   2. Slurm (srun): SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID,
//      SLURM_NTASKS_PER_NODE / SLURM_TASKS_PER_NODE
//   3. Open MPI (mpirun): OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE,
//      OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_SIZE
//   4. none of them: a single process, world size 1, no launcher needed.
// With any source, LOCKSTEP_STORE_SECRET is the job's store secret.
// Slurm and Open MPI do not say where rank 0 listens: MASTER_ADDR and
// MASTER_PORT come from the environment for them too (docs/environment.md).
#pragma once

#include "lockstep/util/names.h"

#include <functional>
#include <map>
#include <optional>
#include <string>

namespace lockstep {

enum class WorldSource { kSingle, kTorchrun, kSlurm, kOpenMpi };
inline constexpr NameTable<WorldSource, 4> kWorldSourceNames{
    {{WorldSource::kSingle, "single process"},
     {WorldSource::kTorchrun, "torchrun-style env"},
     {WorldSource::kSlurm, "slurm"},
     {WorldSource::kOpenMpi, "openmpi"}}};

const char* world_source_name(WorldSource source);

struct WorldInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0 only when world_size == 1
  // torchrun's agent hosts the TCPStore; every rank is then a client and
  // prefixes its keys with /worker/attempt_<restart_count>.
  bool use_agent_store = false;
  int restart_count = 0;
  // LOCKSTEP_STORE_SECRET: what a rank presents to rank 0's store before
  // anything else (Note [Job store]); empty when the job has none. Never
  // printed. Not used with torchrun's agent store.
  std::string store_secret;
  WorldSource source = WorldSource::kSingle;

  bool is_single() const { return world_size == 1; }
  std::string describe() const;  // one line, for logs
};

// Looks a variable up; returns nullopt when it is unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

// The process environment (getenv).
EnvLookup env_process();
// A fixed map, for tests.
EnvLookup env_from_map(std::map<std::string, std::string> vars);

// Reads and validates the world. Throws EnvError naming the variable and its
// value on anything malformed or inconsistent.
WorldInfo world_from_env(const EnvLookup& env = env_process());

}  // namespace lockstep
