// The parts of a run that a checkpoint saves, as Stateful (stateful.h):
// model.pt (the model's state dict), optimizer.pt (whole on rank 0,
// gathered from the owners under ZeRO), rng.pt (every rank's generator, a
// row each) and comm_hook.pt (a stateful hook's per-rank state). The loop's
// own scalars (position, schedule, GradScaler, watched metrics) are
// state.yaml's, from TrainerState.
#pragma once

#include <memory>
#include <vector>

#include "lockstep/checkpoint/run_state.h"
#include "lockstep/checkpoint/stateful.h"
#include "run_parts.h"

namespace lockstep {

// In saving and restoring order. `saved` is the state of the checkpoint
// being restored (its world size says whose rows rng.pt and comm_hook.pt
// hold); `config` seeds the ranks a smaller checkpoint has no row for.
std::vector<std::unique_ptr<Stateful>> run_stateful_parts(RunParts& run, const Config& config,
                                                          ProcessGroup& pg, const WorldInfo& world,
                                                          const TrainerState& saved);

}  // namespace lockstep
