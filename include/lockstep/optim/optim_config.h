// The optimizer section of a run's configuration (optim.*): the optimizer
// and schedule names with their tables, and the plain-data section, the
// one home of its defaults (train/config.h's field table reads them).
#pragma once

#include <cstdint>

#include "lockstep/util/names.h"

namespace lockstep {

// The GradScaler's defaults (PyTorch's), one home: GradScalerOptions and
// train.loss_scale / train.loss_scale_growth_interval take them from here.
inline constexpr double kLossScaleDefault = 65536.0;  // 2^16
inline constexpr int64_t kLossScaleGrowthIntervalDefault = 2000;

enum class OptimizerKind { kSgd, kAdam, kAdamW };
inline constexpr NameTable<OptimizerKind, 3> kOptimizerKindNames{
    {{OptimizerKind::kSgd, "sgd"},
     {OptimizerKind::kAdam, "adam"},
     {OptimizerKind::kAdamW, "adamw"}}};
enum class Schedule { kConstant, kStep, kCosine };
inline constexpr NameTable<Schedule, 3> kScheduleNames{
    {{Schedule::kConstant, "constant"}, {Schedule::kStep, "step"}, {Schedule::kCosine, "cosine"}}};

// Where a run's schedule length came from (saved in state.yaml: a resume
// keeps a length the config chose unless it chooses again).
enum class ScheduleFrom { kEpochs, kMaxSteps, kDecaySteps };
inline constexpr NameTable<ScheduleFrom, 3> kScheduleFromNames{
    {{ScheduleFrom::kEpochs, "epochs"},
     {ScheduleFrom::kMaxSteps, "max_steps"},
     {ScheduleFrom::kDecaySteps, "decay_steps"}}};

struct OptimConfig {
  OptimizerKind name = OptimizerKind::kSgd;
  double lr = 0.1;
  double momentum = 0.9;
  bool nesterov = false;
  double weight_decay = 0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  Schedule schedule = Schedule::kConstant;
  int64_t warmup_steps = 0;
  int64_t step_size = 100;
  double gamma = 0.1;
  double min_lr = 0;
  // The schedule's length (nanoGPT's lr_decay_iters); 0: train.max_steps
  // when set, else the epochs' steps (Note [Schedule length], recipe.cpp).
  int64_t decay_steps = 0;
  int64_t zero = 0;  // ZeRO stage: 0 none, 1 optimizer state, 2 and gradients (optim/zero.h)
};

}  // namespace lockstep
