// DistributedSampler: this rank's shard of a dataset's indices for an epoch,
// index for index the same as torch.utils.data.DistributedSampler for the
// same (length, num_replicas, rank, shuffle, seed, epoch, drop_last):
//   1. shuffle: torch.randperm(length) from a CPU generator seeded with
//      seed + epoch (the same ATen kernel and Mersenne Twister as Python's);
//      otherwise 0 .. length-1;
//   2. not drop_last: pad to a multiple of num_replicas by wrapping around
//      (repeating the list as often as needed); drop_last: truncate to one;
//   3. this rank takes every num_replicas-th index starting at rank.
// Call set_epoch(e) at the start of every epoch, or every epoch repeats the
// same order.
#pragma once

#include <cstdint>
#include <vector>

namespace lockstep {

struct SamplerOptions {
  // The world, which PyTorch takes from the process group: required (the
  // unset -1 is refused, rather than every rank drawing the same shard).
  // From lockstep::init_distributed(): {dist.size(), dist.rank(), ...}.
  int num_replicas = -1;
  int rank = -1;
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = false;
};

class DistributedSampler {
 public:
  // Throws ConfigError for an unset world (num_replicas or rank -1),
  // num_replicas < 1, a rank outside [0, num_replicas), or a negative length.
  DistributedSampler(int64_t length, SamplerOptions options);

  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }
  // Indices per rank per epoch (PyTorch's num_samples).
  int64_t num_samples() const { return num_samples_; }
  int num_replicas() const { return options_.num_replicas; }
  int rank() const { return options_.rank; }
  int64_t total_size() const { return num_samples_ * options_.num_replicas; }
  // This rank's indices for the current epoch.
  std::vector<int64_t> indices() const;
  // The same for the rest of the epoch's order from position `offset` on,
  // as if it were the whole dataset (padded by wrapping it, or truncated
  // with drop_last, to a multiple of num_replicas); offset 0 is indices().
  // Elastic resume: a run of another world size consumed the positions
  // before `offset` (Note [Elastic resume], train/trainer.cpp).
  std::vector<int64_t> indices_from(int64_t offset) const;
  int64_t num_samples_from(int64_t offset) const;
  // The epoch's order of all indices (shuffled or not), unpadded.
  std::vector<int64_t> order() const;

 private:
  int64_t length_;
  SamplerOptions options_;
  int64_t num_samples_;
  int64_t epoch_ = 0;
};

}  // namespace lockstep
