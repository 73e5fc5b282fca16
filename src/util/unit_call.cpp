#include "lockstep/util/unit_call.h"

#include <map>
#include <mutex>

namespace lockstep {
namespace {

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::map<const torch::nn::Module*, std::weak_ptr<UnitWrapper>>& registry() {
  static std::map<const torch::nn::Module*, std::weak_ptr<UnitWrapper>> r;
  return r;
}

}  // namespace

void set_unit_wrapper(const torch::nn::Module& unit, const std::shared_ptr<UnitWrapper>& wrapper) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  if (wrapper) {
    registry()[&unit] = wrapper;
  } else {
    registry().erase(&unit);
  }
}

std::shared_ptr<UnitWrapper> unit_wrapper(const torch::nn::Module& unit) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto& r = registry();
  if (r.empty()) return nullptr;
  const auto it = r.find(&unit);
  if (it == r.end()) return nullptr;
  auto wrapper = it->second.lock();
  if (!wrapper) r.erase(it);
  return wrapper;
}

}  // namespace lockstep
