#include "lockstep/optim/foreach_adam.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cmath>
#include <memory>
#include <tuple>
#include <vector>

#include "lockstep/util/error.h"
#include "lockstep/util/torch_compat.h"

namespace lockstep {
namespace {

// One group's step (Note [Foreach optimizers]). kDecoupled: AdamW's weight
// decay on the weights; else Adam's L2 term added to the gradients.
template <bool kDecoupled, typename State, typename Options, typename Optimizer>
void foreach_group_step(Optimizer& optimizer, torch::optim::OptimizerParamGroup& group) {
  const auto& options = static_cast<const Options&>(group.options());
  const double lr = options.lr();
  const double beta1 = std::get<0>(options.betas());
  const double beta2 = std::get<1>(options.betas());
  const double weight_decay = options.weight_decay();
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs;
  std::vector<at::Scalar> bias_correction2_sqrt, neg_step_size;
  auto& states = optimizer.state();
  for (const auto& p : group.params()) {  // before any state changes
    if (p.grad().defined() && p.grad().is_sparse())
      throw UsageError("Adam and AdamW do not support sparse gradients");
  }
  for (auto& p : group.params()) {
    if (!p.grad().defined()) continue;
    const auto key = optimizer_state_key(optimizer, p);
    if (states.find(key) == states.end()) {
      auto state = std::make_unique<State>();
      state->step(0);
      state->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
      state->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
      states[key] = std::move(state);
    }
    auto& state = static_cast<State&>(*states[key]);
    state.step(state.step() + 1);
    const double bias_correction1 = 1 - std::pow(beta1, state.step());
    const double bias_correction2 = 1 - std::pow(beta2, state.step());
    bias_correction2_sqrt.emplace_back(std::sqrt(bias_correction2));
    neg_step_size.emplace_back(-(lr / bias_correction1));
    params.push_back(p);
    grads.push_back(p.grad());
    exp_avgs.push_back(state.exp_avg());
    exp_avg_sqs.push_back(state.exp_avg_sq());
  }
  if (params.empty()) return;
  if (weight_decay != 0) {
    if constexpr (kDecoupled) {
      at::_foreach_mul_(params, 1 - lr * weight_decay);
    } else {
      grads = at::_foreach_add(grads, params, weight_decay);
    }
  }
  at::_foreach_mul_(exp_avgs, beta1);
  at::_foreach_add_(exp_avgs, grads, 1 - beta1);
  at::_foreach_mul_(exp_avg_sqs, beta2);
  at::_foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2);
  auto denoms = at::_foreach_sqrt(exp_avg_sqs);
  at::_foreach_div_(denoms, bias_correction2_sqrt);
  at::_foreach_add_(denoms, options.eps());
  at::_foreach_addcdiv_(params, exp_avgs, denoms, neg_step_size);
}

template <bool kDecoupled, typename State, typename Options, typename Optimizer>
at::Tensor foreach_step(Optimizer& optimizer, torch::optim::Optimizer::LossClosure& closure) {
  torch::NoGradGuard no_grad;
  at::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : optimizer.param_groups())
    foreach_group_step<kDecoupled, State, Options>(optimizer, group);
  return loss;
}

template <typename Options, typename Optimizer>
bool any_amsgrad(Optimizer& optimizer) {
  for (auto& group : optimizer.param_groups())
    if (static_cast<const Options&>(group.options()).amsgrad()) return true;
  return false;
}

}  // namespace

at::Tensor ForeachAdam::step(LossClosure closure) {
  if (any_amsgrad<torch::optim::AdamOptions>(*this)) return torch::optim::Adam::step(closure);
  return foreach_step<false, torch::optim::AdamParamState, torch::optim::AdamOptions>(*this,
                                                                                      closure);
}

at::Tensor ForeachAdamW::step(LossClosure closure) {
  if (any_amsgrad<torch::optim::AdamWOptions>(*this)) return torch::optim::AdamW::step(closure);
  return foreach_step<true, torch::optim::AdamWParamState, torch::optim::AdamWOptions>(*this,
                                                                                       closure);
}

}  // namespace lockstep
