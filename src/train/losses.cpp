#include "lockstep/train/losses.h"

#include <ATen/ATen.h>

#include <map>
#include <utility>

#include "lockstep/util/error.h"

namespace lockstep {
namespace {

std::map<std::string, LossFunction>& loss_registry() {
  static std::map<std::string, LossFunction> registry;
  return registry;
}

}  // namespace

void register_loss(const std::string& name, LossFunction loss) {
  if (!loss) throw ConfigError("register_loss('" + name + "'): empty function");
  if (value_named(kBuiltinLossNames, name))
    throw ConfigError("register_loss: '" + name + "' is a built-in loss's name");
  loss_registry()[name] = std::move(loss);
}

LossFunction loss_from_config(const std::string& name, TaskKind task) {
  if (const auto builtin = value_named(kBuiltinLossNames, name)) {
    switch (*builtin) {
      case BuiltinLoss::kAuto:
        break;
      case BuiltinLoss::kCrossEntropy:
        if (task == TaskKind::kRegression)
          throw ConfigError(
              "train.loss: cross_entropy needs class labels; this data is regression");
        break;
      case BuiltinLoss::kMse:
        if (task != TaskKind::kRegression)
          throw ConfigError(
              "train.loss: mse needs real-valued targets; this data has class labels");
        break;
    }
    return [task](const at::Tensor& out, const at::Tensor& y) { return loss_for(task, out, y); };
  }
  const auto it = loss_registry().find(name);
  if (it != loss_registry().end()) return it->second;
  std::string names = names_listed(kBuiltinLossNames);
  for (const auto& [n, f] : loss_registry()) names += ", " + n;
  throw ConfigError("train.loss: unknown loss '" + name + "' (valid: " + names +
                    "; register_loss adds your own)");
}

}  // namespace lockstep
