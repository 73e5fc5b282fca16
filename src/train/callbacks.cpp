#include "lockstep/train/callbacks.h"

#include <ATen/ATen.h>

#include <map>
#include <utility>

#include "lockstep/util/error.h"

namespace lockstep {
namespace {

std::vector<std::pair<std::string, CallbackFactory>>& callback_registry() {
  static std::vector<std::pair<std::string, CallbackFactory>> registry;
  return registry;
}

std::map<std::string, LossFunction>& loss_registry() {
  static std::map<std::string, LossFunction> registry;
  return registry;
}

}  // namespace

void register_callback(const std::string& name, CallbackFactory factory) {
  if (!factory) throw ConfigError("register_callback('" + name + "'): empty factory");
  for (auto& [n, f] : callback_registry()) {
    if (n == name) {
      f = std::move(factory);  // registered again: replaced, as register_model does
      return;
    }
  }
  callback_registry().emplace_back(name, std::move(factory));
}

std::vector<std::shared_ptr<TrainerCallback>> callbacks_create() {
  std::vector<std::shared_ptr<TrainerCallback>> out;
  for (const auto& [name, factory] : callback_registry()) {
    auto callback = factory();
    if (!callback) throw ConfigError("callback '" + name + "': its factory returned nothing");
    out.push_back(std::move(callback));
  }
  return out;
}

void register_loss(const std::string& name, LossFunction loss) {
  if (!loss) throw ConfigError("register_loss('" + name + "'): empty function");
  if (name == "auto" || name == "cross_entropy" || name == "mse") {
    throw ConfigError("register_loss: '" + name + "' is a built-in loss's name");
  }
  loss_registry()[name] = std::move(loss);
}

LossFunction loss_from_config(const std::string& name, TaskKind task) {
  if (name == "auto") {
    return [task](const at::Tensor& out, const at::Tensor& y) { return loss_for(task, out, y); };
  }
  if (name == "cross_entropy") {
    if (task == TaskKind::kRegression) {
      throw ConfigError("train.loss: cross_entropy needs class labels; this data is regression");
    }
    return [task](const at::Tensor& out, const at::Tensor& y) { return loss_for(task, out, y); };
  }
  if (name == "mse") {
    if (task != TaskKind::kRegression) {
      throw ConfigError("train.loss: mse needs real-valued targets; this data has class labels");
    }
    return [](const at::Tensor& out, const at::Tensor& y) {
      return loss_for(TaskKind::kRegression, out, y);
    };
  }
  const auto it = loss_registry().find(name);
  if (it != loss_registry().end()) return it->second;
  std::string names = "auto, cross_entropy, mse";
  for (const auto& [n, f] : loss_registry()) names += ", " + n;
  throw ConfigError("train.loss: unknown loss '" + name + "' (valid: " + names +
                    "; register_loss adds your own)");
}

}  // namespace lockstep
