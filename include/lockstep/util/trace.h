// Tracer: per-rank timeline in the Chrome trace event format (opens in
// Perfetto / chrome://tracing). Complete events ("ph": "X") on two lanes:
// tid 0 the training thread (forward, backward, wait, optimizer, check) and
// tid 1 communication (each bucket's all-reduce, launch to completion).
// Thread-safe: completion callbacks arrive on backend threads.
#pragma once

#include <chrono>
#include <mutex>
#include <string>
#include <vector>

namespace lockstep {

class Tracer {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr int kMainLane = 0;
  static constexpr int kCommLane = 1;

  explicit Tracer(int rank);
  void complete(const std::string& name, const std::string& category, Clock::time_point start,
                Clock::time_point end, int lane = kMainLane);
  std::string json() const;
  // Writes json() to a temporary name and renames it into place.
  void write(const std::string& path) const;

 private:
  struct Event {
    std::string name, category;
    double ts_us, dur_us;
    int lane;
  };
  int rank_;
  Clock::time_point origin_;
  mutable std::mutex mu_;
  std::vector<Event> events_;
};

}  // namespace lockstep
