// The recipe: what a configuration makes, shared by the trainer and the
// check mode (`lockstep check --config`), so that both train the same thing.
//   config -> dataset split -> model fitted to the data (seeded, or loaded
//   from model.init_from) -> DDP options, loss, sampler; and the seeding
//   policy for each rank's own generator.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>

#include "lockstep/data/dataset.h"
#include "lockstep/data/sampler.h"
#include "lockstep/ddp/ddp.h"
#include "lockstep/distributed/world.h"
#include "lockstep/train/config.h"
#include "lockstep/train/models.h"

namespace lockstep {

// The configured dataset, split into train and validation (MNIST: its train
// and test files).
DatasetSplit dataset_from_config(const Config& config);

// The model fitted to `data` (input shape, number of classes), identical on
// every rank: initialised from run.seed, or loaded from model.init_from.
std::shared_ptr<Classifier> model_from_config(const Config& config, const TensorDataset& data);

DdpOptions ddp_options_from_config(const DdpConfig& config);

// This rank's shard of `size` examples, in the configured order.
DistributedSampler sampler_from_config(const Config& config, const WorldInfo& world, int64_t size);

// The loss the data calls for: cross-entropy over classes, MSE for regression.
at::Tensor loss_for(const TensorDataset& data, const at::Tensor& output, const at::Tensor& target);

// Seeding policy: the model is initialised from run.seed on every rank
// (model_from_config); after DDP is built each rank's generator (dropout) is
// seeded run.seed + 1 + rank, so ranks differ as in PyTorch, reproducibly.
void seed_rank_generator(const Config& config, int rank);

// This process's CPU generator state, and its restoration (checkpoints).
at::Tensor generator_state();
void generator_restore(const at::Tensor& state);

// Runs `body`; a failure to allocate (std::bad_alloc, c10's "can't allocate")
// becomes a ConfigError naming `what` (e.g. "the dataset (section data)"):
// a config that asks for more than this machine has is bad input.
void within_memory(const std::string& what, const std::function<void()>& body);

}  // namespace lockstep
