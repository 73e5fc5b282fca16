// `lockstep`: the program. Dispatches to one subcommand per file (cmd_*.cpp).
#include <cstdio>
#include <cstring>
#include <string>

#include "common.h"
#include "lockstep/distributed/init.h"
#include "lockstep/util/error.h"

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
      ("backend", "process group backend: auto | gloo | shm | hierarchical | nccl | mpi (auto: shm on one host, hierarchical across hosts with as many ranks each, else gloo; mpi: under mpirun, LibTorch built with MPI)", cxxopts::value<std::string>()->default_value("auto"))
      ("timeout-s", "seconds before a collective that a peer misses fails", cxxopts::value<double>()->default_value("300"))
      ("rdzv-timeout-s", "seconds to reach the store and for every rank to arrive", cxxopts::value<double>()->default_value("300"))
      ("log-level", "trace|debug|info|warn|error (default: LOCKSTEP_LOG_LEVEL or info)", cxxopts::value<std::string>()->default_value(""));
  // clang-format on
}

Dist dist_setup(const std::string& backend, double timeout_s, double rdzv_timeout_s,
                const std::string& log_level, double shm_chunk_mb) {
  InitOptions options;
  options.backend = backend_kind_parse(backend);
  options.shm_chunk_bytes = static_cast<std::size_t>(shm_chunk_mb * (1 << 20)) / 64 * 64;
  options.timeout = timeout_from_seconds(timeout_s, "timeout");
  options.rendezvous_timeout = timeout_from_seconds(rdzv_timeout_s, "rendezvous timeout");
  options.log_level = log_level;
  return init_distributed(options);
}

Dist dist_setup(const cxxopts::ParseResult& args) {
  return dist_setup(args["backend"].as<std::string>(), args["timeout-s"].as<double>(),
                    args["rdzv-timeout-s"].as<double>(), args["log-level"].as<std::string>());
}

}  // namespace lockstep::cli

int main(int argc, char** argv) {
  using namespace lockstep;
  using namespace lockstep::cli;
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? kExitBadInput : kExitOk;
  }
  const std::string command = argv[1];
  if (command == "check") return cmd_check(argc - 1, argv + 1);
  if (command == "bench") return cmd_bench(argc - 1, argv + 1);
  if (command == "train") return lockstep::train_main(argc - 1, argv + 1);
  std::fprintf(stderr, "lockstep: unknown command '%s' (valid: train, check, bench)\n%s",
               command.c_str(), kUsage);
  return kExitBadInput;
}
