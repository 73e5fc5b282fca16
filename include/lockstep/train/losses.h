// Losses by name (train.loss): the built-ins through one NameTable, and
// the ones a program registers.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>

#include "lockstep/train/recipe.h"
#include "lockstep/util/names.h"

namespace lockstep {

// auto: the task's own (cross-entropy, MSE, next-token cross-entropy).
enum class BuiltinLoss { kAuto, kCrossEntropy, kMse };
inline constexpr NameTable<BuiltinLoss, 3> kBuiltinLossNames{
    {{BuiltinLoss::kAuto, "auto"},
     {BuiltinLoss::kCrossEntropy, "cross_entropy"},
     {BuiltinLoss::kMse, "mse"}}};

// (output, target) -> the mean loss over the batch, a scalar.
using LossFunction = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)>;
// ConfigError for an empty function or a built-in's name; registered
// again: replaced.
void register_loss(const std::string& name, LossFunction loss);
// train.loss: a built-in or a registered name; ConfigError listing the
// names otherwise, or when the built-in does not fit the task.
LossFunction loss_from_config(const std::string& name, TaskKind task);

}  // namespace lockstep
