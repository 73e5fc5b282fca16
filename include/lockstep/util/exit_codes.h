// Exit codes of lockstep's programs (README.md, docs/launcher.md) and the one
// place that maps lockstep's exceptions to them. Only a main() calls
// run_guarded: the `lockstep` program and train_main().
#pragma once

#include <functional>
#include <string>

namespace lockstep {

constexpr int kExitOk = 0;
constexpr int kExitCheckFailed = 1;  // a consistency check failed, or training diverged
constexpr int kExitBadInput = 2;     // option, environment, config, data
constexpr int kExitCommFailed = 3;   // unreachable peer, timeout, dead or hung rank
constexpr int kExitInternal = 4;     // our own bug
constexpr int kExitOutOfMemory = 5;  // an allocation failed (a memory limit, a full machine)
constexpr int kExitCorruption = 6;   // a rank computed a wrong gradient (silent data corruption)
// 128 + N: stopped by signal N (after a final checkpoint, checkpoint.on_signal).

// Runs `body` and returns its code; a lockstep exception (or a bad option)
// becomes one line on stderr, "lockstep <command>: ...", and its exit code.
int run_guarded(const std::string& command, const std::function<int()>& body);

}  // namespace lockstep
