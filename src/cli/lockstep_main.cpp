// `lockstep`: the program. Dispatches to one subcommand per file (cmd_*.cpp).
#include <cstdio>
#include <cstring>
#include <string>

#include "common.h"
#include "lockstep/distributed/init.h"
#include "lockstep/util/allocator.h"
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
    "  eval     a checkpoint's validation loss/accuracy/perplexity as JSON (--checkpoint PATH)\n"
    "  export   a checkpoint's weights as safetensors (--checkpoint PATH --out DIR [--layout "
    "hf|lockstep])\n"
    "  generate sample from a GPT checkpoint (--checkpoint PATH --prompt TEXT)\n"
    "  tokenize text files to GPT-2 BPE token files (INPUT... --out DIR)\n"
    "  checkpoint  consolidate DIR --out OUT (a sharded checkpoint as model.pt/optimizer.pt), "
    "info DIR\n"
    "\n"
    "Run under lockstep-run, torchrun --no-python (Debian 12's torchrun also needs\n"
    "-r 0:1 -t 0:1), srun or mpirun for several ranks;\n"
    "with no launcher it runs as a single process. 'lockstep <command> --help' for options.\n";
}  // namespace

void add_dist_options(cxxopts::Options& options) {
  // clang-format off
  options.add_options("distributed")
      ("backend", "process group backend: auto | gloo | shm | hierarchical | nccl | mpi (auto: shm on one host, hierarchical across hosts with as many ranks each, else gloo; mpi: under mpirun, LibTorch built with MPI)", cxxopts::value<std::string>()->default_value("auto"))
      ("timeout-s", "seconds before a collective that a peer misses fails", cxxopts::value<double>()->default_value(std::to_string(kCollectiveTimeout.count())))
      ("rdzv-timeout-s", "seconds to reach the store and for every rank to arrive", cxxopts::value<double>()->default_value(std::to_string(kRendezvousTimeout.count())))
      ("log-level", "trace|debug|info|warn|error (default: LOCKSTEP_LOG_LEVEL or info)", cxxopts::value<std::string>()->default_value(""));
  // clang-format on
}

Dist dist_setup(const cxxopts::ParseResult& args) {
  InitOptions options;
  options.backend = parse_named(kBackendKindNames, args["backend"].as<std::string>(), "--backend");
  options.timeout = timeout_from_seconds(args["timeout-s"].as<double>(), "--timeout-s");
  options.rendezvous_timeout =
      timeout_from_seconds(args["rdzv-timeout-s"].as<double>(), "--rdzv-timeout-s");
  options.log_level = args["log-level"].as<std::string>();
  return init_distributed(options);
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
  tune_allocator();  // Note [Allocator tuning]: before any tensor exists
  if (command == "check") return cmd_check(argc - 1, argv + 1);
  if (command == "bench") return cmd_bench(argc - 1, argv + 1);
  if (command == "train") return lockstep::train_main(argc - 1, argv + 1);
  if (command == "generate") return cmd_generate(argc - 1, argv + 1);
  if (command == "eval") return cmd_eval(argc - 1, argv + 1);
  if (command == "export") return cmd_export(argc - 1, argv + 1);
  if (command == "tokenize") return cmd_tokenize(argc - 1, argv + 1);
  if (command == "checkpoint") return cmd_checkpoint(argc - 1, argv + 1);
  std::fprintf(stderr,
               "lockstep: unknown command '%s' (valid: train, check, bench, eval, export, "
               "generate, tokenize, checkpoint)\n%s",
               command.c_str(), kUsage);
  return kExitBadInput;
}
