#include "store_core.h"

#include <algorithm>
#include <climits>

namespace lockstep {

void StoreCore::set(const std::string& key, std::string value) {
  const auto old = data_.find(key);
  const std::size_t before = old == data_.end() ? 0 : key.size() + old->second.size();
  const std::size_t after = key.size() + value.size();
  if (stored_bytes_ - before + after > max_total_bytes_) {
    throw StoreRefusal("the store is full (" + std::to_string(max_total_bytes_) + " bytes)");
  }
  data_[key] = std::move(value);
  stored_bytes_ = stored_bytes_ - before + after;
  ++changes_;
}

std::optional<std::string> StoreCore::get(const std::string& key) const {
  const auto it = data_.find(key);
  if (it == data_.end()) return std::nullopt;
  return it->second;
}

int64_t StoreCore::add(const std::string& key, int64_t delta) {
  int64_t value = 0;
  if (auto it = data_.find(key); it != data_.end()) {
    std::size_t used = 0;
    try {
      value = std::stoll(it->second, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != it->second.size())
      throw StoreRefusal("add: key '" + key + "' does not hold an integer");
  }
  if ((delta > 0 && value > INT64_MAX - delta) || (delta < 0 && value < INT64_MIN - delta))
    throw StoreRefusal("add: key '" + key + "' would overflow");
  value += delta;
  set(key, std::to_string(value));
  return value;
}

std::string StoreCore::compare_set(const std::string& key, const std::string& expected,
                                   std::string desired) {
  const auto it = data_.find(key);
  if (it == data_.end() ? expected.empty() : it->second == expected) {
    set(key, desired);
    return desired;
  }
  return it == data_.end() ? expected : it->second;
}

bool StoreCore::check(const std::vector<std::string>& keys) const {
  return std::all_of(keys.begin(), keys.end(),
                     [&](const std::string& k) { return data_.count(k) > 0; });
}

bool StoreCore::erase(const std::string& key) {
  const auto it = data_.find(key);
  if (it == data_.end()) return false;
  stored_bytes_ -= key.size() + it->second.size();
  data_.erase(it);
  ++changes_;
  return true;
}

bool StoreCore::wait(int waiter, std::vector<std::string> keys, Clock::time_point deadline) {
  if (check(keys)) return true;
  waiters_.push_back(Waiter{waiter, std::move(keys), deadline});
  return false;
}

std::vector<int> StoreCore::released() {
  std::vector<int> out;
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (check(it->keys)) {
      out.push_back(it->id);
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

std::vector<int> StoreCore::expired(Clock::time_point now) {
  std::vector<int> out;
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (it->deadline <= now) {
      out.push_back(it->id);
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

void StoreCore::forget(int waiter) {
  waiters_.erase(std::remove_if(waiters_.begin(), waiters_.end(),
                                [waiter](const Waiter& w) { return w.id == waiter; }),
                 waiters_.end());
}

StoreCore::Clock::time_point StoreCore::next_deadline() const {
  auto next = Clock::time_point::max();
  for (const auto& w : waiters_) next = std::min(next, w.deadline);
  return next;
}

}  // namespace lockstep
