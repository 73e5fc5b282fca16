// Code of one's own inside `lockstep train`, registered next to
// register_model (model/models.h) before train_main:
//   register_callback("name", factory): hooks at the run's start, each
//     step's end, each evaluation's end, each checkpoint, the run's end;
//   register_loss("name", fn): a loss selected by train.loss: name.
// examples/custom_model/trainer.cpp shows both.
//
// Contract: callbacks run on every rank, on the training thread, in the
// order registered; the trainer's state they see is the same on every rank
// (step, epoch, the all-reduced validation metrics). A callback that throws
// stops the run on its rank (its peers then fail in their next collective):
// raise the same error on every rank. Registration is not thread-safe
// against a running trainer.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/checkpoint/run_state.h"
#include "lockstep/train/losses.h"  // register_loss, here since it was declared here first
#include "lockstep/train/recipe.h"
#include "lockstep/train/step.h"

namespace lockstep {

struct CallbackContext {
  int rank = 0;
  int world_size = 1;
  std::string run_dir;
};

class TrainerCallback {
 public:
  virtual ~TrainerCallback() = default;
  virtual void on_train_start(const CallbackContext& context, const TrainerState& state) {}
  // `stats`: this rank's step (loss and hit counts as tensors, timings).
  virtual void on_step_end(const TrainerState& state, const StepStats& stats) {}
  // The all-reduced result: the same on every rank.
  virtual void on_evaluation_end(const TrainerState& state, const TrainResult& result) {}
  // After a checkpoint was written and verified agreed (rank 0 wrote it).
  virtual void on_checkpoint(const TrainerState& state, const std::string& folder) {}
  virtual void on_train_end(const TrainerState& state, const TrainResult& result) {}
};

using CallbackFactory = std::function<std::shared_ptr<TrainerCallback>()>;
// Every run creates one callback from each factory registered, in order.
void register_callback(const std::string& name, CallbackFactory factory);
std::vector<std::shared_ptr<TrainerCallback>> callbacks_create();

}  // namespace lockstep
