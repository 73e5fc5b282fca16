// The Trainer's parts (private to src/train): what one run holds, and its
// methods by concept, each group in its own file: the lifecycle and the loop
// (trainer.cpp), resuming a checkpoint at any world size (trainer_resume.cpp),
// saving one (trainer_save.cpp), evaluation with the watched metrics
// (trainer_eval.cpp).
#pragma once

#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/check/fault.h"
#include "lockstep/checkpoint/checkpoint.h"
#include "lockstep/checkpoint/run_dir.h"
#include "lockstep/checkpoint/sharded_checkpoint.h"
#include "lockstep/checkpoint/stateful.h"
#include "lockstep/data/loader.h"
#include "lockstep/data/sampler.h"
#include "lockstep/train/callbacks.h"
#include "lockstep/train/recipe.h"
#include "lockstep/train/trainer.h"
#include "lockstep/util/trace.h"
#include "metrics.h"
#include "run_parts.h"

namespace lockstep {

struct Trainer::Impl {
  Config config;
  WorldInfo world;
  std::shared_ptr<ProcessGroup> pg;
  std::string run_dir;
  RunDirLock run_lock;  // rank 0's, for the job's life (Note [One live job per run directory])
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
  std::unique_ptr<torch::optim::Optimizer>& optimizer = run.optimizer;
  ZeroOptimizer*& zero = run.zero;  // `optimizer`, when optim.zero is 1 or 2
  std::unique_ptr<MixedPrecision>& precision = run.precision;  // autocast, the GradScaler
  std::unique_ptr<Checkpointer> checkpointer;
  // What a checkpoint saves besides state.yaml (Note [Stateful parts]);
  // the checkpoint read by maybe_resume until every part is restored.
  std::vector<std::unique_ptr<Stateful>> parts;
  std::optional<Checkpointer::Loaded> resumed;
  TrainerState state;
  StepPlan plan;  // micro-batches and steps per epoch, steps in all
  std::unique_ptr<Metrics> metrics;
  std::shared_ptr<Tracer> tracer;  // log.trace
  std::optional<Fault> fault;      // LOCKSTEP_FAULT, read once the world is known
  std::string last_checkpoint;
  long training_peak_kib = 0;  // peak resident memory after the last step
  std::vector<std::shared_ptr<TrainerCallback>> callbacks;  // register_callback

  // ------------------------------------------------------------ lifecycle
  void agree_on_config();
  // Rank 0 creates the run directory, proves it writable and takes its lock
  // (a live job there: exit 2); every rank learns the outcome, so all stop
  // together before any training. Nothing else is written into it yet: a
  // run refused for its config must not touch another run's results
  // (open_run_dir does, once the run is assembled).
  void prepare_run_dir();
  // After the whole run is assembled (every name in the config resolved,
  // the checkpoint read): the run claims its directory (Note [Run
  // directories]), repairs what a killed writer left (Note [Replacing a
  // checkpoint folder]), and starts writing there: config.yaml, the log
  // file, metrics.
  void open_run_dir();
  double language_tokens = 0, language_flops = 0;  // for metrics, from build_model
  std::string resumed_from_folder;                 // the checkpoint resumed from, if any

  // Which job this process belongs to, the same in every attempt of it
  // (lockstep-run's per-job secret, torchrun's run id); empty: unknown.
  std::string job_identity() const;
  void load_data();
  void build_model();
  void build_optimizer();
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

  // Note [Elastic resume] (trainer_resume.cpp)
  void remap_epoch(int64_t old_world);
  // The steps left from the current position, at this world size.
  int64_t steps_left() const;
  // A checkpoint's position in the epoch means the samples of the data it
  // was trained on. Returns true when the data differ and the user allowed
  // it (checkpoint.allow_data_change); throws ConfigError when not allowed.
  bool check_data_unchanged(const TrainerState& saved, const std::string& folder) const;
  // checkpoint.resume: reads and checks the checkpoint, takes its position;
  // its phases below (trainer_resume.cpp).
  void maybe_resume();
  std::string resume_folder() const;  // "" when there is nothing to resume
  Checkpointer::Loaded load_resumed(const std::string& folder);
  void verify_resumed(const Checkpointer::Loaded& loaded, const std::string& folder);
  // These return what changed, for the "resumed from" line.
  std::string remap_position(int64_t old_world, bool data_changed);
  std::string replan_schedule();
  // Then every Stateful part takes its file's state: those that need no
  // DDP wrapper before it is built (`after_ddp` false), the rest after.
  // Each part's entries are released once restored.
  void restore_parts(bool after_ddp);
  // ------------------------------------------------------------ the loop
  std::unique_ptr<TrainStep>& step = run.step;  // the one step (train/step.h), with its checks

  void check_weights(int64_t at_step, const std::string& why, CheckPolicy policy);
  // Note [Diverged training], at a checkpoint: the optimizer step itself can
  // make weights non-finite (Adam with eps 0) after a finite loss and norm;
  // such weights are never saved. Every rank holds the same weights (the
  // check above), so every rank decides alike without a collective.
  void refuse_nonfinite_weights() const;
  double last_step_samples = 0;         // this rank's, for the progress line
  std::string last_best;                // checkpoints/best, once written
  int64_t saves = 0, failed_saves = 0;  // this run's checkpoints (not best/)
  std::string last_save_problem;        // checkpoint.on_error: warn

  // `best_yaml` non-empty: the best checkpoint (checkpoint.keep_best).
  // `periodic`: a checkpoint.every save, which checkpoint.async may write
  // in the background (the last, best and signal ones are written at once).
  void save_checkpoint(const std::string& best_yaml = "", bool periodic = false);
  // Its phases (Note [Saving in phases], trainer_save.cpp).
  struct SaveTiming {
    std::chrono::steady_clock::time_point began;
    long resident_at_start_kib = 0;
    double checked_s = 0;  // the weights' verification
  };
  struct GatheredParts {
    std::vector<SavedPart> saved;  // rank 0's whole parts
    ShardPieces pieces;            // sharded: this rank's entries of the shardable parts
  };
  void fill_saved_state();
  void verify_weights_before_save();
  GatheredParts gather_parts(bool sharded);
  std::vector<std::string> shard_index_order() const;
  // Sharded: returns true when the save went to the background (a periodic
  // save with checkpoint.async and its copy to host memory succeeded);
  // else it was written or `problem` says why not (the same on every rank).
  bool save_sharded(GatheredParts& gathered, const std::string& best_yaml, bool in_background,
                    const SaveTiming& timing, std::string& problem);
  int64_t copy_to_host(ShardPieces& pieces);  // bytes copied
  void write_in_background(const std::string& staging, GatheredParts gathered,
                           std::vector<std::string> order,
                           std::chrono::steady_clock::time_point began);
  // A save's outcome: counted, logged, callbacks told, or checkpoint.on_error
  // applied to `problem` (every rank's the same words).
  void conclude_save(const std::string& problem, const std::string& best_yaml,
                     const TrainerState& saved_state, const std::string& how);
  // checkpoint.async: waits for the save in flight and agrees on its
  // outcome (collective; nothing when none is in flight).
  void settle_background_save();
  // Runs `body` on every rank; "" when it succeeded everywhere, else the
  // same words on every rank (agree_on_failure; any exception, memory's
  // said as "an allocation failed").
  std::string agreed_problem(const std::function<void()>& body);
  std::string in_flight_staging;
  // Note [Sharded checkpoints]: the staging folders carry rank 0's pid.
  long staging_pid = 0;
  // checkpoint.async's copies, reused save to save; declared before the
  // save that writes from them, so that it outlives its thread.
  HostArena host_arena;
  BackgroundSave background;
  std::optional<TrainerState> in_flight;  // the state the save in flight holds
  std::chrono::steady_clock::time_point in_flight_since;
  void end_interval(Interval& in, TrainResult& result) {
    result.last_loss = metrics->end_interval(in, state, stop_step());
  }

  // Evaluates the validation split (train.eval_batches bounds each rank's
  // share); returns false when it is empty. Collective.
  bool evaluate(TrainResult& result, EvalAt at, bool record = true);
  // ------------------------------------------- best checkpoint, early stop
  static double metric_value(WatchedMetric metric, const TrainResult& r);
  static bool higher_is_better(WatchedMetric metric, MetricMode mode);
  // Whether `value` improves on `watch` by more than `min_delta`; updates it.
  // Every rank holds the same all-reduced value: every rank decides alike.
  bool improve(MetricWatch& watch, double value, bool higher, double min_delta);
  // After an evaluation at an epoch's end or every train.eval_every steps
  // (not at a train.max_steps stop: a run interrupted and resumed must see
  // the evaluations an uninterrupted one sees). Returns true to stop.
  bool after_evaluation(TrainResult& result);
  // `micro_left`: micro-batches of the epoch not trained yet (the last
  // step of an epoch may take fewer than train.accumulation_steps: Note
  // [Epoch tail]).
  StepStats train_step(BatchLoader& loader, Interval& in, int64_t micro_left);

  // Trainer::run's parts: the step the run stops after (train.max_steps or
  // the schedule's end), one epoch (returns true when the run stops in it),
  // what follows a step (evaluation, checkpoints, signals; true: stop),
  // and the end (the last validation, the trace, the memory line).
  int64_t stop_step() const;
  std::string flip_a_weight_bit();
  std::string final_fingerprint();
  // Rank 0: a cosine whose warm-up fills it, or a run past its length.
  void warn_schedule() const;
  bool train_epoch(TrainResult& result, Interval& interval, int64_t stop);
  bool after_step(TrainResult& result, Interval& interval, int64_t stop, int64_t micro);
  void finish(TrainResult& result, int64_t stop);
  void report_memory() const;
};

}  // namespace lockstep
