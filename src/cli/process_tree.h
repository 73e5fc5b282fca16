// A launch's process tree: finding every process a launch started, however
// far it wandered (setsid, double fork), signalling it without ever hitting a
// process that merely reused its pid, stopping what the workers left behind,
// and the guardian that does it when the launcher itself is SIGKILLed.
// Linux only (/proc, pidfd). No LibTorch.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lockstep::launch {

// Note [Launch id]: every lockstep-run makes a random id and gives it to each
// worker as LOCKSTEP_LAUNCH_ID; whatever a worker starts inherits it, setsid'd
// daemons and double forks included. So "the processes of this launch" are
// the ones whose /proc/<pid>/environ carries the id, plus the launcher's own
// children (it is a child subreaper: orphans of the tree come to it, even
// those that cleared their environment). Under a launcher that is itself a
// worker of another one, the variable holds the enclosing ids first,
// ':'-separated, so the outer launch still finds the inner one's workers.
// A process that both clears its environment and stays a child of a live
// process outside the launcher is not found: it has left the job on purpose.

// One process found by tree_scan.
struct TreeProcess {
  pid_t pid = 0;
  pid_t pgrp = 0;
  unsigned long long start_ticks = 0;  // since boot: tells it from a later process with its pid
  std::string name;                    // its comm, as ps shows it
  bool carries_id = false;             // its environment holds the launch id (else: our child)
};

// Whether `env_block` (NUL-separated NAME=VALUE, as /proc/<pid>/environ holds
// it) sets LOCKSTEP_LAUNCH_ID with `launch_id` among its ':'-separated ids.
bool environ_carries_launch_id(std::string_view env_block, std::string_view launch_id);

// The live processes of the launch `launch_id` (Note [Launch id]): those that
// carry it and the caller's own children; never the caller, `spare`, nor
// zombies (reaping those is their parent's business). Reads at most 1 MiB of
// each process's environment.
std::vector<TreeProcess> tree_scan(const std::string& launch_id, pid_t spare);

// Sends `sig` to `process` if it is still the one the scan found (same pid
// and start time). Through a pidfd where the kernel has them, so that the
// check and the signal concern the same process even if its pid is freed and
// reused in between. Returns whether it was signalled.
bool tree_signal(const TreeProcess& process, int sig);

// "4242 (sleep), 4250 (python3)", at most `most` of them, then "...".
std::string tree_describe(const std::vector<TreeProcess>& processes, std::size_t most = 5);

// Note [Leftovers]: what a launch's workers leave behind (daemons, orphans)
// once every worker has ended. Each is sent SIGTERM once; after the grace
// period all that is left get SIGKILL, again at each step until none is
// found; 5 s later the sweep gives up on what even SIGKILL did not end (a
// process stuck in the kernel). The caller reaps its adopted children between
// steps, and calls step() every few tens of milliseconds.
class LeftoverSweep {
 public:
  using Clock = std::chrono::steady_clock;
  LeftoverSweep(std::string launch_id, pid_t spare, double grace_s)
      : launch_id_(std::move(launch_id)), spare_(spare), grace_s_(grace_s) {}

  // Scans and signals. Returns what to tell the user ("" when nothing new).
  std::string step(Clock::time_point now);
  bool done() const { return done_; }

 private:
  std::string launch_id_;
  pid_t spare_;
  double grace_s_;
  bool done_ = false;
  bool killing_ = false;
  Clock::time_point kill_at_ = Clock::time_point::max();
  Clock::time_point give_up_at_ = Clock::time_point::max();
  std::set<std::pair<pid_t, unsigned long long>> terminated_;  // sent SIGTERM already
};

// Note [Guardian]: workers get PDEATHSIG, but what they spawn does not, and a
// SIGKILLed launcher runs no code of its own. So a small guardian process,
// forked before any worker, holds the read end of a pipe on which the
// launcher writes the process group of each worker of the current attempt
// when it starts (watch) and again when it has ended (forget), BEFORE reaping
// it: until then the worker's zombie holds its pid, so no other process can
// get that number as a pid or a group id while the guardian still lists it.
// When the launcher dies, for whatever reason, the kernel closes the write
// end; the guardian reads EOF and, in rounds until none is found, SIGKILLs
// every process of the launch (Note [Launch id]), each through a pidfd, and
// the live groups it was told of, each only once a process that carries the
// launch id was found in it: that process proves the group is still ours (a
// group id cannot be reused while the group has members), so a group that
// another process got after pid reuse is never signalled. On a normal exit
// the launcher writes 0 first and the guardian leaves quietly; if the
// launcher fails with an exception, the Guardian's destructor closes the pipe
// without the 0, so the guardian cleans up as for a kill -9.
class Guardian {
 public:
  explicit Guardian(const std::string& launch_id);  // forks the guardian process
  ~Guardian();  // without release(): the guardian kills the launch's processes
  Guardian(const Guardian&) = delete;
  Guardian& operator=(const Guardian&) = delete;

  void watch(pid_t group) { send(static_cast<int32_t>(group)); }
  void forget(pid_t group) { send(-static_cast<int32_t>(group)); }
  pid_t pid() const { return pid_; }
  // The guardian process ended on its own and the launcher reaped it.
  void lost() { pid_ = -1; }
  // A normal end: the guardian exits without killing anything. Waits at
  // most 5 s for it, then kills it (a stopped or stuck guardian).
  void release();

 private:
  void send(int32_t value);
  [[noreturn]] static void watch_loop(int fd, const std::string& launch_id);

  pid_t pid_ = -1;
  int fd_ = -1;
};

}  // namespace lockstep::launch
