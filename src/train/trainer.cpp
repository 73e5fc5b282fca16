// The lifecycle and the loop of one run, around the one step (step.cpp):
//
//   Trainer(config):  agree on the config; claim the run directory; the data;
//                     the model, the optimizer (run_parts.cpp); resume
//                     (trainer_resume.cpp); DDP and the step with its hooks
//   run():            for each epoch until the stop step:
//                       train_epoch: for each step of the epoch
//                         fault injection; token files unchanged
//                         train_step -> TrainStep::run (step.cpp)
//                         callbacks' on_step_end
//                         after_step: metrics; evaluation at an epoch's end or
//                           train.eval_every (trainer_eval.cpp); early stop;
//                           checkpoint.every (trainer_save.cpp); a signal
//                     finish: the last checks, the last save settled, the
//                       final fingerprint, the memory line
//
// Reports are metrics.cpp, signals stop_signals.cpp.
#include "trainer_impl.h"

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>

#include <spdlog/spdlog.h>

#include "lockstep/check/fault.h"
#include "lockstep/check/fingerprint.h"
#include "lockstep/checkpoint/checkpoint.h"
#include "lockstep/checkpoint/run_dir.h"
#include "lockstep/data/loader.h"
#include "lockstep/distributed/agree.h"
#include "lockstep/model/gpt.h"
#include "lockstep/model/llama.h"
#include "lockstep/optim/optim.h"
#include "lockstep/train/callbacks.h"
#include "lockstep/train/precision.h"
#include "lockstep/train/recipe.h"
#include "lockstep/train/step.h"
#include "lockstep/util/allocator.h"
#include "lockstep/util/error.h"
#include "lockstep/util/fs.h"
#include "lockstep/util/log.h"
#include "lockstep/util/matmul_peak.h"
#include "lockstep/util/module_tensors.h"
#include "lockstep/util/sha256.h"
#include "lockstep/util/text.h"
#include "lockstep/util/trace.h"
#include "lockstep/util/utf8.h"
#include "lockstep/zero/zero.h"
#include "metrics.h"
#include "run_parts.h"
#include "run_stateful.h"
#include "stop_signals.h"

namespace lockstep {

void Trainer::Impl::agree_on_config() {
  config_yaml = config_to_yaml(config);
  std::string differ;
  for (int r : ranks_differing_from_rank0(*pg, sha256_hex(config_yaml).substr(0, 16)))
    differ += (differ.empty() ? "" : ", ") + std::to_string(r);
  if (!differ.empty()) {
    throw ConfigError("the resolved configuration of rank(s) " + differ +
                      " differs from rank 0's (same file and --set on every rank?)");
  }
  // Note [Precision that knows the CPU]: auto resolved (every rank alike),
  // a slow bf16 warned of; the saved configuration says what runs.
  const Precision asked = config.train.precision;
  resolve_precision(config, device_from_config(config, world, pg->kind()), *pg);
  if (config.train.precision != asked) config_yaml = config_to_yaml(config);
}

void Trainer::Impl::prepare_run_dir() {
  run_dir = config.run.dir + "/" + config.run.name;
  const std::string problem = rank0_outcome(*pg, [&] {
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
    // Note [One live job per run directory]: before anything there is read.
    std::string warning;
    run_lock = RunDirLock::acquire(run_dir, run_dir_holder(job_identity()), &warning);
    if (!warning.empty()) spdlog::warn("{}", warning);
    // Note [Replacing a checkpoint folder]: what a killed writer left,
    // before any checkpoint is looked for.
    for (const auto& line : Checkpointer(run_dir, config.checkpoint.keep).repair())
      spdlog::warn("checkpoints: {}", line);
  });
  if (!problem.empty()) throw ConfigError(problem);
}

void Trainer::Impl::open_run_dir() {
  const std::string problem = rank0_outcome(*pg, [&] {
    if (config.checkpoint.resume.empty()) {
      const std::string moved = run_dir_claim(run_dir, config.run.overwrite, job_identity());
      if (!moved.empty()) spdlog::warn("{}", moved);
    } else if (!resumed_from_folder.empty() && config.checkpoint.resume != "auto") {
      // Resumed from an older checkpoint by name: the later ones are an
      // abandoned line of training (Note [Run directories]).
      const std::string moved = run_dir_set_aside_after(run_dir, state.step);
      if (!moved.empty()) spdlog::warn("{}", moved);
    }
    write_file(run_dir + "/config.yaml", config_yaml);
  });
  if (!problem.empty()) throw ConfigError(problem);
  if (config.log.file) log_to_file(run_dir + "/rank_" + std::to_string(world.rank) + ".log");
  if (world.rank == 0) {
    spdlog::info("run directory {} (resolved configuration: {}/config.yaml)", run_dir, run_dir);
    spdlog::debug("resolved configuration:\n{}", config_yaml);
  }
  metrics = std::make_unique<Metrics>(config.log, *pg, run_dir);
  metrics->config_text(config_yaml);
  if (language_tokens > 0) metrics->set_language(language_tokens, language_flops);
  if (language_tokens > 0 && config.log.mfu) {
    const bool bf16 = config.train.precision == Precision::kBf16;
    const int64_t n = device.is_cpu() ? 1024 : kGpuMatmulPeakN;
    const double peak = matmul_peak_gflops(bf16 ? at::kBFloat16 : at::kFloat, n, 0.5, device);
    spdlog::info("log.mfu: this rank's {} matrix-product peak on {} is {:.1f} GFLOP/s ({}^3)",
                 bf16 ? "bf16" : "fp32", device.str(), peak, n);
    metrics->set_peak_gflops(peak);
  }
}

std::string Trainer::Impl::job_identity() const {
  if (!world.store_secret.empty()) return sha256_hex("job:" + world.store_secret).substr(0, 16);
  const char* run_id = std::getenv("TORCHELASTIC_RUN_ID");
  if (run_id != nullptr && *run_id != '\0' && std::string(run_id) != "none")
    return sha256_hex(std::string("job:") + run_id).substr(0, 16);
  return "";
}

void Trainer::Impl::load_data() {
  const auto& d = config.data;
  data = data_from_config(config);
  const int64_t train_size = data.train->size(), val_size = data.validation->size();
  data_id = data_identity(*data.train);
  sampler = std::make_unique<DistributedSampler>(sampler_from_config(config, world, train_size));
  plan = step_plan(config, *sampler, train_size);
  const int64_t acc = config.train.accumulation_steps;
  spdlog::info(
      "data: {} ({}; {} train, {} validation examples); global batch {} = {} per rank x {} "
      "ranks x {} accumulation; {} steps per epoch",
      name_of(kDatasetKindNames, d.name), data.summary, train_size, val_size,
      d.batch_size * world.world_size * acc, d.batch_size, world.world_size, acc,
      plan.steps_per_epoch);
  validate_data(config, data);
  if (val_size == 0 && world.rank == 0) {
    spdlog::warn(
        "data: the validation split is empty ({} examples x data.validation_fraction={} "
        "holds none): no validation is measured or reported",
        train_size, d.validation_fraction);
  }
}

void Trainer::Impl::build_model() {
  // A resumed run takes every weight from its checkpoint: model.init_from,
  // the file the run started from, is not read again (it may have moved).
  Config built = config;
  const std::string& resume = config.checkpoint.resume;
  if (!resume.empty() &&
      (resume != "auto" || Checkpointer(run_dir, config.checkpoint.keep).newest()))
    built.model.init_from.clear();
  run_build_model(run, built, world, pg, data);
  if (data.task == TaskKind::kLanguage) {
    language_tokens = static_cast<double>(data.sample_shape[0]);
    if (auto* gpt = dynamic_cast<Gpt*>(model.get())) language_flops = gpt->flops_per_token();
    if (auto* llama = dynamic_cast<Llama*>(model.get())) language_flops = llama->flops_per_token();
  }
  int64_t count = 0;
  for (const auto& p : model->parameters()) count += p.numel();
  spdlog::info("model: {} with {} parameters on {}", config.model.name, count, device.str());
  if (config.train.precision == Precision::kBf16) {
    spdlog::info("precision: bf16 autocast on {} (weights, gradients, optimizer state fp32)",
                 device.str());
  } else if (config.train.precision == Precision::kFp16) {
    spdlog::info(
        "precision: fp16 autocast on {} with the GradScaler (initial scale {}, growth interval "
        "{}; weights, gradients, optimizer state fp32)",
        device.str(), config.train.loss_scale, config.train.loss_scale_growth_interval);
  }
}

void Trainer::Impl::build_optimizer() {
  run_build_optimizer(run, config, pg);
  if (zero != nullptr) {
    const auto elements = zero->owned_elements();
    int64_t all = 0, owned = 0;
    for (size_t i = 0; i < zero->owners().size(); ++i) owned += zero->owns(i) ? 1 : 0;
    for (int64_t e : elements) all += e;
    spdlog::info(
        "optim.zero: {}: this rank owns {} of {} parameter tensors ({} of {} elements) and "
        "keeps optimizer state for those only{}",
        config.optim.zero, owned, zero->owners().size(), elements[static_cast<size_t>(world.rank)],
        all,
        config.optim.zero == 2   ? "; gradients are reduce-scattered to their owners"
        : config.optim.zero == 3 ? "; gradients are reduce-scattered to their owners, and "
                                   "between uses each weight lives on its owner only"
                                 : "");
  }
  checkpointer = std::make_unique<Checkpointer>(run_dir, config.checkpoint.keep);
  if (config.checkpoint.format == CheckpointFormat::kSharded) {
    // Note [Sharded checkpoints]: every rank writes into rank 0's staging folder.
    at::Tensor pid = at::full({1}, static_cast<int64_t>(getpid()), at::kLong).to(pg->device());
    pg->broadcast(pid, 0);
    staging_pid = static_cast<long>(pid.cpu().item<int64_t>());
  }
}

StepStats Trainer::Impl::train_step(BatchLoader& loader, Interval& in, int64_t micro_left) {
  StepStats stats;
  try {
    stats = step->run(
        [&]() -> std::optional<Batch> {
          auto batch = loader.next();
          if (batch) ++state.batch_in_epoch;
          return batch;
        },
        state.step, std::min(micro_left, config.train.accumulation_steps));
  } catch (const InternalError& e) {  // where in the epoch: the clue for a resume mismatch
    throw InternalError(std::string(e.what()) + " (epoch " + std::to_string(state.epoch + 1) +
                        ", micro-batch " + std::to_string(state.batch_in_epoch) + " of " +
                        std::to_string(plan.micro_per_epoch) + ")");
  }
  in.add(stats);
  ++state.step;
  // Before this step's checkpoint, if any (the process's peak: a save
  // resets the kernel's, reset_resident_peak).
  training_peak_kib = process_resident_peak_kib();
  return stats;
}

Trainer::Trainer(Config config, WorldInfo world, std::shared_ptr<ProcessGroup> pg)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.config = std::move(config);
  s.world = std::move(world);
  s.pg = std::move(pg);
  // Every rank reaches this verdict together: a rank that failed alone and
  // left would tear down the store or shm segment that a slower peer may
  // still be joining, and that peer would report a communication failure
  // (exit 3) instead of the configuration's or environment's error (exit 2).
  agree_on_failure(*s.pg, [&] {
    s.fault = fault_from_env(env_process(), s.world.world_size);
    config_validate(s.config, s.world.world_size);
  });
  s.agree_on_config();
  s.prepare_run_dir();
  within_memory("the dataset (section data)", [&] { s.load_data(); });
  within_memory("the model (section model)", [&] { s.build_model(); });
  s.build_optimizer();
  // Under ZeRO a bad optimizer.pt entry fails only its owner's load: every
  // rank learns the verdict and leaves with the same error (exit 2 alike).
  // Note [Stateful parts]: the parts are made before DDP (they reach the
  // wrapper only when saved or restored); all but the comm hook's state are
  // restored before DDP is built, so its broadcast starts every rank alike.
  s.parts = run_stateful_parts(s.run, s.config, *s.pg, s.world, s.state);
  agree_on_failure(*s.pg, [&] {
    s.maybe_resume();
    s.restore_parts(/*after_ddp=*/false);
  });
  run_build_ddp(s.run, s.config, s.pg);
  agree_on_failure(*s.pg, [&] { s.restore_parts(/*after_ddp=*/true); });
  if (is_comm_hook(s.config.ddp.comm_hook, CommHookKind::kPowerSgd) && s.world.world_size > 1 &&
      s.config.ddp.powersgd.start_iter >= s.stop_step()) {
    spdlog::warn(
        "ddp.powersgd.start_iter is {} and this run has {} steps: PowerSGD never compresses "
        "(it all-reduces plainly until then; PyTorch's default 1000 suits long runs)",
        s.config.ddp.powersgd.start_iter, s.stop_step());
  }
  s.warn_schedule();
  StepOptions step_options = step_options_from_config(s.config, s.plan.schedule_steps);
  step_options.fault = s.fault;
  run_build_step(s.run, s.config, *s.pg, s.data.task, std::move(step_options));
  s.step->set_corruption_observer([&s](const CorruptionFinding& found) {
    if (!s.metrics) return;
    s.metrics->note("\"step\": " + std::to_string(found.step) +
                    ", \"corruption\": {\"rank\": " + std::to_string(found.rank) +
                    ", \"other\": " + std::to_string(found.other) + ", \"check\": \"" +
                    found.check + "\", \"parameter\": " + json_quoted(found.parameter) + "}");
  });
  s.callbacks = callbacks_create();
  s.open_run_dir();
  if (s.config.log.trace) {
    s.tracer = std::make_shared<Tracer>(s.world.rank);
    s.ddp->set_tracer(s.tracer);
    s.step->set_tracer(s.tracer);
  }
  if (s.state.step == 0) {
    // Dropout differs per rank (as in PyTorch); resumed runs restored theirs.
    seed_rank_generator(s.config, s.world.rank);
  }
}

Trainer::~Trainer() = default;

TrainResult Trainer::run() {
  Impl& s = *impl_;
  TrainResult result;
  result.run_dir = s.run_dir;
  const int64_t stop = s.stop_step();
  Interval interval;
  StopSignals signals(s.config.checkpoint.on_signal);
  s.sampler->set_epoch(s.state.epoch);
  if (s.state.batch_in_epoch >= s.micro_in_epoch(*s.sampler, s.state.epoch_offset)) {
    ++s.state.epoch;  // resumed at an epoch's end
    s.state.batch_in_epoch = 0;
    s.state.epoch_offset = 0;
  }
  s.model->train();
  const CallbackContext context{s.world.rank, s.world.world_size, s.run_dir};
  for (auto& c : s.callbacks) c->on_train_start(context, s.state);
  while (s.state.step < stop && s.state.epoch < s.config.train.epochs) {
    if (s.train_epoch(result, interval, stop)) break;
    ++s.state.epoch;
    s.state.batch_in_epoch = 0;
    s.state.epoch_offset = 0;
  }
  s.finish(result, stop);
  return result;
}

void Trainer::Impl::warn_schedule() const {
  const OptimConfig& o = config.optim;
  if (o.schedule != Schedule::kCosine || world.rank != 0) return;
  const int64_t length = plan.schedule_steps, stop = stop_step();
  if (o.warmup_steps >= length - 1) {
    spdlog::warn(
        "optim.warmup_steps={} fills the schedule's {} steps: the cosine never decays (raise "
        "train.max_steps or optim.decay_steps, or lower the warm-up)",
        o.warmup_steps, length);
  } else if (stop > length && state.step < stop) {
    spdlog::warn(
        "the run trains to step {} but the schedule's length is {} steps: steps {}..{} run at "
        "optim.min_lr={} (Note [Schedule length]; optim.decay_steps sets the length)",
        stop, length, std::max(length, state.step) + 1, stop, number_text(o.min_lr));
  }
}

// The digest of the final weights and buffers, the same on every rank.
// Under optim.zero 3 rank 0 takes each unit in turn (no rank holds the
// whole model gathered at once) and sends the digest to the others.
std::string Trainer::Impl::final_fingerprint() {
  auto tensors = fingerprint_tensors(*model, true);
  if (!run.sharded) return hex_of(fingerprint_digest(tensors, DigestMode::kXxh3));
  const NamedTensors params = trainable_parameters(*model);
  std::map<const c10::TensorImpl*, at::Tensor> whole;
  run.sharded->visit_whole([&](size_t i, const at::Tensor& t) {
    if (world.rank == 0)
      whole[params[i].second.unsafeGetTensorImpl()] =
          zero->owns(i) ? t.detach() : t.detach().clone();
  });
  std::string hex(64, ' ');
  if (world.rank == 0) {
    for (auto& t : tensors) {
      const auto it = whole.find(t.tensor.unsafeGetTensorImpl());
      if (it != whole.end()) t.tensor = it->second;
    }
    const std::string digest = hex_of(fingerprint_digest(tensors, DigestMode::kXxh3));
    hex.replace(0, std::min<size_t>(digest.size(), hex.size()), digest);
  }
  at::Tensor bytes = at::empty({64}, at::kByte);
  std::memcpy(bytes.data_ptr(), hex.data(), 64);
  bytes = bytes.to(pg->device());
  pg->broadcast(bytes, 0);
  bytes = bytes.cpu();
  hex.assign(static_cast<const char*>(bytes.data_ptr()), 64);
  return hex.substr(0, hex.find(' '));
}

// LOCKSTEP_FAULT=flip: a bit of the first weight this rank holds
// (its own under optim.zero 3, where the others are placeholders).
std::string Trainer::Impl::flip_a_weight_bit() {
  const NamedTensors params = trainable_parameters(*model);
  for (size_t i = 0; i < params.size(); ++i) {
    if (run.sharded && !zero->owns(i)) continue;
    at::NoGradGuard no_grad;
    const at::Tensor& p = params[i].second;
    const auto bits = p.element_size() == 8   ? at::kLong
                      : p.element_size() == 4 ? at::kInt
                      : p.element_size() == 2 ? at::kShort
                                              : at::kByte;
    // A high mantissa bit (2^20 of a float32's, 2^4 of a 16-bit float's): a
    // change of several per cent that no later rounding undoes (a lowest
    // bit may be rounded away by the next step's weight decay, and the
    // ranks agree again).
    const int64_t bit = p.element_size() == 4 ? (1 << 20) : p.element_size() == 2 ? (1 << 4) : 1;
    p.detach().view(bits).view({-1}).narrow(0, 0, 1).bitwise_xor_(bit);
    return params[i].first;
  }
  return "(no weight on this rank)";
}

int64_t Trainer::Impl::stop_step() const {
  return lockstep::stop_step(config, plan.total_steps);
}

bool Trainer::Impl::train_epoch(TrainResult& result, Interval& interval, int64_t stop) {
  sampler->set_epoch(state.epoch);
  const int64_t micro = micro_in_epoch(*sampler, state.epoch_offset);
  BatchLoader loader(
      data.train, epoch_indices(),
      LoaderOptions{config.data.batch_size, config.data.drop_last, config.data.prefetch});
  for (int64_t skip = 0; skip < state.batch_in_epoch; ++skip) loader.next();
  while (state.batch_in_epoch < micro && state.step < stop) {
    fault_maybe_fire(fault, world, state.step, [this] { return flip_a_weight_bit(); });
    if (data.train->file_backed())  // Note [Token files]: every rank alike, before reading
      agree_on_failure(*pg, [&] { data.train->check_unchanged(); });
    const StepStats stats = train_step(loader, interval, micro - state.batch_in_epoch);
    last_step_samples = stats.samples;
    for (auto& c : callbacks) c->on_step_end(state, stats);
    if (after_step(result, interval, stop, micro)) return true;
  }
  return state.step == stop;
}

bool Trainer::Impl::after_step(TrainResult& result, Interval& interval, int64_t stop,
                               int64_t micro) {
  const bool end = state.step == stop;
  const bool logged = state.step % config.log.every == 0 || end;
  if (logged) end_interval(interval, result);
  metrics->step_done(state, stop, last_step_samples);
  // Evaluations come before any checkpoint of this step, so that the
  // checkpoint holds their effect on the watches (a resume from it makes
  // the decisions an uninterrupted run makes): an epoch's end, a
  // train.eval_every step, or a stop inside an epoch (partial, not counted
  // by the watches).
  const int64_t eval_every = config.train.eval_every;
  const bool eval_point = eval_every > 0 && state.step % eval_every == 0;
  const bool epoch_end = state.batch_in_epoch >= micro;
  if (epoch_end || end || eval_point) {
    const EvalAt at = epoch_end ? EvalAt::kEpochEnd : eval_point ? EvalAt::kEvery : EvalAt::kStop;
    if (evaluate(result, at) && at != EvalAt::kStop && after_evaluation(result)) {
      if (!logged) end_interval(interval, result);  // train.early_stop
      save_checkpoint();
      return true;
    }
  }
  if (end || (config.checkpoint.every > 0 && state.step % config.checkpoint.every == 0))
    save_checkpoint("", /*periodic=*/!end);
  if (end) return true;
  if (!config.checkpoint.on_signal) return false;
  // Every rank learns whether any rank was signalled, so all stop at the
  // same step and agree on the checkpoint.
  const int sig = static_cast<int>(max_over_ranks(*pg, int64_t{stop_signal_received()}));
  if (sig == 0) return false;
  spdlog::warn("received signal {}: saving a checkpoint at step {} and stopping", sig, state.step);
  save_checkpoint();
  throw Interrupted("stopped by signal " + std::to_string(sig) + " after step " +
                        std::to_string(state.step) + "; " +
                        (world.rank == 0 ? "checkpoint " + absolute_path(last_checkpoint)
                                         : std::string("rank 0 saved the checkpoint")),
                    sig);
}

void Trainer::Impl::finish(TrainResult& result, int64_t stop) {
  step->finish_checks();
  if (result.val_examples == 0 && data.validation->size() > 0) {
    // Nothing was trained (a resumed run that had finished): still report
    // the validation of the weights it holds.
    if (world.rank == 0 && state.step >= stop)
      spdlog::info("nothing left to train: step {} of {} was done when it was saved", state.step,
                   stop);
    evaluate(result, EvalAt::kStop, /*record=*/false);  // its record is in metrics.jsonl
    if (world.rank == 0 && result.val_examples > 0)
      spdlog::info("validation of the checkpoint's weights: loss {:.5g}, accuracy {:.4f}",
                   result.val_loss, result.val_accuracy);
  }
  settle_background_save();  // checkpoint.async: the last one in flight
  if (saves == 0 && failed_saves > 0) {
    // checkpoint.on_error: warn trained on, but nothing of this run is on disk.
    throw StorageError("training ended, but none of this run's " + std::to_string(failed_saves) +
                       " checkpoint(s) could be written (checkpoint.on_error: warn), so its "
                       "weights exist nowhere on disk; the last error: " +
                       last_save_problem);
  }
  if (tracer) {
    const std::string path = run_dir + "/trace_rank" + std::to_string(world.rank) + ".json";
    tracer->write(path);
    spdlog::info("trace: {}", path);
  }
  report_memory();
  result.steps = state.step;
  result.fingerprint = final_fingerprint();
  result.last_checkpoint = last_checkpoint;
  if (result.best_checkpoint.empty()) result.best_checkpoint = last_best;
  for (auto& c : callbacks) c->on_train_end(state, result);
  if (result.val_examples > 0) {
    spdlog::info("done: {} steps, validation accuracy {:.4f}, final weights {}", result.steps,
                 result.val_accuracy, result.fingerprint);
  } else {
    spdlog::info("done: {} steps, no validation (empty split), final weights {}", result.steps,
                 result.fingerprint);
  }
}

namespace {
// VmPeak of /proc/self/status (what prlimit --as caps), KiB; 0 if unknown.
int64_t vm_peak_kib() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmPeak:", 0) == 0) return std::atoll(line.c_str() + 7);
  return 0;
}
}  // namespace

// What ZeRO saves, per rank (docs/zero.md's table reads these lines).
void Trainer::Impl::report_memory() const {
  int64_t state_bytes = 0;
  if (zero != nullptr) {
    state_bytes = zero->state_bytes();
  } else {
    for (const auto& t : optimizer_state_tensors(*optimizer, trainable_parameters(*model)))
      state_bytes += static_cast<int64_t>(t.tensor.nbytes());
  }
  if (run.sharded) {
    spdlog::info(
        "memory: weights {:.1f} MiB held on this rank between steps (optim.zero 3), at most "
        "{:.1f} MiB gathered at once",
        static_cast<double>(run.sharded->resident_parameter_bytes()) / (1 << 20),
        static_cast<double>(run.sharded->peak_gathered_bytes()) / (1 << 20));
  }
  spdlog::info(
      "memory: optimizer state {:.1f} MiB on this rank (optim.zero {}); peak resident "
      "{:.1f} MiB while training, {:.1f} MiB in all (checkpoints included); address space "
      "peak {:.1f} MiB",
      static_cast<double>(state_bytes) / (1 << 20), config.optim.zero,
      static_cast<double>(training_peak_kib) / 1024.0,
      static_cast<double>(process_resident_peak_kib()) / 1024.0,
      static_cast<double>(vm_peak_kib()) / 1024.0);
}

}  // namespace lockstep
