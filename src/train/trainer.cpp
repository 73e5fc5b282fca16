#include "lockstep/train/trainer.h"

#include <ATen/ATen.h>
#include <sys/stat.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/optimizer.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>

#include <spdlog/spdlog.h>

#include "lockstep/check/fingerprint.h"
#include "lockstep/data/dataset.h"
#include "lockstep/data/loader.h"
#include "lockstep/data/sampler.h"
#include "lockstep/ddp/ddp.h"
#include "lockstep/dist/coalesced.h"
#include "lockstep/train/checkpoint.h"
#include "lockstep/train/fault.h"
#include "lockstep/train/models.h"
#include "lockstep/train/optim.h"
#include "lockstep/util/error.h"
#include "lockstep/util/fs.h"
#include "lockstep/util/log.h"
#include "lockstep/util/sha256.h"
#include "lockstep/util/trace.h"

namespace lockstep {
namespace {

using Clock = std::chrono::steady_clock;

// A dataset or model that the config makes larger than this machine's memory
// is bad input (exit 2 naming the section), not an internal error: the
// allocator's failure (std::bad_alloc, or c10's "can't allocate memory") is
// turned into a ConfigError.
template <typename Body>
void within_memory(const std::string& what, Body&& body) {
  try {
    body();
  } catch (const std::bad_alloc&) {
    throw ConfigError(what + " does not fit in this machine's memory (make it smaller)");
  } catch (const c10::Error& e) {
    const std::string text = e.what_without_backtrace();
    if (text.find("allocate") == std::string::npos && text.find("memory") == std::string::npos) {
      throw;
    }
    throw ConfigError(what + " does not fit in this machine's memory (make it smaller): " +
                      text.substr(0, text.find('\n')));
  }
}

// checkpoint.on_signal: the handler only records the signal; the loop reacts
// at the next step boundary, where it is safe to checkpoint.
std::atomic<int> g_stop_signal{0};
void on_stop_signal(int sig) {
  g_stop_signal = sig;
}

class StopSignals {
 public:
  explicit StopSignals(bool enabled) : enabled_(enabled) {
    if (!enabled_) return;
    struct sigaction action {};
    action.sa_handler = on_stop_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(SIGINT, &action, &old_int_);
    sigaction(SIGTERM, &action, &old_term_);
  }
  ~StopSignals() {
    if (!enabled_) return;
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }

 private:
  bool enabled_;
  struct sigaction old_int_ {
  }, old_term_{};
};

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Each rank's CPU generator state (dropout), gathered for checkpoints.
at::Tensor rng_state() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void rng_restore(const at::Tensor& state) {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

bool isatty_stdout() {
  return isatty(STDOUT_FILENO) != 0;
}

}  // namespace

DatasetSplit dataset_from_config(const Config& config) {
  const auto& d = config.data;
  if (d.name == "mnist") return {dataset_mnist(d.path, true), dataset_mnist(d.path, false)};
  TensorDataset all;
  if (d.name == "digits") {
    all = dataset_digits();
  } else if (d.name == "synthetic") {
    all = dataset_synthetic_classification(d.synthetic_size, d.synthetic_features,
                                           d.synthetic_classes, config.run.seed);
  } else {
    CsvOptions csv;
    csv.label_column = d.label_column;
    csv.max_classes = d.max_classes;
    all = dataset_csv(d.path, csv);
  }
  return dataset_split(all, d.validation_fraction, config.run.seed);
}

DdpOptions ddp_options_from_config(const DdpConfig& c) {
  DdpOptions ddp;
  ddp.bucket_cap_mb = c.bucket_cap_mb;
  ddp.first_bucket_cap_mb = c.first_bucket_cap_mb;
  ddp.gradient_as_bucket_view = c.gradient_as_bucket_view;
  ddp.find_unused_parameters = c.find_unused_parameters;
  ddp.broadcast_buffers = c.broadcast_buffers;
  if (c.comm_hook != "allreduce") ddp.comm_hook = comm_hook_create(c.comm_hook);
  return ddp;
}

struct Trainer::Impl {
  Config config;
  WorldInfo world;
  std::shared_ptr<ProcessGroup> pg;
  std::string run_dir;
  std::string config_yaml;

  TensorDataset train_data, val_data;
  std::unique_ptr<DistributedSampler> sampler;
  std::shared_ptr<Classifier> model;
  std::unique_ptr<DistributedDataParallel<std::shared_ptr<Classifier>>> ddp;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::unique_ptr<Checkpointer> checkpointer;
  TrainerState state;
  int64_t micro_per_epoch = 0;  // micro-batches used per epoch (multiple of accumulation)
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;
  std::FILE* metrics = nullptr;
  bool metrics_failed = false;

  // One metrics.jsonl record, written whole or not at all: a failed write
  // (a full disk) is cut back to the last complete record and reported once;
  // training goes on, and later records are written when writes work again.
  void metrics_printf(const char* format, ...) __attribute__((format(printf, 2, 3))) {
    char record[1024];
    va_list args;
    va_start(args, format);
    const int length = std::vsnprintf(record, sizeof record, format, args);
    va_end(args);
    if (length < 0 || static_cast<size_t>(length) >= sizeof record) return;
    const long before = std::ftell(metrics);
    if (std::fwrite(record, 1, static_cast<size_t>(length), metrics) ==
        static_cast<size_t>(length)) {
      return;
    }
    const int err = errno;
    std::clearerr(metrics);
    if (before >= 0) (void)ftruncate(fileno(metrics), before);
    if (!metrics_failed) {
      metrics_failed = true;
      spdlog::warn(
          "metrics.jsonl: a record could not be written ({}); records are dropped while "
          "writes fail, and the file holds only complete records (reported once)",
          std::strerror(err));
    }
  }
  std::shared_ptr<Tracer> tracer;  // log.trace
  std::optional<Fault> fault = fault_from_env();
  bool warned_comm_share = false;
  std::string last_checkpoint;

  // ------------------------------------------------------------ lifecycle
  void agree_on_config() {
    config_yaml = config_to_yaml(config);
    const std::string digest = sha256_hex(config_yaml).substr(0, 16);
    auto mine = at::zeros({16}, at::kByte);
    std::memcpy(mine.data_ptr<uint8_t>(), digest.data(), 16);
    const auto all = pg->allgather(mine.to(pg->device()));
    std::string differ;
    for (int r = 1; r < pg->size(); ++r) {
      if (!at::equal(all[r].cpu(), all[0].cpu()))
        differ += (differ.empty() ? "" : ", ") + std::to_string(r);
    }
    if (!differ.empty()) {
      throw ConfigError("the resolved configuration of rank(s) " + differ +
                        " differs from rank 0's (same file and --set on every rank?)");
    }
  }

  // Rank 0 creates the run directory and proves it writable; every rank
  // learns the outcome, so all stop together before any training.
  void prepare_run_dir() {
    run_dir = config.run.dir + "/" + config.run.name;
    std::string problem;
    if (world.rank == 0) {
      try {
        try {
          make_directories(run_dir);
        } catch (const DataError& e) {
          throw ConfigError(std::string("run directory: ") + e.what());
        }
        const std::string probe = run_dir + "/.write-test";
        std::ofstream out(probe);
        out << "ok";
        out.close();
        if (!out) throw ConfigError("run directory '" + run_dir + "' is not writable");
        std::remove(probe.c_str());
        write_file(run_dir + "/config.yaml", config_yaml);
      } catch (const Error& e) {
        problem = e.what();
      }
    }
    auto ok = at::full({1}, problem.empty() ? 1 : 0, at::kInt).to(pg->device());
    pg->allreduce(ok, ReduceKind::kMin);
    if (ok.cpu().item<int>() == 0) {
      throw ConfigError(problem.empty() ? "rank 0 could not prepare run directory '" + run_dir + "'"
                                        : problem);
    }
    if (config.log.file) log_to_file(run_dir + "/rank_" + std::to_string(world.rank) + ".log");
    if (world.rank == 0) {
      spdlog::info("run directory {}; resolved configuration:\n{}", run_dir, config_yaml);
      metrics = std::fopen((run_dir + "/metrics.jsonl").c_str(), "a");
      if (metrics == nullptr) throw ConfigError("cannot open " + run_dir + "/metrics.jsonl");
      std::setvbuf(metrics, nullptr, _IONBF, 0);  // one write per record: see metrics_printf
    }
  }

  void load_data() {
    const auto& d = config.data;
    auto split = dataset_from_config(config);
    train_data = std::move(split.train);
    val_data = std::move(split.validation);
    sampler = std::make_unique<DistributedSampler>(
        train_data.size(), SamplerOptions{world.world_size, world.rank, d.shuffle,
                                          static_cast<uint64_t>(config.run.seed), d.drop_last});
    const int64_t per_rank = sampler->num_samples();
    const int64_t micro =
        d.drop_last ? per_rank / d.batch_size : (per_rank + d.batch_size - 1) / d.batch_size;
    const int64_t acc = config.train.accumulation_steps;
    steps_per_epoch = micro / acc;
    micro_per_epoch = steps_per_epoch * acc;
    if (steps_per_epoch == 0) {
      throw ConfigError(
          "the train split (" + std::to_string(train_data.size()) + " examples) over " +
          std::to_string(world.world_size) + " rank(s) gives " + std::to_string(micro) +
          " micro-batch(es) of data.batch_size=" + std::to_string(d.batch_size) +
          " per rank per epoch, fewer than train.accumulation_steps=" + std::to_string(acc) +
          ": no optimizer step would run");
    }
    total_steps = steps_per_epoch * config.train.epochs;
    spdlog::info(
        "data: {} ({} train, {} validation); global batch {} = {} per rank x {} ranks x {} "
        "accumulation; {} steps per epoch",
        d.name, train_data.size(), val_data.size(), d.batch_size * world.world_size * acc,
        d.batch_size, world.world_size, acc, steps_per_epoch);
    if (val_data.size() == 0 && world.rank == 0) {
      spdlog::warn(
          "data: the validation split is empty ({} examples x data.validation_fraction={} "
          "holds none): no validation is measured or reported",
          train_data.size(), d.validation_fraction);
    }
  }

  void build_model() {
    at::manual_seed(static_cast<uint64_t>(config.run.seed));  // identical init everywhere
    std::vector<int64_t> shape(train_data.features.sizes().begin() + 1,
                               train_data.features.sizes().end());
    model = model_create(config.model, shape, train_data.num_classes);
    if (!config.model.init_from.empty()) {
      state_dict_load(*model, state_dict_load_file(config.model.init_from), config.model.init_from);
      spdlog::info("model initialised from {}", config.model.init_from);
    }
    int64_t count = 0;
    for (const auto& p : model->parameters()) count += p.numel();
    spdlog::info("model: {} with {} parameters", config.model.name, count);
  }

  void build_optimizer() {
    optimizer = optimizer_create(config.optim, model->parameters());
    checkpointer = std::make_unique<Checkpointer>(run_dir, config.checkpoint.keep);
  }

  void maybe_resume() {
    std::string folder = config.checkpoint.resume;
    if (folder.empty()) return;
    if (folder == "auto") {
      const auto newest = checkpointer->newest();
      if (!newest) {
        spdlog::info("checkpoint.resume: auto: no checkpoint in {}/checkpoints, starting fresh",
                     run_dir);
        return;
      }
      folder = *newest;
    }
    auto loaded = Checkpointer::load(folder, *optimizer);
    if (loaded.state.world_size != world.world_size) {
      throw ConfigError(
          "checkpoint '" + folder + "' was written by " + std::to_string(loaded.state.world_size) +
          " rank(s), this run has " + std::to_string(world.world_size) +
          ": the data order would differ (start fresh with model.init_from: " + folder +
          "/model.pt)");
    }
    if (loaded.state.model != config.model.name) {
      throw ConfigError("checkpoint '" + folder + "' holds a '" + loaded.state.model +
                        "' model, the config asks for '" + config.model.name + "'");
    }
    state_dict_load(*model, loaded.model, folder + "/model.pt");
    rng_restore(loaded.rng_states[world.rank]);
    state = loaded.state;
    last_checkpoint = folder;
    spdlog::info("resumed from {} at step {} (epoch {}, micro-batch {})", folder, state.step,
                 state.epoch, state.batch_in_epoch);
  }

  // ------------------------------------------------------------ the loop
  void trace(const char* name, Clock::time_point start) {
    if (tracer) tracer->complete(name, "step", start, Clock::now());
  }

  at::Tensor loss_of(const at::Tensor& out, const at::Tensor& y) {
    return train_data.num_classes > 0 ? torch::nn::functional::cross_entropy(out, y)
                                      : torch::nn::functional::mse_loss(out, y);
  }

  struct Interval {
    // Loss and correct counts stay tensors on the model's device until the
    // logging interval ends: no host sync per micro-batch (matters on CUDA).
    at::Tensor loss_sum, correct;
    double samples = 0;
    double forward_ms = 0, backward_ms = 0, comm_ms = 0, optimizer_ms = 0, check_ms = 0;
    int64_t steps = 0;
    Clock::time_point start = Clock::now();
  };

  // The per-step check overlaps the next step (PendingCheck): started after
  // the optimizer step, finished before the next one.
  std::optional<PendingCheck> pending;

  void finish_pending_check() {
    if (!pending) return;
    const auto report = pending->finish();
    pending.reset();
    if (report.consistent) return;  // the per-step path: nothing more to build
    spdlog::error("step {}: {}", report.step, report.message);
    fingerprint_enforce(*pg, report, check_policy_parse(config.check.policy), checked_tensors());
  }

  std::vector<NamedTensor> checked_tensors() {
    auto tensors = fingerprint_tensors(*model, config.check.buffers);
    if (config.check.optimizer_state) {
      StateDict params;
      for (const auto& p : model->named_parameters(true)) params.emplace_back(p.key(), p.value());
      for (auto& t : optimizer_state_tensors(*optimizer, params)) tensors.push_back(std::move(t));
    }
    return tensors;
  }

  // Buffers (BatchNorm statistics) legitimately differ after a forward in
  // train mode; DDP re-syncs them before the next forward. Compare them as
  // that forward will see them.
  void sync_buffers_for_check() {
    if (config.check.buffers && config.ddp.broadcast_buffers) {
      std::vector<at::Tensor> buffers;
      for (const auto& b : model->buffers()) buffers.push_back(b);
      broadcast_coalesced(*pg, buffers, 0);
    }
  }

  void check_weights(int64_t step, const std::string& why, CheckPolicy policy) {
    sync_buffers_for_check();
    const auto tensors = checked_tensors();
    const auto report = fingerprint_check(*pg, tensors, digest_mode_parse(config.check.mode), step);
    if (!report.consistent) spdlog::error("{}: {}", why, report.message);
    fingerprint_enforce(*pg, report, policy, tensors);
  }

  void save_checkpoint() {
    finish_pending_check();
    state.world_size = world.world_size;
    state.model = config.model.name;
    // Only weights every rank agrees on are worth keeping.
    check_weights(state.step, "checkpoint", CheckPolicy::kAbort);
    const auto states = pg->allgather(rng_state().to(pg->device()));
    std::string problem;
    if (world.rank == 0) {
      try {
        std::vector<at::Tensor> rows;
        for (const auto& s : states) rows.push_back(s.cpu());
        last_checkpoint = checkpointer->save(state, state_dict_of(*model), *optimizer,
                                             at::stack(rows), config_yaml);
        spdlog::info("checkpoint: {}", last_checkpoint);
      } catch (const Error& e) {
        problem = e.what();
      }
    }
    auto ok = at::full({1}, problem.empty() ? 1 : 0, at::kInt).to(pg->device());
    pg->allreduce(ok, ReduceKind::kMin);
    if (ok.cpu().item<int>() == 0) {
      const std::string why = problem.empty() ? "rank 0 failed to write a checkpoint" : problem;
      if (config.checkpoint.on_error != "warn") throw DataError(why);
      spdlog::warn("{}; training goes on (checkpoint.on_error: warn)", why);
    }
  }

  void log_interval(Interval& in, TrainResult& result, double lr) {
    auto sums = at::tensor({in.loss_sum.defined() ? in.loss_sum.item<double>() : 0.0,
                            in.correct.defined() ? in.correct.item<double>() : 0.0, in.samples},
                           at::kDouble)
                    .to(pg->device());
    pg->allreduce(sums, ReduceKind::kSum);
    sums = sums.cpu();
    const double samples = sums[2].item<double>();
    const double loss = sums[0].item<double>() / samples;
    const double accuracy = sums[1].item<double>() / samples;
    const double seconds = ms_since(in.start) / 1000.0;
    result.last_loss = loss;
    const double n = std::max<int64_t>(in.steps, 1);
    const double step_ms =
        in.forward_ms + in.backward_ms + in.comm_ms + in.optimizer_ms + in.check_ms;
    if (!warned_comm_share && step_ms > 0 && in.comm_ms / step_ms > 0.2) {
      warned_comm_share = true;
      spdlog::warn(
          "communication is {:.0f}% of step time ({:.2f} of {:.2f} ms per step waiting for "
          "gradients): consider a larger per-rank batch, gradient accumulation "
          "(train.accumulation_steps), ddp.comm_hook: fp16, or other bucket sizes (this warning "
          "is shown once)",
          100 * in.comm_ms / step_ms, in.comm_ms / n, step_ms / n);
    }
    if (world.rank == 0) {
      metrics_printf(
          "{\"step\": %lld, \"epoch\": %lld, \"loss\": %.8g, \"accuracy\": %.6f, "
          "\"lr\": %.6g, \"samples_per_s\": %.1f, \"ms\": {\"forward\": %.3f, "
          "\"backward\": %.3f, \"comm_wait\": %.3f, \"optimizer\": %.3f, \"check\": %.3f}}\n",
          static_cast<long long>(state.step), static_cast<long long>(state.epoch), loss, accuracy,
          lr, samples / seconds, in.forward_ms / n, in.backward_ms / n, in.comm_ms / n,
          in.optimizer_ms / n, in.check_ms / n);
      const bool bar =
          config.log.progress == "bar" || (config.log.progress == "auto" && isatty_stdout());
      if (bar) {
        const int width = 30;
        const int filled = static_cast<int>(width * state.step / std::max<int64_t>(total_steps, 1));
        std::printf("\r[%s%s] step %lld/%lld epoch %lld loss %.4f acc %.3f %.0f samples/s",
                    std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(),
                    static_cast<long long>(state.step), static_cast<long long>(total_steps),
                    static_cast<long long>(state.epoch + 1), loss, accuracy, samples / seconds);
        std::fflush(stdout);
      } else {
        spdlog::info("step {}/{} epoch {} loss {:.5f} acc {:.4f} lr {:.4g} {:.0f} samples/s",
                     state.step, total_steps, state.epoch + 1, loss, accuracy, lr,
                     samples / seconds);
      }
    }
    in = Interval{};
  }

  void evaluate(TrainResult& result) {
    if (val_data.size() == 0) return;  // the same on every rank: the split is deterministic
    model->eval();
    at::NoGradGuard no_grad;
    std::vector<int64_t> mine;  // unpadded shard: exact global counts
    for (int64_t i = world.rank; i < val_data.size(); i += world.world_size) mine.push_back(i);
    double loss_sum = 0, correct = 0;
    if (!mine.empty()) {
      BatchLoader loader(val_data, mine, LoaderOptions{256, false, false});
      while (auto batch = loader.next()) {
        const auto out = model->forward(batch->x);
        loss_sum += loss_of(out, batch->y).item<double>() * batch->x.size(0);
        if (val_data.num_classes > 0) correct += (out.argmax(1) == batch->y).sum().item<double>();
      }
    }
    auto sums = at::tensor({loss_sum, correct, static_cast<double>(mine.size())}, at::kDouble)
                    .to(pg->device());
    pg->allreduce(sums, ReduceKind::kSum);
    sums = sums.cpu();
    const double count = std::max(1.0, sums[2].item<double>());
    result.val_loss = sums[0].item<double>() / count;
    result.val_accuracy = sums[1].item<double>() / count;
    result.val_examples = static_cast<int64_t>(sums[2].item<double>());
    model->train();
    if (world.rank == 0) {
      if (isatty_stdout() && config.log.progress != "plain") std::printf("\n");
      spdlog::info("epoch {} validation: loss {:.5f} accuracy {:.4f} ({} examples)",
                   state.epoch + 1, result.val_loss, result.val_accuracy,
                   static_cast<int64_t>(count));
      metrics_printf(
          "{\"step\": %lld, \"epoch\": %lld, \"val_loss\": %.8g, \"val_accuracy\": %.6f}\n",
          static_cast<long long>(state.step), static_cast<long long>(state.epoch + 1),
          result.val_loss, result.val_accuracy);
    }
  }

  // One optimizer step over `acc` micro-batches; returns false when the
  // epoch's data is exhausted.
  void train_step(BatchLoader& loader, Interval& in) {
    const int64_t acc = config.train.accumulation_steps;
    optimizer->zero_grad();
    for (int64_t m = 0; m < acc; ++m) {
      auto batch = loader.next();
      if (!batch) throw Error("internal: the loader ran out of batches mid-step");
      const bool last = m == acc - 1;
      std::optional<DdpCore::NoSyncGuard> guard;
      if (!last) guard.emplace(*ddp);
      auto t = Clock::now();
      const auto out = ddp->forward(batch->x);
      const auto loss = loss_of(out, batch->y);
      in.forward_ms += ms_since(t);
      trace("forward", t);
      t = Clock::now();
      (loss / static_cast<double>(acc)).backward();
      trace(last ? "backward" : "backward (no_sync)", t);
      double wait = 0;
      if (last && ddp->reducer() != nullptr) wait = ddp->reducer()->last_stats().wait_ms;
      in.backward_ms += ms_since(t) - wait;
      in.comm_ms += wait;
      const double rows = static_cast<double>(batch->x.size(0));
      const auto weighted = loss.detach().to(at::kDouble) * rows;
      in.loss_sum = in.loss_sum.defined() ? in.loss_sum + weighted : weighted;
      in.samples += rows;
      if (train_data.num_classes > 0) {
        const auto hits = (out.detach().argmax(1) == batch->y).sum().to(at::kDouble);
        in.correct = in.correct.defined() ? in.correct + hits : hits;
      }
      ++state.batch_in_epoch;
    }
    auto t = Clock::now();
    finish_pending_check();  // the previous step's weights are still in place
    in.check_ms += ms_since(t);
    t = Clock::now();
    const double lr = lr_at(config.optim, state.step, total_steps);
    optimizer_set_lr(*optimizer, lr);
    if (config.train.clip_grad_norm > 0) {
      // After synchronisation: every rank clips the same averaged gradients.
      torch::nn::utils::clip_grad_norm_(model->parameters(), config.train.clip_grad_norm);
    }
    optimizer->step();
    in.optimizer_ms += ms_since(t);
    trace("optimizer step", t);
    ++state.step;
    ++in.steps;
    if (config.check.every > 0 && state.step % config.check.every == 0) {
      t = Clock::now();
      sync_buffers_for_check();
      pending.emplace(*pg, checked_tensors(), digest_mode_parse(config.check.mode), state.step);
      in.check_ms += ms_since(t);
      trace("consistency check", t);
    }
  }
};

Trainer::Trainer(Config config, WorldInfo world, std::shared_ptr<ProcessGroup> pg)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.config = std::move(config);
  s.world = std::move(world);
  s.pg = std::move(pg);
  config_validate(s.config, s.world.world_size);
  s.agree_on_config();
  s.prepare_run_dir();
  within_memory("the dataset (section data)", [&] { s.load_data(); });
  within_memory("the model (section model)", [&] { s.build_model(); });
  s.build_optimizer();
  s.maybe_resume();
  DdpOptions ddp;
  ddp.bucket_cap_mb = s.config.ddp.bucket_cap_mb;
  ddp.first_bucket_cap_mb = s.config.ddp.first_bucket_cap_mb;
  ddp.gradient_as_bucket_view = s.config.ddp.gradient_as_bucket_view;
  ddp.find_unused_parameters = s.config.ddp.find_unused_parameters;
  ddp.broadcast_buffers = s.config.ddp.broadcast_buffers;
  if (s.config.ddp.comm_hook != "allreduce")
    ddp.comm_hook = comm_hook_create(s.config.ddp.comm_hook);
  s.ddp =
      std::make_unique<DistributedDataParallel<std::shared_ptr<Classifier>>>(s.model, s.pg, ddp);
  if (s.config.log.trace) {
    s.tracer = std::make_shared<Tracer>(s.world.rank);
    s.ddp->set_tracer(s.tracer);
  }
  if (s.state.step == 0) {
    // Dropout differs per rank (as in PyTorch); resumed runs restored theirs.
    at::manual_seed(static_cast<uint64_t>(s.config.run.seed) + 1 + s.world.rank);
  }
}

Trainer::~Trainer() {
  if (impl_ && impl_->metrics != nullptr) std::fclose(impl_->metrics);
}

TrainResult Trainer::run() {
  Impl& s = *impl_;
  TrainResult result;
  result.run_dir = s.run_dir;
  const int64_t max_steps = s.config.train.max_steps > 0 ? s.config.train.max_steps : s.total_steps;
  const int64_t stop = std::min(max_steps, s.total_steps);
  Impl::Interval interval;
  StopSignals signals(s.config.checkpoint.on_signal);
  if (s.state.batch_in_epoch >= s.micro_per_epoch) {  // resumed at an epoch's end
    ++s.state.epoch;
    s.state.batch_in_epoch = 0;
  }
  s.model->train();
  while (s.state.step < stop && s.state.epoch < s.config.train.epochs) {
    s.sampler->set_epoch(s.state.epoch);
    BatchLoader loader(
        s.train_data, s.sampler->indices(),
        LoaderOptions{s.config.data.batch_size, s.config.data.drop_last, s.config.data.prefetch});
    for (int64_t skip = 0; skip < s.state.batch_in_epoch; ++skip) loader.next();
    while (s.state.batch_in_epoch < s.micro_per_epoch && s.state.step < stop) {
      fault_maybe_fire(s.fault, s.world, s.state.step);
      s.train_step(loader, interval);
      if (s.state.step % s.config.log.every == 0) {
        s.log_interval(interval, result, lr_at(s.config.optim, s.state.step - 1, s.total_steps));
      }
      const bool end = s.state.step == stop;
      if (s.config.checkpoint.every > 0 && s.state.step % s.config.checkpoint.every == 0 && !end) {
        s.save_checkpoint();
      }
      if (s.config.checkpoint.on_signal) {
        // Every rank learns whether any rank was signalled, so all stop at
        // the same step and agree on the checkpoint.
        auto flag = at::full({1}, g_stop_signal.load(), at::kInt).to(s.pg->device());
        s.pg->allreduce(flag, ReduceKind::kMax);
        const int sig = flag.cpu().item<int>();
        if (sig != 0) {
          spdlog::warn("received signal {}: saving a checkpoint at step {} and stopping", sig,
                       s.state.step);
          s.save_checkpoint();
          throw Interrupted("stopped by signal " + std::to_string(sig) + " after step " +
                                std::to_string(s.state.step) + "; checkpoint " + s.last_checkpoint,
                            sig);
        }
      }
    }
    const bool epoch_done = s.state.batch_in_epoch >= s.micro_per_epoch;
    if (epoch_done) s.evaluate(result);
    if (s.state.step == stop) {
      if (interval.steps > 0) {
        s.log_interval(interval, result, lr_at(s.config.optim, s.state.step - 1, s.total_steps));
      }
      if (!epoch_done) s.evaluate(result);
      s.save_checkpoint();
      break;
    }
    ++s.state.epoch;
    s.state.batch_in_epoch = 0;
  }
  s.finish_pending_check();
  if (s.tracer) {
    const std::string path = s.run_dir + "/trace_rank" + std::to_string(s.world.rank) + ".json";
    s.tracer->write(path);
    spdlog::info("trace: {}", path);
  }
  result.steps = s.state.step;
  result.fingerprint =
      to_hex(fingerprint_digest(fingerprint_tensors(*s.model, true), DigestMode::kXxh3));
  result.last_checkpoint = s.last_checkpoint;
  if (result.val_examples > 0) {
    spdlog::info("done: {} steps, validation accuracy {:.4f}, final weights {}", result.steps,
                 result.val_accuracy, result.fingerprint);
  } else {
    spdlog::info("done: {} steps, no validation (empty split), final weights {}", result.steps,
                 result.fingerprint);
  }
  return result;
}

}  // namespace lockstep
