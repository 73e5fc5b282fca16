// Optimizers (SGD with momentum/Nesterov/weight decay, Adam, AdamW) and the
// learning-rate schedule: linear warmup, then constant, step or cosine.
#pragma once

#include <torch/optim/optimizer.h>

#include <memory>
#include <vector>

#include "lockstep/train/config.h"

namespace lockstep {

std::unique_ptr<torch::optim::Optimizer> optimizer_create(const OptimConfig& config,
                                                          const std::vector<at::Tensor>& params);

// The learning rate for optimizer step `step` (0-based) of `total_steps`.
double lr_at(const OptimConfig& config, int64_t step, int64_t total_steps);

void optimizer_set_lr(torch::optim::Optimizer& optimizer, double lr);

}  // namespace lockstep

namespace lockstep {
struct NamedTensor;
// The optimizer's per-parameter state tensors (SGD momentum buffers, Adam's
// moments and step), named "optim <param name>.<field>", in parameter order,
// for fingerprints (check.optimizer_state). Parameters without state yet are
// skipped.
std::vector<NamedTensor> optimizer_state_tensors(
    const torch::optim::Optimizer& optimizer,
    const std::vector<std::pair<std::string, at::Tensor>>& named_params);
}  // namespace lockstep
