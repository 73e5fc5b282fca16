// Saving a checkpoint: the weights checked across ranks and for finite
// values first, then every Stateful part gathered and written by rank 0.
#include "trainer_impl.h"

#include <ATen/ATen.h>

#include <spdlog/spdlog.h>

#include "lockstep/check/fingerprint.h"
#include "lockstep/distributed/agree.h"
#include "lockstep/util/allocator.h"
#include "lockstep/util/error.h"
#include "lockstep/util/fs.h"
#include "lockstep/util/module_tensors.h"

namespace lockstep {

void Trainer::Impl::check_weights(int64_t at_step, const std::string& why, CheckPolicy policy) {
  step->sync_buffers_for_check();
  const auto tensors = step->checked_tensors();
  const auto report = fingerprint_check(*pg, tensors, config.check.mode, at_step);
  if (!report.consistent) spdlog::error("{}: {}", why, report.message);
  fingerprint_enforce(*pg, report, policy, tensors);
}

void Trainer::Impl::refuse_nonfinite_weights() const {
  if (!config.train.stop_on_nonfinite || config.train.precision == Precision::kFp16) return;
  const NamedTensors params = trainable_parameters(*model);
  std::string bad;
  if (run.sharded) {
    // Each owner looks at its own weights; every rank learns the first bad one.
    int64_t first = static_cast<int64_t>(params.size());
    for (size_t i = 0; i < params.size() && first == static_cast<int64_t>(params.size()); ++i)
      if (zero->owns(i) && !params[i].second.isfinite().all().item<bool>())
        first = static_cast<int64_t>(i);
    first = -max_over_ranks(*pg, -first);
    if (first < static_cast<int64_t>(params.size())) bad = params[static_cast<size_t>(first)].first;
  } else {
    for (const auto& [name, p] : params) {
      if (p.isfinite().all().item<bool>()) continue;
      bad = name;
      break;
    }
  }
  if (!bad.empty()) {
    const std::string& name = bad;
    throw TrainingError("training diverged at step " + std::to_string(state.step) +
                        ": parameter '" + name +
                        "' holds NaN or inf after the optimizer step; no checkpoint of this "
                        "state is written (the last one stays the newest; lower optim.lr, check "
                        "optim.eps, or set train.stop_on_nonfinite: false to save it anyway)");
  }
}

void Trainer::Impl::save_checkpoint(const std::string& best_yaml) {
  step->finish_checks();
  state.world_size = world.world_size;
  state.zero = config.optim.zero;
  state.batch_size = config.data.batch_size;
  state.accumulation_steps = config.train.accumulation_steps;
  state.total_steps = plan.schedule_steps;
  state.schedule_from = plan.schedule_from;
  state.model = config.model.name;
  state.data_size = data.train->size();
  state.data_id = data_id;
  state.scaler = precision->state_dict();
  // Only weights every rank agrees on are worth keeping.
  // Under optim.zero 3 there are no replicas to compare: the shard seal,
  // verified now, guards each weight on its owner.
  if (run.sharded) {
    step->verify_seal(state.step);
  } else {
    check_weights(state.step, "checkpoint", CheckPolicy::kAbort);
  }
  refuse_nonfinite_weights();
  // Note [Stateful parts]: every part, every rank, in order (collectives:
  // the optimizer gathered from its owners, the generators, the hook).
  std::vector<SavedPart> saved;
  for (const auto& part : parts) {
    StateDict entries = part->state_dict();
    if (world.rank == 0 && (part->required() || !entries.empty()))
      saved.push_back({part->file(), std::move(entries)});
  }
  const std::string problem = rank0_outcome(*pg, [&] {
    const std::string folder = checkpointer->save(state, saved, config_yaml, best_yaml);
    if (best_yaml.empty()) {
      last_checkpoint = folder;
      spdlog::info("checkpoint: {}", absolute_path(folder));
    } else {
      last_best = folder;
      spdlog::info("best checkpoint: {} (step {})", absolute_path(folder), state.step);
    }
  });
  saved.clear();
  release_free_memory();  // the gathered state's peak, not kept resident (Note [Allocator tuning])
  if (!problem.empty()) {
    const bool disk = problem.find("ENOSPC") != std::string::npos ||
                      problem.find("cannot write") != std::string::npos ||
                      problem.find("cannot create") != std::string::npos;
    if (config.checkpoint.on_error == OnCheckpointError::kFail) {
      if (problem.find("an allocation failed") != std::string::npos)
        throw OutOfMemoryError(problem);
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

}  // namespace lockstep
