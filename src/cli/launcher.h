// lockstep-run's engine: start one worker per local rank with torchrun's
// environment contract, relay their output with rank prefixes, and when one
// fails stop the others and say who failed first; leave no process of the
// job behind, however it ends. No LibTorch in here.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace lockstep::launch {

struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;  // 0: pick a free port (single node only)
  int max_restarts = 0;     // restarts of the whole worker group after a failure
  std::string log_dir;      // when set: <log_dir>/attempt_<k>/rank_<r>.log
  double grace_s = 5;       // SIGTERM, then this long, then SIGKILL
  int tail_lines = 20;      // lines of the failed worker shown in the summary
  // Given to every worker as LOCKSTEP_STORE_SECRET (Note [Job store]). From
  // the launcher's environment; made fresh for a single-node job without one;
  // required (the same on every node) for several nodes.
  std::string store_secret;
  // Given to every worker as LOCKSTEP_LAUNCH_ID, after the enclosing ids (Note
  // [Launch id], process_tree.h). launch_run makes a random one when empty.
  std::string launch_id;
  // LOCKSTEP_LAUNCH_ID of the launcher's own environment, when it is itself a
  // worker of another launch.
  std::string enclosing_launch_ids;
  std::vector<std::string> command;
};

// Throws ConfigError naming the flag and value when inconsistent; the
// launcher's own system calls failing (fork, pipe) throw SystemError.
void launch_validate(const LaunchOptions& options);

// Runs the job (with restarts) and returns the launcher's exit code:
// 0 when every worker of the last attempt exited 0; otherwise the first
// failed worker's exit code, or 128+signal when it was killed by a signal or
// the launcher was interrupted. Makes the calling process a child subreaper.
// Whatever the end (success, failure, signal), no process of the launch is
// left: not the workers, not what they started (Note [Leftovers]); and if the
// launcher is killed, its guardian process does it (Note [Guardian]).
int launch_run(const LaunchOptions& options);

// 32 random bytes from the kernel, as 64 hex digits.
std::string launch_make_secret();

// The pure parts of the engine, for tests.

// A worker's environment beyond the launcher's own: torchrun's contract
// (RANK, WORLD_SIZE, LOCAL_RANK, ..., MASTER_ADDR/PORT, TORCHELASTIC_*),
// LOCKSTEP_STORE_SECRET, LOCKSTEP_LINES_TAGGED and LOCKSTEP_LAUNCH_ID, in the
// order they are set.
std::vector<std::pair<std::string, std::string>> worker_environment(const LaunchOptions& options,
                                                                    int rank, int local_rank,
                                                                    int master_port, int attempt);

// Splits a worker's output into lines; output without a newline comes out in
// pieces of at most `max_line` bytes, so memory stays bounded.
class LineSplitter {
 public:
  explicit LineSplitter(std::size_t max_line) : max_line_(max_line) {}
  std::vector<std::string> feed(const char* data, std::size_t size);  // complete lines
  std::vector<std::string> finish();                                  // what is left at EOF
  std::size_t held() const { return partial_.size(); }

 private:
  std::size_t max_line_;
  std::string partial_;
};

// Binds port 0 on all interfaces and returns the port the kernel picked.
int launch_free_port();

}  // namespace lockstep::launch
