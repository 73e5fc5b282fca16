// The run assembly shared by `lockstep train` (trainer.cpp) and
// `lockstep check --config` (check_run.cpp): what a config makes of the
// model, the precision, the optimizer (ZeRO or not), DDP with its comm hook
// and the one step with its hooks (Note [One run assembly]).
#pragma once

#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>

#include "lockstep/config/config.h"
#include "lockstep/ddp/comm_hooks.h"
#include "lockstep/train/precision.h"
#include "lockstep/train/recipe.h"
#include "lockstep/train/step.h"
#include "lockstep/zero/fully_shard.h"
#include "lockstep/zero/zero.h"

namespace lockstep {

struct RunParts {
  std::shared_ptr<Classifier> model;
  at::Device device{at::kCPU};
  std::unique_ptr<MixedPrecision> precision;  // train.precision: autocast, the GradScaler
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  ZeroOptimizer* zero = nullptr;  // `optimizer`, when optim.zero is 1, 2 or 3
  // optim.zero 3: the weights, each on its owner, gathered per unit.
  std::shared_ptr<FullyShardedParameters> sharded;
  std::shared_ptr<CommHook> comm_hook;  // ddp.comm_hook's (nullptr: plain all-reduce)
  std::unique_ptr<ClassifierDdp> ddp;
  std::unique_ptr<TrainStep> step;
};

// 1. The model fitted to the data (seeded, or model.init_from) on its
//    device (train.device), and the precision.
void run_build_model(RunParts& run, const Config& config, const WorldInfo& world,
                     const std::shared_ptr<ProcessGroup>& pg, const TrainData& data);
// 2. The optimizer over the model's trainable parameters (DDP's list and
//    order): a ZeroOptimizer for optim.zero 1 or 2.
void run_build_optimizer(RunParts& run, const Config& config,
                         const std::shared_ptr<ProcessGroup>& pg);
// 3. DDP (with ZeRO-2's reduce-scatter as its comm hook, else ddp.comm_hook;
//    under ZeRO-3 without a Reducer, and the weights then sharded),
//    then the step with `options` and the precision's and ZeRO-2's hooks.
//    Between 2 and 3 the trainer resumes (the optimizer's state, the
//    hook's state once DDP exists).
void run_build_ddp(RunParts& run, const Config& config, const std::shared_ptr<ProcessGroup>& pg);
// Runs `fn` with every weight whole on every rank (collective under
// optim.zero 3, where it gathers them and frees them again after; just
// `fn` otherwise): state dicts, weight checks and loads.
void with_whole_weights(RunParts& run, const std::function<void()>& fn);
// 4. The step with `options`, its hooks set by what the config asks for
//    (plug_step_hooks: Note [What each option plugs into the step]).
void run_build_step(RunParts& run, const Config& config, ProcessGroup& pg, TaskKind task,
                    StepOptions options);
void plug_step_hooks(RunParts& run, const Config& config, ProcessGroup& pg);

}  // namespace lockstep
