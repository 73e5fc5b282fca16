// The state of a run, in its own header: what a checkpoint saves of the
// loop (TrainerState, with the watched metrics) and what a run returns
// (TrainResult). Callbacks, metrics and the checkpointer take it from
// here, not from each other.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "lockstep/io/state_dict.h"
#include "lockstep/optim/optim_config.h"

namespace lockstep {

// A watched validation metric's progress (checkpoint.keep_best,
// train.early_stop): the best value, its step (-1: none yet) and the
// evaluations since without improvement. Saved in state.yaml.
struct MetricWatch {
  double best = 0;
  int64_t best_step = -1;
  int64_t bad = 0;
};

struct TrainerState {
  int64_t step = 0;            // optimizer steps done
  int64_t epoch = 0;           // current epoch
  int64_t batch_in_epoch = 0;  // micro-batches per rank consumed since epoch_offset
  // Positions of this epoch's sample order consumed before the world size
  // last changed (Note [Elastic resume], trainer.cpp); 0: none.
  int64_t epoch_offset = 0;
  int64_t world_size = 1;
  int64_t zero = 0;  // optim.zero of the run that wrote it
  // The writer's data.batch_size, train.accumulation_steps and schedule
  // length (0: unknown, an older checkpoint: the resuming run's are used).
  int64_t batch_size = 0;
  int64_t accumulation_steps = 0;
  int64_t total_steps = 0;  // the schedule's length
  ScheduleFrom schedule_from = ScheduleFrom::kEpochs;
  std::string model;
  // The training split the writer trained on: its size (examples) and
  // data_identity() (0 and empty: unknown, an older checkpoint).
  int64_t data_size = 0;
  std::string data_id;
  std::map<std::string, double> scaler;  // GradScaler::state_dict(); empty: none
  MetricWatch keep_best, early_stop;
};

struct TrainResult {
  int64_t steps = 0;
  double last_loss = 0;  // global mean over the last logging interval
  double val_loss = 0;
  double val_accuracy = 0;   // global, all-reduced counts
  int64_t val_examples = 0;  // 0: the validation split is empty, nothing was measured
  std::string fingerprint;   // final weights' digest (hex)
  std::string run_dir;
  std::string last_checkpoint;
  std::string best_checkpoint;  // checkpoint.keep_best: checkpoints/best, once written
  std::string stopped_early;    // train.early_stop: why the run stopped early ("" if not)
};

}  // namespace lockstep
