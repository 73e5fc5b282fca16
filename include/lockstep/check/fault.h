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
// and, inside step s itself (the s-th optimizer step, 1-based, as the log
// counts), silent corruption of this rank's own computation, once:
//   grad-flip - the largest element of the first local gradient this rank
//               hands to the exchange (DDP's bucket, ZeRO's reduce-scatter)
//   act-flip  - the largest element of this rank's model output (the last
//               activation) in the step's first forward
// with :bit=B the bit flipped (default: the highest mantissa bit of the
// element's type: 22 for float32, 6 for bfloat16, 9 for float16; an
// exponent bit such as 30 for float32 changes the value by orders of
// magnitude). check.grad_screen and check.replay_every catch them.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "lockstep/distributed/world.h"
#include "lockstep/util/names.h"

namespace lockstep {

enum class FaultKind { kCrash, kHang, kExit, kFlip, kGradFlip, kActFlip };
inline constexpr NameTable<FaultKind, 6> kFaultKindNames{{{FaultKind::kCrash, "crash"},
                                                          {FaultKind::kHang, "hang"},
                                                          {FaultKind::kExit, "exit"},
                                                          {FaultKind::kFlip, "flip"},
                                                          {FaultKind::kGradFlip, "grad-flip"},
                                                          {FaultKind::kActFlip, "act-flip"}}};

struct Fault {
  FaultKind kind = FaultKind::kCrash;
  int rank = 0;
  int64_t step = 0;
  int attempt = -1;  // -1: any
  int bit = -1;      // grad-flip, act-flip: -1 the highest mantissa bit
  // grad-flip and act-flip fire inside a step (TrainStep), not between steps.
  bool in_step() const { return kind == FaultKind::kGradFlip || kind == FaultKind::kActFlip; }
};

// Flips bit `bit` (-1: the highest mantissa bit; taken modulo the element's
// width) of the element of `t` of largest magnitude, in place.
void flip_one_element(const at::Tensor& t, int bit);

// nullopt when unset; EnvError naming the variable on a malformed value:
// numbers out of range, and (when world_size > 0) a rank outside the job.
std::optional<Fault> fault_from_env(const EnvLookup& env = env_process(), int world_size = 0);

// Fires `fault` if it is due for this rank, step and attempt; `flip` does a
// flip (given the weight's name for the message).
void fault_maybe_fire(const std::optional<Fault>& fault, const WorldInfo& world, int64_t step,
                      const std::function<std::string()>& flip = nullptr);

}  // namespace lockstep
