// The every-step consistency check as a training loop runs it: start()
// after an optimizer step, before_update() before the next one, drain()
// before anything that needs every verdict (a checkpoint, the end).
//
// In place (CheckHashing::kInPlace), step s's verdict comes from the
// before_update() before optimizer step s + 1. With the idle thread, that
// before_update() ends the hashing and starts the digest exchange, and the
// verdict comes one step later, before optimizer step s + 2: the exchange
// then overlaps a whole step instead of making every rank wait for the
// slowest at it. What is traded is that step: a divergence is reported one
// optimizer step later, still naming the step it happened at and the first
// tensor that differed then (from the digests kept).
#pragma once

#include <memory>
#include <vector>

#include "lockstep/check/fingerprint.h"

namespace lockstep {

class StepChecks {
 public:
  StepChecks(ProcessGroup& pg, DigestMode mode, CheckHashing hashing);

  // Collectives, called by every rank at the same points.
  void start(std::vector<NamedTensor> tensors, int64_t step);
  std::vector<ConsistencyReport> before_update();
  std::vector<ConsistencyReport> drain();

  // Bytes hashed so far, and of them by the idle thread.
  size_t hashed_bytes() const { return hashed_bytes_; }
  size_t idle_bytes() const { return idle_bytes_; }

 private:
  void count(const PendingCheck& check);

  ProcessGroup& pg_;
  DigestMode mode_;
  CheckHashing hashing_;
  std::unique_ptr<PendingCheck> hashing_check_;     // started, still hashing
  std::unique_ptr<PendingCheck> exchanging_check_;  // closed, digests in flight
  std::vector<ConsistencyReport> owed_;             // taken early by start(), not yet handed out
  size_t hashed_bytes_ = 0;
  size_t idle_bytes_ = 0;
};

}  // namespace lockstep
