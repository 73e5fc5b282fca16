#include "run_parts.h"

#include "lockstep/ddp/zero_grad_hook.h"
#include "lockstep/optim/optim.h"
#include "lockstep/train/callbacks.h"
#include "lockstep/util/module_tensors.h"

// Note [One run assembly]
// ~~~~~~~~~~~~~~~~~~~~~~~
// `lockstep check --config` promises to check the run `lockstep train`
// would run. It used to assemble its own: a plain optimizer over
// model->parameters() and the configured comm hook, so with optim.zero it
// checked a run that never happens (no ZeroOptimizer, no reduce-scatter).
// Both now build their parts here, in the order the trainer needs (the
// resume reads the optimizer's state before DDP exists, and the comm
// hook's after), and the check mode's injected faults act on the parts.

namespace lockstep {

void run_build_model(RunParts& run, const Config& config, const WorldInfo& world, ProcessGroup& pg,
                     const TrainData& data) {
  run.model = model_from_config(config, data);
  run.device = device_from_config(config, world, pg.kind());
  run.model->to(run.device);  // before the optimizer and a resume: their state lives there too
  run.precision = std::make_unique<MixedPrecision>(config.train, run.device, &pg);
}

void run_build_optimizer(RunParts& run, const Config& config,
                         const std::shared_ptr<ProcessGroup>& pg) {
  if (config.optim.zero > 0) {
    auto sharded = std::make_unique<ZeroOptimizer>(
        pg, config.optim, trainable_parameters(*run.model), static_cast<int>(config.optim.zero));
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
  run.ddp = std::make_unique<ClassifierDdp>(run.model, pg, ddp);
}

void run_build_step(RunParts& run, const Config& config, ProcessGroup& pg, TaskKind task,
                    StepOptions options) {
  run.step = std::make_unique<TrainStep>(pg, *run.ddp, *run.model, *run.optimizer,
                                         loss_from_config(config.train.loss, task),
                                         task == TaskKind::kClassification, std::move(options));
  run.precision->install(run.step->hooks);
  if (run.zero != nullptr && run.zero->stage() == 2) {
    ZeroOptimizer* zero = run.zero;
    run.step->hooks.after_backward = [zero] { zero->release_unowned_grads(); };
    run.step->hooks.grad_norms = [zero] { return zero->grad_norms(); };
  }
}

}  // namespace lockstep
