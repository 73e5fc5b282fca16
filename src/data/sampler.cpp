#include "lockstep/data/sampler.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>

#include "lockstep/util/error.h"

namespace lockstep {

DistributedSampler::DistributedSampler(int64_t length, SamplerOptions options)
    : length_(length), options_(options) {
  if (options_.num_replicas == -1 || options_.rank == -1) {
    throw ConfigError(
        "sampler: num_replicas and rank are not set, so every rank would draw the same shard; "
        "pass the world, as PyTorch takes it from the process group: SamplerOptions{"
        "dist.size(), dist.rank(), shuffle, seed, drop_last} with dist = "
        "lockstep::init_distributed()");
  }
  if (options_.num_replicas < 1) {
    throw ConfigError("sampler: num_replicas=" + std::to_string(options_.num_replicas) +
                      " must be >= 1");
  }
  if (options_.rank < 0 || options_.rank >= options_.num_replicas) {
    throw ConfigError("sampler: rank " + std::to_string(options_.rank) + " is outside [0, " +
                      std::to_string(options_.num_replicas) + ")");
  }
  if (length_ < 0) throw ConfigError("sampler: negative dataset length");
  const int64_t n = options_.num_replicas;
  // PyTorch: with drop_last and a remainder, ceil((len - n) / n) samples.
  num_samples_ =
      options_.drop_last && length_ % n != 0 ? (length_ - n + n - 1) / n : (length_ + n - 1) / n;
  if (num_samples_ < 0) num_samples_ = 0;
}

std::vector<int64_t> DistributedSampler::order() const {
  std::vector<int64_t> all;
  if (options_.shuffle) {
    auto generator = at::detail::createCPUGenerator(options_.seed + epoch_);
    const auto perm = at::randperm(length_, generator, at::kLong);
    all.assign(perm.data_ptr<int64_t>(), perm.data_ptr<int64_t>() + length_);
  } else {
    for (int64_t i = 0; i < length_; ++i) all.push_back(i);
  }
  return all;
}

int64_t DistributedSampler::num_samples_from(int64_t offset) const {
  const int64_t left = std::max<int64_t>(0, length_ - std::max<int64_t>(0, offset));
  const int64_t n = options_.num_replicas;
  if (offset <= 0) return num_samples_;
  return options_.drop_last ? left / n : (left + n - 1) / n;
}

std::vector<int64_t> DistributedSampler::indices_from(int64_t offset) const {
  if (offset < 0) throw UsageError("sampler: negative offset " + std::to_string(offset));
  std::vector<int64_t> all = order();
  all.erase(all.begin(), all.begin() + std::min<int64_t>(offset, length_));
  const int64_t total = num_samples_from(offset) * options_.num_replicas;
  if (!options_.drop_last) {
    // Wrap around as often as needed (len may be smaller than the padding).
    const size_t original = all.size();
    for (size_t k = 0; all.size() < static_cast<size_t>(total) && original > 0; ++k) {
      all.push_back(all[k % original]);
    }
  } else {
    all.resize(static_cast<size_t>(total));
  }
  std::vector<int64_t> mine;
  for (int64_t i = options_.rank; i < total; i += options_.num_replicas) mine.push_back(all[i]);
  return mine;
}

std::vector<int64_t> DistributedSampler::indices() const {
  return indices_from(0);
}

}  // namespace lockstep
