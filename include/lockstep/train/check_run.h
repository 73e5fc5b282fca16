// `lockstep check --config FILE`: the consistency-check mode.
//   (a) the communication self-check;
//   (b) K steps of DDP training of the configured model, with every rank's
//       weight digest after every step;
//   (c) a negative control: the same K steps with gradient synchronisation
//       disabled (every backward under no_sync), which must be caught as
//       divergence at step 1 - proof that the check can fail;
//   (d) a summary; passed only when (a) and (b) pass and (c) was caught.
// Faults can be injected into (b) to see what the classic bugs look like.
#pragma once

#include <memory>
#include <string>

#include "lockstep/distributed/process_group.h"
#include "lockstep/train/config.h"

namespace lockstep {

struct CheckRunOptions {
  int64_t steps = 10;
  // "" (none), "lr" (a rank with a 1.5x learning rate), "init" (a rank that
  // re-initialises a layer after DDP was built, unseeded), or
  // "no-buffer-broadcast" (BatchNorm statistics never synchronised).
  std::string fault;
  int fault_rank = -1;  // -1: the last rank
};

struct CheckRunResult {
  bool passed = false;
  std::string summary;  // the report rank 0 prints
};

// Collective. Every rank returns the same verdict.
CheckRunResult check_run(const Config& config, const WorldInfo& world,
                         const std::shared_ptr<ProcessGroup>& pg, const CheckRunOptions& options);

}  // namespace lockstep
