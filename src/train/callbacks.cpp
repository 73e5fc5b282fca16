#include "lockstep/train/callbacks.h"

#include <ATen/ATen.h>

#include <utility>

#include "lockstep/util/error.h"
#include "lockstep/util/registry.h"

namespace lockstep {
void register_callback(const std::string& name, CallbackFactory factory) {
  if (!factory) throw ConfigError("register_callback('" + name + "'): empty factory");
  registry_of<CallbackFactory>().add(name, std::move(factory), /*replace=*/true);
}

std::vector<std::shared_ptr<TrainerCallback>> callbacks_create() {
  std::vector<std::shared_ptr<TrainerCallback>> out;
  for (const auto& [name, factory] : registry_of<CallbackFactory>().entries()) {
    auto callback = factory();
    if (!callback) throw ConfigError("callback '" + name + "': its factory returned nothing");
    out.push_back(std::move(callback));
  }
  return out;
}

}  // namespace lockstep
