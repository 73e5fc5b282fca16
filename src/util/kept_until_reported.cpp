#include "lockstep/util/kept_until_reported.h"

#include <cstdlib>
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
  // A program that catches the error itself and never calls release_kept:
  // released at its exit, before the statics made earlier are destroyed.
  static const bool at_exit = std::atexit(release_kept) == 0;
  (void)at_exit;
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
