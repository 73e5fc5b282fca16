#include "run_parts.h"

#include <ATen/Context.h>
#include <spdlog/spdlog.h>

#include <cstdlib>

#include "lockstep/ddp/batch_stats_exchange.h"
#include "lockstep/model/sync_batchnorm.h"
#include "lockstep/optim/optim.h"
#include "lockstep/train/callbacks.h"
#include "lockstep/util/module_tensors.h"
#include "lockstep/zero/shard_seal.h"
#include "lockstep/zero/zero_grad_hook.h"

// Note [One run assembly]
// ~~~~~~~~~~~~~~~~~~~~~~~
// `lockstep check --config` promises to check the run `lockstep train`
// would run. An assembly of its own (a plain optimizer over
// model->parameters() and the configured comm hook) would, with
// optim.zero, check a run that never happens (no ZeroOptimizer, no
// reduce-scatter). Both build their parts here, in the order the trainer
// needs (the resume reads the optimizer's state before DDP exists, and the
// comm hook's after), and the check mode's injected faults act on the
// parts.

namespace lockstep {
namespace {

// Note [Deterministic kernels for the replay]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// check.replay_every recomputes a rank's local gradient and compares its
// bits (Note [Silent corruption]). On a GPU several of ATen's kernels give
// other bits from run to run unless asked for their deterministic versions:
// the memory-efficient attention's backward (split keys summed with
// atomics), scatters with atomics, cuBLAS with more than one workspace. So
// a run that replays on a GPU asks for them, as torch.use_deterministic_
// algorithms(True, warn_only=True) and CUBLAS_WORKSPACE_CONFIG=:4096:8 do
// in Python (a value the user set is kept): a kernel that has no
// deterministic version warns once instead of failing the run. Set before
// the model reaches the device (with one stream cuBLAS is deterministic
// whatever its workspace; ATen's determinism check reads the variable).
void deterministic_kernels_for_replay(const Config& config, const at::Device& device) {
  if (config.check.replay_every <= 0 || !device.is_cuda()) return;
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
  spdlog::info(
      "check.replay_every on {}: ATen's deterministic kernels (the replay compares bits; "
      "CUBLAS_WORKSPACE_CONFIG={})",
      device.str(), std::getenv("CUBLAS_WORKSPACE_CONFIG"));
}

}  // namespace

void run_build_model(RunParts& run, const Config& config, const WorldInfo& world,
                     const std::shared_ptr<ProcessGroup>& pg, const TrainData& data) {
  run.model = model_from_config(config, data);
  // Before the optimizer: a converted layer's parameters are new tensors.
  if (config.model.sync_batchnorm) {
    convert_sync_batchnorm(run.model, batch_stats_exchange(pg));
    if (count_sync_batchnorm(*run.model) == 0)
      throw ConfigError("model.sync_batchnorm: true" +
                        config_origin(config, "model.sync_batchnorm") + ", but model.name " +
                        config.model.name +
                        " has no batch normalisation to synchronise (cnn needs model.batch_norm: "
                        "true; resnet has it)");
  }
  run.device = device_from_config(config, world, pg->kind());
  deterministic_kernels_for_replay(config, run.device);
  run.model->to(run.device);  // before the optimizer and a resume: their state lives there too
  run.precision = std::make_unique<MixedPrecision>(config.train, run.device, pg.get());
}

void run_build_optimizer(RunParts& run, const Config& config,
                         const std::shared_ptr<ProcessGroup>& pg) {
  if (config.optim.zero > 0) {
    // Stage 3: owners balanced within each unit (its gathers are padded to
    // the largest owner's share).
    std::vector<int> owners;
    if (config.optim.zero == 3)
      owners = fully_shard_partition(*run.model, run.model->sharding_units(), pg->size());
    auto sharded =
        std::make_unique<ZeroOptimizer>(pg, config.optim, trainable_parameters(*run.model),
                                        static_cast<int>(config.optim.zero), owners);
    run.zero = sharded.get();
    run.optimizer = std::move(sharded);
  } else {
    run.optimizer = optimizer_create(config.optim, run.model->parameters());
  }
}

void run_build_ddp(RunParts& run, const Config& config, const std::shared_ptr<ProcessGroup>& pg) {
  DdpOptions ddp = ddp_options_from_config(config.ddp);
  run.comm_hook = ddp.comm_hook;
  if (run.zero != nullptr && run.zero->stage() == 2)
    ddp.comm_hook = zero_grad_hook(run.zero->owners(), pg->rank());
  const bool fully_sharded = run.zero != nullptr && run.zero->stage() == 3;
  if (fully_sharded) ddp.reduce_gradients = false;
  run.ddp = std::make_unique<ClassifierDdp>(run.model, pg, ddp);
  if (fully_sharded) {
    // After DDP's broadcast: every rank starts from rank 0's weights.
    run.sharded = fully_shard(*run.model, pg, run.zero->owners(), run.model->sharding_units(), {});
    ClassifierDdp* core = run.ddp.get();
    run.sharded->set_gradient_sync([core] { return core->gradients_synchronised(); });
  }
}

void with_whole_weights(RunParts& run, const std::function<void()>& fn) {
  if (!run.sharded) return fn();
  run.sharded->unshard_all();
  try {
    fn();
  } catch (...) {
    run.sharded->reshard_all();
    throw;
  }
  run.sharded->reshard_all();
}

// Note [What each option plugs into the step]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The one place a TrainStep's hooks are set: each option, the hooks it
// sets, and why (train/step.h's pseudocode shows where each runs).
void plug_step_hooks(RunParts& run, const Config& config, ProcessGroup& pg) {
  StepHooks& hooks = run.step->hooks;
  MixedPrecision* precision = run.precision.get();
  // train.precision bf16 or fp16: each micro-batch's forward and loss under
  // autocast (backward follows the graph's dtypes, as in PyTorch).
  if (precision->precision() != Precision::kFp32)
    hooks.around_forward = [precision](const std::function<void()>& f) { precision->run(f); };
  // train.precision fp16: the GradScaler scales the loss, unscales the
  // synchronised gradients before clipping (the norm is the true
  // gradient's), steps unless a gradient is inf/NaN, updates its scale, and
  // reports it.
  if (amp::GradScaler* scaler = precision->scaler()) {
    hooks.scale_loss = [scaler](const at::Tensor& loss) { return scaler->scale(loss); };
    hooks.before_clip = [scaler](torch::optim::Optimizer& optimizer) {
      scaler->unscale_(optimizer);
    };
    hooks.optimizer_step = [scaler](torch::optim::Optimizer& optimizer) {
      scaler->step(optimizer);
      scaler->update();
    };
    hooks.report = [precision](StepStats& stats) { precision->report(stats); };
  }
  if (run.zero != nullptr && run.zero->stage() >= 2) {
    ZeroOptimizer* zero = run.zero;
    // optim.zero 2: the gradients this rank does not own are dropped after
    // the exchange (stage 3 drops them as each unit is reduced).
    if (zero->stage() == 2) hooks.after_backward = [zero] { zero->release_unowned_grads(); };
    // optim.zero 2 and 3: no rank holds every gradient; the norm is
    // gathered from the owners.
    hooks.grad_norms = [zero] { return zero->grad_norms(); };
  }
  // check.grad_screen, check.replay_every (and a grad-flip fault): each
  // local gradient is seen before the exchange, by DDP's Reducer or, under
  // optim.zero 3, by each unit's reduce-scatter (Note [Silent corruption]).
  if (const auto observer = run.step->local_grad_observer()) {
    run.ddp->set_local_grad_observer(observer);
    if (run.sharded) run.sharded->set_local_grad_observer(observer);
  }
  // optim.zero 3 with check.every: no replicas to compare; each owner seals
  // its weights after the step and verifies them in the next (zero/shard_seal.h).
  if (run.sharded && config.check.every > 0) {
    const NamedTensors params = trainable_parameters(*run.model);
    std::vector<std::string> names;
    std::vector<std::pair<size_t, at::Tensor>> mine;
    for (size_t i = 0; i < params.size(); ++i) {
      names.push_back(params[i].first);
      if (run.zero->owns(i)) mine.emplace_back(i, params[i].second);
    }
    auto seal = std::make_shared<ShardSeal>(pg, names, run.zero->owners(), DigestMode::kXxh3);
    hooks.seal_weights = [seal, mine](int64_t done) { seal->seal(mine, done); };
    hooks.verify_weights = [seal, mine](int64_t step) { return seal->verify(mine, step); };
  }
}

void run_build_step(RunParts& run, const Config& config, ProcessGroup& pg, TaskKind task,
                    StepOptions options) {
  run.step = std::make_unique<TrainStep>(pg, *run.ddp, *run.model, *run.optimizer,
                                         loss_from_config(config.train.loss, task),
                                         task == TaskKind::kClassification, std::move(options));
  plug_step_hooks(run, config, pg);
}

}  // namespace lockstep
