// Trainer: a configured DDP training run. The constructor reads as the
// lifecycle: config validated and compared across ranks -> run directory ->
// data -> model (init_from) -> optimizer -> checkpoint resume -> DDP (built on
// the resumed weights) -> each rank's generator seeded (fresh runs). What a
// config makes comes from the recipe (train/recipe.h), reports go through
// src/train/metrics.h, signals through src/train/stop_signals.h. run() is the loop:
// epochs of sharded micro-batches, accumulation with no_sync, clipping after
// synchronisation, optimizer step, per-step consistency check, metrics,
// checkpoints, evaluation each epoch.
#pragma once

#include <memory>
#include <string>

#include "lockstep/checkpoint/run_state.h"
#include "lockstep/config/config.h"
#include "lockstep/data/dataset.h"
#include "lockstep/ddp/ddp.h"
#include "lockstep/distributed/process_group.h"

namespace lockstep {

class Trainer {
 public:
  Trainer(Config config, WorldInfo world, std::shared_ptr<ProcessGroup> pg);
  ~Trainer();
  TrainResult run();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lockstep
