// `lockstep`: the program. Dispatches to one subcommand per file (cmd_*.cpp).
#include <cstdio>
#include <cstring>
#include <string>

#include "common.h"
#include "lockstep/dist/process_group.h"
#include "lockstep/dist/rendezvous.h"
#include "lockstep/util/error.h"
#include "lockstep/util/log.h"

namespace lockstep::cli {

namespace {
constexpr const char* kUsage =
    "usage: lockstep <command> [options]\n"
    "\n"
    "commands:\n"
    "  check    consistency checks (--comm: the communication self-check)\n"
    "  train    a training run from a YAML config (--config FILE [--set section.key=value ...])\n"
    "  bench    benchmarks (ddp: ms/step with and without DistributedDataParallel)\n"
    "\n"
    "Run under lockstep-run, torchrun --no-python, srun or mpirun for several ranks;\n"
    "with no launcher it runs as a single process. 'lockstep <command> --help' for options.\n";
}  // namespace

void add_dist_options(cxxopts::Options& options) {
  // clang-format off
  options.add_options("distributed")
      ("backend", "process group backend: gloo | nccl | mpi (mpi: under mpirun, LibTorch built with MPI)", cxxopts::value<std::string>()->default_value("gloo"))
      ("timeout-s", "seconds before a collective that a peer misses fails", cxxopts::value<double>()->default_value("300"))
      ("rdzv-timeout-s", "seconds to reach the store and for every rank to arrive", cxxopts::value<double>()->default_value("300"))
      ("log-level", "trace|debug|info|warn|error (default: LOCKSTEP_LOG_LEVEL or info)", cxxopts::value<std::string>()->default_value(""));
  // clang-format on
}

namespace {
std::chrono::milliseconds positive_seconds(double s, const std::string& name) {
  if (!(s > 0)) throw ConfigError(name + "=" + std::to_string(s) + " must be > 0");
  return std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
}
}  // namespace

Dist dist_setup(const std::string& backend, double timeout_s, double rdzv_timeout_s,
                const std::string& log_level) {
  Dist dist;
  // Logging first with rank 0's tag would mislabel errors: read the world,
  // then start logging, even if the world read fails (rank unknown: -1).
  try {
    dist.world = world_from_env();
  } catch (const Error&) {
    log_init(-1, log_level);
    throw;
  }
  log_init(dist.world.rank, log_level);
  spdlog::info("lockstep: {}", dist.world.describe());
  ProcessGroupOptions pg_options;
  pg_options.backend = backend_kind_parse(backend);
  pg_options.timeout = positive_seconds(timeout_s, "timeout");
  RendezvousOptions rdzv;
  rdzv.timeout = positive_seconds(rdzv_timeout_s, "rendezvous timeout");
  const auto store = rendezvous_connect(dist.world, rdzv);
  dist.pg = ProcessGroup::create(store, dist.world, pg_options);
  return dist;
}

Dist dist_setup(const cxxopts::ParseResult& args) {
  return dist_setup(args["backend"].as<std::string>(), args["timeout-s"].as<double>(),
                    args["rdzv-timeout-s"].as<double>(), args["log-level"].as<std::string>());
}

int run_guarded(const std::string& command, const std::function<int()>& body) {
  auto report = [&](const char* kind, const std::string& what) {
    if (spdlog::default_logger()->name() == "lockstep") {
      spdlog::error("lockstep {}: {}{}", command, kind, what);
    } else {
      std::fprintf(stderr, "lockstep %s: %s%s\n", command.c_str(), kind, what.c_str());
    }
  };
  try {
    return body();
  } catch (const cxxopts::exceptions::exception& e) {
    report("bad option: ", e.what());
    return kExitBadInput;
  } catch (const ConfigError& e) {
    report("", e.what());
    return kExitBadInput;
  } catch (const Interrupted& e) {
    report("", e.what());
    return 128 + e.signal;
  } catch (const DataError& e) {
    report("bad data: ", e.what());
    return kExitBadInput;
  } catch (const ConsistencyError& e) {
    report("consistency check failed: ", e.what());
    return kExitCheckFailed;
  } catch (const EnvError& e) {
    report("bad environment: ", e.what());
    return kExitBadInput;
  } catch (const CommError& e) {
    report("communication failed: ", e.what());
    return kExitCommFailed;
  } catch (const std::exception& e) {
    report("internal error: ", what_of(e));
    return kExitInternal;
  }
}

}  // namespace lockstep::cli

int main(int argc, char** argv) {
  using namespace lockstep::cli;
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? kExitBadInput : kExitOk;
  }
  const std::string command = argv[1];
  if (command == "check") return cmd_check(argc - 1, argv + 1);
  if (command == "bench") return cmd_bench(argc - 1, argv + 1);
  if (command == "train") return cmd_train(argc - 1, argv + 1);
  std::fprintf(stderr, "lockstep: unknown command '%s' (valid: train, check, bench)\n%s",
               command.c_str(), kUsage);
  return kExitBadInput;
}
