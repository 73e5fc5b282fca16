// `lockstep-run`: a torchrun-style launcher (see launcher.h, docs/launcher.md).
//
// Options come before the program; the first argument that is not an option
// (or everything after "--") is the program and its arguments, which are
// passed through untouched. torchrun's underscore spellings
// (--nproc_per_node) are accepted too.
#include <cxxopts.hpp>

#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "launcher.h"
#include "lockstep/util/error.h"

using lockstep::launch::LaunchOptions;

namespace {

cxxopts::Options make_parser() {
  cxxopts::Options options("lockstep-run",
                           "Start N workers per node with torchrun's environment contract.");
  options.custom_help("[OPTION...] PROGRAM [ARGS...]");
  // clang-format off
  options.add_options()
      ("nproc-per-node", "workers on this node", cxxopts::value<int>()->default_value("1"))
      ("nnodes", "number of nodes", cxxopts::value<int>()->default_value("1"))
      ("node-rank", "this node's index in [0, nnodes)", cxxopts::value<int>()->default_value("0"))
      ("master-addr", "address of the node that hosts rank 0", cxxopts::value<std::string>()->default_value("127.0.0.1"))
      ("master-port", "port of rank 0's store; 0 picks a free one (single node)", cxxopts::value<int>()->default_value("29500"))
      ("max-restarts", "restart the whole worker group up to K times after a failure", cxxopts::value<int>()->default_value("0"))
      ("log-dir", "also write each worker's output to DIR/attempt_<k>/rank_<r>.log", cxxopts::value<std::string>()->default_value(""))
      ("grace-s", "seconds between SIGTERM and SIGKILL when stopping workers", cxxopts::value<double>()->default_value("5"))
      ("h,help", "this help");
  // clang-format on
  return options;
}

// Index of the first argument that belongs to the program.
size_t split_at_program(int argc, char** argv, std::vector<std::string>& own) {
  const std::set<std::string> flags{"help", "h"};
  own.push_back(argv[0]);
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") return static_cast<size_t>(i + 1);
    if (arg.size() < 2 || arg[0] != '-') return static_cast<size_t>(i);
    std::string name = arg.substr(arg.find_first_not_of('-'));
    const auto eq = name.find('=');
    for (size_t k = 0; k < std::min(eq, name.size()); ++k) {
      if (name[k] == '_') name[k] = '-';
    }
    own.push_back(std::string(arg[1] == '-' ? "--" : "-") + name);
    if (eq == std::string::npos && flags.count(name) == 0 && i + 1 < argc) own.push_back(argv[++i]);
  }
  return static_cast<size_t>(argc);
}

}  // namespace

int main(int argc, char** argv) {
  auto parser = make_parser();
  try {
    std::vector<std::string> own;
    const size_t program = split_at_program(argc, argv, own);
    std::vector<char*> own_argv;
    for (auto& arg : own) own_argv.push_back(arg.data());
    const auto args = parser.parse(static_cast<int>(own_argv.size()), own_argv.data());
    if (args.count("help") != 0) {
      std::fputs(parser.help().c_str(), stdout);
      return 0;
    }
    LaunchOptions options;
    options.nproc_per_node = args["nproc-per-node"].as<int>();
    options.nnodes = args["nnodes"].as<int>();
    options.node_rank = args["node-rank"].as<int>();
    options.master_addr = args["master-addr"].as<std::string>();
    options.master_port = args["master-port"].as<int>();
    options.max_restarts = args["max-restarts"].as<int>();
    options.log_dir = args["log-dir"].as<std::string>();
    options.grace_s = args["grace-s"].as<double>();
    for (int i = static_cast<int>(program); i < argc; ++i) options.command.push_back(argv[i]);
    // The workers check its form (16-256 printable characters).
    if (const char* secret = std::getenv("LOCKSTEP_STORE_SECRET"); secret && *secret) {
      options.store_secret = secret;
    } else if (options.nnodes == 1) {
      options.store_secret = lockstep::launch::launch_make_secret();
    }
    // Under another launcher: its workers' processes carry its id too, so that
    // it still finds ours (Note [Launch id], process_tree.h).
    if (const char* outer = std::getenv("LOCKSTEP_LAUNCH_ID"); outer && *outer) {
      options.enclosing_launch_ids = outer;
    }
    return lockstep::launch::launch_run(options);
  } catch (const cxxopts::exceptions::exception& e) {
    std::fprintf(stderr, "lockstep-run: bad option: %s (see --help)\n", e.what());
    return 2;
  } catch (const lockstep::ConfigError& e) {
    std::fprintf(stderr, "lockstep-run: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lockstep-run: error: %s\n", e.what());
    return 1;
  }
}
