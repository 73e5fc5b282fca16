// TrainStep: the one training step. Every optimizer step lockstep takes -
// in the Trainer and in `lockstep check --config` - goes through run():
//
//   for each of train.accumulation_steps micro-batches (no_sync but the last):
//     hooks.around_forward( forward through DDP, loss )     autocast
//     backward of hooks.scale_loss(loss) / accumulation     loss scaling
//   check.grad_screen, check.replay_every: each rank's local gradient
//     before the exchange, checked (CorruptionChecks); on a finding the
//     job stops, or the step is taken again (check.on_corruption)
//   hooks.after_backward                                     ZeRO-2's release
//   verdicts of earlier checks (StepChecks::before_update), before the
//     weights change
//   hooks.before_clip                                        unscale_
//   learning rate of the schedule; the gradient norm; clip by value, by norm
//   hooks.optimizer_step, or optimizer.step()               skip, sharded step
//   the per-step check started (check.every)                 or the shard seal
//   hooks.report                                             loss scale
//
// The hooks are the seam for what wraps the step (mixed precision, a
// sharded optimizer); unset, the step is plain DDP training. Which option
// sets which hook is in one function, plug_step_hooks (run_parts.cpp). Contract: run() and
// finish_checks() are collectives, called by every rank with the same step numbers; one thread.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "lockstep/check/corruption.h"
#include "lockstep/check/fault.h"
#include "lockstep/check/fingerprint.h"
#include "lockstep/config/config.h"
#include "lockstep/data/loader.h"
#include "lockstep/ddp/ddp.h"
#include "lockstep/model/models.h"

namespace torch::optim {
class Optimizer;
}

namespace lockstep {

class StepChecks;
class Tracer;

using ClassifierDdp = DistributedDataParallel<std::shared_ptr<Classifier>>;

// What one step did on this rank. Loss and hit counts stay tensors on the
// model's device (no host sync per micro-batch).
struct StepStats {
  at::Tensor loss_sum;  // sum over micro-batches of mean loss x rows (double)
  at::Tensor correct;   // classification: hits; undefined for regression
  double samples = 0;
  double lr = 0;  // the learning rate this step used
  double forward_ms = 0, backward_ms = 0, comm_ms = 0, clip_ms = 0, optimizer_ms = 0, check_ms = 0;
  double comm_bytes = 0;  // this rank's payload in the gradient exchange (the comm hook's)
  at::Tensor grad_norm;   // the global gradient norm before clipping (a scalar tensor)
  bool scaling = false;   // a GradScaler runs (fp16)
  double loss_scale = 0;  // its scale after this step
  bool skipped = false;   // the optimizer step was skipped (inf/NaN gradients)
};

struct StepHooks {
  // Runs `forward_and_loss` (one micro-batch) inside, e.g. under autocast.
  std::function<void(const std::function<void()>& forward_and_loss)> around_forward;
  // The loss backward starts from (e.g. multiplied by a loss scale).
  std::function<at::Tensor(const at::Tensor& loss)> scale_loss;
  // After the last micro-batch's backward (the gradients synchronised):
  // e.g. ZeRO-2 releases the gradients this rank does not own.
  std::function<void()> after_backward;
  // The per-parameter norms of the synchronised gradients, the same on
  // every rank (ZeRO-2: gathered from the owners); unset: computed here.
  std::function<at::Tensor()> grad_norms;
  // After the gradients are synchronised, before clipping (e.g. unscale_).
  std::function<void(torch::optim::Optimizer&)> before_clip;
  // Replaces optimizer.step() (e.g. a scaler that skips, a sharded step).
  std::function<void(torch::optim::Optimizer&)> optimizer_step;
  // Last: what the wrappers add to the step's statistics (the loss scale).
  std::function<void(StepStats&)> report;
  // Replace the cross-rank weight check where ranks hold no replicas
  // (optim.zero 3's shard seal, check/shard_seal.h), when check.every > 0:
  // `seal_weights` after every optimizer step (`done`: steps done),
  // `verify_weights` in the next step before the weights change, and
  // before a checkpoint (verify_seal); its report is handled as the
  // check's (the observer, or check.policy).
  std::function<void(int64_t done)> seal_weights;
  std::function<ConsistencyReport(int64_t step)> verify_weights;
};

// The parts of a step: a config's sections, converted once.
struct StepOptions {
  int64_t accumulation_steps = 1;
  double clip_grad_norm = 0;  // 0: no clipping
  double clip_value = 0;      // 0: none; else gradients clamped to [-v, v] first
  // StepStats::grad_norm on every N-th step (the trainer: log.every, the
  // steps it reports; a pass over the gradients is not free); 0: never.
  int64_t grad_norm_every = 1;
  OptimConfig optim;        // the learning-rate schedule
  int64_t total_steps = 1;  // the schedule's length
  CheckConfig check;        // check.every 0: no per-step check
  bool broadcast_buffers = true;
  // The buffers are the same on every rank after a forward (SyncBatchNorm):
  // check.buffers compares them without DDP's broadcast first.
  bool buffers_alike = false;
  // false: every backward runs under no_sync (the check mode's negative
  // control: ranks that never synchronise must be caught).
  bool synchronise = true;
  // Throw TrainingError ("training diverged at step N") on every rank alike
  // when any rank's loss or the gradient norm is not finite, before the
  // optimizer steps (train.stop_on_nonfinite; off under fp16's GradScaler).
  bool stop_on_nonfinite = false;
  // log.sync_timing: on a GPU, wait for the device before each phase's
  // time is taken (StepStats' *_ms are then the device's times).
  bool sync_timing = false;
  // LOCKSTEP_FAULT's grad-flip or act-flip for this job (fault.h).
  std::optional<Fault> fault;
};
StepOptions step_options_from_config(const Config& config, int64_t total_steps);

// A source of micro-batches: the next one, or nullopt when none is left.
using BatchSource = std::function<std::optional<Batch>()>;

class TrainStep {
 public:
  // `model` is the module `ddp` wraps, already on its device (batches are
  // moved there); `loss` maps (output, target) to the mean loss.
  // `classification`: hits are counted.
  TrainStep(ProcessGroup& pg, ClassifierDdp& ddp, Classifier& model,
            torch::optim::Optimizer& optimizer,
            std::function<at::Tensor(const at::Tensor&, const at::Tensor&)> loss,
            bool classification, StepOptions options);
  ~TrainStep();
  TrainStep(const TrainStep&) = delete;
  TrainStep& operator=(const TrainStep&) = delete;

  // Optimizer step number `step` (0-based: `step` steps were done before),
  // over `micro_batches` micro-batches (0: train.accumulation_steps; fewer:
  // an epoch's tail, Note [Epoch tail] in recipe.h), each micro-batch's loss
  // divided by their number. Throws InternalError when `next` runs dry
  // inside the step.
  StepStats run(const BatchSource& next, int64_t step, int64_t micro_batches = 0);

  // Every verdict still owed (before a checkpoint, at the end).
  void finish_checks();
  // The shard seal verified now (collective; a no-op without one): before
  // a checkpoint is written, so that no changed weight is saved.
  void verify_seal(int64_t step);

  // A divergence found by a per-step check is handled by check.policy
  // (abort throws ConsistencyError) unless an observer is set: then every
  // report goes to it, and nothing is enforced (the check mode's table).
  void set_report_observer(std::function<void(const ConsistencyReport&)> observer);
  void set_tracer(std::shared_ptr<Tracer> tracer) { tracer_ = std::move(tracer); }
  // check.grad_screen, check.replay_every (and a grad-flip fault): what
  // must see each local gradient before the exchange (attach it to DDP and
  // fully sharded parameters); nullptr when nothing does.
  std::shared_ptr<LocalGradObserver> local_grad_observer() const;
  // Each finding of the silent-corruption checks, before it stops the job
  // or the step is taken again (the trainer's metrics.jsonl record).
  void set_corruption_observer(std::function<void(const CorruptionFinding&)> observer) {
    corruption_observer_ = std::move(observer);
  }

  // The tensors the per-step check compares: parameters, with check.buffers
  // the buffers, with check.optimizer_state the optimizer's state.
  std::vector<NamedTensor> checked_tensors() const;
  // BatchNorm statistics legitimately differ after a forward in train mode;
  // DDP re-syncs them before the next forward. Compare them as that forward
  // will see them (collective; nothing without check.buffers).
  void sync_buffers_for_check();

  StepHooks hooks;

 private:
  void handle(const std::vector<ConsistencyReport>& reports);
  void phase_end() const;  // log.sync_timing
  void trace(const char* name, std::chrono::steady_clock::time_point start);
  // Note [Diverged training]: throws on every rank alike. `step`: 1-based.
  void micro_batch(Batch& batch, bool synced, int64_t acc, StepStats& stats);
  // Note [Silent corruption]: the step's micro-batches kept, checked, and
  // taken again under check.on_corruption: skip.
  StepStats checked_backward(const BatchSource& next, int64_t step, int64_t acc);
  void recompute(const CorruptionChecks::MicroBatches& batches);
  at::Tensor act_flip_if_due(const at::Tensor& out);
  void clip_gradients(int64_t step, StepStats& stats);
  void maybe_start_check(int64_t done, StepStats& stats);
  void stop_if_diverged(const at::Tensor& loss_sum, const at::Tensor& grad_norm, int64_t step);

  ProcessGroup& pg_;
  ClassifierDdp& ddp_;
  Classifier& model_;
  torch::optim::Optimizer& optimizer_;
  std::function<at::Tensor(const at::Tensor&, const at::Tensor&)> loss_;
  bool classification_;
  StepOptions options_;
  at::Device device_;  // the model's: batches are moved there
  std::unique_ptr<StepChecks> checks_;
  bool sealed_ = false;  // seal_weights ran: verify_weights is due
  std::function<void(const ConsistencyReport&)> observer_;
  std::unique_ptr<CorruptionChecks> corruption_;
  std::function<void(const CorruptionFinding&)> corruption_observer_;
  std::map<int, int> caught_;  // check.on_corruption: skip: findings per rank
  int64_t computing_ = 0;      // the 1-based number of the step being computed
  bool fault_fired_ = false;
  std::shared_ptr<Tracer> tracer_;
};

}  // namespace lockstep
