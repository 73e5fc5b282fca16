// The training configuration: one struct per section, each field with its
// default and a one-line meaning in the field table (config.cpp), which is
// the single source for parsing, --set overrides, the resolved YAML dump and
// the reference in docs/config.md (a test fails when they drift).
//
// Precedence: --set section.key=value > the YAML file > the defaults below.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "lockstep/check/check_kinds.h"
#include "lockstep/ddp/ddp_options.h"
#include "lockstep/distributed/backend_kind.h"
#include "lockstep/distributed/shm_options.h"
#include "lockstep/model/model_config.h"
#include "lockstep/optim/optim_config.h"
#include "lockstep/util/names.h"
#include "lockstep/util/timeouts.h"

namespace lockstep {

// The closed choices of the configuration, each with its one name table
// (parsing, error messages, the YAML dump, docs/config.md). Models are not
// here: model.name is open, since programs register their own models.
enum class DatasetKind { kDigits, kSynthetic, kCsv, kMnist, kText, kTokens };
inline constexpr NameTable<DatasetKind, 6> kDatasetKindNames{
    {{DatasetKind::kDigits, "digits"},
     {DatasetKind::kSynthetic, "synthetic"},
     {DatasetKind::kCsv, "csv"},
     {DatasetKind::kMnist, "mnist"},
     {DatasetKind::kText, "text"},
     {DatasetKind::kTokens, "tokens"}}};
// Where the model, its gradients and batches live: auto is cuda with the
// nccl backend, cpu otherwise; cuda is GPU LOCAL_RANK (modulo the GPUs seen).
enum class DeviceKind { kAuto, kCpu, kCuda };
inline constexpr NameTable<DeviceKind, 3> kDeviceKindNames{
    {{DeviceKind::kAuto, "auto"}, {DeviceKind::kCpu, "cpu"}, {DeviceKind::kCuda, "cuda"}}};
// train.precision: the forward's arithmetic (Note [Mixed precision] in
// train/precision.h). Weights, gradients and optimizer state stay float32.
// auto: bf16 where this machine's bf16 products beat fp32's, else fp32,
// decided at start (Note [Precision that knows the CPU], precision_choice.cpp).
enum class Precision { kFp32, kBf16, kFp16, kAuto };
inline constexpr NameTable<Precision, 4> kPrecisionNames{{{Precision::kFp32, "fp32"},
                                                          {Precision::kBf16, "bf16"},
                                                          {Precision::kFp16, "fp16"},
                                                          {Precision::kAuto, "auto"}}};
// A validation metric: what checkpoint.keep_best and train.early_stop watch.
enum class WatchedMetric { kNone, kValLoss, kValAccuracy, kValPerplexity };
inline constexpr NameTable<WatchedMetric, 4> kWatchedMetricNames{
    {{WatchedMetric::kNone, "none"},
     {WatchedMetric::kValLoss, "val_loss"},
     {WatchedMetric::kValAccuracy, "val_accuracy"},
     {WatchedMetric::kValPerplexity, "val_perplexity"}}};
// Better is lower (min) or higher (max); auto: max for accuracy, else min.
enum class MetricMode { kAuto, kMin, kMax };
inline constexpr NameTable<MetricMode, 3> kMetricModeNames{
    {{MetricMode::kAuto, "auto"}, {MetricMode::kMin, "min"}, {MetricMode::kMax, "max"}}};
enum class OnCheckpointError { kFail, kWarn };
inline constexpr NameTable<OnCheckpointError, 2> kOnCheckpointErrorNames{
    {{OnCheckpointError::kFail, "fail"}, {OnCheckpointError::kWarn, "warn"}}};
// checkpoint.format (docs/checkpoints.md): rank 0's model.pt/optimizer.pt,
// or every rank's shard file with an index (Note [Sharded checkpoints]).
enum class CheckpointFormat { kConsolidated, kSharded };
inline constexpr NameTable<CheckpointFormat, 2> kCheckpointFormatNames{
    {{CheckpointFormat::kConsolidated, "consolidated"}, {CheckpointFormat::kSharded, "sharded"}}};
enum class Progress { kAuto, kBar, kPlain };
inline constexpr NameTable<Progress, 3> kProgressNames{
    {{Progress::kAuto, "auto"}, {Progress::kBar, "bar"}, {Progress::kPlain, "plain"}}};

struct RunConfig {
  std::string name = "run";
  std::string dir = "runs";
  int64_t seed = 0;
  // A fresh run (no checkpoint.resume) into a run directory that holds
  // another run's checkpoints or metrics: false refuses (exit 2), true moves
  // them aside into <run dir>/overwritten-<time>/ first.
  bool overwrite = false;
};

struct DistConfig {
  BackendKind backend = BackendKind::kAuto;
  double shm_chunk_mb = bytes_to_mib(ShmOptions{}.chunk_bytes);
  double timeout_s = kCollectiveTimeout.count();
  double rdzv_timeout_s = kRendezvousTimeout.count();
};

struct DataConfig {
  DatasetKind name = DatasetKind::kDigits;
  std::string path;
  std::string label_column = "-1";
  int64_t max_classes = 100000;
  double validation_fraction = 0.2;
  int64_t batch_size = 32;
  bool shuffle = true;
  bool drop_last = false;
  bool prefetch = true;
  int64_t synthetic_size = 4096;
  int64_t synthetic_features = 32;
  int64_t synthetic_classes = 10;
  int64_t vocab_size = 0;  // tokens: the vocabulary (0: 50257 for llm.c files, else required)
  // tokens: the tokenizer that made them ("gpt2", a folder with encoder.json
  // and vocab.bpe, or empty: ids only), for lockstep generate's --prompt.
  std::string tokenizer;
};

struct TrainConfig {
  int64_t epochs = 10;
  int64_t max_steps = 0;
  int64_t accumulation_steps = 1;
  double clip_grad_norm = 0;
  DeviceKind device = DeviceKind::kAuto;
  Precision precision = Precision::kFp32;
  double loss_scale = kLossScaleDefault;  // fp16: the GradScaler's initial scale
  int64_t loss_scale_growth_interval = kLossScaleGrowthIntervalDefault;  // before it doubles
  std::string loss = "auto";  // auto (the task's), cross_entropy, mse, or a register_loss name
  double clip_value = 0;      // clamp every gradient element to [-v, v] (0: off)
  int64_t eval_every = 0;     // also evaluate every N steps (0: at epoch ends only)
  int64_t eval_batches = 0;   // validation batches per rank per evaluation (0: all)
  // train.early_stop: {metric, patience, min_delta} (YAML) or
  // --set train.early_stop.metric=val_loss.
  WatchedMetric early_stop_metric = WatchedMetric::kNone;
  int64_t early_stop_patience = 3;  // evaluations without improvement before stopping
  double early_stop_min_delta = 0;  // what counts as an improvement
  // fp32/bf16: stop every rank (exit 1) at the first non-finite loss or
  // gradient norm, before the optimizer steps on it (fp16: the GradScaler
  // skips such steps instead).
  bool stop_on_nonfinite = true;
};

struct DdpConfig {
  // Defaults: DDP's own (ddp/ddp_options.h).
  double bucket_cap_mb = DdpOptions{}.bucket_cap_mb;
  double first_bucket_cap_mb = DdpOptions{}.first_bucket_cap_mb;
  bool gradient_as_bucket_view = DdpOptions{}.gradient_as_bucket_view;
  bool find_unused_parameters = DdpOptions{}.find_unused_parameters;
  bool broadcast_buffers = DdpOptions{}.broadcast_buffers;
  std::string comm_hook = "allreduce";  // built-in (kCommHookKindNames) or registered
  // ddp.powersgd: PyTorch's PowerSGDState, defaults included (ddp/powersgd.h).
  PowerSgdOptions powersgd;  // ddp.powersgd.*: PyTorch's PowerSGDState defaults
};

PowerSgdOptions powersgd_options_from_config(const DdpConfig& ddp);

struct CheckConfig {
  int64_t every = 1;
  DigestMode mode = DigestMode::kAuto;
  CheckPolicy policy = CheckPolicy::kAbort;
  bool buffers = false;
  bool optimizer_state = false;
  // Note [Silent corruption] (check/corruption.cpp): each rank's local
  // gradient screened before the exchange, every step; replayed by another
  // rank every N steps (0: off); what a caught rank does. The screen is on
  // by default: its cost on the GPT demo is within the noise (docs/consistency.md).
  bool grad_screen = true;
  int64_t replay_every = 0;
  OnCorruption on_corruption = OnCorruption::kStop;
};

struct CheckpointConfig {
  int64_t every = 0;
  int64_t keep = 3;
  std::string resume;
  bool on_signal = false;
  OnCheckpointError on_error = OnCheckpointError::kFail;  // a checkpoint that cannot be written
  WatchedMetric keep_best = WatchedMetric::kNone;  // keep checkpoints/best: the best evaluation
  MetricMode mode = MetricMode::kAuto;             // keep_best: lower or higher is better
  // Resume although the training data's size or identity differs from the
  // writer's (state.yaml's data_size, data_id): the epoch is re-mapped.
  bool allow_data_change = false;
  CheckpointFormat format = CheckpointFormat::kConsolidated;
  // Sharded only: the step pauses for a copy to host memory; the files are
  // written on a background thread (one save in flight).
  bool async = false;
};

struct LogConfig {
  std::string level = "info";
  int64_t every = 10;
  bool file = false;
  Progress progress = Progress::kAuto;
  bool trace = false;
  bool tensorboard = false;  // events.out.tfevents.* in the run directory (rank 0)
  bool mfu = false;          // language models: the matmul peak measured at start, MFU reported
  bool sync_timing = false;  // a GPU's step phases timed to their end (ms.*), for profiling
};

struct Config {
  RunConfig run;
  DistConfig dist;
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  OptimConfig optim;
  DdpConfig ddp;
  CheckConfig check;
  CheckpointConfig checkpoint;
  LogConfig log;
  // Where each key set away from its default was set: "file:line" or
  // "--set" (Note [Config includes], config.cpp); config_origin() reads it.
  std::map<std::string, std::string> origin;
};
// " (set at base.yaml:12)" for a key set in a file or by --set; "" for a default.
std::string config_origin(const Config& config, const std::string& key);

// Loads `path` (empty: defaults only) after the files its `include:` names
// (Note [Config includes]), then applies "section.key=value" overrides. Throws ConfigError:
// malformed YAML with line and column, an unknown key with the nearest valid one, a wrong type or
// out-of-range value with its path and value.
Config config_load(const std::string& path, const std::vector<std::string>& overrides = {});

// Derived checks that need the world (e.g. the global batch).
void config_validate(const Config& config, int world_size);

// What every command that runs a config does first (train, check --config,
// eval): config_load, then config_validate for one rank, so that a
// cross-field error exits 2 before any rendezvous, on every rank alike.
Config config_load_validated(const std::string& path, const std::vector<std::string>& overrides);

// "model.name mlp on data.name digits" (and data.path when one is set): what
// a config trains, for start-up lines.
std::string config_summary(const Config& config);

// Every field, resolved, as YAML (saved in the run directory; hashed and
// compared across ranks).
std::string config_to_yaml(const Config& config);

// docs/config.md's table: section, key, type, default, meaning.
std::string config_reference_markdown();

}  // namespace lockstep
