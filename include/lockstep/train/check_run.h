// `lockstep check --config FILE`: the consistency-check mode.
//   (a) the communication self-check;
//   (b) K steps of DDP training of the configured model through the
//       trainer's own step (train/step.h: accumulation, clipping, the
//       schedule), with every rank's weight digest after every step; the
//       weights equal those of `lockstep train` with train.max_steps=K;
//   (c) a negative control: the same K steps with gradient synchronisation
//       disabled (every backward under no_sync), which must be caught as
//       divergence at step 1 - proof that the check can fail;
//   (d) a summary; passed only when (a) and (b) pass and (c) was caught.
// Faults can be injected into (b) to see what the classic bugs look like.
#pragma once

#include <memory>
#include <string>

#include "lockstep/config/config.h"
#include "lockstep/distributed/process_group.h"
#include "lockstep/util/names.h"

namespace lockstep {

// The classic bugs the check mode can inject into (b): a rank with a 1.5x
// learning rate, a rank that re-initialises a layer after DDP was built
// (unseeded), BatchNorm statistics never synchronised.
// grad-flip and act-flip: silent corruption of the fault rank's own
// computation at step 2 (check/fault.h), which the weights cannot show; (b)
// runs with check.replay_every 1 and must catch it.
enum class CheckFault { kNone, kLr, kInit, kNoBufferBroadcast, kGradFlip, kActFlip };
inline constexpr NameTable<CheckFault, 6> kCheckFaultNames{
    {{CheckFault::kNone, "none"},
     {CheckFault::kLr, "lr"},
     {CheckFault::kInit, "init"},
     {CheckFault::kNoBufferBroadcast, "no-buffer-broadcast"},
     {CheckFault::kGradFlip, "grad-flip"},
     {CheckFault::kActFlip, "act-flip"}}};

struct CheckRunOptions {
  int64_t steps = 10;
  CheckFault fault = CheckFault::kNone;
  int fault_rank = -1;  // -1: the last rank
};

struct CheckRunResult {
  bool passed = false;
  std::string summary;      // the report rank 0 prints
  std::string fingerprint;  // (b)'s final weights, as TrainResult::fingerprint
};

// Collective. Every rank returns the same verdict.
CheckRunResult check_run(const Config& config, const WorldInfo& world,
                         const std::shared_ptr<ProcessGroup>& pg, const CheckRunOptions& options);

}  // namespace lockstep
