// Batch normalisation whose statistics are the whole global batch's, as
// PyTorch's nn.SyncBatchNorm: in training each rank's per-channel mean and
// inverse standard deviation and its count are all-gathered, combined
// weighted by count (a short last batch, a rank with an empty batch), and
// every rank normalises with the global figures and updates its running
// statistics alike; backward all-reduces the two per-channel sums the
// input's gradient needs. In eval mode, without an exchange, or with one
// rank it is torch::nn::BatchNorm{1,2,3}d exactly (at::batch_norm).
// Input [N, C, *] of any rank >= 2 (1d, 2d, 3d), any memory format
// (channels_last kept); half and bfloat16 inputs (autocast) are normalised
// with float statistics and returned in their own dtype, as PyTorch does.
// A converted layer keeps the BatchNorm's device, dtype and frozen
// (requires_grad false) parameters.
// Parameter and buffer names are BatchNorm's (weight, bias, running_mean,
// running_var, num_batches_tracked): state dicts move both ways.
//
//   auto bn = lockstep::SyncBatchNorm(64);           // a BatchNorm2d(64) until...
//   lockstep::convert_sync_batchnorm(model, lockstep::batch_stats_exchange(pg));
//
// Note [Synchronised batch normalisation] (src/model/sync_batchnorm.cpp).
#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <optional>
#include <string>

#include "lockstep/util/stats_exchange.h"

namespace lockstep {

struct SyncBatchNormOptions {
  SyncBatchNormOptions(int64_t num_features) : num_features(num_features) {}  // NOLINT
  int64_t num_features;
  double eps = 1e-5;
  std::optional<double> momentum = 0.1;  // nullopt: a cumulative average
  bool affine = true;
  bool track_running_stats = true;
};

class SyncBatchNormImpl : public torch::nn::Cloneable<SyncBatchNormImpl> {
 public:
  explicit SyncBatchNormImpl(SyncBatchNormOptions options);
  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  at::Tensor forward(const at::Tensor& input);

  // The ranks this layer synchronises over; none: each rank alone.
  void set_exchange(std::shared_ptr<StatsExchange> exchange) { exchange_ = std::move(exchange); }
  const std::shared_ptr<StatsExchange>& exchange() const { return exchange_; }
  // Its path in the model, for messages ("layer1.0.bn1"); set by convert.
  void set_path(std::string path) { path_ = std::move(path); }

  SyncBatchNormOptions options;
  at::Tensor weight, bias, running_mean, running_var, num_batches_tracked;

 private:
  std::shared_ptr<StatsExchange> exchange_;
  std::string path_ = "SyncBatchNorm";
};
TORCH_MODULE(SyncBatchNorm);

// Every torch::nn::BatchNorm{1,2,3}d of `module`'s tree becomes a
// SyncBatchNorm with its options, weights and buffers, and every
// SyncBatchNorm (converted or built as one) synchronises over `exchange`.
// Returns the module to use: a new SyncBatchNorm when `module` itself is a
// BatchNorm, else `module`, changed in place. Converting twice changes
// nothing more. A BatchNorm can be replaced only where the module tree's
// registry is its only holder (a parent whose forward reaches it through
// named_children()); one that a typed member (torch::nn::BatchNorm2d bn),
// a Sequential or a ModuleList also holds would go on running unchanged, so
// nothing is converted and a UsageError names those paths: declare them as
// lockstep::SyncBatchNorm instead. A TorchScript module's BatchNorms are
// out of reach. With an exchange of more than one rank it is collective:
// every rank calls it, and the ranks' SyncBatchNorm layers (paths and
// channels) are compared once (UsageError when they differ).
std::shared_ptr<torch::nn::Module> convert_sync_batchnorm(
    const std::shared_ptr<torch::nn::Module>& module,
    const std::shared_ptr<StatsExchange>& exchange);

// The SyncBatchNorm layers of `module`'s tree.
int64_t count_sync_batchnorm(const torch::nn::Module& module);

}  // namespace lockstep
