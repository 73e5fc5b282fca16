#include "lockstep/train/callbacks.h"

#include <ATen/ATen.h>

#include <utility>

#include "lockstep/util/error.h"

namespace lockstep {
namespace {

std::vector<std::pair<std::string, CallbackFactory>>& callback_registry() {
  static std::vector<std::pair<std::string, CallbackFactory>> registry;
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

}  // namespace lockstep
