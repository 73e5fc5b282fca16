// Pieces every `lockstep` subcommand shares: the distributed options, the
// lifecycle world -> logging -> rendezvous -> process group, and the mapping
// from exceptions to exit codes (only main() turns exceptions into codes).
#pragma once

#include <cxxopts.hpp>

#include <memory>
#include <string>

#include "lockstep/dist/process_group.h"
#include "lockstep/dist/world.h"

namespace lockstep::cli {

// Exit codes, documented in README.md and docs/launcher.md.
constexpr int kExitOk = 0;
constexpr int kExitCheckFailed = 1;
constexpr int kExitBadInput = 2;
constexpr int kExitCommFailed = 3;
constexpr int kExitInternal = 4;

void add_dist_options(cxxopts::Options& options);

struct Dist {
  WorldInfo world;
  std::shared_ptr<ProcessGroup> pg;
};

// Reads the world, sets up rank-tagged logging, meets the peers and creates
// the process group, as the parsed options say.
Dist dist_setup(const cxxopts::ParseResult& args);

// The same from explicit values (lockstep train takes them from its config).
Dist dist_setup(const std::string& backend, double timeout_s, double rdzv_timeout_s,
                const std::string& log_level);

// Runs `body`, turning lockstep's exceptions into a message on stderr and an
// exit code.
int run_guarded(const std::string& command, const std::function<int()>& body);

int cmd_check(int argc, char** argv);
int cmd_bench(int argc, char** argv);
int cmd_train(int argc, char** argv);
int bench_allreduce(const cxxopts::ParseResult& args);

}  // namespace lockstep::cli
