// The job store's key-value semantics without sockets (Note [Job store],
// store_server.cpp): c10d::Store's operations over a map bounded in bytes,
// and the waits they release. The server's poll loop only moves bytes and
// calls these; the unit tests call them directly.
//
// Threads: one (the server's). A waiter is an id the caller chooses (the
// connection's descriptor) and is answered by the caller when released() or
// expired() returns it.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace lockstep {

// A request the store refuses (full, not an integer, overflow): the server
// answers it with an error and goes on.
class StoreRefusal : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class StoreCore {
 public:
  using Clock = std::chrono::steady_clock;

  explicit StoreCore(std::size_t max_total_bytes) : max_total_bytes_(max_total_bytes) {}

  // Throws StoreRefusal when keys and values would exceed max_total_bytes.
  void set(const std::string& key, std::string value);
  std::optional<std::string> get(const std::string& key) const;
  // c10d's counters: decimal text; a missing key counts from 0. Throws
  // StoreRefusal for a value that is not an integer, or an overflow.
  int64_t add(const std::string& key, int64_t delta);
  // c10d's semantics: sets `desired` when the key holds `expected` (a missing
  // key matches an empty expectation); returns what the key holds after.
  std::string compare_set(const std::string& key, const std::string& expected, std::string desired);
  bool check(const std::vector<std::string>& keys) const;
  bool erase(const std::string& key);
  int64_t num_keys() const { return static_cast<int64_t>(data_.size()); }
  std::size_t stored_bytes() const { return stored_bytes_; }
  // Counts the changes to keys: waiters need a rescan only after one.
  uint64_t changes() const { return changes_; }

  // true when every key is present now; otherwise `waiter` waits until
  // released() or expired() hands it back (deadline max(): no limit).
  bool wait(int waiter, std::vector<std::string> keys, Clock::time_point deadline);
  // The waiters whose keys are now all present, removed (after any change).
  std::vector<int> released();
  // The waiters whose deadline passed by `now`, removed.
  std::vector<int> expired(Clock::time_point now);
  // A waiter that went away (its connection closed).
  void forget(int waiter);
  // The earliest waiter deadline, max() when none.
  Clock::time_point next_deadline() const;

 private:
  struct Waiter {
    int id;
    std::vector<std::string> keys;
    Clock::time_point deadline;
  };

  std::size_t max_total_bytes_;
  std::size_t stored_bytes_ = 0;
  uint64_t changes_ = 0;
  std::unordered_map<std::string, std::string> data_;
  std::vector<Waiter> waiters_;
};

}  // namespace lockstep
