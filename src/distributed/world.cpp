#include "lockstep/distributed/world.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <sstream>
#include <vector>

#include "lockstep/util/error.h"

namespace lockstep {
namespace {

// Strict integer parse: the whole value must be a base-10 integer in range.
int parse_int(const std::string& name, const std::string& value, long lo, long hi) {
  errno = 0;
  char* end = nullptr;
  const long parsed = std::strtol(value.c_str(), &end, 10);
  const bool starts_well = !value.empty() && (std::isdigit(static_cast<unsigned char>(value[0])) ||
                                              (value[0] == '-' && value.size() > 1));
  if (!starts_well || *end != '\0' || errno == ERANGE) {
    throw EnvError(name + "='" + value + "' is not an integer");
  }
  if (parsed < lo || parsed > hi) {
    throw EnvError(name + "=" + value + " is out of range [" + std::to_string(lo) + ", " +
                   std::to_string(hi) + "]");
  }
  return static_cast<int>(parsed);
}

struct Reader {
  const EnvLookup& env;

  bool has(const std::string& name) const { return env(name).has_value(); }

  std::string required(const std::string& name, const std::string& why) const {
    auto value = env(name);
    if (!value || value->empty()) throw EnvError(name + " is not set (" + why + ")");
    return *value;
  }
  int required_int(const std::string& name, const std::string& why, long lo, long hi) const {
    return parse_int(name, required(name, why), lo, hi);
  }
  int optional_int(const std::string& name, int fallback, long lo, long hi) const {
    auto value = env(name);
    return value && !value->empty() ? parse_int(name, *value, lo, hi) : fallback;
  }
  bool optional_bool(const std::string& name, bool fallback) const {
    auto value = env(name);
    if (!value || value->empty()) return fallback;
    if (*value == "True" || *value == "true" || *value == "1") return true;
    if (*value == "False" || *value == "false" || *value == "0") return false;
    throw EnvError(name + "='" + *value + "' is not a boolean (True/False, true/false, 1/0)");
  }
};

constexpr long kMaxWorld = 1 << 20;

// SLURM_TASKS_PER_NODE looks like "2(x3),1": 2 tasks on each of 3 nodes, then
// 1. Returns the count for node `node`.
int slurm_tasks_on_node(const std::string& spec, int node) {
  std::vector<int> per_node;
  std::stringstream items(spec);
  std::string item;
  while (std::getline(items, item, ',')) {
    const auto paren = item.find("(x");
    const int count = parse_int("SLURM_TASKS_PER_NODE", item.substr(0, paren), 1, kMaxWorld);
    int repeat = 1;
    if (paren != std::string::npos) {
      if (item.back() != ')') throw EnvError("SLURM_TASKS_PER_NODE='" + spec + "' is malformed");
      repeat = parse_int("SLURM_TASKS_PER_NODE", item.substr(paren + 2, item.size() - paren - 3), 1,
                         kMaxWorld);
    }
    per_node.insert(per_node.end(), repeat, count);
  }
  if (node >= static_cast<int>(per_node.size())) {
    throw EnvError("SLURM_TASKS_PER_NODE='" + spec +
                   "' has no entry for SLURM_NODEID=" + std::to_string(node));
  }
  return per_node[node];
}

void read_master(const Reader& r, WorldInfo& w) {
  if (w.world_size == 1) {
    w.master_addr = r.env("MASTER_ADDR").value_or("127.0.0.1");
    w.master_port = r.optional_int("MASTER_PORT", 0, 0, 65535);
    return;
  }
  const std::string why = "needed when WORLD_SIZE=" + std::to_string(w.world_size) +
                          " > 1: where rank 0 hosts the rendezvous store";
  w.master_addr = r.required("MASTER_ADDR", why);
  w.master_port = r.required_int("MASTER_PORT", why, 1, 65535);
}

// The job's store secret: 16-256 printable ASCII characters. Errors never
// echo the value.
void read_secret(const Reader& r, WorldInfo& w) {
  const auto secret = r.env("LOCKSTEP_STORE_SECRET");
  if (!secret) return;
  const bool printable =
      std::all_of(secret->begin(), secret->end(), [](char c) { return c > ' ' && c < 127; });
  if (secret->size() < 16 || secret->size() > 256 || !printable) {
    throw EnvError(
        "LOCKSTEP_STORE_SECRET must be 16 to 256 printable characters without spaces (it has " +
        std::to_string(secret->size()) + (printable ? "" : ", some not printable") +
        "); e.g. export LOCKSTEP_STORE_SECRET=$(openssl rand -hex 32)");
  }
  w.store_secret = *secret;
}

// What a launcher names its variables: the world size and rank (required
// together: `why`), and its local ones (optional: one node holds every rank).
struct LauncherVariables {
  WorldSource source;
  const char* why;
  const char* world_size;
  const char* rank;
  const char* local_world_size;
  const char* local_rank;
};

WorldInfo read_launcher(const Reader& r, const LauncherVariables& v) {
  WorldInfo w;
  w.source = v.source;
  w.world_size = r.required_int(v.world_size, v.why, 1, kMaxWorld);
  w.rank = r.required_int(v.rank, v.why, 0, kMaxWorld);
  w.local_world_size = r.optional_int(v.local_world_size, w.world_size, 1, kMaxWorld);
  w.local_rank = r.optional_int(v.local_rank, w.rank, 0, kMaxWorld);
  return w;
}

WorldInfo read_torchrun(const Reader& r) {
  // Hand-set environments (RANK/WORLD_SIZE only, as for PyTorch's env://)
  // describe one node holding every rank.
  WorldInfo w =
      read_launcher(r, {WorldSource::kTorchrun,
                        "torchrun's variables are present: RANK and WORLD_SIZE go together",
                        "WORLD_SIZE", "RANK", "LOCAL_WORLD_SIZE", "LOCAL_RANK"});
  w.node_rank = r.optional_int("GROUP_RANK", 0, 0, kMaxWorld);
  w.use_agent_store = r.optional_bool("TORCHELASTIC_USE_AGENT_STORE", false);
  w.restart_count = r.optional_int("TORCHELASTIC_RESTART_COUNT", 0, 0, kMaxWorld);
  return w;
}

WorldInfo read_slurm(const Reader& r) {
  WorldInfo w;
  w.source = WorldSource::kSlurm;
  const std::string why = "SLURM_PROCID is set: srun sets both";
  w.world_size = r.required_int("SLURM_NTASKS", why, 1, kMaxWorld);
  w.rank = r.required_int("SLURM_PROCID", why, 0, kMaxWorld);
  w.local_rank = r.optional_int("SLURM_LOCALID", w.rank, 0, kMaxWorld);
  w.node_rank = r.optional_int("SLURM_NODEID", 0, 0, kMaxWorld);
  if (r.has("SLURM_NTASKS_PER_NODE")) {
    w.local_world_size = r.required_int("SLURM_NTASKS_PER_NODE", "", 1, kMaxWorld);
  } else if (r.has("SLURM_TASKS_PER_NODE")) {
    w.local_world_size = slurm_tasks_on_node(*r.env("SLURM_TASKS_PER_NODE"), w.node_rank);
  } else {
    w.local_world_size = w.world_size;
  }
  return w;
}

WorldInfo read_openmpi(const Reader& r) {
  WorldInfo w =
      read_launcher(r, {WorldSource::kOpenMpi, "OMPI_COMM_WORLD_RANK is set: mpirun sets both",
                        "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
                        "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"});
  // Open MPI names no node index; with its default by-slot mapping the ranks
  // of one node are contiguous, so this is exact for uniform nodes.
  w.node_rank = w.rank / w.local_world_size;
  return w;
}

void validate(const WorldInfo& w, const char* rank_var, const char* local_var) {
  if (w.rank >= w.world_size) {
    throw EnvError(std::string(rank_var) + "=" + std::to_string(w.rank) +
                   " must be smaller than the world size " + std::to_string(w.world_size));
  }
  if (w.local_world_size > w.world_size) {
    throw EnvError("local world size " + std::to_string(w.local_world_size) +
                   " exceeds the world size " + std::to_string(w.world_size));
  }
  if (w.local_rank >= w.local_world_size) {
    throw EnvError(std::string(local_var) + "=" + std::to_string(w.local_rank) +
                   " must be smaller than the local world size " +
                   std::to_string(w.local_world_size));
  }
}

}  // namespace

const char* world_source_name(WorldSource source) {
  return name_of(kWorldSourceNames, source);
}

std::string WorldInfo::describe() const {
  std::ostringstream out;
  out << "rank " << rank << "/" << world_size << " (local " << local_rank << "/" << local_world_size
      << ", node " << node_rank << ") from " << world_source_name(source);
  if (world_size > 1) {
    out << ", master " << master_addr << ":" << master_port
        << (use_agent_store ? " (agent store, attempt " + std::to_string(restart_count) + ")" : "");
  }
  return out.str();
}

EnvLookup env_process() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

EnvLookup env_from_map(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

WorldInfo world_from_env(const EnvLookup& env) {
  const Reader r{env};
  WorldInfo w;
  if (r.has("RANK") || r.has("WORLD_SIZE")) {
    w = read_torchrun(r);
    validate(w, "RANK", "LOCAL_RANK");
  } else if (r.has("SLURM_PROCID")) {
    w = read_slurm(r);
    validate(w, "SLURM_PROCID", "SLURM_LOCALID");
  } else if (r.has("OMPI_COMM_WORLD_RANK")) {
    w = read_openmpi(r);
    validate(w, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK");
  }
  read_master(r, w);
  read_secret(r, w);
  return w;
}

}  // namespace lockstep
