#include "lockstep/zero/shard_seal.h"

#include <ATen/ATen.h>

#include "lockstep/util/error.h"
#include "lockstep/util/hex.h"

// Note [Shard seal]
// ~~~~~~~~~~~~~~~~~
// What it catches: any change to a weight between its owner's optimizer
// step and the next check (memory corruption, a write through a stale
// pointer, a bug that steps a weight twice), on the rank that holds it,
// named. What it cannot: an optimizer step that computes wrong values on
// its owner (there is no second copy to disagree with; optim.zero 0-2 keep
// one per rank and catch it by comparison), or a corrupted gather on one
// rank (its gradients would differ; the gathered copies are not kept). The
// check costs two passes over this rank's shard per check.every steps.

namespace lockstep {

ShardSeal::ShardSeal(ProcessGroup& pg, std::vector<std::string> names, std::vector<int> owners,
                     DigestMode mode)
    : pg_(pg), names_(std::move(names)), owners_(std::move(owners)), mode_(mode) {}

std::vector<std::string> ShardSeal::digests(
    const std::vector<std::pair<size_t, at::Tensor>>& mine) const {
  std::vector<NamedTensor> tensors;
  for (const auto& [index, t] : mine) tensors.push_back({names_.at(index), t.detach()});
  return fingerprint_per_tensor(tensors, mode_);
}

void ShardSeal::seal(const std::vector<std::pair<size_t, at::Tensor>>& mine, int64_t done) {
  sealed_ = digests(mine);
  sealed_at_ = done;
}

ConsistencyReport ShardSeal::verify(const std::vector<std::pair<size_t, at::Tensor>>& mine,
                                    int64_t step) {
  ConsistencyReport report;
  report.step = step;
  int64_t bad = -1;
  std::string before, after;
  if (sealed_at_ >= 0) {
    if (mine.size() != sealed_.size())
      throw InternalError("shard seal: " + std::to_string(mine.size()) + " weights, " +
                          std::to_string(sealed_.size()) + " sealed");
    const auto now = digests(mine);
    for (size_t j = 0; j < now.size(); ++j) {
      if (now[j] == sealed_[j]) continue;
      bad = static_cast<int64_t>(mine[j].first);
      before = hex_of(sealed_[j]).substr(0, 16);
      after = hex_of(now[j]).substr(0, 16);
      break;
    }
  }
  // Every rank's first changed weight (index + 1; 0: none).
  const auto flags = pg_.allgather(
      at::full({1}, bad + 1, at::TensorOptions().dtype(at::kLong).device(pg_.device())));
  int first_rank = -1;
  int64_t first = -1;
  for (size_t r = 0; r < flags.size(); ++r) {
    const int64_t v = flags[r].cpu().item<int64_t>();
    if (v > 0) {
      first_rank = static_cast<int>(r);
      first = v - 1;
      break;
    }
  }
  if (first_rank < 0) return report;
  if (first >= static_cast<int64_t>(names_.size()) ||
      owners_[static_cast<size_t>(first)] != first_rank)
    throw InternalError("shard seal: rank " + std::to_string(first_rank) + " reported weight " +
                        std::to_string(first) + ", not its own");
  report.consistent = false;
  report.first_tensor = names_[static_cast<size_t>(first)];
  report.message = "step " + std::to_string(step) + ": weight '" + report.first_tensor +
                   "' (optim.zero 3: held by rank " + std::to_string(first_rank) +
                   " only) changed after its optimizer step";
  if (pg_.rank() == first_rank) {
    report.message += " (digest " + before + " sealed after step " + std::to_string(sealed_at_) +
                      ", now " + after + ")";
  }
  report.message += ": a flipped bit or a write outside the optimizer";
  return report;
}

}  // namespace lockstep
