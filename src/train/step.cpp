#include "lockstep/train/step.h"

#include <ATen/ATen.h>
#include <torch/cuda.h>
#include <torch/optim/optimizer.h>

#include <spdlog/spdlog.h>

#include <ATen/CPUGeneratorImpl.h>

#include <chrono>
#include <mutex>

#include "lockstep/check/step_checks.h"
#include "lockstep/distributed/agree.h"
#include "lockstep/distributed/coalesced.h"
#include "lockstep/optim/grad_norms.h"
#include "lockstep/optim/optim.h"
#include "lockstep/util/error.h"
#include "lockstep/util/module_tensors.h"
#include "lockstep/util/text.h"
#include "lockstep/util/trace.h"
#include "lockstep/util/unit_call.h"

namespace lockstep {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

at::Tensor add_to(const at::Tensor& sum, const at::Tensor& value) {
  return sum.defined() ? sum + value : value;
}

}  // namespace

StepOptions step_options_from_config(const Config& config, int64_t total_steps) {
  StepOptions options;
  options.accumulation_steps = config.train.accumulation_steps;
  options.clip_grad_norm = config.train.clip_grad_norm;
  options.clip_value = config.train.clip_value;
  options.grad_norm_every = config.log.every;
  options.optim = config.optim;
  options.total_steps = total_steps;
  options.check = config.check;
  options.broadcast_buffers = config.ddp.broadcast_buffers;
  // Synchronised statistics are every rank's alike after each forward: the
  // per-step check compares them as they are, unless check.buffers was set
  // false (under ZeRO-3 each rank's weights are its own shards: no check of
  // buffers there).
  if (config.model.sync_batchnorm && config.optim.zero != 3) {
    if (config.origin.count("check.buffers") == 0) options.check.buffers = true;
    options.buffers_alike = true;
  }
  options.stop_on_nonfinite =
      config.train.stop_on_nonfinite && config.train.precision != Precision::kFp16;
  options.sync_timing = config.log.sync_timing;
  return options;
}

TrainStep::TrainStep(ProcessGroup& pg, ClassifierDdp& ddp, Classifier& model,
                     torch::optim::Optimizer& optimizer,
                     std::function<at::Tensor(const at::Tensor&, const at::Tensor&)> loss,
                     bool classification, StepOptions options)
    : pg_(pg),
      ddp_(ddp),
      model_(model),
      optimizer_(optimizer),
      loss_(std::move(loss)),
      classification_(classification),
      options_(std::move(options)),
      device_(model.parameters().empty() ? at::Device(at::kCPU)
                                         : model.parameters().front().device()) {
  if (options_.accumulation_steps < 1) {
    throw ConfigError("train.accumulation_steps=" + std::to_string(options_.accumulation_steps) +
                      " must be >= 1");
  }
  const auto& fault = options_.fault;
  const bool grad_flip = fault && fault->kind == FaultKind::kGradFlip && fault->rank == pg_.rank();
  if (!options_.check.grad_screen && options_.check.replay_every == 0 && !grad_flip) return;
  CorruptionOptions corruption;
  corruption.screen = options_.check.grad_screen;
  corruption.replay_every = options_.check.replay_every;
  std::vector<at::Tensor> buffers;
  for (const auto& b : model_.buffers()) buffers.push_back(b);
  const at::Generator generator = device_.is_cuda() ? at::globalContext().defaultGenerator(device_)
                                                    : at::detail::getDefaultCPUGenerator();
  corruption_ = std::make_unique<CorruptionChecks>(pg_, trainable_parameters(model_),
                                                   std::move(buffers), generator, corruption);
  if (!grad_flip) return;
  corruption_->set_injector([this](size_t, const at::Tensor& grad) {
    if (fault_fired_ || computing_ != options_.fault->step) return;
    fault_fired_ = true;
    flip_one_element(grad, options_.fault->bit);
    spdlog::warn("LOCKSTEP_FAULT: flipped a bit of a local gradient on rank {} in step {}",
                 pg_.rank(), computing_);
  });
}

std::shared_ptr<LocalGradObserver> TrainStep::local_grad_observer() const {
  return corruption_ ? corruption_->observer() : nullptr;
}

TrainStep::~TrainStep() {
  // The observer may outlive the step (DDP holds it): not its injector.
  if (corruption_) corruption_->set_injector(nullptr);
}

void TrainStep::set_report_observer(std::function<void(const ConsistencyReport&)> observer) {
  observer_ = std::move(observer);
}

// log.sync_timing: a GPU runs the kernels a phase launched after the host
// has moved on; waiting for them makes the phase's time the device's.
void TrainStep::phase_end() const {
  if (options_.sync_timing && device_.is_cuda()) torch::cuda::synchronize(device_.index());
}

void TrainStep::trace(const char* name, Clock::time_point start) {
  if (tracer_) tracer_->complete(name, "step", start, Clock::now());
}

std::vector<NamedTensor> TrainStep::checked_tensors() const {
  auto tensors = fingerprint_tensors(model_, options_.check.buffers);
  if (options_.check.optimizer_state) {
    for (auto& t : optimizer_state_tensors(optimizer_, module_tensors(model_, false)))
      tensors.push_back(std::move(t));
  }
  return tensors;
}

void TrainStep::sync_buffers_for_check() {
  if (!options_.check.buffers || !options_.broadcast_buffers || options_.buffers_alike) return;
  std::vector<at::Tensor> buffers;
  for (const auto& b : model_.buffers()) buffers.push_back(b);
  broadcast_coalesced(pg_, buffers, 0);
}

void TrainStep::handle(const std::vector<ConsistencyReport>& reports) {
  for (const auto& report : reports) {
    if (observer_) {
      observer_(report);
      continue;
    }
    if (report.consistent) continue;  // the per-step path: nothing more to build
    spdlog::error("step {}: {}", report.step, report.message);
    fingerprint_enforce(pg_, report, options_.check.policy, checked_tensors());
    if (options_.check.policy == CheckPolicy::kResync) {
      // Checks still in flight saw the weights before the resync: their
      // verdicts are known already (a collective: every rank drops them).
      checks_->drain();
      return;
    }
  }
}

void TrainStep::verify_seal(int64_t step) {
  if (!hooks.verify_weights || !sealed_) return;
  const ConsistencyReport report = hooks.verify_weights(step);
  if (report.consistent) return;
  spdlog::error("checkpoint: {}", report.message);
  throw ConsistencyError(report.message);  // nothing of this state is saved
}

void TrainStep::finish_checks() {
  if (checks_) handle(checks_->drain());
}

// Note [Diverged training]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// A NaN or inf loss trains on silently in fp32 and bf16: every later step
// reads nan, every checkpoint holds NaN weights and checkpoint.keep pushes
// the good ones out. So each step, before the optimizer, every rank looks
// at its own loss and at the global gradient norm (synchronised: the same
// on every rank), and one small MAX all-reduce makes the verdict the same
// everywhere: every rank throws TrainingError at the same step, before the
// weights change, and no checkpoint of that state is written. The norm is
// the one clipping uses; computing it every step is a pass over the
// gradients, a few per cent of a step for the models here. fp16 is exempt:
// its GradScaler skips such steps and lowers the scale instead.
void TrainStep::stop_if_diverged(const at::Tensor& loss_sum, const at::Tensor& grad_norm,
                                 int64_t step) {
  const bool loss_bad = loss_sum.defined() && !loss_sum.isfinite().item<bool>();
  const bool norm_bad = grad_norm.defined() && !grad_norm.isfinite().item<bool>();
  const int world = pg_.size();
  // [any rank's loss, the norm, world - (lowest rank with a bad loss)]
  std::vector<double> flags{loss_bad ? 1.0 : 0.0, norm_bad ? 1.0 : 0.0,
                            loss_bad ? static_cast<double>(world - pg_.rank()) : 0.0};
  if (world > 1) flags = max_over_ranks(pg_, flags);
  if (flags[0] == 0 && flags[1] == 0) return;
  std::string what;
  if (flags[0] != 0) {
    const int first = world - static_cast<int>(flags[2]);
    what =
        "the loss is " +
        (first == pg_.rank() ? number_text(loss_sum.item<double>()) : std::string("not finite")) +
        " on rank " + std::to_string(first);
  }
  if (flags[1] != 0) {
    what +=
        std::string(what.empty() ? "" : " and ") + "the gradient norm is " +
        (grad_norm.defined() ? number_text(grad_norm.item<double>()) : std::string("not finite"));
  }
  throw TrainingError("training diverged at step " + std::to_string(step) + ": " + what +
                      "; stopped before the optimizer step, and no checkpoint of this state is "
                      "written (lower optim.lr, clip gradients with train.clip_grad_norm, or "
                      "resume from the last checkpoint; train.stop_on_nonfinite: false trains on)");
}

// One micro-batch: forward and loss (the precision's hook around them),
// backward of loss / acc; the last one of a step (`synced`) waits for DDP's
// exchange, whose wait is counted as communication, not backward.
void TrainStep::micro_batch(Batch& batch, bool synced, int64_t acc, StepStats& stats) {
  // Batches come from the host; the model may live on a GPU.
  batch.x = batch.x.to(device_, /*non_blocking=*/true);
  batch.y = batch.y.to(device_, /*non_blocking=*/true);
  std::optional<DdpCore::NoSyncGuard> guard;
  if (!synced) guard.emplace(ddp_);
  phase_end();  // the batch's copy to the device is not the forward's
  auto t = Clock::now();
  at::Tensor out, loss;
  const auto forward_and_loss = [&] {
    out = act_flip_if_due(ddp_.forward(batch.x));
    loss = loss_(out, batch.y);
  };
  if (hooks.around_forward) {
    hooks.around_forward(forward_and_loss);
  } else {
    forward_and_loss();
  }
  phase_end();
  stats.forward_ms += ms_since(t);
  trace("forward", t);
  t = Clock::now();
  const at::Tensor start = hooks.scale_loss ? hooks.scale_loss(loss) : loss;
  (start / static_cast<double>(acc)).backward();
  phase_end();
  trace(synced ? "backward" : "backward (no_sync)", t);
  double wait = 0;
  if (synced && ddp_.reducer() != nullptr) {
    const auto reduced = ddp_.reducer()->last_stats();
    wait = reduced.wait_ms;
    stats.comm_bytes += static_cast<double>(reduced.bytes);
  }
  stats.backward_ms += ms_since(t) - wait;
  stats.comm_ms += wait;
  const double rows = static_cast<double>(batch.x.size(0));
  stats.loss_sum = add_to(stats.loss_sum, loss.detach().to(at::kDouble) * rows);
  stats.samples += rows;
  if (classification_) {
    stats.correct =
        add_to(stats.correct, (out.detach().argmax(1) == batch.y).sum().to(at::kDouble));
  }
}

// The learning rate of this step, then the gradients' norms (reported
// every options_.grad_norm_every steps), the divergence stop, and clipping.
void TrainStep::clip_gradients(int64_t step, StepStats& stats) {
  if (hooks.before_clip) hooks.before_clip(optimizer_);
  stats.lr = lr_at(options_.optim, step, options_.total_steps);
  optimizer_set_lr(optimizer_, stats.lr);
  // After synchronisation (and unscaling): every rank measures and clips
  // the same averaged gradients. The norm stays a tensor: no host sync here.
  // The arithmetic is torch::nn::utils::clip_grad_norm_'s, step for step
  // (each gradient's 2-norm, the 2-norm of those), so that a sharded
  // optimizer that gathers the norms from their owners clips alike.
  const bool report_norm =
      options_.grad_norm_every > 0 && (step + 1) % options_.grad_norm_every == 0;
  // The gradients present (clamped in place below, so gathered once); on a
  // GPU measured and scaled by multi-tensor kernels: Note [Clipping's kernels].
  std::vector<at::Tensor> grads;
  for (const auto& p : model_.parameters())
    if (p.grad().defined()) grads.push_back(p.grad().detach());
  const auto norms_now = [&] {
    if (hooks.grad_norms) return hooks.grad_norms();
    const auto each = tensor_norms(grads);
    return each.empty() ? at::Tensor() : at::stack(each);
  };
  const auto total_of = [](const at::Tensor& norms) {
    return norms.numel() == 1 ? norms[0] : norms.norm(2);
  };
  at::Tensor norms;  // before any clipping: what is reported
  if (report_norm || (options_.clip_grad_norm > 0 && options_.clip_value <= 0)) {
    norms = norms_now();
    if (report_norm && norms.defined()) stats.grad_norm = total_of(norms).to(at::kFloat);
  }
  if (options_.stop_on_nonfinite) {
    if (!norms.defined()) norms = norms_now();
    stop_if_diverged(stats.loss_sum, norms.defined() ? total_of(norms) : at::Tensor(), step + 1);
  }
  if (options_.clip_value > 0) {
    for (const auto& g : grads) g.clamp_(-options_.clip_value, options_.clip_value);
    norms = at::Tensor();
  }
  if (options_.clip_grad_norm > 0) {
    if (!norms.defined()) norms = norms_now();
    if (norms.defined()) {
      const auto clip_coef = options_.clip_grad_norm / (total_of(norms) + 1e-6);
      scale_tensors(grads, at::clamp(clip_coef, c10::nullopt, 1.0));
    }
  }
}

// Every options_.check.every steps: the weights' cross-rank check started
// (its verdict taken before a later update: StepChecks).
void TrainStep::maybe_start_check(int64_t done, StepStats& stats) {
  auto t = Clock::now();
  if (options_.check.every > 0 && hooks.seal_weights) {
    // Every step, whatever check.every: a seal taken only every N steps
    // would absorb what changed between a verification and the next seal.
    hooks.seal_weights(done);
    sealed_ = true;
    stats.check_ms += ms_since(t);
    trace("weight seal", t);
    return;
  }
  if (options_.check.every > 0 && done % options_.check.every == 0) {
    sync_buffers_for_check();
    if (!checks_) {
      checks_ = std::make_unique<StepChecks>(pg_, options_.check.mode,
                                             check_hashing_for(options_.check.buffers));
    }
    checks_->start(checked_tensors(), done);
    stats.check_ms += ms_since(t);
    trace("consistency check", t);
  }
}

StepStats TrainStep::run(const BatchSource& next, int64_t step, int64_t micro_batches) {
  StepStats stats;
  if (micro_batches < 0 || micro_batches > options_.accumulation_steps)
    throw InternalError("TrainStep::run: " + std::to_string(micro_batches) +
                        " micro-batches, outside [0, " +
                        std::to_string(options_.accumulation_steps) + "]");
  const int64_t acc = micro_batches > 0 ? micro_batches : options_.accumulation_steps;
  optimizer_.zero_grad();
  computing_ = step + 1;
  if (corruption_) stats = checked_backward(next, step, acc);
  for (int64_t m = 0; m < acc && !corruption_; ++m) {
    auto batch = next();
    if (!batch) {
      throw InternalError("the batches ran out in step " + std::to_string(step + 1) +
                          " at micro-batch " + std::to_string(m + 1) + " of " +
                          std::to_string(acc));
    }
    micro_batch(*batch, options_.synchronise && m == acc - 1, acc, stats);
  }
  if (hooks.after_backward) hooks.after_backward();
  auto t = Clock::now();
  if (checks_) handle(checks_->before_update());  // before the weights change
  if (hooks.verify_weights && sealed_) {
    sealed_ = false;
    handle({hooks.verify_weights(step + 1)});
  }
  stats.check_ms += ms_since(t);

  t = Clock::now();
  clip_gradients(step, stats);
  phase_end();
  stats.clip_ms += ms_since(t);
  trace("clipping", t);
  t = Clock::now();
  if (hooks.optimizer_step) {
    hooks.optimizer_step(optimizer_);
  } else {
    optimizer_.step();
  }
  phase_end();
  stats.optimizer_ms += ms_since(t);
  trace("optimizer step", t);

  const int64_t done = step + 1;
  maybe_start_check(done, stats);
  if (hooks.report) hooks.report(stats);
  return stats;
}

at::Tensor TrainStep::act_flip_if_due(const at::Tensor& out) {
  const auto& fault = options_.fault;
  if (!fault || fault->kind != FaultKind::kActFlip || fault->rank != pg_.rank() ||
      fault->step != computing_ || fault_fired_)
    return out;
  fault_fired_ = true;
  at::Tensor changed = out.detach().clone();
  flip_one_element(changed, fault->bit);
  spdlog::warn("LOCKSTEP_FAULT: flipped a bit of an activation on rank {} in step {}", pg_.rank(),
               computing_);
  return out + (changed - out.detach());  // the gradient flows through `out` as before
}

// Note [Silent corruption] (check/corruption.cpp): the step's micro-batches
// are fetched first and kept with the generator's state, so that a replay
// recomputes them and check.on_corruption: skip takes the step again from
// the same batches and dropout masks (the run then ends as one without the
// fault would). A rank caught twice is faulty: the job stops.
StepStats TrainStep::checked_backward(const BatchSource& next, int64_t step, int64_t acc) {
  std::vector<Batch> batches;
  CorruptionChecks::MicroBatches pairs;
  for (int64_t m = 0; m < acc; ++m) {
    auto batch = next();
    if (!batch)
      throw InternalError("the batches ran out in step " + std::to_string(step + 1) +
                          " at micro-batch " + std::to_string(m + 1) + " of " +
                          std::to_string(acc));
    pairs.emplace_back(batch->x, batch->y);
    batches.push_back(std::move(*batch));
  }
  at::Generator generator = device_.is_cuda() ? at::globalContext().defaultGenerator(device_)
                                              : at::detail::getDefaultCPUGenerator();
  at::Tensor rng;
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    rng = generator.get_state();
  }
  std::vector<at::Tensor> buffers, kept;  // BatchNorm's statistics, for a retake
  if (options_.check.on_corruption == OnCorruption::kSkip) {
    for (const auto& b : model_.buffers()) {
      buffers.push_back(b);
      kept.push_back(b.clone());
    }
  }
  for (;;) {
    StepStats stats;
    corruption_->begin_step(step + 1, hooks.scale_loss != nullptr);
    for (int64_t m = 0; m < acc; ++m) {
      Batch batch = batches[m];
      micro_batch(batch, options_.synchronise && m == acc - 1, acc, stats);
    }
    const CorruptionFinding found =
        corruption_->verdict(pairs, rng, stats.loss_sum, [this](const auto& mb) { recompute(mb); });
    if (found.rank < 0) return stats;
    if (corruption_observer_) corruption_observer_(found);
    const bool skip = options_.check.on_corruption == OnCorruption::kSkip;
    if (!skip || ++caught_[found.rank] > 1)
      throw CorruptionError(found.message() + (skip ? "; caught a second time, so the job "
                                                      "stops (check.on_corruption: skip)"
                                                    : ""));
    spdlog::warn(
        "silent data corruption: {}; no weight changed: the step is taken again "
        "(check.on_corruption: skip)",
        found.message());
    {
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(rng);
    }
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < buffers.size(); ++i) buffers[i].copy_(kept[i]);
    optimizer_.zero_grad();
  }
}

// A replay (Note [Silent corruption]): the micro-batches' forward and
// backward as micro_batch runs them, without the exchange.
void TrainStep::recompute(const CorruptionChecks::MicroBatches& batches) {
  auto unseen = ddp_.unseen();
  const double acc = static_cast<double>(batches.size());
  for (const auto& [x, y] : batches) {
    at::Tensor loss;
    const auto forward_and_loss = [&, x = x.to(device_), y = y.to(device_)] {
      // Through call_unit, as the module's forward runs under DDP, so that
      // fully sharded units know the backward that follows (unsynchronised).
      loss = loss_(call_unit(model_, [&] { return model_.forward(x); }), y);
    };
    if (hooks.around_forward) {
      hooks.around_forward(forward_and_loss);
    } else {
      forward_and_loss();
    }
    ((hooks.scale_loss ? hooks.scale_loss(loss) : loss) / acc).backward();
  }
}

}  // namespace lockstep
