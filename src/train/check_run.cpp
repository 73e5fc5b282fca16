#include "lockstep/train/check_run.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/optim/optimizer.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "lockstep/check/comm_check.h"
#include "lockstep/check/fingerprint.h"
#include "lockstep/data/loader.h"
#include "lockstep/data/sampler.h"
#include "lockstep/distributed/agree.h"
#include "lockstep/model/models.h"
#include "lockstep/optim/optim.h"
#include "lockstep/train/callbacks.h"
#include "lockstep/train/precision.h"
#include "lockstep/train/recipe.h"
#include "lockstep/train/step.h"
#include "lockstep/util/error.h"
#include "run_parts.h"

namespace lockstep {
namespace {

struct Phase {
  std::vector<ConsistencyReport> steps;
  int64_t first_divergence = -1;  // step, or -1
  std::string first_message;
  std::string fingerprint;  // the final weights (and buffers), as TrainResult's
  int64_t total_steps = 0;  // the config's: past them lockstep train would stop
  // The first step whose optimizer step ran: with fp16 the GradScaler skips
  // steps with inf/NaN gradients on every rank, and weights that did not
  // move cannot diverge yet.
  int64_t first_stepped = -1;
  int64_t corrupted_at = -1;  // check.grad_screen, check.replay_every: the step, or -1
  std::string corruption;
};

// K steps of training through the trainer's own step (train/step.h), with
// the configured accumulation, clipping and schedule, and a check after
// every step whose every report is kept; `synchronise` false runs every
// backward under no_sync.
Phase run_phase(const Config& base, const WorldInfo& world, const std::shared_ptr<ProcessGroup>& pg,
                const TrainData& data, int64_t steps, bool synchronise,
                const CheckRunOptions& options) {
  const int fault_rank = options.fault_rank >= 0 ? options.fault_rank : world.world_size - 1;
  const bool faulty = synchronise && options.fault != CheckFault::kNone && world.rank == fault_rank;
  Config config = base;
  config.check.every = 1;
  if (faulty && options.fault == CheckFault::kLr) config.optim.lr *= 1.5;
  // Under ZeRO the owners broadcast every parameter after their step, so
  // ranks that never synchronise their gradients still agree on the weights
  // by construction: the negative control checks the unsharded run.
  if (!synchronise) config.optim.zero = 0;
  // Nothing is exchanged without synchronisation: no local gradient to check.
  if (!synchronise) config.check.grad_screen = false, config.check.replay_every = 0;
  const bool corrupt = synchronise && (options.fault == CheckFault::kGradFlip ||
                                       options.fault == CheckFault::kActFlip);
  if (corrupt) config.check.replay_every = 1, config.check.on_corruption = OnCorruption::kStop;
  // Note [One run assembly]: the parts lockstep train builds for this config.
  RunParts run;
  run_build_model(run, config, world, pg, data);
  Classifier& model = *run.model;
  if (options.fault == CheckFault::kNoBufferBroadcast) {
    if (model.buffers().empty()) {
      throw ConfigError(
          "fault no-buffer-broadcast needs a model with buffers "
          "(--set model.name=cnn --set model.batch_norm=true)");
    }
    config.ddp.broadcast_buffers = false;
    config.check.buffers = true;
  }
  run_build_optimizer(run, config, pg);
  run_build_ddp(run, config, pg);
  seed_rank_generator(config, world.rank);
  if (faulty && options.fault == CheckFault::kInit) {
    // A layer re-initialised after wrapping, from an unseeded generator.
    at::NoGradGuard no_grad;
    auto p = model.parameters().front();
    p.copy_(at::randn(p.sizes(), at::detail::createCPUGenerator(
                                     std::chrono::steady_clock::now().time_since_epoch().count())) *
            0.05);  // copy_ moves it to the parameter's device
  }
  auto sampler = sampler_from_config(config, world, data.train->size());
  const StepPlan plan = step_plan(config, sampler, data.train->size());
  StepOptions step_options = step_options_from_config(config, plan.schedule_steps);
  step_options.synchronise = synchronise;
  if (corrupt) {
    Fault fault;
    fault.kind =
        options.fault == CheckFault::kGradFlip ? FaultKind::kGradFlip : FaultKind::kActFlip;
    fault.rank = fault_rank;
    fault.step = 2;
    step_options.fault = fault;
  }
  run_build_step(run, config, *pg, data.task, step_options);
  TrainStep& step = *run.step;
  Phase phase;
  step.set_report_observer([&](const ConsistencyReport& r) { phase.steps.push_back(r); });
  int64_t done = 0;
  try {
    for (int64_t epoch = 0; done < steps; ++epoch) {
      sampler.set_epoch(epoch);
      BatchLoader loader(data.train, sampler.indices(),
                         LoaderOptions{config.data.batch_size, config.data.drop_last, false});
      for (int64_t used = 0; used < plan.micro_per_epoch && done < steps;
           used += config.train.accumulation_steps) {
        const int64_t window =
            std::min(config.train.accumulation_steps, plan.micro_per_epoch - used);
        const StepStats stats = step.run([&] { return loader.next(); }, done++, window);
        if (!stats.skipped && phase.first_stepped < 0) phase.first_stepped = done;
      }
    }
  } catch (const CorruptionError& e) {  // every rank alike: a collective verdict
    phase.corrupted_at = done;
    phase.corruption = e.what();
  }
  step.finish_checks();
  std::sort(phase.steps.begin(), phase.steps.end(),
            [](const auto& a, const auto& b) { return a.step < b.step; });
  for (const auto& report : phase.steps) {
    if (!report.consistent) {
      phase.first_divergence = report.step;
      phase.first_message = report.message;
      break;
    }
  }
  phase.total_steps = plan.total_steps;
  phase.fingerprint =
      hex_of(fingerprint_digest(fingerprint_tensors(model, true), DigestMode::kXxh3));
  return phase;
}

std::string verdict(bool ok) {
  return ok ? "PASS" : "FAIL";
}

}  // namespace

CheckRunResult check_run(const Config& asked, const WorldInfo& world,
                         const std::shared_ptr<ProcessGroup>& pg, const CheckRunOptions& options) {
  // Every rank reaches the verdict together (a rank leaving alone would tear
  // down what a slower peer may still be joining: Trainer's constructor).
  agree_on_failure(*pg, [&] {
    config_validate(asked, world.world_size);  // as the Trainer does: the same rules
    if (options.steps < 1) throw ConfigError("--steps must be >= 1");
    if (asked.optim.zero == 3) {
      throw ConfigError(
          "lockstep check --config compares the ranks' weights, but optim.zero: 3 keeps each "
          "weight on one rank only (no replica to compare; its training runs guard each shard "
          "with a seal instead, docs/zero.md): check this config with --set optim.zero=2, which "
          "runs the same optimizer and gradient exchange");
    }
    if (options.fault_rank >= world.world_size) {
      throw ConfigError("--fault-rank " + std::to_string(options.fault_rank) + " is outside [0, " +
                        std::to_string(world.world_size) + ")");
    }
  });
  Config config = asked;  // train.precision: auto resolved as lockstep train would
  resolve_precision(config, device_from_config(config, world, pg->kind()), *pg);
  // (a)
  CommCheckOptions comm;
  comm.sizes = {1, 1001, 65536};
  const auto comm_report = comm_check_run(*pg, comm);
  // (b) and (c)
  const auto data = data_from_config(config);
  validate_data(config, data);  // as the Trainer does, every rank alike (same data)
  const Phase healthy = run_phase(config, world, pg, data, options.steps, true, options);
  const Phase control = run_phase(config, world, pg, data, options.steps, false, options);

  const bool single = world.world_size == 1;
  const bool a_ok = comm_report.passed();
  const bool b_ok = healthy.first_divergence < 0 && healthy.corrupted_at < 0;
  // Caught at the first step the optimizer took (step 1 unless fp16's
  // scaler skipped the first ones).
  const bool c_ok =
      single || (control.first_stepped > 0 && control.first_divergence == control.first_stepped);

  std::string out;
  char line[512];
  std::snprintf(
      line, sizeof line,
      "consistency check: model %s, data %s, %d rank(s), %lld steps, digest %s%s\n",
      config.model.name.c_str(), name_of(kDatasetKindNames, config.data.name), world.world_size,
      static_cast<long long>(options.steps), digest_mode_name(config.check.mode),
      options.fault == CheckFault::kNone
          ? ""
          : (std::string(", fault '") + name_of(kCheckFaultNames, options.fault) + "' injected")
                .c_str());
  out += line;
  // What the run is made of (Note [One run assembly]): as lockstep train.
  std::snprintf(
      line, sizeof line, "run: optim %s, optim.zero %lld%s, precision %s, accumulation %lld\n",
      name_of(kOptimizerKindNames, config.optim.name), static_cast<long long>(config.optim.zero),
      config.optim.zero > 0 ? " (the negative control unsharded: owners' broadcasts "
                              "would make unsynchronised ranks agree)"
                            : "",
      name_of(kPrecisionNames, config.train.precision),
      static_cast<long long>(config.train.accumulation_steps));
  out += line;
  out += "\n(b) weights digest per rank after each synchronised step:\nstep";
  for (int r = 0; r < world.world_size; ++r) {
    std::snprintf(line, sizeof line, "  %-16s", ("rank " + std::to_string(r)).c_str());
    out += line;
  }
  out += "  verdict\n";
  for (const auto& s : healthy.steps) {
    std::snprintf(line, sizeof line, "%4lld", static_cast<long long>(s.step));
    out += line;
    for (const auto& d : s.rank_digests_hex) {
      std::snprintf(line, sizeof line, "  %-16s", d.substr(0, 16).c_str());
      out += line;
    }
    out += s.consistent ? "  same\n" : "  DIFFERENT\n";
  }
  out += "\nsummary:\n";
  std::snprintf(line, sizeof line, "(a) communication self-check       %s (%zu cases)\n",
                verdict(a_ok).c_str(), comm_report.cases.size());
  out += line;
  std::snprintf(line, sizeof line, "(b) DDP training, %lld steps        %s",
                static_cast<long long>(options.steps), verdict(b_ok).c_str());
  out += line;
  out += b_ok                        ? " (identical after every step)\n"
         : healthy.corrupted_at >= 0 ? ": silent data corruption: " + healthy.corruption + "\n"
                                     : ": " + healthy.first_message + "\n";
  std::string control_text;
  if (single) {
    control_text = "n/a (one rank cannot diverge)";
  } else if (c_ok) {
    control_text = "PASS (divergence caught at step " + std::to_string(control.first_divergence) +
                   (control.first_stepped > 1 ? ", the first the GradScaler did not skip" : "") +
                   ": " + control.first_message + ")";
  } else if (control.first_stepped < 0) {
    control_text =
        "FAIL (the GradScaler skipped every step: inf/NaN gradients at every loss scale, so "
        "nothing could diverge; more --steps or a lower train.loss_scale)";
  } else if (control.first_divergence < 0) {
    control_text = "FAIL (training without synchronisation was never caught)";
  } else {
    control_text = "FAIL (caught only at step " + std::to_string(control.first_divergence) + ")";
  }
  out += "(c) negative control, no sync      " + control_text + "\n";
  out += "(b)'s final weights " + healthy.fingerprint +
         (options.steps <= healthy.total_steps
              ? " (as lockstep train with train.max_steps=" + std::to_string(options.steps) + ")\n"
              : " (past the config's " + std::to_string(healthy.total_steps) +
                    " steps, where lockstep train would stop)\n");
  CheckRunResult result;
  result.passed = a_ok && b_ok && c_ok;
  result.fingerprint = healthy.fingerprint;
  out += std::string("result: ") + (result.passed ? "PASS" : "FAIL") + "\n";
  result.summary = out;
  return result;
}

}  // namespace lockstep
