// Optimizers (SGD with momentum/Nesterov/weight decay, Adam, AdamW) and the
// learning-rate schedule: linear warmup, then constant, step or cosine.
#pragma once

#include <torch/optim/optimizer.h>

#include <memory>
#include <optional>
#include <vector>

#include "lockstep/optim/optim_config.h"
#include "lockstep/util/module_tensors.h"

namespace lockstep {

// `use_foreach`, as PyTorch's foreach: Adam and AdamW step with multi-tensor kernels
// (ForeachAdam, ForeachAdamW: Note [Foreach optimizers]); unset, when every
// parameter is on a GPU, as PyTorch defaults. SGD steps per parameter.
std::unique_ptr<torch::optim::Optimizer> optimizer_create(
    const OptimConfig& config, const std::vector<at::Tensor>& params,
    std::optional<bool> use_foreach = std::nullopt);

// The learning rate for optimizer step `step` (0-based) of `total_steps`:
// a cosine reaches min_lr at the last one (step total_steps - 1) and stays.
double lr_at(const OptimConfig& config, int64_t step, int64_t total_steps);

void optimizer_set_lr(torch::optim::Optimizer& optimizer, double lr);

}  // namespace lockstep

namespace lockstep {
// The optimizer's per-parameter state tensors (SGD momentum buffers, Adam's
// moments and step), named "optim <param name>.<field>", in parameter order,
// for fingerprints (check.optimizer_state). Parameters without state yet are
// skipped.
std::vector<NamedTensor> optimizer_state_tensors(const torch::optim::Optimizer& optimizer,
                                                 const NamedTensors& named_params);
}  // namespace lockstep

namespace lockstep {
// The optimizer's state as a state dict that torch.load reads and that does
// not depend on how many ranks held it: "<param name>.<field>" for every
// parameter with state, fields momentum_buffer (SGD), exp_avg, exp_avg_sq,
// max_exp_avg_sq, step (Adam, AdamW; step a 0-dim int64). Parameters without
// state yet have no entries.
NamedTensors optimizer_state_dict(const torch::optim::Optimizer& optimizer,
                                  const NamedTensors& named_params);
// Sets the state of `named_params` from `state` (what optimizer_state_dict
// wrote, with any number of ranks and any optim.zero). Entries of parameters
// in `elsewhere` (held by another rank) are checked by name and skipped.
// Throws DataError naming `source` and the entry for an unknown parameter or
// field, a field of another optimizer, a wrong shape or dtype, a negative
// step, or a parameter with some of its fields missing.
void optimizer_load_state_dict(torch::optim::Optimizer& optimizer, const NamedTensors& named_params,
                               const NamedTensors& state, const std::vector<std::string>& elsewhere,
                               const std::string& source);
}  // namespace lockstep
