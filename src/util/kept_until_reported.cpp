#include "lockstep/util/kept_until_reported.h"

#include <mutex>
#include <utility>
#include <vector>

namespace lockstep {
namespace {
std::mutex g_mutex;
std::vector<std::shared_ptr<void>>& kept() {
  static auto* objects = new std::vector<std::shared_ptr<void>>();  // outlives static teardown
  return *objects;
}
}  // namespace

void keep_until_reported(std::shared_ptr<void> object) {
  if (!object) return;
  const std::lock_guard<std::mutex> lock(g_mutex);
  kept().push_back(std::move(object));
}

void release_kept() {
  std::vector<std::shared_ptr<void>> objects;
  {
    const std::lock_guard<std::mutex> lock(g_mutex);
    objects.swap(kept());
  }
  for (auto& object : objects) object.reset();  // in the order handed in, outside the lock
}

}  // namespace lockstep
