// Fault injection for the failure-mode tests and for seeing what a failure
// looks like: LOCKSTEP_FAULT=<kind>:rank=<r>:step=<s>[:attempt=<a>] makes
// rank r, once it has finished s optimizer steps (and any checkpoint due at
// s), in restart attempt a (TORCHELASTIC_RESTART_COUNT; default: every
// attempt):
//   crash - SIGKILL itself (a segfault or the OOM killer, as peers see it)
//   hang  - SIGSTOP itself (stuck: alive but silent)
//   exit  - exit with code 7 (a bug that ends the process)
//   flip  - flip a high mantissa bit of the first weight this rank holds (under
//           optim.zero 3 its own shard), and train on (a memory error)
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "lockstep/distributed/world.h"
#include "lockstep/util/names.h"

namespace lockstep {

enum class FaultKind { kCrash, kHang, kExit, kFlip };
inline constexpr NameTable<FaultKind, 4> kFaultKindNames{{{FaultKind::kCrash, "crash"},
                                                          {FaultKind::kHang, "hang"},
                                                          {FaultKind::kExit, "exit"},
                                                          {FaultKind::kFlip, "flip"}}};

struct Fault {
  FaultKind kind = FaultKind::kCrash;
  int rank = 0;
  int64_t step = 0;
  int attempt = -1;  // -1: any
};

// nullopt when unset; EnvError naming the variable on a malformed value:
// numbers out of range, and (when world_size > 0) a rank outside the job.
std::optional<Fault> fault_from_env(const EnvLookup& env = env_process(), int world_size = 0);

// Fires `fault` if it is due for this rank, step and attempt; `flip` does a
// flip (given the weight's name for the message).
void fault_maybe_fire(const std::optional<Fault>& fault, const WorldInfo& world, int64_t step,
                      const std::function<std::string()>& flip = nullptr);

}  // namespace lockstep
