// Size (over ~400 lines): the Trainer still holds its lifecycle, the resume with its
// elastic re-mapping, evaluation and the loop in one Impl; splitting them is open work
// of issue 37 (the run assembly already lives in run_parts.cpp).
// The lifecycle and the loop of one run, around the one step (step.cpp).
// What a config makes is in recipe.cpp, reports in metrics.cpp, signals in
// stop_signals.cpp.
#include "lockstep/train/trainer.h"

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <sys/resource.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <set>

#include <spdlog/spdlog.h>

#include "hook_state.h"
#include "lockstep/check/fingerprint.h"
#include "lockstep/data/loader.h"
#include "lockstep/ddp/zero_grad_hook.h"
#include "lockstep/distributed/agree.h"
#include "lockstep/model/gpt.h"
#include "lockstep/optim/optim.h"
#include "lockstep/optim/zero.h"
#include "lockstep/train/callbacks.h"
#include "lockstep/train/checkpoint.h"
#include "lockstep/train/fault.h"
#include "lockstep/train/precision.h"
#include "lockstep/train/recipe.h"
#include "lockstep/train/step.h"
#include "lockstep/util/error.h"
#include "lockstep/util/fs.h"
#include "lockstep/util/log.h"
#include "lockstep/util/module_tensors.h"
#include "lockstep/util/sha256.h"
#include "lockstep/util/text.h"
#include "lockstep/util/trace.h"
#include "metrics.h"
#include "run_dir.h"
#include "run_parts.h"
#include "stop_signals.h"

namespace lockstep {
struct Trainer::Impl {
  Config config;
  WorldInfo world;
  std::shared_ptr<ProcessGroup> pg;
  std::string run_dir;
  std::string config_yaml;

  TrainData data;       // train and validation, and what the model needs of them
  std::string data_id;  // data_identity(train split), for state.yaml
  std::unique_ptr<DistributedSampler> sampler;
  // What the config makes, as `lockstep check --config` makes it too (Note
  // [One run assembly], run_parts.h); the names below are its parts.
  RunParts run;
  std::shared_ptr<Classifier>& model = run.model;
  at::Device& device = run.device;  // train.device, resolved
  std::unique_ptr<ClassifierDdp>& ddp = run.ddp;
  std::shared_ptr<CommHook>& comm_hook = run.comm_hook;  // ddp.comm_hook; nullptr: all-reduce
  StateDict resumed_hook_state;  // from the checkpoint, until the hook exists
  int64_t resumed_world_size = 0;
  std::string resumed_from;
  std::unique_ptr<torch::optim::Optimizer>& optimizer = run.optimizer;
  ZeroOptimizer*& zero = run.zero;  // `optimizer`, when optim.zero is 1 or 2
  std::unique_ptr<MixedPrecision>& precision = run.precision;  // autocast, the GradScaler
  std::unique_ptr<Checkpointer> checkpointer;
  TrainerState state;
  StepPlan plan;  // micro-batches and steps per epoch, steps in all
  std::unique_ptr<Metrics> metrics;
  std::shared_ptr<Tracer> tracer;  // log.trace
  std::optional<Fault> fault;      // LOCKSTEP_FAULT, read once the world is known
  std::string last_checkpoint;
  long training_peak_kib = 0;  // peak resident memory after the last step
  std::vector<std::shared_ptr<TrainerCallback>> callbacks;  // register_callback

  // ------------------------------------------------------------ lifecycle
  void agree_on_config() {
    config_yaml = config_to_yaml(config);
    std::string differ;
    for (int r : ranks_differing_from_rank0(*pg, sha256_hex(config_yaml).substr(0, 16)))
      differ += (differ.empty() ? "" : ", ") + std::to_string(r);
    if (!differ.empty()) {
      throw ConfigError("the resolved configuration of rank(s) " + differ +
                        " differs from rank 0's (same file and --set on every rank?)");
    }
  }

  // Rank 0 creates the run directory and proves it writable; every rank
  // learns the outcome, so all stop together before any training. Nothing
  // is written into it yet: a run refused for its config must not touch
  // another run's results (open_run_dir does, once the run is assembled).
  void prepare_run_dir() {
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
      // Note [Replacing a checkpoint folder]: what a killed writer left,
      // before any checkpoint is looked for.
      for (const auto& line : Checkpointer(run_dir, config.checkpoint.keep).repair())
        spdlog::warn("checkpoints: {}", line);
    });
    if (!problem.empty()) throw ConfigError(problem);
  }

  // After the whole run is assembled (every name in the config resolved,
  // the checkpoint read): the run claims its directory (Note [Run
  // directories]), repairs what a killed writer left (Note [Replacing a
  // checkpoint folder]), and starts writing there: config.yaml, the log
  // file, metrics.
  void open_run_dir() {
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
  }
  double language_tokens = 0, language_flops = 0;  // for metrics, from build_model
  std::string resumed_from_folder;                 // the checkpoint resumed from, if any

  // Which job this process belongs to, the same in every attempt of it
  // (lockstep-run's per-job secret, torchrun's run id); empty: unknown.
  std::string job_identity() const {
    if (!world.store_secret.empty()) return sha256_hex("job:" + world.store_secret).substr(0, 16);
    const char* run_id = std::getenv("TORCHELASTIC_RUN_ID");
    if (run_id != nullptr && *run_id != '\0' && std::string(run_id) != "none")
      return sha256_hex(std::string("job:") + run_id).substr(0, 16);
    return "";
  }

  void load_data() {
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
    const char* watcher =
        config.checkpoint.keep_best != WatchedMetric::kNone      ? "checkpoint.keep_best"
        : config.train.early_stop_metric != WatchedMetric::kNone ? "train.early_stop.metric"
                                                                 : nullptr;
    if (val_size == 0 && watcher != nullptr) {
      throw ConfigError(std::string(watcher) +
                        " watches a validation metric, but the validation split is empty "
                        "(data.validation_fraction=" +
                        number_text(d.validation_fraction) + ")");
    }
    if (val_size == 0 && world.rank == 0) {
      spdlog::warn(
          "data: the validation split is empty ({} examples x data.validation_fraction={} "
          "holds none): no validation is measured or reported",
          train_size, d.validation_fraction);
    }
  }

  void build_model() {
    run_build_model(run, config, world, *pg, data);
    if (data.task == TaskKind::kLanguage) {
      language_tokens = static_cast<double>(data.sample_shape[0]);
      if (auto* gpt = dynamic_cast<Gpt*>(model.get())) language_flops = gpt->flops_per_token();
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

  void build_optimizer() {
    run_build_optimizer(run, config, pg);
    if (zero != nullptr) {
      const auto elements = zero->owned_elements();
      int64_t all = 0, owned = 0;
      for (size_t i = 0; i < zero->owners().size(); ++i) owned += zero->owns(i) ? 1 : 0;
      for (int64_t e : elements) all += e;
      spdlog::info(
          "optim.zero: {}: this rank owns {} of {} parameter tensors ({} of {} elements) and "
          "keeps optimizer state for those only{}",
          config.optim.zero, owned, zero->owners().size(),
          elements[static_cast<size_t>(world.rank)], all,
          config.optim.zero == 2 ? "; gradients are reduce-scattered to their owners" : "");
    }
    checkpointer = std::make_unique<Checkpointer>(run_dir, config.checkpoint.keep);
  }

  // This epoch's share of samples for this rank: the sampler's, or the rest
  // of the epoch from state.epoch_offset (Note [Elastic resume]).
  std::vector<int64_t> epoch_indices() const {
    return state.epoch_offset > 0 ? sampler->indices_from(state.epoch_offset) : sampler->indices();
  }
  // Micro-batches this rank trains in the current epoch (from its offset):
  // whole optimizer steps only, as step_plan() counts them.
  int64_t micro_in_epoch(const DistributedSampler& s, int64_t offset) const {
    if (offset == 0 && &s == sampler.get()) return plan.micro_per_epoch;
    return micro_of(s, offset, config.data.batch_size, config.train.accumulation_steps);
  }
  int64_t micro_of(const DistributedSampler& s, int64_t offset, int64_t bs, int64_t acc) const {
    return micro_batches_used(s.num_samples_from(offset), bs, acc, config.data.drop_last);
  }

  // Note [Elastic resume]
  // ~~~~~~~~~~~~~~~~~~~~~
  // A checkpoint written by W ranks resumes on W' ranks. Within the
  // interrupted epoch, the W ranks consumed the first
  //   consumed = epoch_offset + batch_in_epoch x data.batch_size x W
  // positions of the epoch's sample order (rank r takes positions r, r + W,
  // ...: a DistributedSampler's deal; the batches before the epoch's end
  // are full). The W' ranks take the rest of that order, positions
  // consumed .. end, dealt the same way as if it were the whole dataset
  // (padded by wrapping or truncated with drop_last to a multiple of W'):
  // no sample of the epoch is repeated or skipped beyond what the padding
  // of a DistributedSampler repeats anyway. The next epochs are the
  // sampler's for W'. The step count and the optimizer state continue;
  // the schedule's length becomes the steps done plus the steps left at W'
  // (so a cosine still ends at the last step). Generators: ranks below W
  // restore theirs, the others are seeded afresh (run.seed, rank).
  void remap_epoch(int64_t old_world) {
    SamplerOptions o;
    o.num_replicas = static_cast<int>(old_world);
    o.rank = 0;
    o.shuffle = config.data.shuffle;
    o.seed = static_cast<uint64_t>(config.run.seed);
    o.drop_last = config.data.drop_last;
    DistributedSampler old(data.train->size(), o);
    old.set_epoch(state.epoch);
    // The writer's batch size and accumulation (this run's may differ).
    const int64_t bs = state.batch_size > 0 ? state.batch_size : config.data.batch_size;
    const int64_t acc =
        state.accumulation_steps > 0 ? state.accumulation_steps : config.train.accumulation_steps;
    const int64_t old_micro = micro_of(old, state.epoch_offset, bs, acc);
    // batch_in_epoch < old_micro <= (dataset / bs + 1): no overflow below.
    if (state.batch_in_epoch >= old_micro) {  // the epoch was complete
      ++state.epoch;
      state.epoch_offset = 0;
      state.batch_in_epoch = 0;
      return;
    }
    const int64_t consumed = state.epoch_offset + state.batch_in_epoch * bs * old_world;
    state.epoch_offset = std::min(consumed, data.train->size());
    state.batch_in_epoch = 0;
  }

  // The steps left from the current position, at this world size.
  int64_t steps_left() const {
    sampler->set_epoch(state.epoch);
    const int64_t in_epoch = steps_over(
        std::max<int64_t>(0, micro_in_epoch(*sampler, state.epoch_offset) - state.batch_in_epoch),
        config.train.accumulation_steps);
    const int64_t later = std::max<int64_t>(0, config.train.epochs - state.epoch - 1);
    return std::max<int64_t>(0, in_epoch) + later * plan.steps_per_epoch;
  }

  // A checkpoint's position in the epoch means the samples of the data it
  // was trained on. Returns true when the data differ and the user allowed
  // it (checkpoint.allow_data_change); throws ConfigError when not allowed.
  bool check_data_unchanged(const TrainerState& saved, const std::string& folder) const {
    if (saved.data_size == 0) return false;  // written before lockstep recorded it
    const int64_t size = data.train->size();
    if (saved.data_size == size && saved.data_id == data_id) return false;
    const std::string what = "checkpoint '" + folder + "' was trained on " +
                             std::to_string(saved.data_size) + " training examples (data_id " +
                             saved.data_id + "), the training split now has " +
                             std::to_string(size) + " (data_id " + data_id +
                             "; it comes from data.name and data.path and, where lockstep splits "
                             "it, run.seed and data.validation_fraction)" +
                             (saved.data_size == size ? ": the same count, other contents" : "");
    if (!config.checkpoint.allow_data_change) {
      throw ConfigError(what +
                        "; its position in the epoch would not mean the same samples. Set "
                        "checkpoint.allow_data_change: true to continue on the new data (the rest "
                        "of the epoch re-mapped onto it), or start a fresh run");
    }
    if (world.rank == 0)
      spdlog::warn(
          "{}; checkpoint.allow_data_change: the rest of the epoch is re-mapped onto the "
          "new data",
          what);
    return true;
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
    auto loaded = reading_key("checkpoint.resume", [&] {
      return Checkpointer::load(folder, zero != nullptr ? nullptr : optimizer.get());
    });
    const int64_t old_world = loaded.state.world_size;
    if (loaded.legacy_optimizer && old_world != world.world_size) {
      throw ConfigError("checkpoint '" + folder +
                        "' holds an optimizer archive of an older "
                        "lockstep, which resumes only on the " +
                        std::to_string(old_world) + " rank(s) that wrote it (this run has " +
                        std::to_string(world.world_size) + ")");
    }
    if (loaded.state.model != config.model.name) {
      throw ConfigError("checkpoint '" + folder + "' holds a '" + loaded.state.model +
                        "' model, the config asks for '" + config.model.name + "'");
    }
    {
      std::set<std::string> parameters;
      for (const auto& [name, _] : trainable_parameters(*model)) parameters.insert(name);
      Checkpointer::check_values(loaded, parameters, generator_state().numel());
    }
    const bool data_changed = check_data_unchanged(loaded.state, folder);
    state_dict_load(*model, loaded.model, folder + "/model.pt");
    if (!loaded.legacy_optimizer) {
      reading_key("checkpoint.resume", [&] {
        const std::string source = folder + "/optimizer.pt";
        if (zero != nullptr) {
          zero->load_state_dict(loaded.optimizer, source);
        } else {
          optimizer_load_state_dict(*optimizer, trainable_parameters(*model), loaded.optimizer, {},
                                    source);
        }
        return 0;
      });
    }
    precision->load_state_dict(loaded.state.scaler, folder + "/state.yaml");
    if (world.rank < loaded.rng_states.size(0)) {
      try {
        generator_restore(loaded.rng_states[world.rank]);
      } catch (const c10::Error& e) {
        throw DataError(folder + "/rng.pt: row " + std::to_string(world.rank) +
                        " is not a CPU generator state: " + what_of(e).substr(0, 200));
      }
    } else {
      seed_rank_generator(config, world.rank);
    }
    resumed_hook_state = std::move(loaded.state.comm_hook);
    resumed_world_size = old_world;
    resumed_from = folder + "/comm_hook.pt";
    loaded.state.comm_hook.clear();
    state = loaded.state;
    last_checkpoint = folder;
    resumed_from_folder = folder;
    const std::string where = "at step " + std::to_string(state.step) + " (epoch " +
                              std::to_string(state.epoch + 1) + ", after micro-batch " +
                              std::to_string(state.batch_in_epoch) + ")";
    std::string changed;
    const int64_t old_bs = state.batch_size > 0 ? state.batch_size : config.data.batch_size;
    const int64_t old_acc =
        state.accumulation_steps > 0 ? state.accumulation_steps : config.train.accumulation_steps;
    // Another world size, batch size or accumulation: the rest of the epoch
    // is dealt anew (Note [Elastic resume]).
    if (old_world != world.world_size || old_bs != config.data.batch_size ||
        old_acc != config.train.accumulation_steps || data_changed) {
      const int64_t before_epoch = state.epoch;
      // In double: a hostile state.yaml must not overflow a message.
      const double old_batch = static_cast<double>(old_bs) * static_cast<double>(old_world) *
                               static_cast<double>(old_acc);
      remap_epoch(old_world);
      changed += "; written by " + std::to_string(old_world) + " rank(s) x data.batch_size " +
                 std::to_string(old_bs) + " x train.accumulation_steps " + std::to_string(old_acc) +
                 ", now " + std::to_string(world.world_size) + " x " +
                 std::to_string(config.data.batch_size) + " x " +
                 std::to_string(config.train.accumulation_steps) + ": ";
      if (state.epoch != before_epoch) {
        changed += "its epoch was complete, epoch " + std::to_string(state.epoch + 1) +
                   " starts on the new ranks";
      } else {
        changed += "the rest of epoch " + std::to_string(state.epoch + 1) + " (" +
                   std::to_string(data.train->size() - state.epoch_offset) +
                   " samples from position " + std::to_string(state.epoch_offset) +
                   " of its order) is dealt to the new ranks";
      }
      const int64_t new_batch =
          config.data.batch_size * world.world_size * config.train.accumulation_steps;
      changed += "; global batch " + number_text(old_batch) + " -> " + std::to_string(new_batch);
    }
    if (state.zero != config.optim.zero) {
      changed +=
          "; optim.zero " + std::to_string(state.zero) + " -> " + std::to_string(config.optim.zero);
    }
    plan.total_steps = state.step + steps_left();
    if (state.total_steps > 0 && plan.total_steps != state.total_steps) {
      changed += "; schedule length " + std::to_string(state.total_steps) + " -> " +
                 std::to_string(plan.total_steps) + " steps";
    }
    spdlog::info("resumed from {} {}{}", folder, where, changed);
  }

  // ------------------------------------------------------------ the loop
  std::unique_ptr<TrainStep>& step = run.step;  // the one step (train/step.h), with its checks

  void check_weights(int64_t at_step, const std::string& why, CheckPolicy policy) {
    step->sync_buffers_for_check();
    const auto tensors = step->checked_tensors();
    const auto report = fingerprint_check(*pg, tensors, config.check.mode, at_step);
    if (!report.consistent) spdlog::error("{}: {}", why, report.message);
    fingerprint_enforce(*pg, report, policy, tensors);
  }

  // Note [Diverged training], at a checkpoint: the optimizer step itself can
  // make weights non-finite (Adam with eps 0) after a finite loss and norm;
  // such weights are never saved. Every rank holds the same weights (the
  // check above), so every rank decides alike without a collective.
  void refuse_nonfinite_weights() const {
    if (!config.train.stop_on_nonfinite || config.train.precision == Precision::kFp16) return;
    for (const auto& [name, p] : trainable_parameters(*model)) {
      if (p.isfinite().all().item<bool>()) continue;
      throw TrainingError("training diverged at step " + std::to_string(state.step) +
                          ": parameter '" + name +
                          "' holds NaN or inf after the optimizer step; no checkpoint of this "
                          "state is written (the last one stays the newest; lower optim.lr, check "
                          "optim.eps, or set train.stop_on_nonfinite: false to save it anyway)");
    }
  }

  std::string last_best;                // checkpoints/best, once written
  int64_t saves = 0, failed_saves = 0;  // this run's checkpoints (not best/)
  std::string last_save_problem;        // checkpoint.on_error: warn

  // `best_yaml` non-empty: the best checkpoint (checkpoint.keep_best).
  void save_checkpoint(const std::string& best_yaml = "") {
    step->finish_checks();
    state.world_size = world.world_size;
    state.zero = config.optim.zero;
    state.batch_size = config.data.batch_size;
    state.accumulation_steps = config.train.accumulation_steps;
    state.total_steps = plan.total_steps;
    state.model = config.model.name;
    state.data_size = data.train->size();
    state.data_id = data_id;
    state.scaler = precision->state_dict();
    if (comm_hook) state.comm_hook = hook_state_gather(*pg, *comm_hook, *ddp);
    struct ClearOnExit {
      StateDict& held;
      ~ClearOnExit() { held.clear(); }  // every rank's hook state: not kept between checkpoints
    } clear{state.comm_hook};
    // Only weights every rank agrees on are worth keeping.
    check_weights(state.step, "checkpoint", CheckPolicy::kAbort);
    refuse_nonfinite_weights();
    const auto states = pg->allgather(generator_state().to(pg->device()));
    // Whole on rank 0 (gathered from the owners under ZeRO), whatever the stage.
    const StateDict optimizer_state =
        zero != nullptr   ? zero->consolidated_state_dict()
        : world.rank == 0 ? optimizer_state_dict(*optimizer, trainable_parameters(*model))
                          : StateDict{};
    const std::string problem = rank0_outcome(*pg, [&] {
      std::vector<at::Tensor> rows;
      for (const auto& s : states) rows.push_back(s.cpu());
      const std::string folder = checkpointer->save(state, state_dict_of(*model), optimizer_state,
                                                    at::stack(rows), config_yaml, best_yaml);
      if (best_yaml.empty()) {
        last_checkpoint = folder;
        spdlog::info("checkpoint: {}", absolute_path(folder));
      } else {
        last_best = folder;
        spdlog::info("best checkpoint: {} (step {})", absolute_path(folder), state.step);
      }
    });
    if (!problem.empty()) {
      const bool disk = problem.find("ENOSPC") != std::string::npos ||
                        problem.find("cannot write") != std::string::npos ||
                        problem.find("cannot create") != std::string::npos;
      if (config.checkpoint.on_error == OnCheckpointError::kFail) {
        if (disk) throw StorageError(problem);
        throw DataError(problem);
      }
      spdlog::warn("{}; training goes on (checkpoint.on_error: warn)", problem);
      if (best_yaml.empty()) {
        ++failed_saves;
        last_save_problem = problem;
      }
      return;
    }
    if (best_yaml.empty()) ++saves;
    char name[32];
    std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(state.step));
    const std::string folder =
        run_dir + "/checkpoints/" + (best_yaml.empty() ? std::string(name) : "best");
    for (auto& c : callbacks) c->on_checkpoint(state, folder);
  }

  void end_interval(Interval& in, TrainResult& result) {
    result.last_loss = metrics->end_interval(in, state, plan.total_steps);
  }

  // Evaluates the validation split (train.eval_batches bounds each rank's
  // share); returns false when it is empty. Collective.
  bool evaluate(TrainResult& result, EvalAt at, bool record = true) {
    const int64_t val_size = data.validation->size();
    if (val_size == 0) return false;     // the same on every rank: the split is deterministic
    if (data.validation->file_backed())  // Note [Token files]: every rank alike
      agree_on_failure(*pg, [&] { data.validation->check_unchanged(); });
    model->eval();
    at::NoGradGuard no_grad;
    // Language windows are large: the training batch; rows otherwise.
    const int64_t rows = data.task == TaskKind::kLanguage ? config.data.batch_size : 256;
    std::vector<int64_t> mine;  // unpadded shard: exact global counts
    for (int64_t i = world.rank; i < val_size; i += world.world_size) mine.push_back(i);
    if (config.train.eval_batches > 0 &&
        static_cast<int64_t>(mine.size()) > config.train.eval_batches * rows) {
      mine.resize(static_cast<size_t>(config.train.eval_batches * rows));
    }
    double loss_sum = 0, correct = 0;
    if (!mine.empty()) {
      BatchLoader loader(data.validation, mine, LoaderOptions{rows, false, false});
      while (auto batch = loader.next()) {
        const auto x = batch->x.to(device), y = batch->y.to(device);
        at::Tensor out, loss;
        precision->run([&] {  // as the training forward
          out = model->forward(x);
          loss = loss_for(data.task, out, y);
        });
        loss_sum += loss.item<double>() * x.size(0);
        if (data.task == TaskKind::kClassification)
          correct += (out.argmax(1) == y).sum().item<double>();
        if (data.task == TaskKind::kLanguage)  // next-token accuracy, a share per window
          correct += (out.argmax(-1) == y).to(at::kDouble).mean(1).sum().item<double>();
      }
    }
    const auto sums = sum_over_ranks(*pg, {loss_sum, correct, static_cast<double>(mine.size())});
    const double count = std::max(1.0, sums[2]);
    result.val_loss = sums[0] / count;
    result.val_accuracy = sums[1] / count;
    result.val_examples = static_cast<int64_t>(sums[2]);
    model->train();
    if (!record) return true;
    metrics->validation(state, result.val_loss, result.val_accuracy, result.val_examples, at);
    for (auto& c : callbacks) c->on_evaluation_end(state, result);
    return true;
  }

  // ------------------------------------------- best checkpoint, early stop
  static double metric_value(WatchedMetric metric, const TrainResult& r) {
    switch (metric) {
      case WatchedMetric::kValAccuracy:
        return r.val_accuracy;
      case WatchedMetric::kValPerplexity:
        return std::exp(r.val_loss);
      case WatchedMetric::kValLoss:
      case WatchedMetric::kNone:
        break;
    }
    return r.val_loss;
  }
  static bool higher_is_better(WatchedMetric metric, MetricMode mode) {
    if (mode != MetricMode::kAuto) return mode == MetricMode::kMax;
    return metric == WatchedMetric::kValAccuracy;
  }
  // Whether `value` improves on `watch` by more than `min_delta`; updates it.
  // Every rank holds the same all-reduced value: every rank decides alike.
  bool improve(MetricWatch& watch, double value, bool higher, double min_delta) {
    // A NaN (a diverged evaluation) is never better; any number beats none.
    const bool better =
        !std::isnan(value) &&
        (watch.best_step < 0 || std::isnan(watch.best) ||
         (higher ? value > watch.best + min_delta : value < watch.best - min_delta));
    if (better) {
      watch.best = value;
      watch.best_step = state.step;
      watch.bad = 0;
    } else {
      ++watch.bad;
    }
    return better;
  }

  // After an evaluation at an epoch's end or every train.eval_every steps
  // (not at a train.max_steps stop: a run interrupted and resumed must see
  // the evaluations an uninterrupted one sees). Returns true to stop.
  bool after_evaluation(TrainResult& result) {
    const auto& ck = config.checkpoint;
    if (ck.keep_best != WatchedMetric::kNone) {
      const double value = metric_value(ck.keep_best, result);
      if (improve(state.keep_best, value, higher_is_better(ck.keep_best, ck.mode), 0)) {
        char best[256];
        std::snprintf(best, sizeof best, "metric: %s\nmode: %s\nvalue: %.17g\nstep: %lld\n",
                      name_of(kWatchedMetricNames, ck.keep_best),
                      higher_is_better(ck.keep_best, ck.mode) ? "max" : "min", value,
                      static_cast<long long>(state.step));
        save_checkpoint(best);
        result.best_checkpoint = last_best;
      }
    }
    const auto& tr = config.train;
    if (tr.early_stop_metric == WatchedMetric::kNone) return false;
    const double value = metric_value(tr.early_stop_metric, result);
    improve(state.early_stop, value, higher_is_better(tr.early_stop_metric, MetricMode::kAuto),
            tr.early_stop_min_delta);
    if (state.early_stop.bad < tr.early_stop_patience) return false;
    char why[320];
    std::snprintf(why, sizeof why,
                  "early stop at step %lld: %s has not improved by more than %g for %lld "
                  "evaluations (best %.6g at step %lld)",
                  static_cast<long long>(state.step),
                  name_of(kWatchedMetricNames, tr.early_stop_metric), tr.early_stop_min_delta,
                  static_cast<long long>(state.early_stop.bad), state.early_stop.best,
                  static_cast<long long>(state.early_stop.best_step));
    result.stopped_early = why;
    if (world.rank == 0) spdlog::warn("{}", why);
    metrics->note("\"step\": " + std::to_string(state.step) + ", \"early_stop\": \"" +
                  std::string(why) + "\"");
    return true;
  }

  // `micro_left`: micro-batches of the epoch not trained yet (the last
  // step of an epoch may take fewer than train.accumulation_steps: Note
  // [Epoch tail]).
  StepStats train_step(BatchLoader& loader, Interval& in, int64_t micro_left) {
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
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    training_peak_kib = usage.ru_maxrss;  // before this step's checkpoint, if any
    return stats;
  }
};

Trainer::Trainer(Config config, WorldInfo world, std::shared_ptr<ProcessGroup> pg)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.config = std::move(config);
  s.world = std::move(world);
  s.pg = std::move(pg);
  s.fault = fault_from_env(env_process(), s.world.world_size);
  config_validate(s.config, s.world.world_size);
  s.agree_on_config();
  s.prepare_run_dir();
  within_memory("the dataset (section data)", [&] { s.load_data(); });
  within_memory("the model (section model)", [&] { s.build_model(); });
  s.build_optimizer();
  // Under ZeRO a bad optimizer.pt entry fails only its owner's load: every
  // rank learns the verdict and leaves with the same error (exit 2 alike).
  agree_on_failure(*s.pg, [&] { s.maybe_resume(); });
  run_build_ddp(s.run, s.config, s.pg);
  if (!s.resumed_from.empty()) {
    hook_state_restore(s.comm_hook.get(), *s.ddp, s.resumed_hook_state, s.world.rank,
                       s.world.world_size, s.resumed_world_size, s.resumed_from);
    s.resumed_hook_state.clear();
  }
  if (s.config.ddp.comm_hook == "powersgd" && s.world.world_size > 1 &&
      s.config.ddp.powersgd_start_iter >= s.plan.total_steps) {
    spdlog::warn(
        "ddp.powersgd.start_iter is {} and this run has {} steps: PowerSGD never compresses "
        "(it all-reduces plainly until then; PyTorch's default 1000 suits long runs)",
        s.config.ddp.powersgd_start_iter, s.plan.total_steps);
  }
  run_build_step(s.run, s.config, *s.pg, s.data.task,
                 step_options_from_config(s.config, s.plan.total_steps));
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
  const int64_t max_steps =
      s.config.train.max_steps > 0 ? s.config.train.max_steps : s.plan.total_steps;
  const int64_t stop = std::min(max_steps, s.plan.total_steps);
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
  const int64_t eval_every = s.config.train.eval_every;
  const auto eval_point = [&] { return eval_every > 0 && s.state.step % eval_every == 0; };
  bool stopping = false;  // train.early_stop
  while (!stopping && s.state.step < stop && s.state.epoch < s.config.train.epochs) {
    s.sampler->set_epoch(s.state.epoch);
    const int64_t micro = s.micro_in_epoch(*s.sampler, s.state.epoch_offset);
    BatchLoader loader(
        s.data.train, s.epoch_indices(),
        LoaderOptions{s.config.data.batch_size, s.config.data.drop_last, s.config.data.prefetch});
    for (int64_t skip = 0; skip < s.state.batch_in_epoch; ++skip) loader.next();
    while (s.state.batch_in_epoch < micro && s.state.step < stop) {
      fault_maybe_fire(s.fault, s.world, s.state.step);
      if (s.data.train->file_backed())  // Note [Token files]: every rank alike, before reading
        agree_on_failure(*s.pg, [&] { s.data.train->check_unchanged(); });
      const StepStats stats = s.train_step(loader, interval, micro - s.state.batch_in_epoch);
      for (auto& c : s.callbacks) c->on_step_end(s.state, stats);
      const bool end = s.state.step == stop;
      if (s.state.step % s.config.log.every == 0 || end) s.end_interval(interval, result);
      // Evaluations come before any checkpoint of this step, so that the
      // checkpoint holds their effect on the watches (a resume from it
      // makes the decisions an uninterrupted run makes): an epoch's end, a
      // train.eval_every step, or a stop inside an epoch (partial, not
      // counted by the watches).
      const bool epoch_end = s.state.batch_in_epoch >= micro;
      const bool evaluate_now = epoch_end || end || eval_point();
      if (evaluate_now) {
        const EvalAt at = epoch_end      ? EvalAt::kEpochEnd
                          : eval_point() ? EvalAt::kEvery
                                         : EvalAt::kStop;
        if (s.evaluate(result, at) && at != EvalAt::kStop && s.after_evaluation(result)) {
          stopping = true;
          if (!end && s.state.step % s.config.log.every != 0) s.end_interval(interval, result);
          s.save_checkpoint();
          break;
        }
      }
      if (end) {
        s.save_checkpoint();
        break;
      }
      if (s.config.checkpoint.every > 0 && s.state.step % s.config.checkpoint.every == 0 && !end) {
        s.save_checkpoint();
      }
      if (s.config.checkpoint.on_signal) {
        // Every rank learns whether any rank was signalled, so all stop at
        // the same step and agree on the checkpoint.
        const int sig = static_cast<int>(max_over_ranks(*s.pg, int64_t{stop_signal_received()}));
        if (sig != 0) {
          spdlog::warn("received signal {}: saving a checkpoint at step {} and stopping", sig,
                       s.state.step);
          s.save_checkpoint();
          throw Interrupted(
              "stopped by signal " + std::to_string(sig) + " after step " +
                  std::to_string(s.state.step) + "; " +
                  (s.world.rank == 0 ? "checkpoint " + absolute_path(s.last_checkpoint)
                                     : std::string("rank 0 saved the checkpoint")),
              sig);
        }
      }
    }
    if (stopping || s.state.step == stop) break;
    ++s.state.epoch;
    s.state.batch_in_epoch = 0;
    s.state.epoch_offset = 0;
  }
  s.step->finish_checks();
  if (result.val_examples == 0 && s.data.validation->size() > 0) {
    // Nothing was trained (a resumed run that had finished): still report
    // the validation of the weights it holds.
    if (s.world.rank == 0 && s.state.step >= stop)
      spdlog::info("nothing left to train: step {} of {} was done when it was saved", s.state.step,
                   stop);
    s.evaluate(result, EvalAt::kStop, /*record=*/false);  // its record is in metrics.jsonl
    if (s.world.rank == 0 && result.val_examples > 0)
      spdlog::info("validation of the checkpoint's weights: loss {:.5g}, accuracy {:.4f}",
                   result.val_loss, result.val_accuracy);
  }
  if (s.saves == 0 && s.failed_saves > 0) {
    // checkpoint.on_error: warn trained on, but nothing of this run is on disk.
    throw StorageError("training ended, but none of this run's " + std::to_string(s.failed_saves) +
                       " checkpoint(s) could be written (checkpoint.on_error: warn), so its "
                       "weights exist nowhere on disk; the last error: " +
                       s.last_save_problem);
  }
  if (s.tracer) {
    const std::string path = s.run_dir + "/trace_rank" + std::to_string(s.world.rank) + ".json";
    s.tracer->write(path);
    spdlog::info("trace: {}", path);
  }
  {
    // What ZeRO saves, per rank (docs/zero.md's table reads these lines).
    int64_t state_bytes = 0;
    if (s.zero != nullptr) {
      state_bytes = s.zero->state_bytes();
    } else {
      for (const auto& t : optimizer_state_tensors(*s.optimizer, trainable_parameters(*s.model)))
        state_bytes += static_cast<int64_t>(t.tensor.nbytes());
    }
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    spdlog::info(
        "memory: optimizer state {:.1f} MiB on this rank (optim.zero {}); peak resident "
        "{:.1f} MiB while training, {:.1f} MiB in all (checkpoints included)",
        static_cast<double>(state_bytes) / (1 << 20), s.config.optim.zero,
        static_cast<double>(s.training_peak_kib) / 1024.0,
        static_cast<double>(usage.ru_maxrss) / 1024.0);
  }
  result.steps = s.state.step;
  result.fingerprint =
      hex_of(fingerprint_digest(fingerprint_tensors(*s.model, true), DigestMode::kXxh3));
  result.last_checkpoint = s.last_checkpoint;
  if (result.best_checkpoint.empty()) result.best_checkpoint = s.last_best;
  for (auto& c : s.callbacks) c->on_train_end(s.state, result);
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
