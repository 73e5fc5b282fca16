// `lockstep`: the program. Dispatches to one subcommand per file (cmd_*.cpp).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

#include "common.h"
#include "lockstep/distributed/init.h"
#include "lockstep/util/allocator.h"
#include "lockstep/util/error.h"

namespace lockstep::cli {

namespace {

// The subcommands, once: the usage text, the dispatch and the message for
// an unknown one are all made from this table.
struct Command {
  const char* name;
  const char* summary;
  int (*run)(int argc, char** argv);
};
const Command kCommands[] = {
    {"check", "consistency checks (--comm: the communication self-check)", cmd_check},
    {"train", "a training run from a YAML config (--config FILE [--set section.key=value ...])",
     lockstep::train_main},
    {"bench", "benchmarks (ddp: ms/step with and without DistributedDataParallel)", cmd_bench},
    {"eval", "a checkpoint's validation loss/accuracy/perplexity as JSON (--checkpoint PATH)",
     cmd_eval},
    {"export",
     "a checkpoint's weights as safetensors (--checkpoint PATH --out DIR [--layout hf|lockstep])",
     cmd_export},
    {"generate", "sample from a GPT checkpoint (--checkpoint PATH --prompt TEXT)", cmd_generate},
    {"tokenize", "text files to GPT-2 BPE token files (INPUT... --out DIR)", cmd_tokenize},
    {"checkpoint",
     "consolidate DIR --out OUT (a sharded checkpoint as model.pt/optimizer.pt), info DIR",
     cmd_checkpoint},
};

std::string usage() {
  std::string text = "usage: lockstep <command> [options]\n\ncommands:\n";
  for (const Command& c : kCommands) {
    std::string name = c.name;
    name.resize(std::max<size_t>(name.size() + 1, 9), ' ');
    text += "  " + name + c.summary + "\n";
  }
  return text +
         "\n"
         "Run under lockstep-run, torchrun --no-python (Debian 12's torchrun also needs\n"
         "-r 0:1 -t 0:1), srun or mpirun for several ranks;\n"
         "with no launcher it runs as a single process. 'lockstep <command> --help' for options.\n";
}

std::string command_names() {
  std::string names;
  for (const Command& c : kCommands) names += (names.empty() ? "" : ", ") + std::string(c.name);
  return names;
}

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
    std::fputs(usage().c_str(), argc < 2 ? stderr : stdout);
    return argc < 2 ? kExitBadInput : kExitOk;
  }
  const std::string command = argv[1];
  tune_allocator();  // Note [Allocator tuning]: before any tensor exists
  for (const Command& c : kCommands)
    if (command == c.name) return c.run(argc - 1, argv + 1);
  std::fprintf(stderr, "lockstep: unknown command '%s' (valid: %s)\n%s", command.c_str(),
               command_names().c_str(), usage().c_str());
  return kExitBadInput;
}
