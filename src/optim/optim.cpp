#include "lockstep/optim/optim.h"

#include <torch/optim.h>

#include <algorithm>
#include <cmath>

#include "lockstep/optim/foreach_adam.h"
#include "lockstep/util/error.h"

namespace lockstep {
namespace {

// Adam or AdamW from the config: LibTorch's, or its multi-tensor twin.
template <typename Options, typename Foreach, typename Plain>
std::unique_ptr<torch::optim::Optimizer> adam_family(const OptimConfig& c,
                                                     const std::vector<at::Tensor>& params,
                                                     bool multi_tensor) {
  const auto options =
      Options(c.lr).betas({c.beta1, c.beta2}).eps(c.eps).weight_decay(c.weight_decay);
  if (multi_tensor) return std::make_unique<Foreach>(params, options);
  return std::make_unique<Plain>(params, options);
}

}  // namespace

std::unique_ptr<torch::optim::Optimizer> optimizer_create(const OptimConfig& c,
                                                          const std::vector<at::Tensor>& params,
                                                          std::optional<bool> use_foreach) {
  const bool all_cuda =
      !params.empty() &&
      std::all_of(params.begin(), params.end(), [](const at::Tensor& p) { return p.is_cuda(); });
  const bool multi_tensor = use_foreach.value_or(all_cuda);
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
      return adam_family<torch::optim::AdamOptions, ForeachAdam, torch::optim::Adam>(c, params,
                                                                                     multi_tensor);
    case OptimizerKind::kAdamW:
      return adam_family<torch::optim::AdamWOptions, ForeachAdamW, torch::optim::AdamW>(
          c, params, multi_tensor);
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
    // The last step (total_steps - 1) runs at min_lr: the run ends there.
    const int64_t span = std::max<int64_t>(1, total_steps - 1 - c.warmup_steps);
    const double progress = std::min(1.0, static_cast<double>(after) / static_cast<double>(span));
    return c.min_lr + (c.lr - c.min_lr) * 0.5 * (1.0 + std::cos(M_PI * progress));
  }
  return c.lr;
}

void optimizer_set_lr(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

}  // namespace lockstep

#include <map>
#include <set>

#include "lockstep/util/module_tensors.h"
#include "lockstep/util/torch_compat.h"

namespace lockstep {

std::vector<NamedTensor> optimizer_state_tensors(const torch::optim::Optimizer& optimizer,
                                                 const NamedTensors& named_params) {
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

namespace lockstep {

NamedTensors optimizer_state_dict(const torch::optim::Optimizer& optimizer,
                                  const NamedTensors& named_params) {
  NamedTensors out;
  for (auto& t : optimizer_state_tensors(optimizer, named_params)) {
    at::Tensor value = t.tensor.detach();
    if (t.name.size() > 5 && t.name.compare(t.name.size() - 5, 5, ".step") == 0)
      value = value.reshape({});                // a 0-dim int64, as Python's state dicts hold it
    out.emplace_back(t.name.substr(6), value);  // less "optim "
  }
  return out;
}

namespace {

enum class Family { kSgd, kAdam, kAdamW };

Family family_of(const torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer)) return Family::kSgd;
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer)) return Family::kAdamW;
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer)) return Family::kAdam;
  throw UsageError("optimizer state: only SGD, Adam and AdamW are supported");
}

const char* family_name(Family f) {
  return f == Family::kSgd ? "sgd" : f == Family::kAdam ? "adam" : "adamw";
}

bool field_of(Family f, const std::string& field) {
  if (f == Family::kSgd) return field == "momentum_buffer";
  return field == "exp_avg" || field == "exp_avg_sq" || field == "max_exp_avg_sq" ||
         field == "step";
}

// Adam's and AdamW's states have the same fields.
template <typename State, typename Need, typename Optional>
std::unique_ptr<State> adam_state(const Need& need, const Optional& optional) {
  auto s = std::make_unique<State>();
  s->step(need("step").template item<int64_t>());
  s->exp_avg(need("exp_avg"));
  s->exp_avg_sq(need("exp_avg_sq"));
  s->max_exp_avg_sq(optional("max_exp_avg_sq"));
  return s;
}

}  // namespace

void optimizer_load_state_dict(torch::optim::Optimizer& optimizer, const NamedTensors& named_params,
                               const NamedTensors& state, const std::vector<std::string>& elsewhere,
                               const std::string& source) {
  const Family family = family_of(optimizer);
  std::map<std::string, at::Tensor> params(named_params.begin(), named_params.end());
  const std::set<std::string> other(elsewhere.begin(), elsewhere.end());
  std::map<std::string, std::map<std::string, at::Tensor>> fields;  // by parameter
  for (const auto& [key, value] : state) {
    const auto dot = key.rfind('.');
    const std::string name = dot == std::string::npos ? "" : key.substr(0, dot);
    const std::string field = dot == std::string::npos ? key : key.substr(dot + 1);
    const bool here = params.count(name) != 0;
    if (!here && other.count(name) == 0)
      throw DataError(source + ": '" + key + "' names no parameter of this model");
    if (!field_of(family, field)) {
      throw DataError(source + ": '" + key + "' is not state of optim.name " + family_name(family) +
                      " (state of another optimizer?)");
    }
    if (!value.defined() || !value.device().is_cpu() || value.is_sparse())
      throw DataError(source + ": '" + key + "' is not a dense CPU tensor");
    if (field == "step") {
      if (value.scalar_type() != at::kLong || value.numel() != 1 || value.item<int64_t>() < 0)
        throw DataError(source + ": '" + key + "' must be one int64 >= 0");
    } else if (here) {
      const at::Tensor& p = params.at(name);
      if (value.sizes() != p.sizes() || value.scalar_type() != p.scalar_type()) {
        throw DataError(source + ": '" + key + "' has shape " + c10::str(value.sizes()) + " " +
                        c10::toString(value.scalar_type()) + ", the parameter " +
                        c10::str(p.sizes()) + " " + c10::toString(p.scalar_type()));
      }
    }
    if (here) fields[name][field] = value;
  }
  auto& states = optimizer.state();
  for (const auto& [name, f] : fields) {
    const at::Tensor& p = params.at(name);
    auto need = [&](const char* field) {
      auto it = f.find(field);
      if (it == f.end())
        throw DataError(source + ": '" + name + "' has optimizer state but no '" + field + "'");
      return it->second.to(p.device()).clone();
    };
    auto optional = [&](const char* field) {
      auto it = f.find(field);
      return it == f.end() ? at::Tensor() : it->second.to(p.device()).clone();
    };
    const auto key = optimizer_state_key(optimizer, p);
    if (family == Family::kSgd) {
      auto s = std::make_unique<torch::optim::SGDParamState>();
      s->momentum_buffer(need("momentum_buffer"));
      states[key] = std::move(s);
    } else if (family == Family::kAdam) {
      states[key] = adam_state<torch::optim::AdamParamState>(need, optional);
    } else {
      states[key] = adam_state<torch::optim::AdamWParamState>(need, optional);
    }
  }
}

}  // namespace lockstep
