// Most of it is the field table, one entry per
// configuration field, kept in one place on purpose.
// The field table: every configuration field, once, with its type, limits,
// choices and meaning. Parsing, overrides, the YAML dump and the reference
// documentation are all walks over this table.
#include "lockstep/config/config.h"
#include "lockstep/model/gpt.h"
#include "lockstep/model/llama.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <set>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <limits>
#include <sstream>

#include "lockstep/util/error.h"
#include "lockstep/util/fs.h"
#include "lockstep/util/log.h"
#include "lockstep/util/text.h"
#include "lockstep/util/utf8.h"

namespace lockstep {
namespace {

enum class Type { kInt, kDouble, kBool, kString };

struct Field {
  std::string section;
  std::string key;
  Type type;
  std::string help;
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  std::vector<std::string> choices;
  std::function<std::string(const Config&)> get;
  std::function<void(Config&, const std::string&, const std::string& where)> set;
  std::string path() const { return section + "." + key; }
};

std::string format_double(double v) {
  return number_text(v);
}

int64_t parse_int(const std::string& text, const std::string& where) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE) {
    throw ConfigError(where + ": '" + text + "' is not an integer");
  }
  return v;
}

double parse_double(const std::string& text, const std::string& where) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v)) {
    throw ConfigError(where + ": '" + text + "' is not a number");
  }
  return v;
}

bool parse_bool(const std::string& text, const std::string& where) {
  if (text == "true" || text == "True" || text == "yes" || text == "on") return true;
  if (text == "false" || text == "False" || text == "no" || text == "off") return false;
  throw ConfigError(where + ": '" + text + "' is not a boolean (true or false)");
}

void check_range(const Field& f, double v, const std::string& text, const std::string& where) {
  if (v < f.lo || v > f.hi) {
    std::string range = "[" + (std::isinf(f.lo) ? std::string("-inf") : format_double(f.lo)) +
                        ", " + (std::isinf(f.hi) ? std::string("inf") : format_double(f.hi)) + "]";
    throw ConfigError(where + ": " + text + " is out of range " + range);
  }
}

// A field of type T that `ref` finds in a Config.
template <typename T, typename Ref>
Field field_at(const char* section, const char* key, Ref ref, Type type, std::string help,
               double lo, double hi, std::vector<std::string> choices) {
  Field f{section, key, type, std::move(help), lo, hi, std::move(choices), nullptr, nullptr};
  f.get = [ref](const Config& c) -> std::string {
    const T& v = ref(const_cast<Config&>(c));
    if constexpr (std::is_same_v<T, std::string>) {
      return v;
    } else if constexpr (std::is_same_v<T, bool>) {
      return v ? "true" : "false";
    } else if constexpr (std::is_same_v<T, double>) {
      return format_double(v);
    } else {
      return std::to_string(v);
    }
  };
  const Field shape = f;
  f.set = [ref, shape](Config& c, const std::string& text, const std::string& where) {
    T& v = ref(c);
    if constexpr (std::is_same_v<T, std::string>) {
      // Note [Strings in config.yaml]: only what writes back and reads the same.
      if (!utf8_valid(text) || text.find('\0') != std::string::npos)
        throw ConfigError((where.rfind("--set ", 0) == 0 ? "--set " + shape.path() : where) +
                          ": not UTF-8 text (a NUL or a byte sequence that is no UTF-8); "
                          "config.yaml could not hold it");
      if (!shape.choices.empty() &&
          std::find(shape.choices.begin(), shape.choices.end(), text) == shape.choices.end()) {
        std::string valid;
        for (const auto& ch : shape.choices) valid += (valid.empty() ? "" : ", ") + ch;
        throw ConfigError(where + ": '" + text + "' is not one of " + valid);
      }
      v = text;
    } else if constexpr (std::is_same_v<T, bool>) {
      v = parse_bool(text, where);
    } else if constexpr (std::is_same_v<T, double>) {
      const double parsed = parse_double(text, where);
      check_range(shape, parsed, text, where);
      v = parsed;
    } else {
      const int64_t parsed = parse_int(text, where);
      check_range(shape, static_cast<double>(parsed), text, where);
      v = parsed;
    }
  };
  return f;
}

constexpr double kNoLimit = std::numeric_limits<double>::infinity();

template <typename S, typename T>
Field make_field(const char* section, const char* key, S Config::*sec, T S::*member, Type type,
                 std::string help, double lo = -kNoLimit, double hi = kNoLimit,
                 std::vector<std::string> choices = {}) {
  return field_at<T>(
      section, key, [sec, member](Config& c) -> T& { return c.*sec.*member; }, type,
      std::move(help), lo, hi, std::move(choices));
}

// A field of an options struct held whole in a section (ddp.powersgd.*:
// PowerSgdOptions), so that the options need no copying field by field.
template <typename S, typename U, typename T>
Field make_field(const char* section, const char* key, S Config::*sec, U S::*sub, T U::*member,
                 Type type, std::string help, double lo = -kNoLimit, double hi = kNoLimit) {
  return field_at<T>(section, key,
                     [sec, sub, member](Config& c) -> T& { return c.*sec.*sub.*member; }, type,
                     std::move(help), lo, hi, {});
}

// A field that holds an enum: its names come from the enum's one table.
template <typename S, typename E, std::size_t N>
Field make_choice(const char* section, const char* key, S Config::*sec, E S::*member,
                  const NameTable<E, N>& table, std::string help) {
  Field f{section,
          key,
          Type::kString,
          std::move(help),
          -std::numeric_limits<double>::infinity(),
          std::numeric_limits<double>::infinity(),
          names_of(table),
          nullptr,
          nullptr};
  f.get = [sec, member, &table](const Config& c) -> std::string {
    return name_of(table, c.*sec.*member);
  };
  f.set = [sec, member, &table](Config& c, const std::string& text, const std::string& where) {
    c.*sec.*member = parse_named(table, text, where);
  };
  return f;
}

const std::vector<Field>& fields() {
  using C = Config;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  static const std::vector<Field> table{
      make_field("run", "name", &C::run, &RunConfig::name, Type::kString,
                 "run name: the run directory is <dir>/<name>"),
      make_field("run", "dir", &C::run, &RunConfig::dir, Type::kString,
                 "parent of run directories"),
      make_field("run", "seed", &C::run, &RunConfig::seed, Type::kInt,
                 "seed of model init, shuffling, split and dropout", 0, 1e15),
      make_field("run", "overwrite", &C::run, &RunConfig::overwrite, Type::kBool,
                 "a fresh run into a run directory holding another run's checkpoints or "
                 "metrics: false refuses (exit 2), true moves them into "
                 "<run dir>/overwritten-<time>/ first"),
      make_choice("dist", "backend", &C::dist, &DistConfig::backend, kBackendKindNames,
                  "process group backend (auto: shm when every rank is on one host, hierarchical "
                  "when several hosts hold as many ranks each, else gloo)"),
      make_field("dist", "shm_chunk_mb", &C::dist, &DistConfig::shm_chunk_mb, Type::kDouble,
                 "shm backend: MiB per step through each rank's slot; /dev/shm holds 2 x (ranks + "
                 "1) of them",
                 0.0625, 1024),
      make_field("dist", "timeout_s", &C::dist, &DistConfig::timeout_s, Type::kDouble,
                 "seconds before a collective a peer misses fails", 0.001, 1e7),
      make_field("dist", "rdzv_timeout_s", &C::dist, &DistConfig::rdzv_timeout_s, Type::kDouble,
                 "seconds to reach the store and for every rank to arrive", 0.001, 1e7),
      make_field("model", "name", &C::model, &ModelConfig::name, Type::kString,
                 "architecture: mlp, cnn, resnet (model.depth, model.width), transformer, gpt or "
                 "llama (language models: model.n_*), "
                 "torchscript (model.path), or a name a "
                 "program registered with lockstep::register_model"),
      make_field("model", "hidden", &C::model, &ModelConfig::hidden, Type::kInt,
                 "hidden width (mlp), channels (cnn), model width (transformer)", 1, 1 << 16),
      make_field("model", "layers", &C::model, &ModelConfig::layers, Type::kInt,
                 "hidden layers (mlp), encoder layers (transformer)", 1, 128),
      make_field("model", "dropout", &C::model, &ModelConfig::dropout, Type::kDouble,
                 "dropout probability", 0, 0.99),
      make_field("model", "batch_norm", &C::model, &ModelConfig::batch_norm, Type::kBool,
                 "cnn: BatchNorm2d after each convolution"),
      make_field("model", "sync_batchnorm", &C::model, &ModelConfig::sync_batchnorm, Type::kBool,
                 "every BatchNorm's statistics over the whole global batch "
                 "(lockstep::SyncBatchNorm, as PyTorch's nn.SyncBatchNorm)"),
      make_field("model", "depth", &C::model, &ModelConfig::depth, Type::kInt,
                 "resnet: 10, 18 or 34 layers (BasicBlocks per stage 1,1,1,1 / 2,2,2,2 / "
                 "3,4,6,3)",
                 10, 34),
      make_field("model", "width", &C::model, &ModelConfig::width, Type::kInt,
                 "resnet: the first stage's channels, doubled at each of the 4 stages "
                 "(ResNet-18: 64)",
                 1, 1 << 12),
      make_choice("model", "stem", &C::model, &ModelConfig::stem, kResNetStemNames,
                  "resnet: cifar (3x3 convolution, stride 1: small images) or imagenet (7x7, "
                  "stride 2, max pooling)"),
      make_field("model", "heads", &C::model, &ModelConfig::heads, Type::kInt,
                 "attention heads (transformer; must divide hidden)", 1, 256),
      make_field("model", "token_size", &C::model, &ModelConfig::token_size, Type::kInt,
                 "features per token (transformer; must divide the feature count)", 1, 1 << 16),
      make_field("model", "path", &C::model, &ModelConfig::path, Type::kString,
                 "torchscript: the module saved by torch.jit.script(model).save(path)"),
      make_field("model", "init_from", &C::model, &ModelConfig::init_from, Type::kString,
                 "state dict to start from (torch.save(model.state_dict()) or a lockstep "
                 "checkpoint's model.pt); empty: random init"),
      make_field("model", "n_layer", &C::model, &ModelConfig::n_layer, Type::kInt,
                 "gpt, llama: transformer blocks", 1, 256),
      make_field("model", "n_head", &C::model, &ModelConfig::n_head, Type::kInt,
                 "gpt, llama: attention heads (must divide n_embd)", 1, 256),
      make_field("model", "n_embd", &C::model, &ModelConfig::n_embd, Type::kInt,
                 "gpt, llama: embedding width", 1, 1 << 16),
      make_field("model", "block_size", &C::model, &ModelConfig::block_size, Type::kInt,
                 "gpt, llama: context length in tokens; text and tokens data come in windows of it",
                 1, 1 << 20),
      make_field("model", "bias", &C::model, &ModelConfig::bias, Type::kBool,
                 "gpt: biases in the Linear layers and LayerNorms (GPT-2: true)"),
      make_field(
          "model", "activation_checkpointing", &C::model, &ModelConfig::activation_checkpointing,
          Type::kBool,
          "gpt, llama: keep only each block's input and recompute its activations in backward "
          "(torch.utils.checkpoint; less memory, one more forward per block; gradients "
          "bit-identical)"),
      make_field("model", "n_kv_head", &C::model, &ModelConfig::n_kv_head, Type::kInt,
                 "llama: key/value heads, each serving n_head / n_kv_head query heads "
                 "(grouped-query attention; 0: n_head)",
                 0, 256),
      make_field("model", "intermediate_size", &C::model, &ModelConfig::intermediate_size,
                 Type::kInt, "llama: the SwiGLU MLP's width (0: 4 x n_embd)", 0, 1 << 20),
      make_field("model", "rope_theta", &C::model, &ModelConfig::rope_theta, Type::kDouble,
                 "llama: the rotary embeddings' base (Llama 2: 10000, Llama 3: 500000)", 1, 1e12),
      make_field("model", "rms_norm_eps", &C::model, &ModelConfig::rms_norm_eps, Type::kDouble,
                 "llama: RMSNorm's epsilon", 1e-12, 1),
      make_field("model", "tie_embeddings", &C::model, &ModelConfig::tie_embeddings, Type::kBool,
                 "llama: the output head is the token embedding (no lm_head.weight)"),
      make_choice("model", "rope_scaling", &C::model, &ModelConfig::rope_scaling, kRopeScalingNames,
                  "llama: the rotary frequencies as they are, or scaled as Llama 3.1-3.3's "
                  "(transformers' rope_type llama3)"),
      make_field("model", "rope_factor", &C::model, &ModelConfig::rope_factor, Type::kDouble,
                 "llama, rope_scaling llama3: low frequencies divided by this (factor)", 1, 1e6),
      make_field("model", "rope_low_freq_factor", &C::model, &ModelConfig::rope_low_freq_factor,
                 Type::kDouble,
                 "llama, rope_scaling llama3: wavelengths over original_max_position_embeddings / "
                 "this are scaled (low_freq_factor)",
                 1e-6, 1e6),
      make_field("model", "rope_high_freq_factor", &C::model, &ModelConfig::rope_high_freq_factor,
                 Type::kDouble,
                 "llama, rope_scaling llama3: wavelengths under original_max_position_embeddings / "
                 "this are kept; between the two they are blended (high_freq_factor)",
                 1e-6, 1e6),
      make_field("model", "rope_original_max_position_embeddings", &C::model,
                 &ModelConfig::rope_original_max_position_embeddings, Type::kInt,
                 "llama, rope_scaling llama3: the context the model was pretrained at "
                 "(original_max_position_embeddings)",
                 1, int64_t{1} << 30),
      make_choice("data", "name", &C::data, &DataConfig::name, kDatasetKindNames, "dataset"),
      make_field("data", "path", &C::data, &DataConfig::path, Type::kString,
                 "csv: the file; mnist: the folder of idx files; text: any file, read as bytes; "
                 "tokens: a .bin of uint16 tokens (nanoGPT's, or llm.c's with its header), or "
                 "a folder with train.bin and val.bin"),
      make_field("data", "label_column", &C::data, &DataConfig::label_column, Type::kString,
                 "csv: label column, a header name or an index (-1: last)"),
      make_field("data", "max_classes", &C::data, &DataConfig::max_classes, Type::kInt,
                 "csv: a label at or above this is an error, not a model that large", 2, 1e9),
      make_field("data", "validation_fraction", &C::data, &DataConfig::validation_fraction,
                 Type::kDouble, "share held out for validation (mnist uses its test files)", 0,
                 0.9),
      make_field("data", "batch_size", &C::data, &DataConfig::batch_size, Type::kInt,
                 "per-rank micro-batch size", 1, 1 << 20),
      make_field("data", "shuffle", &C::data, &DataConfig::shuffle, Type::kBool,
                 "reshuffle every epoch (DistributedSampler)"),
      make_field("data", "drop_last", &C::data, &DataConfig::drop_last, Type::kBool,
                 "drop the tail instead of padding shards and the last batch"),
      make_field("data", "prefetch", &C::data, &DataConfig::prefetch, Type::kBool,
                 "assemble batches on a background thread"),
      make_field("data", "synthetic_size", &C::data, &DataConfig::synthetic_size, Type::kInt,
                 "synthetic: examples", 1, 1e9),
      make_field("data", "synthetic_features", &C::data, &DataConfig::synthetic_features,
                 Type::kInt, "synthetic: features", 1, 1 << 20),
      make_field("data", "synthetic_classes", &C::data, &DataConfig::synthetic_classes, Type::kInt,
                 "synthetic: classes", 2, 1 << 20),
      make_field("data", "tokenizer", &C::data, &DataConfig::tokenizer, Type::kString,
                 "tokens: the tokenizer that made the files, recorded for lockstep generate "
                 "--prompt TEXT: gpt2 (GPT-2's BPE, as lockstep tokenize writes it), a .tiktoken "
                 "rank file, a tokenizer.json, or a folder with encoder.json and vocab.bpe (a "
                 "path: relative to the config file's folder); empty: token ids in and out"),
      make_field("data", "vocab_size", &C::data, &DataConfig::vocab_size, Type::kInt,
                 "tokens: the vocabulary (0: llm.c files' own, 50257 for magic 20240520, "
                 "128256 for 20240801; a nanoGPT .bin needs it set, e.g. to its meta.pkl's "
                 "vocab_size, which lockstep does not read); text is bytes: 256",
                 0, 1 << 24),
      make_field("train", "epochs", &C::train, &TrainConfig::epochs, Type::kInt, "epochs to train",
                 1, 1e9),
      make_field("train", "max_steps", &C::train, &TrainConfig::max_steps, Type::kInt,
                 "stop after this many optimizer steps (0: run all epochs)", 0, 1e15),
      make_field("train", "accumulation_steps", &C::train, &TrainConfig::accumulation_steps,
                 Type::kInt, "micro-batches per optimizer step (no_sync on all but the last)", 1,
                 1 << 20),
      make_field("train", "clip_grad_norm", &C::train, &TrainConfig::clip_grad_norm, Type::kDouble,
                 "clip gradients to this global norm after synchronisation (0: off)", 0, kInf),
      make_field("train", "clip_value", &C::train, &TrainConfig::clip_value, Type::kDouble,
                 "clamp every gradient element to [-v, v] after synchronisation, before "
                 "clip_grad_norm (0: off)",
                 0, kInf),
      make_choice("train", "device", &C::train, &TrainConfig::device, kDeviceKindNames,
                  "where the model and batches live (auto: cuda with dist.backend nccl, else "
                  "cpu; cuda: GPU LOCAL_RANK modulo the GPUs seen)"),
      make_field("train", "loss", &C::train, &TrainConfig::loss, Type::kString,
                 "auto (cross-entropy for classes and next tokens, MSE for regression), "
                 "cross_entropy, mse, or a name given to register_loss",
                 -kInf, kInf),
      make_field("train", "eval_every", &C::train, &TrainConfig::eval_every, Type::kInt,
                 "also evaluate the validation split every N steps (0: at epoch ends only)", 0,
                 1e15),
      make_field("train", "eval_batches", &C::train, &TrainConfig::eval_batches, Type::kInt,
                 "validation batches per rank per evaluation (0: the whole split)", 0, 1e9),
      make_choice("train", "early_stop.metric", &C::train, &TrainConfig::early_stop_metric,
                  kWatchedMetricNames,
                  "stop every rank when this validation metric has not improved for "
                  "early_stop.patience evaluations (none: never)"),
      make_field("train", "early_stop.patience", &C::train, &TrainConfig::early_stop_patience,
                 Type::kInt, "evaluations without improvement before early stopping", 1, 1e9),
      make_field("train", "early_stop.min_delta", &C::train, &TrainConfig::early_stop_min_delta,
                 Type::kDouble, "the least change that counts as an improvement", 0, 1e30),
      make_field("train", "stop_on_nonfinite", &C::train, &TrainConfig::stop_on_nonfinite,
                 Type::kBool,
                 "fp32/bf16: stop every rank (exit 1, no checkpoint of that state) at the first "
                 "non-finite loss or gradient norm (fp16: the GradScaler skips such steps)"),
      make_choice("train", "precision", &C::train, &TrainConfig::precision, kPrecisionNames,
                  "the forward's arithmetic: fp32, or autocast to bf16 (no loss scaling) or fp16 "
                  "(with the GradScaler); weights and optimizer state stay fp32; auto: bf16 where "
                  "a start-up probe finds its products at least 1.2x fp32's (on CUDA: bf16), "
                  "else fp32; a CPU run with bf16/fp16 slower than fp32 is warned of"),
      make_field("train", "loss_scale", &C::train, &TrainConfig::loss_scale, Type::kDouble,
                 "fp16: the GradScaler's initial loss scale (halved on inf/NaN gradients)", 1e-30,
                 3e38),
      make_field("train", "loss_scale_growth_interval", &C::train,
                 &TrainConfig::loss_scale_growth_interval, Type::kInt,
                 "fp16: steps without inf/NaN gradients before the loss scale doubles", 1,
                 2147483647),
      make_choice("optim", "name", &C::optim, &OptimConfig::name, kOptimizerKindNames, "optimizer"),
      make_field("optim", "lr", &C::optim, &OptimConfig::lr, Type::kDouble, "peak learning rate", 0,
                 1e6),
      make_field("optim", "momentum", &C::optim, &OptimConfig::momentum, Type::kDouble,
                 "sgd: momentum", 0, 1),
      make_field("optim", "nesterov", &C::optim, &OptimConfig::nesterov, Type::kBool,
                 "sgd: Nesterov momentum"),
      make_field("optim", "weight_decay", &C::optim, &OptimConfig::weight_decay, Type::kDouble,
                 "L2 penalty (sgd, adam) or decoupled decay (adamw)", 0, 1e3),
      make_field("optim", "beta1", &C::optim, &OptimConfig::beta1, Type::kDouble,
                 "adam/adamw: first moment decay", 0, 0.999999),
      make_field("optim", "beta2", &C::optim, &OptimConfig::beta2, Type::kDouble,
                 "adam/adamw: second moment decay", 0, 0.999999),
      make_field("optim", "eps", &C::optim, &OptimConfig::eps, Type::kDouble,
                 "adam/adamw: denominator epsilon", 0, 1),
      make_choice("optim", "schedule", &C::optim, &OptimConfig::schedule, kScheduleNames,
                  "learning-rate schedule after warmup"),
      make_field("optim", "warmup_steps", &C::optim, &OptimConfig::warmup_steps, Type::kInt,
                 "linear warmup from 0 over this many steps", 0, 1e15),
      make_field("optim", "step_size", &C::optim, &OptimConfig::step_size, Type::kInt,
                 "step schedule: multiply by gamma every this many steps", 1, 1e15),
      make_field("optim", "gamma", &C::optim, &OptimConfig::gamma, Type::kDouble,
                 "step schedule: factor", 0, 1),
      make_field("optim", "min_lr", &C::optim, &OptimConfig::min_lr, Type::kDouble,
                 "cosine schedule: final learning rate", 0, 1e6),
      make_field("optim", "decay_steps", &C::optim, &OptimConfig::decay_steps, Type::kInt,
                 "the schedule's length in steps, warm-up included (nanoGPT's lr_decay_iters; "
                 "past it the cosine stays at min_lr); 0: train.max_steps when set, else the "
                 "epochs' steps",
                 0, 1e15),
      make_field("optim", "zero", &C::optim, &OptimConfig::zero, Type::kInt,
                 "ZeRO stage: 0 every rank keeps the whole optimizer state; 1 each rank keeps "
                 "its parameters' share; 2 also reduce-scatters the gradients to their owners; "
                 "3 also keeps each weight on its owner only, gathered per block for forward "
                 "and backward (docs/zero.md)",
                 0, 3),
      make_field("ddp", "bucket_cap_mb", &C::ddp, &DdpConfig::bucket_cap_mb, Type::kDouble,
                 "gradient bucket cap (MB)", 0, 1e5),
      make_field("ddp", "first_bucket_cap_mb", &C::ddp, &DdpConfig::first_bucket_cap_mb,
                 Type::kDouble, "first bucket cap (MB)", 0, 1e5),
      make_field("ddp", "gradient_as_bucket_view", &C::ddp, &DdpConfig::gradient_as_bucket_view,
                 Type::kBool, ".grad lives in the bucket (no copy back)"),
      make_field("ddp", "find_unused_parameters", &C::ddp, &DdpConfig::find_unused_parameters,
                 Type::kBool, "reduce missing gradients as zeros instead of failing"),
      make_field(
          "ddp", "broadcast_buffers", &C::ddp, &DdpConfig::broadcast_buffers, Type::kBool,
          "broadcast rank 0's buffers before a forward that follows a synced one (PyTorch's rule)"),
      make_field("ddp", "comm_hook", &C::ddp, &DdpConfig::comm_hook, Type::kString,
                 "gradient exchange: allreduce, fp16, bf16, powersgd (ddp.powersgd.*), or a name "
                 "a program registered with lockstep::register_comm_hook"),
      make_field("ddp", "powersgd.rank", &C::ddp, &DdpConfig::powersgd,
                 &PowerSgdOptions::matrix_approximation_rank, Type::kInt,
                 "powersgd: matrix approximation rank (PyTorch's matrix_approximation_rank)", 1,
                 1 << 16),
      make_field("ddp", "powersgd.start_iter", &C::ddp, &DdpConfig::powersgd,
                 &PowerSgdOptions::start_iter, Type::kInt,
                 "powersgd: plain all-reduce for this many synchronised backwards first "
                 "(start_powerSGD_iter; >= 2 with error_feedback or warm_start)",
                 0, 1e15),
      make_field("ddp", "powersgd.min_compression_rate", &C::ddp, &DdpConfig::powersgd,
                 &PowerSgdOptions::min_compression_rate, Type::kDouble,
                 "powersgd: a gradient is compressed only if it shrinks by more than this", 0, 1e9),
      make_field("ddp", "powersgd.error_feedback", &C::ddp, &DdpConfig::powersgd,
                 &PowerSgdOptions::use_error_feedback, Type::kBool,
                 "powersgd: add the last compression error to the gradient"),
      make_field("ddp", "powersgd.warm_start", &C::ddp, &DdpConfig::powersgd,
                 &PowerSgdOptions::warm_start, Type::kBool,
                 "powersgd: start from the last iteration's Q"),
      make_field("check", "every", &C::check, &CheckConfig::every, Type::kInt,
                 "cross-rank weight fingerprint check every N optimizer steps (0: off)", 0, 1e15),
      make_choice("check", "mode", &C::check, &CheckConfig::mode, kDigestModeNames, "digest"),
      make_choice("check", "policy", &C::check, &CheckConfig::policy, kCheckPolicyNames,
                  "on mismatch"),
      make_field("check", "buffers", &C::check, &CheckConfig::buffers, Type::kBool,
                 "include buffers (e.g. BatchNorm statistics)"),
      make_field("check", "optimizer_state", &C::check, &CheckConfig::optimizer_state, Type::kBool,
                 "also compare the optimizer state (momentum buffers, Adam moments)"),
      make_field("check", "grad_screen", &C::check, &CheckConfig::grad_screen, Type::kBool,
                 "every step, each rank's local gradient before the exchange: a non-finite "
                 "value or a norm 10x the other ranks' and its own recent ones names the rank"),
      make_field("check", "replay_every", &C::check, &CheckConfig::replay_every, Type::kInt,
                 "every N steps each rank also computes its neighbour's local gradient and "
                 "the two are compared bit for bit (0: off)",
                 0, 1e15),
      make_choice("check", "on_corruption", &C::check, &CheckConfig::on_corruption,
                  kOnCorruptionNames,
                  "a rank caught by grad_screen or replay_every: stop the job (exit 6), or "
                  "take the step again (a rank caught twice stops it)"),
      make_field("checkpoint", "every", &C::checkpoint, &CheckpointConfig::every, Type::kInt,
                 "save every N optimizer steps, and always at the end (0: only at the end)", 0,
                 1e15),
      make_field("checkpoint", "keep", &C::checkpoint, &CheckpointConfig::keep, Type::kInt,
                 "checkpoints to keep (the oldest are deleted)", 1, 1e6),
      make_field("checkpoint", "resume", &C::checkpoint, &CheckpointConfig::resume, Type::kString,
                 "empty: start fresh; auto: the newest checkpoint in the run directory, if any; or "
                 "a checkpoint folder"),
      make_choice("checkpoint", "on_error", &C::checkpoint, &CheckpointConfig::on_error,
                  kOnCheckpointErrorNames,
                  "a checkpoint that cannot be written (full disk): fail (exit 2) or warn and "
                  "train on; either way the previous checkpoint is kept"),
      make_field("checkpoint", "on_signal", &C::checkpoint, &CheckpointConfig::on_signal,
                 Type::kBool,
                 "on SIGINT/SIGTERM: finish the step, save a checkpoint on every rank's agreement, "
                 "exit 128+signal (costs one tiny all-reduce per step)"),
      make_choice("checkpoint", "keep_best", &C::checkpoint, &CheckpointConfig::keep_best,
                  kWatchedMetricNames,
                  "keep the checkpoint of the best evaluation so far in checkpoints/best (its "
                  "metric and step in best.yaml), apart from the rolling ones (none: off)"),
      make_choice("checkpoint", "mode", &C::checkpoint, &CheckpointConfig::mode, kMetricModeNames,
                  "keep_best: min (lower is better) or max; auto: max for val_accuracy, else min"),
      make_field("checkpoint", "allow_data_change", &C::checkpoint,
                 &CheckpointConfig::allow_data_change, Type::kBool,
                 "resume although the training data's size or identity differs from the "
                 "checkpoint's (a warning, the epoch re-mapped); false: exit 2"),
      make_choice("checkpoint", "format", &C::checkpoint, &CheckpointConfig::format,
                  kCheckpointFormatNames,
                  "consolidated: model.pt and optimizer.pt written by rank 0 (torch.load opens "
                  "them); sharded: each rank writes what it owns to its own file, in parallel, "
                  "with an index, and any world size reads it back (lockstep checkpoint "
                  "consolidate makes the other form)"),
      make_field("checkpoint", "async", &C::checkpoint, &CheckpointConfig::async, Type::kBool,
                 "format sharded: the periodic checkpoints (checkpoint.every) pause training "
                 "only to copy the state to memory and are written by a background thread; the "
                 "last, best and signal checkpoints are written at once"),
      make_field("log", "level", &C::log, &LogConfig::level, Type::kString, "log level", -kInf,
                 kInf, names_of(kLogLevelNames)),
      make_field("log", "every", &C::log, &LogConfig::every, Type::kInt,
                 "log and record metrics every N optimizer steps", 1, 1e15),
      make_field("log", "file", &C::log, &LogConfig::file, Type::kBool,
                 "also log to <run dir>/rank_<r>.log"),
      make_choice("log", "progress", &C::log, &LogConfig::progress, kProgressNames,
                  "rank 0's progress display (auto: a bar on a terminal)"),
      make_field("log", "mfu", &C::log, &LogConfig::mfu, Type::kBool,
                 "language models: measure this core's (on a GPU, the GPU's) matrix-product peak "
                 "at start (about half a second, in the run's precision) and report the model "
                 "FLOP utilisation (mfu: achieved FLOP/s per rank over that peak)"),
      make_field("log", "tensorboard", &C::log, &LogConfig::tensorboard, Type::kBool,
                 "write TensorBoard scalars and the config to <run dir>/events.out.tfevents.* "
                 "(rank 0)"),
      make_field("log", "trace", &C::log, &LogConfig::trace, Type::kBool,
                 "write a Chrome trace per rank: <run dir>/trace_rank<r>.json (open in Perfetto)"),
      make_field("log", "sync_timing", &C::log, &LogConfig::sync_timing, Type::kBool,
                 "on a GPU: wait for the device at the end of each step phase, so that ms.forward, "
                 "ms.backward, ms.clip and ms.optimizer are the device's times, not the host's "
                 "launch times (a profiling pass: it slows the step)"),
  };
  return table;
}

const Field& find_field(const std::string& section, const std::string& key,
                        const std::string& where) {
  std::vector<std::string> sections, keys;
  for (const auto& f : fields()) {
    if (f.section == section && f.key == key) return f;
    if (std::find(sections.begin(), sections.end(), f.section) == sections.end()) {
      sections.push_back(f.section);
    }
    if (f.section == section) keys.push_back(f.key);
  }
  if (keys.empty()) {
    throw ConfigError(where + ": unknown section '" + section + "' (" +
                      near_miss(section, sections, "") + ")");
  }
  throw ConfigError(where + ": unknown key '" + section + "." + key + "' (" +
                    near_miss(key, keys, section + ".") + ")");
}

std::string mark(const std::string& path, const YAML::Node& node) {
  return path + ":" + std::to_string(node.Mark().line + 1);
}

// Note [Paths in a config]: an input path written in a config file (data.path,
// data.tokenizer, model.path, model.init_from, checkpoint.resume) is
// relative to the file's folder, so that a config and its data move
// together; on the command line (--set) it is relative to the working
// directory, as a shell user expects. Either way it is made absolute, so
// that the resolved config (<run dir>/config.yaml) reads back the same from
// anywhere: eval --checkpoint, generate and resume read that file from
// other folders. Names that are no paths stay as they are: resume's
// "auto" and data.tokenizer's "gpt2". run.dir is output, always relative
// to the working directory.
bool is_input_path(const Field& f) {
  const std::string p = f.path();
  return p == "data.path" || p == "data.tokenizer" || p == "model.path" || p == "model.init_from" ||
         p == "checkpoint.resume";
}

// `value` made absolute against `folder`: "~/" is the home folder, as a
// shell would have it; ".." is resolved as the kernel resolves it (through
// symbolic links), "." and doubled slashes as text.
std::filesystem::path absolute_in(const std::filesystem::path& folder, const std::string& value) {
  std::filesystem::path given = value;
  const char* home = std::getenv("HOME");
  if (value.rfind("~/", 0) == 0 && home != nullptr && *home != '\0')
    given = std::filesystem::path(home) / value.substr(2);
  std::error_code error;
  auto absolute = std::filesystem::absolute(folder / given, error);
  if (error) absolute = folder / given;
  for (const auto& part : absolute)
    if (part == "..") {
      const auto canonical = std::filesystem::weakly_canonical(absolute, error);
      return error ? absolute : canonical;
    }
  return absolute.lexically_normal();
}

// `value` of input path `f` made absolute against `folder` (a config
// file's, or "" for the working directory).
std::string resolved_against(const Field& f, const std::filesystem::path& folder,
                             const std::string& value) {
  const bool name = (f.path() == "checkpoint.resume" && value == "auto") ||
                    (f.path() == "data.tokenizer" && value == "gpt2");
  if (value.empty() || name) return value;
  const std::filesystem::path resolved = absolute_in(folder, value);
  // Older lockstep kept data.tokenizer as given (relative to the working
  // directory) in the config.yaml it saved: where the file's folder holds
  // nothing of that name and the working directory does, that is meant.
  std::error_code error;
  if (f.path() == "data.tokenizer" && !folder.empty() &&
      !std::filesystem::exists(resolved, error) && std::filesystem::exists(value, error))
    return absolute_in("", value).string();
  return resolved.string();
}

std::filesystem::path folder_of(const std::string& config_path) {
  return std::filesystem::path(config_path).parent_path();
}

// Note [Config includes]
// ~~~~~~~~~~~~~~~~~~~~~~
// A config's top-level `include:` names a file or a list of files (paths
// relative to the including file's folder), each loaded, with its own
// includes, before the file's own keys: a later file overrides an earlier
// one, the including file overrides them all, and --set overrides every
// file. Precedence: --set > the file > its includes (the last listed
// first) > defaults. Every key remembers where it was set
// (Config::origin: "file:line" or "--set"), and an error in an included
// file names that file and line. A cycle, or more than kMaxIncludeDepth
// nested includes, is an error naming the chain.
constexpr size_t kMaxIncludeDepth = 16;
// Files loaded for one config, repeats counted (a file listing another 20
// times, 7 levels deep, would otherwise be 20^7 loads), and one file's size.
constexpr size_t kMaxConfigFiles = 64;
constexpr size_t kMaxConfigBytes = 16 << 20;

YAML::Node config_root(const std::string& path, const std::string& where) {
  std::string text;
  try {
    text = read_regular_file(path, kMaxConfigBytes);
  } catch (const DataError& e) {
    throw ConfigError(where + "cannot read config '" + path + "': " + e.what());
  }
  // yaml-cpp reads a raw NUL as an escape of its own (a path "a\0b" became
  // "a\x08 "): refused, with its line, before YAML sees it.
  if (const size_t nul = text.find('\0'); nul != std::string::npos) {
    const auto line =
        std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(nul), '\n');
    throw ConfigError("config " + path + ":" + std::to_string(line + 1) +
                      ": a NUL byte (a binary file, not YAML?)");
  }
  std::vector<YAML::Node> documents;
  try {
    documents = YAML::LoadAll(text);
  } catch (const YAML::ParserException& e) {
    throw ConfigError("config " + path + ":" + std::to_string(e.mark.line + 1) + ":" +
                      std::to_string(e.mark.column + 1) + ": malformed YAML: " + e.msg);
  }
  if (documents.empty() || (documents.size() == 1 && documents[0].IsNull())) {
    throw ConfigError(where + "config " + path +
                      " is empty (give at least one section, e.g. run:)");
  }
  if (documents.size() > 1) {
    throw ConfigError("config " + path + " holds " + std::to_string(documents.size()) +
                      " YAML documents (---); one is read, so give one");
  }
  if (!documents[0].IsMap()) {
    throw ConfigError("config " + path + ": the top level must map sections to their keys");
  }
  return documents[0];
}

std::string chain_text(const std::vector<std::string>& chain, const std::string& last) {
  std::string out;
  for (const auto& file : chain) out += file + " -> ";
  return out + last;
}

void apply_config_file(Config& config, const std::string& path, std::vector<std::string>& chain,
                       size_t& loaded, const std::string& where) {
  if (++loaded > kMaxConfigFiles) {
    throw ConfigError(where + "more than " + std::to_string(kMaxConfigFiles) +
                      " config files loaded for one config (includes repeated over and over?)");
  }
  std::error_code error;
  const std::string identity =
      std::filesystem::weakly_canonical(std::filesystem::absolute(path), error).string();
  if (std::find(chain.begin(), chain.end(), identity) != chain.end()) {
    throw ConfigError(where + "include cycle: " + chain_text(chain, identity));
  }
  if (chain.size() >= kMaxIncludeDepth) {
    throw ConfigError(where + "more than " + std::to_string(kMaxIncludeDepth) +
                      " nested includes: " + chain_text(chain, identity));
  }
  const YAML::Node root = config_root(path, where);
  chain.push_back(identity);
  if (const YAML::Node include = root["include"]) {
    std::vector<YAML::Node> files;
    if (include.IsScalar()) {
      files.push_back(include);
    } else if (include.IsSequence()) {
      for (const auto& file : include) files.push_back(file);
    }
    if (files.empty()) {
      throw ConfigError(mark(path, include) + ": include: a config file's path, or a list of them");
    }
    for (const auto& file : files) {
      if (!file.IsScalar() || file.Scalar().empty()) {
        throw ConfigError(mark(path, file) + ": include: each entry must be a file's path");
      }
      apply_config_file(config, (folder_of(path) / file.Scalar()).string(), chain, loaded,
                        mark(path, file) + ": include '" + file.Scalar() + "': ");
    }
  }
  chain.pop_back();
  std::set<std::string> sections_seen;
  for (const auto& section : root) {
    if (!section.first.IsScalar()) {
      throw ConfigError(mark(path, section.first) + ": a section name must be plain text");
    }
    const std::string name = section.first.Scalar();
    if (!sections_seen.insert(name).second) {
      throw ConfigError(mark(path, section.first) + ": section '" + name +
                        "' appears twice (merge them)");
    }
    if (name == "include") continue;  // applied above
    if (!section.second.IsMap()) {
      bool known = false;
      for (const auto& f : fields()) known = known || f.section == name;
      if (!known) find_field(name, "", mark(path, section.first));  // throws: unknown section
      throw ConfigError(mark(path, section.second) + ": section '" + name +
                        "' must be a mapping of keys to values");
    }
    std::set<std::string> keys_seen;
    // A nested mapping (train: {early_stop: {metric: ...}}) names the
    // dotted keys (train.early_stop.metric); one level deep.
    struct Item {
      YAML::Node at;  // for the message's line and column
      std::string key;
      YAML::Node value;
    };
    std::vector<Item> items;
    for (const auto& item : section.second) {
      if (!item.first.IsScalar()) {
        throw ConfigError(mark(path, item.first) + ": a key must be plain text");
      }
      if (!item.second.IsMap() || item.second.size() == 0) {  // {}: "must be a single value"
        items.push_back({item.first, item.first.Scalar(), item.second});
        continue;
      }
      for (const auto& sub : item.second) {
        if (!sub.first.IsScalar()) {
          throw ConfigError(mark(path, sub.first) + ": a key must be plain text");
        }
        items.push_back({sub.first, item.first.Scalar() + "." + sub.first.Scalar(), sub.second});
      }
    }
    for (const auto& item : items) {
      const std::string where = mark(path, item.at);
      const std::string& key = item.key;
      if (!keys_seen.insert(key).second) {
        throw ConfigError(where + ": " + name + "." + key + " is set twice");
      }
      const Field& f = find_field(name, key, where);
      if (!item.value.IsScalar()) {
        throw ConfigError(where + ": " + f.path() + " must be a single value");
      }
      const std::string value = item.value.Scalar();
      f.set(config, is_input_path(f) ? resolved_against(f, folder_of(path), value) : value,
            where + ": " + f.path());
      config.origin[f.path()] = where;
    }
  }
}

}  // namespace

Config config_load(const std::string& path, const std::vector<std::string>& overrides) {
  Config config;
  if (!path.empty()) {
    std::vector<std::string> chain;
    size_t loaded = 0;
    apply_config_file(config, path, chain, loaded, "");
  }
  for (const auto& assignment : overrides) {
    const auto eq = assignment.find('=');
    const auto dot = assignment.find('.');
    const std::string where = "--set " + assignment;
    if (eq == std::string::npos || dot == std::string::npos || dot > eq) {
      throw ConfigError(where + ": expected section.key=value");
    }
    const std::string section = assignment.substr(0, dot);
    const std::string key = assignment.substr(dot + 1, eq - dot - 1);
    const Field& f = find_field(section, key, where);
    const std::string value = assignment.substr(eq + 1);
    f.set(config, is_input_path(f) ? resolved_against(f, "", value) : value, where);
    config.origin[f.path()] = "--set";
  }
  return config;
}

std::string config_origin(const Config& config, const std::string& key) {
  const auto it = config.origin.find(key);
  if (it == config.origin.end()) return "";
  return it->second == "--set" ? " (set by --set)" : " (set at " + it->second + ")";
}

PowerSgdOptions powersgd_options_from_config(const DdpConfig& ddp) {
  return ddp.powersgd;
}

namespace {

// The rules between sections: each one's condition, and the message that
// names the keys (where they were set) and what to do.
struct CrossRule {
  bool (*broken)(const Config&);
  std::string (*why)(const Config&);
};

const std::vector<CrossRule>& cross_rules() {
  static const std::vector<CrossRule> rules{
      {[](const Config& c) {
         return c.optim.zero >= 2 && !is_comm_hook(c.ddp.comm_hook, CommHookKind::kAllreduce);
       },
       [](const Config& c) {
         return "optim.zero: " + std::to_string(c.optim.zero) +
                " exchanges the gradients by reduce-scatter, so it takes no ddp.comm_hook (it "
                "is '" +
                c.ddp.comm_hook + "'" + config_origin(c, "ddp.comm_hook") +
                "); use optim.zero: 1 with a comm hook";
       }},
      {[](const Config& c) {
         return c.checkpoint.async && c.checkpoint.format != CheckpointFormat::kSharded;
       },
       [](const Config& c) {
         return "checkpoint.async writes each rank's shard in the background, so it needs "
                "checkpoint.format: sharded" +
                config_origin(c, "checkpoint.format") +
                " (rank 0 alone writes a consolidated checkpoint); set both";
       }},
      {[](const Config& c) { return c.optim.zero == 3 && c.ddp.find_unused_parameters; },
       [](const Config& c) {
         return "ddp.find_unused_parameters: optim.zero: 3 reduces each block's gradients as "
                "soon as they are all in, so every parameter of a block that ran forward must "
                "get one" +
                config_origin(c, "ddp.find_unused_parameters") +
                "; use optim.zero: 2 for a model with unused parameters";
       }},
      {[](const Config& c) { return c.optim.zero == 3 && c.check.buffers; },
       [](const Config& c) {
         return "check.buffers compares the ranks' weights and buffers, but with optim.zero: 3 "
                "each weight lives on one rank (its check is the owner's seal)" +
                config_origin(c, "check.buffers") + "; turn check.buffers off";
       }},
      {[](const Config& c) { return c.optim.zero == 3 && c.check.policy == CheckPolicy::kResync; },
       [](const Config& c) {
         return "check.policy: resync copies rank 0's weights to the others, but with "
                "optim.zero: 3 each weight lives on one rank only (there is nothing to copy "
                "from)" +
                config_origin(c, "check.policy") + "; use check.policy: abort or warn";
       }},
      {[](const Config& c) { return c.model.sync_batchnorm && c.check.replay_every > 0; },
       [](const Config& c) {
         return "check.replay_every" + config_origin(c, "check.replay_every") +
                " recomputes one rank's gradient from its batch alone, but with "
                "model.sync_batchnorm" +
                config_origin(c, "model.sync_batchnorm") +
                " every rank's gradient depends on every rank's batch (the statistics are "
                "shared): the replay would name healthy ranks; use check.grad_screen";
       }},
      {[](const Config& c) {
         return c.check.on_corruption == OnCorruption::kSkip &&
                is_comm_hook(c.ddp.comm_hook, CommHookKind::kPowerSgd);
       },
       [](const Config& c) {
         return "check.on_corruption: skip" + config_origin(c, "check.on_corruption") +
                " takes a step again, but ddp.comm_hook: powersgd keeps state across steps (its "
                "error feedback has absorbed the exchange that is thrown away); use "
                "check.on_corruption: stop with PowerSGD";
       }},
      {[](const Config& c) { return c.optim.zero > 0 && c.check.optimizer_state; },
       [](const Config& c) {
         return "check.optimizer_state compares the optimizer state across ranks, but with "
                "optim.zero: " +
                std::to_string(c.optim.zero) +
                " each rank holds a different share of it; turn one of them off (the weights "
                "are still checked)";
       }},
  };
  return rules;
}

}  // namespace

void config_validate(const Config& c, int world_size) {
  if ((c.data.name == DatasetKind::kCsv || c.data.name == DatasetKind::kMnist ||
       c.data.name == DatasetKind::kText || c.data.name == DatasetKind::kTokens) &&
      c.data.path.empty()) {
    throw ConfigError(std::string("data.path must be set for data.name: ") +
                      name_of(kDatasetKindNames, c.data.name));
  }
  // The GPT's shape rules have one home (gpt_options), checked here early.
  const auto builtin = builtin_model(c.model.name);
  if (builtin == BuiltinModel::kGpt) (void)gpt_options(c.model, 256);
  if (builtin == BuiltinModel::kLlama) (void)llama_options(c.model, 256);
  const bool language = is_language_model(c.model.name);
  if (language && c.data.name != DatasetKind::kText && c.data.name != DatasetKind::kTokens) {
    throw ConfigError("model.name: " + c.model.name +
                      " is a language model: it needs data.name: text or tokens (not " +
                      name_of(kDatasetKindNames, c.data.name) + config_origin(c, "data.name") +
                      ")");
  }
  const bool tokens = c.data.name == DatasetKind::kText || c.data.name == DatasetKind::kTokens;
  if (tokens && builtin && !language) {
    throw ConfigError(std::string("data.name: ") + name_of(kDatasetKindNames, c.data.name) +
                      " gives windows of token ids for a language model: model.name: gpt or "
                      "llama (or one a program registered), not " +
                      c.model.name);
  }
  if (builtin == BuiltinModel::kTransformer && c.model.hidden % c.model.heads != 0) {
    throw ConfigError("model.heads=" + std::to_string(c.model.heads) +
                      config_origin(c, "model.heads") + " must divide model.hidden=" +
                      std::to_string(c.model.hidden) + config_origin(c, "model.hidden"));
  }
  if (world_size < 1) throw ConfigError("world size must be >= 1");
  if (is_comm_hook(c.ddp.comm_hook, CommHookKind::kPowerSgd))
    powersgd_validate(powersgd_options_from_config(c.ddp));
  for (const auto& rule : cross_rules())
    if (rule.broken(c)) throw ConfigError(rule.why(c));
  // The per-epoch step count needs the dataset: the trainer checks it
  // (global batch = data.batch_size x world x train.accumulation_steps).
}

Config config_load_validated(const std::string& path, const std::vector<std::string>& overrides) {
  Config config = config_load(path, overrides);
  config_validate(config, 1);
  return config;
}

std::string config_summary(const Config& c) {
  std::string out =
      "model.name " + c.model.name + " on data.name " + name_of(kDatasetKindNames, c.data.name);
  if (!c.data.path.empty()) out += " (" + c.data.path + ")";
  return out;
}

namespace {

// Note [Strings in config.yaml]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// config.yaml is read back by eval, export, generate and resume, so every
// string must read back as it was. Written between quotes unescaped, a
// run.name 'exp "best"' would train, and then every command on its
// checkpoints would fail on malformed YAML (a backslash would read back as
// an escape). A value is a YAML double-quoted scalar: quote, backslash,
// tab, newline, carriage return and the other control characters escaped,
// the rest (UTF-8, validated when the config was read) written as it is.
std::string yaml_quoted(const std::string& raw) {
  std::string out = "\"";
  for (size_t i = 0; i < raw.size(); ++i) {
    const auto c = static_cast<unsigned char>(raw[i]);
    const auto next = i + 1 < raw.size() ? static_cast<unsigned char>(raw[i + 1]) : 0;
    char escaped[8];
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7F) {
      std::snprintf(escaped, sizeof escaped, "\\x%02X", c);
      out += escaped;
    } else if (c == 0xC2 && next >= 0x80 && next <= 0x9F) {  // U+0080..U+009F: not printable
      std::snprintf(escaped, sizeof escaped, "\\u%04X", next);
      out += escaped;
      ++i;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

}  // namespace

std::string config_to_yaml(const Config& config) {
  std::string out;
  std::string section;
  for (const auto& f : fields()) {
    if (f.section != section) {
      section = f.section;
      out += section + ":\n";
    }
    std::string value = f.get(config);
    if (f.type == Type::kString) value = yaml_quoted(value);
    out += "  " + f.key + ": " + value + "\n";
  }
  return out;
}

std::string config_reference_markdown() {
  const Config defaults;
  std::string out = "| key | type | default | meaning |\n| --- | --- | --- | --- |\n";
  for (const auto& f : fields()) {
    static const char* kTypes[] = {"int", "float", "bool", "string"};
    std::string type = kTypes[static_cast<int>(f.type)];
    if (!f.choices.empty()) {
      type = "";
      for (const auto& ch : f.choices) type += (type.empty() ? "" : " \\| ") + ch;
    }
    std::string meaning = f.help;
    if (!std::isinf(f.lo) || !std::isinf(f.hi)) {
      meaning += " [" + format_double(f.lo) + ", " +
                 (std::isinf(f.hi) ? std::string("inf") : format_double(f.hi)) + "]";
    }
    const std::string value = f.get(defaults);
    out += "| `" + f.path() + "` | " + type + " | `" + (value.empty() ? "\"\"" : value) + "` | " +
           meaning + " |\n";
  }
  return out;
}

}  // namespace lockstep
