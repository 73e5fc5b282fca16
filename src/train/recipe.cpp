#include "lockstep/train/recipe.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/functional/loss.h>

#include <spdlog/spdlog.h>

#include <cmath>
#include <mutex>
#include <set>

#include "lockstep/checkpoint/checkpoint.h"
#include "lockstep/data/tokens.h"
#include "lockstep/ddp/comm_hooks.h"
#include "lockstep/io/hf_folder.h"
#include "lockstep/io/safetensors.h"
#include "lockstep/io/state_dict.h"
#include "lockstep/model/gpt_layout.h"
#include "lockstep/model/llama_layout.h"
#include "lockstep/util/error.h"
#include "lockstep/util/fs.h"
#include "lockstep/util/sha256.h"
#include "lockstep/util/text.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

namespace lockstep {

namespace {
// A data.path that is not there: named with where it was set, and how a
// relative path in a file was read (Note [Paths in a config], config.cpp).
void require_data_path(const Config& config) {
  const std::string& path = config.data.path;
  struct stat st {};
  if (path.empty() || stat(path.c_str(), &st) == 0) return;
  const int err = errno;
  const std::string origin = config_origin(config, "data.path");
  const bool in_file = !origin.empty() && origin != " (set by --set)";
  throw DataError("data.path: '" + path + "' " +
                  (err == ENOENT ? std::string("does not exist") : std::strerror(err)) + origin +
                  (in_file ? "; a relative path in a config file is resolved against that "
                             "file's folder (a copied config reads from its new folder: give "
                             "an absolute path or --set data.path=...)"
                           : ""));
}
}  // namespace

DatasetSplit dataset_from_config(const Config& config) {
  const auto& d = config.data;
  if (d.name != DatasetKind::kDigits && d.name != DatasetKind::kSynthetic)
    require_data_path(config);
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

namespace {

TaskKind task_of(const TensorDataset& data) {
  return data.num_classes > 0 ? TaskKind::kClassification : TaskKind::kRegression;
}

// tokens: the validation file beside the train file, when there is one:
// <dir>/val.bin for a folder, else the file's name with its last "train"
// made "val" (nanoGPT's train.bin/val.bin, llm.c's *_train.bin/*_val.bin).
std::string validation_beside(const std::string& train) {
  const auto slash = train.rfind('/');
  const auto at = train.rfind("train");
  if (at == std::string::npos || (slash != std::string::npos && at < slash)) return "";
  const std::string val = train.substr(0, at) + "val" + train.substr(at + 5);
  return path_exists(val) ? val : "";
}

std::string count_text(int64_t n) {
  std::string digits = std::to_string(n), out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

TrainData language_data(const Config& config) {
  const auto& d = config.data;
  require_data_path(config);
  const int64_t block = config.model.block_size;
  const bool text = d.name == DatasetKind::kText;
  std::string train_path = d.path, val_path;
  if (!text && is_directory(d.path)) {
    train_path = d.path + "/train.bin";
    val_path = d.path + "/val.bin";
    if (!path_exists(val_path)) val_path.clear();
  } else if (!text) {
    val_path = validation_beside(d.path);
  }
  const auto format = text ? TokenFormat::kBytes : TokenFormat::kUint16;
  auto train = reading_key("data.path", [&] { return TokenFile::open(train_path, format); });
  int64_t vocab = 256;
  if (text && d.vocab_size != 0 && d.vocab_size != 256)
    throw ConfigError("data.vocab_size=" + std::to_string(d.vocab_size) +
                      ": data.name: text reads bytes, whose vocabulary is 256 (leave it 0)");
  if (!text) {
    vocab = d.vocab_size;
    if (vocab == 0 && train->format() == TokenFormat::kLlmc) vocab = 50257;     // GPT-2's tokenizer
    if (vocab == 0 && train->format() == TokenFormat::kLlmc32) vocab = 128256;  // Llama 3's
    if (vocab == 0)
      throw ConfigError("data.vocab_size must be set for '" + train_path +
                        "' (nanoGPT's meta.pkl holds it as vocab_size; 50257 for GPT-2's "
                        "tokenizer)");
  }
  TrainData data;
  data.task = TaskKind::kLanguage;
  data.num_classes = vocab;
  data.sample_shape = {block};
  if (!val_path.empty()) {
    auto val = reading_key("data.path", [&] { return TokenFile::open(val_path, format); });
    data.train = std::make_shared<TokenWindows>(train, 0, train->size(), block, vocab);
    data.validation = std::make_shared<TokenWindows>(val, 0, val->size(), block, vocab);
    data.summary = count_text(train->size()) + " tokens in " + train_path + ", " +
                   count_text(val->size()) + " in " + val_path;
  } else {
    const int64_t n = train->size();
    const auto held =
        static_cast<int64_t>(std::llround(static_cast<double>(n) * d.validation_fraction));
    data.train = std::make_shared<TokenWindows>(train, 0, n - held, block, vocab);
    data.validation = std::make_shared<TokenWindows>(train, n - held, n, block, vocab);
    data.summary = count_text(n) + (text ? " bytes of " : " tokens in ") + train_path +
                   ", the last " + count_text(held) + " held out for validation";
  }
  if (data.train->size() == 0)
    throw ConfigError("data.path: '" + train_path + "' gives no window of model.block_size + 1 = " +
                      std::to_string(block + 1) + " tokens for training");
  return data;
}

}  // namespace

TrainData data_from_config(const Config& config) {
  if (config.data.name == DatasetKind::kText || config.data.name == DatasetKind::kTokens)
    return language_data(config);
  auto split = dataset_from_config(config);
  TrainData data;
  data.task = task_of(split.train);
  data.num_classes = split.train.num_classes;
  data.sample_shape.assign(split.train.features.sizes().begin() + 1,
                           split.train.features.sizes().end());
  data.summary = "in memory";
  data.train = std::make_shared<TensorExamples>(std::move(split.train));
  data.validation = std::make_shared<TensorExamples>(std::move(split.validation));
  return data;
}

void validate_data(const Config& config, const TrainData& data) {
  const char* watcher = config.checkpoint.keep_best != WatchedMetric::kNone ? "checkpoint.keep_best"
                        : config.train.early_stop_metric != WatchedMetric::kNone
                            ? "train.early_stop.metric"
                            : nullptr;
  if (data.validation->size() == 0 && watcher != nullptr) {
    throw ConfigError(std::string(watcher) +
                      " watches a validation metric, but the validation split is empty "
                      "(data.validation_fraction=" +
                      number_text(config.data.validation_fraction) + ")");
  }
}

std::shared_ptr<Classifier> model_from_config(const Config& config, const TensorDataset& data) {
  TrainData shape;
  shape.sample_shape.assign(data.features.sizes().begin() + 1, data.features.sizes().end());
  shape.num_classes = data.num_classes;
  shape.task = task_of(data);
  return model_from_config(config, shape);
}

std::shared_ptr<Classifier> model_from_config(const Config& config, const TrainData& data) {
  at::manual_seed(static_cast<uint64_t>(config.run.seed));  // identical init everywhere
  auto model = model_create(config.model, data.sample_shape, data.num_classes);
  if (!config.model.init_from.empty()) {
    reading_key("model.init_from", [&] {
      const std::string& from = config.model.init_from;
      if (is_hf_folder(from)) {  // Note [Llama's config.json]
        auto* llama = dynamic_cast<Llama*>(model.get());
        if (llama == nullptr)
          throw ConfigError("'" + from + "' is a Hugging Face folder (config.json): model.name: " +
                            "llama reads those, not " + config.model.name);
        llama_check_hf_config(hf_config_text(from), llama->options(), from + "/config.json");
        const StateDict state =
            llama_state_from_hf(hf_folder_weights(from), llama->options(), from);
        std::set<std::string> names;
        for (const auto& entry : state) names.insert(entry.first);
        Checkpointer::check_model_values(state, names, from);  // no NaN or inf trained on
        state_dict_load(*model, state, from);
        return 0;
      }
      if (is_directory(from))
        throw ConfigError("'" + from + "' is a folder without config.json: model.init_from " +
                          "takes a Hugging Face folder (config.json and its safetensors), a " +
                          "model.pt or a .safetensors file");
      const bool safetensors =
          from.size() > 12 && from.compare(from.size() - 12, 12, ".safetensors") == 0;
      if (!safetensors) {
        state_dict_load(*model, state_dict_load_file(from), from);
        return 0;
      }
      // Note [GPT-2 layout]: lockstep's own names (export --layout lockstep
      // says so in __metadata__) or Hugging Face's GPT-2.
      std::map<std::string, std::string> metadata;
      StateDict state = safetensors_load(from, &metadata);
      if (metadata["layout"] != "lockstep" && is_model(config.model.name, BuiltinModel::kGpt))
        state = gpt_state_from_hf(state, from);
      for (const auto& [name, tensor] : state) {  // weights: no integers or booleans copied in
        if (!at::isFloatingType(tensor.scalar_type()))
          throw DataError(from + ": '" + name + "' holds " +
                          std::string(c10::toString(tensor.scalar_type())) +
                          ", not floating-point weights");
      }
      state_dict_load(*model, state, from);
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
  ddp.comm_hook = comm_hook_create(c.comm_hook, powersgd_options_from_config(c));
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

std::string data_identity(const Dataset& train) {
  const int64_t n = train.size();
  std::string bytes = std::to_string(n);
  const auto append = [&](const at::Tensor& t) {
    const auto c = t.contiguous().cpu();
    bytes += std::string(c.scalar_type() == at::kFloat ? "f" : "x") + std::to_string(c.numel());
    bytes.append(static_cast<const char*>(c.data_ptr()), c.nbytes());
  };
  for (const int64_t i : {int64_t{0}, n / 2, n - 1}) {
    if (i < 0 || i >= n) continue;
    const Example e = train.get(i);
    append(e.x);
    append(e.y);
  }
  return sha256_hex(bytes).substr(0, 16);
}

int64_t micro_batches_used(int64_t per_rank, int64_t batch_size, int64_t accumulation,
                           bool drop_last) {
  if (drop_last) return per_rank / batch_size / accumulation * accumulation;
  return (per_rank + batch_size - 1) / batch_size;
}

StepPlan step_plan(const Config& config, const DistributedSampler& sampler, int64_t train_size) {
  const auto& d = config.data;
  const int64_t per_rank = sampler.num_samples();
  const int64_t acc = config.train.accumulation_steps;
  StepPlan plan;
  plan.micro_per_epoch = micro_batches_used(per_rank, d.batch_size, acc, d.drop_last);
  plan.steps_per_epoch = steps_over(plan.micro_per_epoch, acc);
  if (plan.steps_per_epoch == 0) {
    const int64_t micro = per_rank / d.batch_size;
    throw ConfigError(
        "the train split (" + std::to_string(train_size) + " examples) over " +
        std::to_string(sampler.num_replicas()) + " rank(s) gives " + std::to_string(micro) +
        " whole micro-batch(es) of data.batch_size=" + std::to_string(d.batch_size) +
        " per rank per epoch" +
        (micro > 0 ? ", fewer than train.accumulation_steps=" + std::to_string(acc) : "") +
        ", and data.drop_last drops the rest: no optimizer step would run");
  }
  plan.total_steps = plan.steps_per_epoch * config.train.epochs;
  plan_schedule(config, plan);
  return plan;
}

int64_t stop_step(const Config& config, int64_t epochs_end) {
  const int64_t max_steps = config.train.max_steps;
  return max_steps > 0 ? std::min(max_steps, epochs_end) : epochs_end;
}

// Note [Schedule length]
// ~~~~~~~~~~~~~~~~~~~~~~
// A warm-up, cosine or step schedule runs over `schedule_steps` optimizer
// steps: optim.decay_steps when set (nanoGPT's lr_decay_iters), else the
// steps the run trains (train.max_steps, capped by the epochs' end), else
// the epochs' steps. So a run stopped by max_steps ends at min_lr, as
// nanoGPT's does; past the length the cosine stays at min_lr (the trainer
// warns at start when the run goes past it). A resume (trainer_resume.cpp)
// keeps the checkpoint's length when it came from optim.decay_steps and
// the resuming config sets none (the length was chosen apart from where
// the run stops); otherwise it follows the resuming config, as a fresh run
// would: its max_steps, else the epochs' end at the new world size (the
// steps done plus the steps left). A resume without the max_steps the run
// was started with trains to the epochs' end, and its schedule with it.
void plan_schedule(const Config& config, StepPlan& plan) {
  if (config.optim.decay_steps > 0) {
    plan.schedule_steps = config.optim.decay_steps;
    plan.schedule_from = ScheduleFrom::kDecaySteps;
  } else if (config.train.max_steps > 0 && config.train.max_steps < plan.total_steps) {
    plan.schedule_steps = config.train.max_steps;
    plan.schedule_from = ScheduleFrom::kMaxSteps;
  } else {  // no max_steps, or one past the epochs: the epochs end the run
    plan.schedule_steps = plan.total_steps;
    plan.schedule_from = ScheduleFrom::kEpochs;
  }
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

at::Tensor loss_for(TaskKind task, const at::Tensor& output, const at::Tensor& target) {
  switch (task) {
    case TaskKind::kClassification:
      return torch::nn::functional::cross_entropy(output, target);
    case TaskKind::kRegression:
      return torch::nn::functional::mse_loss(output, target);
    case TaskKind::kLanguage:
      return torch::nn::functional::cross_entropy(output.flatten(0, 1), target.flatten());
  }
  throw InternalError("loss_for: unknown task");
}

at::Tensor loss_for(const TensorDataset& data, const at::Tensor& output, const at::Tensor& target) {
  return loss_for(task_of(data), output, target);
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
  // A tensor of its own: 2.15's CPUGeneratorImpl::set_state reads the
  // state's storage from its start, so a row of the [ranks, bytes] rng.pt
  // (a view at an offset) crashed every rank but 0.
  const at::Tensor owned = state.contiguous().clone();
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(owned);
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
