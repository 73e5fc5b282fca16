#include "lockstep/check/step_checks.h"

#include <utility>

namespace lockstep {

StepChecks::StepChecks(ProcessGroup& pg, DigestMode mode, CheckHashing hashing)
    : pg_(pg), mode_(mode), hashing_(hashing) {}

void StepChecks::count(const PendingCheck& check) {
  hashed_bytes_ += check.hashed_bytes();
  idle_bytes_ += check.idle_bytes();
}

void StepChecks::start(std::vector<NamedTensor> tensors, int64_t step) {
  // A check still hashing has had no before_update(): end it first, and
  // hand out its verdicts with the next ones.
  if (hashing_check_) {
    for (auto& r : before_update()) owed_.push_back(std::move(r));
  }
  hashing_check_ = std::make_unique<PendingCheck>(pg_, std::move(tensors), mode_, step, hashing_);
}

std::vector<ConsistencyReport> StepChecks::before_update() {
  std::vector<ConsistencyReport> reports = std::move(owed_);
  owed_.clear();
  if (exchanging_check_) {
    reports.push_back(exchanging_check_->finish());
    exchanging_check_.reset();
  }
  if (hashing_check_) {
    if (hashing_check_->verdict_can_wait()) {
      hashing_check_->close();
      count(*hashing_check_);
      exchanging_check_ = std::move(hashing_check_);
    } else {
      reports.push_back(hashing_check_->finish());
      count(*hashing_check_);
      hashing_check_.reset();
    }
  }
  return reports;
}

std::vector<ConsistencyReport> StepChecks::drain() {
  std::vector<ConsistencyReport> reports = before_update();
  for (auto& r : before_update()) reports.push_back(std::move(r));
  return reports;
}

}  // namespace lockstep
