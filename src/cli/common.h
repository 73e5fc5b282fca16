// Pieces every `lockstep` subcommand shares: the distributed options and the
// set-up from them (lockstep::init_distributed). The mapping from exceptions
// to exit codes is the library's (util/exit_codes.h), used by main() only.
#pragma once

#include <cxxopts.hpp>

#include <memory>
#include <string>

#include "command_line.h"  // src/train: -h/--help, --config, --set
#include "lockstep/cli/train_main.h"
#include "lockstep/distributed/init.h"
#include "lockstep/util/exit_codes.h"

namespace lockstep::cli {

void add_dist_options(cxxopts::Options& options);

using Dist = lockstep::Distributed;

// Reads the world, sets up rank-tagged logging, meets the peers and creates
// the process group, as the parsed options say.
Dist dist_setup(const cxxopts::ParseResult& args);

int cmd_check(int argc, char** argv);
int cmd_bench(int argc, char** argv);
int cmd_generate(int argc, char** argv);
int cmd_eval(int argc, char** argv);
int cmd_export(int argc, char** argv);
int cmd_tokenize(int argc, char** argv);
int cmd_checkpoint(int argc, char** argv);
int bench_allreduce(const cxxopts::ParseResult& args);

}  // namespace lockstep::cli
