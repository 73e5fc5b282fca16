#include "lockstep/train/optim.h"

#include <torch/optim.h>

#include <cmath>

#include "lockstep/util/error.h"

namespace lockstep {

std::unique_ptr<torch::optim::Optimizer> optimizer_create(const OptimConfig& c,
                                                          const std::vector<at::Tensor>& params) {
  switch (c.name) {
    case OptimizerKind::kSgd:
      if (c.nesterov && c.momentum <= 0) {
        throw ConfigError("optim.nesterov needs optim.momentum > 0 (it is " +
                          std::to_string(c.momentum) + ")");
      }
      return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(c.lr)
                                                             .momentum(c.momentum)
                                                             .nesterov(c.nesterov)
                                                             .weight_decay(c.weight_decay));
    case OptimizerKind::kAdam:
      return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(c.lr)
                                                              .betas({c.beta1, c.beta2})
                                                              .eps(c.eps)
                                                              .weight_decay(c.weight_decay));
    case OptimizerKind::kAdamW:
      return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(c.lr)
                                                               .betas({c.beta1, c.beta2})
                                                               .eps(c.eps)
                                                               .weight_decay(c.weight_decay));
  }
  throw std::logic_error("optimizer_create: an OptimizerKind outside its name table");
}

double lr_at(const OptimConfig& c, int64_t step, int64_t total_steps) {
  if (step < c.warmup_steps) {
    return c.lr * static_cast<double>(step + 1) / static_cast<double>(c.warmup_steps);
  }
  const int64_t after = step - c.warmup_steps;
  if (c.schedule == Schedule::kStep) {
    return c.lr * std::pow(c.gamma, static_cast<double>(after / c.step_size));
  }
  if (c.schedule == Schedule::kCosine) {
    const int64_t span = std::max<int64_t>(1, total_steps - c.warmup_steps);
    const double progress = std::min(1.0, static_cast<double>(after) / static_cast<double>(span));
    return c.min_lr + (c.lr - c.min_lr) * 0.5 * (1.0 + std::cos(M_PI * progress));
  }
  return c.lr;
}

void optimizer_set_lr(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

}  // namespace lockstep

#include "lockstep/check/fingerprint.h"
#include "lockstep/distributed/torch_compat.h"

namespace lockstep {

std::vector<NamedTensor> optimizer_state_tensors(
    const torch::optim::Optimizer& optimizer,
    const std::vector<std::pair<std::string, at::Tensor>>& named_params) {
  std::vector<NamedTensor> out;
  const auto& state = optimizer.state();
  for (const auto& [name, param] : named_params) {
    // LibTorch keys optimizer state by the parameter's TensorImpl address.
    auto it = state.find(optimizer_state_key(optimizer, param));
    if (it == state.end()) continue;
    const auto* s = it->second.get();
    auto add = [&](const std::string& field, const at::Tensor& t) {
      if (t.defined()) out.push_back({"optim " + name + "." + field, t});
    };
    if (const auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(s)) {
      add("momentum_buffer", sgd->momentum_buffer());
    } else if (const auto* adam = dynamic_cast<const torch::optim::AdamParamState*>(s)) {
      add("exp_avg", adam->exp_avg());
      add("exp_avg_sq", adam->exp_avg_sq());
      add("max_exp_avg_sq", adam->max_exp_avg_sq());
      add("step", at::tensor({adam->step()}, at::kLong));
    } else if (const auto* adamw = dynamic_cast<const torch::optim::AdamWParamState*>(s)) {
      add("exp_avg", adamw->exp_avg());
      add("exp_avg_sq", adamw->exp_avg_sq());
      add("max_exp_avg_sq", adamw->max_exp_avg_sq());
      add("step", at::tensor({adamw->step()}, at::kLong));
    }
  }
  return out;
}

}  // namespace lockstep
