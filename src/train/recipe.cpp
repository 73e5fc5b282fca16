#include "lockstep/train/recipe.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/functional/loss.h>

#include <spdlog/spdlog.h>

#include <mutex>

#include "lockstep/ddp/comm_hooks.h"
#include "lockstep/train/state_dict.h"
#include "lockstep/util/error.h"

namespace lockstep {

DatasetSplit dataset_from_config(const Config& config) {
  const auto& d = config.data;
  if (d.name == DatasetKind::kMnist) {
    return reading_key("data.path", [&] {
      return DatasetSplit{dataset_mnist(d.path, true), dataset_mnist(d.path, false)};
    });
  }
  TensorDataset all;
  if (d.name == DatasetKind::kDigits) {
    all = dataset_digits();
  } else if (d.name == DatasetKind::kSynthetic) {
    all = dataset_synthetic_classification(d.synthetic_size, d.synthetic_features,
                                           d.synthetic_classes, config.run.seed);
  } else {
    CsvOptions csv;
    csv.label_column = d.label_column;
    csv.max_classes = d.max_classes;
    all = reading_key("data.path", [&] { return dataset_csv(d.path, csv); });
  }
  return dataset_split(all, d.validation_fraction, config.run.seed);
}

std::shared_ptr<Classifier> model_from_config(const Config& config, const TensorDataset& data) {
  at::manual_seed(static_cast<uint64_t>(config.run.seed));  // identical init everywhere
  std::vector<int64_t> shape(data.features.sizes().begin() + 1, data.features.sizes().end());
  auto model = model_create(config.model, shape, data.num_classes);
  if (!config.model.init_from.empty()) {
    reading_key("model.init_from", [&] {
      state_dict_load(*model, state_dict_load_file(config.model.init_from), config.model.init_from);
      return 0;
    });
    spdlog::info("model initialised from {}", config.model.init_from);
  }
  return model;
}

DdpOptions ddp_options_from_config(const DdpConfig& c) {
  DdpOptions ddp;
  ddp.bucket_cap_mb = c.bucket_cap_mb;
  ddp.first_bucket_cap_mb = c.first_bucket_cap_mb;
  ddp.gradient_as_bucket_view = c.gradient_as_bucket_view;
  ddp.find_unused_parameters = c.find_unused_parameters;
  ddp.broadcast_buffers = c.broadcast_buffers;
  if (c.comm_hook != CommHookKind::kAllreduce) ddp.comm_hook = comm_hook_create(c.comm_hook);
  return ddp;
}

InitOptions init_options_from_config(const Config& config) {
  InitOptions init;
  init.backend = config.dist.backend;
  init.shm_chunk_bytes = shm_chunk_bytes_from_mib(config.dist.shm_chunk_mb);
  init.timeout = timeout_from_seconds(config.dist.timeout_s, "dist.timeout_s");
  init.rendezvous_timeout = timeout_from_seconds(config.dist.rdzv_timeout_s, "dist.rdzv_timeout_s");
  init.log_level = config.log.level;
  return init;
}

DistributedSampler sampler_from_config(const Config& config, const WorldInfo& world, int64_t size) {
  return DistributedSampler(
      size, SamplerOptions{world.world_size, world.rank, config.data.shuffle,
                           static_cast<uint64_t>(config.run.seed), config.data.drop_last});
}

StepPlan step_plan(const Config& config, const DistributedSampler& sampler, int64_t train_size) {
  const auto& d = config.data;
  const int64_t per_rank = sampler.num_samples();
  const int64_t micro =
      d.drop_last ? per_rank / d.batch_size : (per_rank + d.batch_size - 1) / d.batch_size;
  const int64_t acc = config.train.accumulation_steps;
  StepPlan plan;
  plan.steps_per_epoch = micro / acc;
  plan.micro_per_epoch = plan.steps_per_epoch * acc;
  if (plan.steps_per_epoch == 0) {
    throw ConfigError(
        "the train split (" + std::to_string(train_size) + " examples) over " +
        std::to_string(sampler.num_replicas()) + " rank(s) gives " + std::to_string(micro) +
        " micro-batch(es) of data.batch_size=" + std::to_string(d.batch_size) +
        " per rank per epoch, fewer than train.accumulation_steps=" + std::to_string(acc) +
        ": no optimizer step would run");
  }
  plan.total_steps = plan.steps_per_epoch * config.train.epochs;
  return plan;
}

at::Device device_from_config(const Config& config, const WorldInfo& world, BackendKind backend,
                              const std::string& what) {
  const DeviceKind kind = config.train.device;
  if (kind == DeviceKind::kCpu || (kind == DeviceKind::kAuto && backend != BackendKind::kNccl))
    return at::Device(at::kCPU);
  if (!at::hasCUDA() || at::getNumGPUs() == 0) {
    throw ConfigError(
        what + ": " +
        (kind == DeviceKind::kAuto ? "auto chose cuda for the nccl backend" : "cuda") + ", but " +
        (at::hasCUDA() ? "no GPU is visible (CUDA_VISIBLE_DEVICES?)"
                       : "this lockstep was built against a LibTorch without CUDA") +
        "; use the cpu device with the gloo backend");
  }
  const int gpus = static_cast<int>(at::getNumGPUs());
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(world.local_rank % gpus));
}

at::Tensor loss_for(const TensorDataset& data, const at::Tensor& output, const at::Tensor& target) {
  return data.num_classes > 0 ? torch::nn::functional::cross_entropy(output, target)
                              : torch::nn::functional::mse_loss(output, target);
}

void seed_rank_generator(const Config& config, int rank) {
  at::manual_seed(static_cast<uint64_t>(config.run.seed) + 1 + rank);
}

at::Tensor generator_state() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void generator_restore(const at::Tensor& state) {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

void within_memory(const std::string& what, const std::function<void()>& body) {
  try {
    body();
  } catch (const std::bad_alloc&) {
    throw ConfigError(what + " does not fit in this machine's memory (make it smaller)");
  } catch (const c10::Error& e) {
    const std::string text = e.what_without_backtrace();
    if (text.find("allocate") == std::string::npos && text.find("memory") == std::string::npos)
      throw;
    throw ConfigError(what + " does not fit in this machine's memory (make it smaller): " +
                      text.substr(0, text.find('\n')));
  }
}

}  // namespace lockstep
