#include "lockstep/train/losses.h"

#include <ATen/ATen.h>

#include <utility>

#include "lockstep/util/error.h"
#include "lockstep/util/registry.h"

namespace lockstep {
void register_loss(const std::string& name, LossFunction loss) {
  if (!loss) throw ConfigError("register_loss('" + name + "'): empty function");
  if (value_named(kBuiltinLossNames, name))
    throw ConfigError("register_loss: '" + name + "' is a built-in loss's name");
  registry_of<LossFunction>().add(name, std::move(loss), /*replace=*/true);
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
  if (auto loss = registry_of<LossFunction>().find(name)) return *loss;
  std::string names = names_listed(kBuiltinLossNames);
  for (const auto& n : registry_of<LossFunction>().names()) names += ", " + n;
  throw ConfigError("train.loss: unknown loss '" + name + "' (valid: " + names +
                    "; register_loss adds your own)");
}

}  // namespace lockstep
