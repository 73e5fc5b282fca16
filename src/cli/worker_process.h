// Starting one worker process: fork and exec with the discipline a launcher
// with threads needs. No LibTorch.
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

namespace lockstep::launch {

// Forks and execs `command` (searched in PATH) with the launcher's environment
// plus `env` (whose values win), its stdout and stderr on `out_fd` and
// `err_fd`, in a process group of its own (so that stopping it also stops
// what it spawned) and SIGKILLed by the kernel if the launcher dies
// (PDEATHSIG). Returns its pid once the group exists.
//   Everything the child needs is built before the fork: the child of a
// process with threads (the output queue's writers) may only make
// async-signal-safe calls, as another thread may hold the allocator's or
// stdio's lock at the instant of the fork. Signals stay blocked across the
// fork until the child has dropped the launcher's handlers: a SIGTERM sent to
// a worker that has not exec'd yet must kill it, not run our handler in its
// copy of the launcher. A program that cannot be executed exits 127 after
// "lockstep-run: cannot execute 'PROG': <reason>" on its stderr.
// `keep_fd` >= 0: a descriptor the program keeps open at its number
// (lockstep-run's progress pipe); every other one of ours is close-on-exec.
// Throws SystemError when fork fails.
pid_t worker_spawn(const std::vector<std::string>& command,
                   const std::vector<std::pair<std::string, std::string>>& env, int out_fd,
                   int err_fd, int keep_fd = -1);

}  // namespace lockstep::launch
