// What a program registers by name beside the built-ins (register_model,
// register_loss, register_callback, register_comm_hook): one kind of table,
// safe to use from any thread, kept in registration order.
#pragma once

#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace lockstep {

template <typename T>
class Registry {
 public:
  // Returns false, and changes nothing, when `name` is taken and `replace`
  // is false; a name registered again with `replace` keeps its place.
  bool add(const std::string& name, T value, bool replace) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [n, v] : entries_) {
      if (n != name) continue;
      if (!replace) return false;
      v = std::move(value);
      return true;
    }
    entries_.emplace_back(name, std::move(value));
    return true;
  }
  std::optional<T> find(const std::string& name) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [n, v] : entries_)
      if (n == name) return v;
    return std::nullopt;
  }
  std::vector<std::pair<std::string, T>> entries() const {
    std::lock_guard<std::mutex> lock(mu_);
    return entries_;
  }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [n, v] : entries()) out.push_back(n);
    return out;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::pair<std::string, T>> entries_;
};

// The one registry of entries of type T (a factory's std::function type),
// alive from its first use on: a program may register from a static
// initialiser.
template <typename T>
Registry<T>& registry_of() {
  static Registry<T> registry;
  return registry;
}

}  // namespace lockstep
