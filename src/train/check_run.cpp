#include "lockstep/train/check_run.h"

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <optional>

#include "lockstep/check/comm_check.h"
#include "lockstep/check/fingerprint.h"
#include "lockstep/data/loader.h"
#include "lockstep/data/sampler.h"
#include "lockstep/train/models.h"
#include "lockstep/train/optim.h"
#include "lockstep/train/recipe.h"
#include "lockstep/util/error.h"

namespace lockstep {
namespace {

struct Phase {
  std::vector<ConsistencyReport> steps;
  int64_t first_divergence = -1;  // step, or -1
  std::string first_message;
};

// K steps of training; `synchronise` false runs every backward under
// no_sync. Returns every rank's digest after every step.
Phase run_phase(const Config& config, const WorldInfo& world,
                const std::shared_ptr<ProcessGroup>& pg, const DatasetSplit& data, int64_t steps,
                bool synchronise, const CheckRunOptions& options) {
  const int fault_rank = options.fault_rank >= 0 ? options.fault_rank : world.world_size - 1;
  const bool faulty = synchronise && !options.fault.empty() && world.rank == fault_rank;
  auto model = model_from_config(config, data.train);
  DdpOptions ddp_options = ddp_options_from_config(config.ddp);
  const bool with_buffers = config.check.buffers || options.fault == "no-buffer-broadcast";
  if (options.fault == "no-buffer-broadcast") {
    if (model->buffers().empty()) {
      throw ConfigError(
          "fault no-buffer-broadcast needs a model with buffers "
          "(--set model.name=cnn --set model.batch_norm=true)");
    }
    ddp_options.broadcast_buffers = false;
  }
  DistributedDataParallel<std::shared_ptr<Classifier>> ddp(model, pg, ddp_options);
  seed_rank_generator(config, world.rank);
  if (faulty && options.fault == "init") {
    // A layer re-initialised after wrapping, from an unseeded generator.
    at::NoGradGuard no_grad;
    auto p = model->parameters().front();
    p.copy_(at::randn(p.sizes(), at::detail::createCPUGenerator(
                                     std::chrono::steady_clock::now().time_since_epoch().count())) *
            0.05);
  }
  auto optimizer = optimizer_create(config.optim, model->parameters());
  const double lr = config.optim.lr * (faulty && options.fault == "lr" ? 1.5 : 1.0);
  optimizer_set_lr(*optimizer, lr);

  auto sampler = sampler_from_config(config, world, data.train.size());
  const auto mode = config.check.mode;
  Phase phase;
  int64_t epoch = 0;
  while (static_cast<int64_t>(phase.steps.size()) < steps) {
    sampler.set_epoch(epoch++);
    BatchLoader loader(data.train, sampler.indices(),
                       LoaderOptions{config.data.batch_size, config.data.drop_last, false});
    while (static_cast<int64_t>(phase.steps.size()) < steps) {
      auto batch = loader.next();
      if (!batch) break;
      optimizer->zero_grad();
      {
        std::optional<DdpCore::NoSyncGuard> guard;
        if (!synchronise) guard.emplace(ddp);
        const auto out = ddp.forward(batch->x);
        loss_for(data.train, out, batch->y).backward();
      }
      optimizer->step();
      const int64_t step = static_cast<int64_t>(phase.steps.size()) + 1;
      auto report = fingerprint_check(*pg, fingerprint_tensors(*model, with_buffers), mode, step);
      if (!report.consistent && phase.first_divergence < 0) {
        phase.first_divergence = step;
        phase.first_message = report.message;
      }
      phase.steps.push_back(std::move(report));
    }
  }
  return phase;
}

std::string verdict(bool ok) {
  return ok ? "PASS" : "FAIL";
}

}  // namespace

CheckRunResult check_run(const Config& config, const WorldInfo& world,
                         const std::shared_ptr<ProcessGroup>& pg, const CheckRunOptions& options) {
  if (options.steps < 1) throw ConfigError("--steps must be >= 1");
  if (!options.fault.empty() && options.fault != "lr" && options.fault != "init" &&
      options.fault != "no-buffer-broadcast") {
    throw ConfigError("--inject: unknown fault '" + options.fault +
                      "' (valid: lr, init, no-buffer-broadcast)");
  }
  if (options.fault_rank >= world.world_size) {
    throw ConfigError("--fault-rank " + std::to_string(options.fault_rank) + " is outside [0, " +
                      std::to_string(world.world_size) + ")");
  }
  // (a)
  CommCheckOptions comm;
  comm.sizes = {1, 1001, 65536};
  const auto comm_report = comm_check_run(*pg, comm);
  // (b) and (c)
  const auto data = dataset_from_config(config);
  const Phase healthy = run_phase(config, world, pg, data, options.steps, true, options);
  const Phase control = run_phase(config, world, pg, data, options.steps, false, options);

  const bool single = world.world_size == 1;
  const bool a_ok = comm_report.passed();
  const bool b_ok = healthy.first_divergence < 0;
  const bool c_ok = single || control.first_divergence == 1;

  std::string out;
  char line[512];
  std::snprintf(line, sizeof line,
                "consistency check: model %s, data %s, %d rank(s), %lld steps, digest %s%s\n",
                config.model.name.c_str(), name_of(kDatasetKindNames, config.data.name),
                world.world_size, static_cast<long long>(options.steps),
                digest_mode_name(config.check.mode),
                options.fault.empty() ? "" : (", fault '" + options.fault + "' injected").c_str());
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
  std::snprintf(line, sizeof line, "(b) DDP training, %lld steps        %s%s\n",
                static_cast<long long>(options.steps), verdict(b_ok).c_str(),
                b_ok ? " (identical after every step)" : (": " + healthy.first_message).c_str());
  out += line;
  std::string control_text;
  if (single) {
    control_text = "n/a (one rank cannot diverge)";
  } else if (control.first_divergence == 1) {
    control_text = "PASS (divergence caught at step 1: " + control.first_message + ")";
  } else if (control.first_divergence < 0) {
    control_text = "FAIL (training without synchronisation was never caught)";
  } else {
    control_text = "FAIL (caught only at step " + std::to_string(control.first_divergence) + ")";
  }
  out += "(c) negative control, no sync      " + control_text + "\n";
  CheckRunResult result;
  result.passed = a_ok && b_ok && c_ok;
  out += std::string("result: ") + (result.passed ? "PASS" : "FAIL") + "\n";
  result.summary = out;
  return result;
}

}  // namespace lockstep
