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
#include <vector>

#include "lockstep/config/config.h"
#include "lockstep/data/dataset.h"
#include "lockstep/data/loader.h"
#include "lockstep/data/sampler.h"
#include "lockstep/ddp/ddp.h"
#include "lockstep/distributed/init.h"
#include "lockstep/distributed/world.h"
#include "lockstep/model/models.h"
#include "lockstep/util/error.h"

namespace lockstep {

// Runs `body`, which reads a file a config names under `key`; a DataError
// from it names the key too ("data.path: cannot open '/abs/x.csv': ...").
// Note [Paths in a config] (config.cpp): the path is already resolved.
template <typename Body>
auto reading_key(const char* key, Body&& body) {
  try {
    return body();
  } catch (const DataError& e) {
    throw DataError(std::string(key) + ": " + e.what());
  }
}

// The configured dataset, split into train and validation (MNIST: its train
// and test files). In-memory datasets only: data_from_config covers all.
DatasetSplit dataset_from_config(const Config& config);

enum class TaskKind { kClassification, kRegression, kLanguage };

// What the trainer and the check mode train on: the train and validation
// datasets (validation of size 0 when none is held out) and what the model
// must know of them.
struct TrainData {
  std::shared_ptr<const Dataset> train, validation;
  std::vector<int64_t> sample_shape;  // one example's x
  int64_t num_classes = 0;            // classes, or the vocabulary (language); 0: regression
  TaskKind task = TaskKind::kClassification;
  std::string summary;  // for the log: what was read
};

// Every data.name: the in-memory ones (dataset_from_config) and the token
// streams, text and tokens (lockstep/data/tokens.h), read in windows of
// model.block_size + 1 from a memory-mapped file. Their validation is
// val.bin beside train.bin when there is one, else the file's last
// data.validation_fraction of tokens (the train part is the rest).
TrainData data_from_config(const Config& config);

// The rules that need the data as read (train and check --config alike):
// a validation metric watched (checkpoint.keep_best, train.early_stop.metric)
// needs a validation split that holds examples. ConfigError otherwise.
void validate_data(const Config& config, const TrainData& data);

// The model fitted to `data` (input shape, number of classes), identical on
// every rank: initialised from run.seed, or loaded from model.init_from.
std::shared_ptr<Classifier> model_from_config(const Config& config, const TrainData& data);
std::shared_ptr<Classifier> model_from_config(const Config& config, const TensorDataset& data);

// Each layer's options from its section, converted here once.
DdpOptions ddp_options_from_config(const DdpConfig& config);
// The dist section (and log.level) as init_distributed's options; throws
// ConfigError for a timeout outside (0, 1e7] seconds.
InitOptions init_options_from_config(const Config& config);

// This rank's shard of `size` examples, in the configured order.
DistributedSampler sampler_from_config(const Config& config, const WorldInfo& world, int64_t size);

// How an epoch of the train split becomes optimizer steps, the same for the
// trainer and the check mode: each rank's shard in micro-batches of
// data.batch_size (a final short one unless data.drop_last), grouped by
// train.accumulation_steps (a remainder that fills no step is not used).
// Note [Epoch tail]
// ~~~~~~~~~~~~~~~~~
// An epoch of m micro-batches per rank with train.accumulation_steps a:
// with data.drop_last false every sample is trained: ceil(m / a) optimizer
// steps, the last over the m mod a micro-batches left (each micro-batch's
// loss divided by that shorter count, so the step is the mean over the
// micro-batches it saw, as a full one is). With data.drop_last true the
// incomplete batch and an incomplete accumulation window are both dropped,
// as drop_last drops what does not fill a batch: floor(m / a) steps. Every
// rank holds the same m (a DistributedSampler pads), so every rank runs the
// same short step.
int64_t micro_batches_used(int64_t per_rank, int64_t batch_size, int64_t accumulation,
                           bool drop_last);
// Optimizer steps over `micro` micro-batches: ceil(micro / accumulation).
inline int64_t steps_over(int64_t micro, int64_t accumulation) {
  return (micro + accumulation - 1) / accumulation;
}

// A cheap identity of a training split, for state.yaml's data_id: SHA-256
// (16 hex digits) of its size and of its first, middle and last examples.
// Not a full hash (a 10 GB token file is not read for it): it tells a
// regenerated or replaced data set from the one a checkpoint was made on.
std::string data_identity(const Dataset& train);

struct StepPlan {
  int64_t micro_per_epoch = 0;  // micro-batches trained per epoch per rank (Note [Epoch tail])
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;     // steps_per_epoch x train.epochs: where the epochs end
  int64_t schedule_steps = 0;  // the learning-rate schedule's length (Note [Schedule length])
  ScheduleFrom schedule_from = ScheduleFrom::kEpochs;
};
// Throws ConfigError when an epoch holds no optimizer step.
StepPlan step_plan(const Config& config, const DistributedSampler& sampler, int64_t train_size);
// The steps a run trains: train.max_steps when set, capped by the epochs'
// end (`epochs_end`, the step at which the last epoch ends).
int64_t stop_step(const Config& config, int64_t epochs_end);
// Sets plan.schedule_steps and schedule_from from the config
// (optim.decay_steps, else train.max_steps, else the epochs' end).
void plan_schedule(const Config& config, StepPlan& plan);

// The device train.device asks for on this rank; throws ConfigError for
// cuda where this LibTorch has no CUDA or no GPU is visible, naming `what`
// (the key or flag that asked).
at::Device device_from_config(const Config& config, const WorldInfo& world, BackendKind backend,
                              const std::string& what = "train.device");

// The loss the data calls for: cross-entropy over classes, MSE for
// regression, cross-entropy over every position's next token for language
// ([batch, time, vocab] against [batch, time]).
at::Tensor loss_for(TaskKind task, const at::Tensor& output, const at::Tensor& target);
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
