// Saving a checkpoint: the weights checked across ranks and for finite
// values first, then every Stateful part gathered and written by rank 0.
#include "trainer_impl.h"

#include <ATen/ATen.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

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

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

std::string folder_of(const std::string& run_dir, int64_t step, bool best) {
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(step));
  return run_dir + "/checkpoints/" + (best ? std::string("best") : std::string(name));
}

}  // namespace

// Note [Saving in phases]
// ~~~~~~~~~~~~~~~~~~~~~~~
// A save runs the same phases in every form: the loop's state filled in,
// the weights verified (checked across ranks, or the shard seal; never a
// non-finite one), every Stateful part gathered on every rank in order (its
// state_dict may be collective), then written: consolidated by rank 0, or
// sharded (each rank its shard into rank 0's staging folder, rank 0 the
// index and the rest), or, for a periodic save with checkpoint.async,
// sharded after a copy to host memory, in the background. Each form's
// outcome is agreed, then concluded alike (conclude_save).
void Trainer::Impl::save_checkpoint(const std::string& best_yaml, bool periodic) {
  settle_background_save();  // one save in flight at most
  step->finish_checks();
  SaveTiming timing;
  timing.began = std::chrono::steady_clock::now();
  timing.resident_at_start_kib = resident_now_kib();
  reset_resident_peak();  // rank 0's peak during the save, logged below
  fill_saved_state();
  verify_weights_before_save();
  timing.checked_s = seconds_since(timing.began);
  const bool sharded = config.checkpoint.format == CheckpointFormat::kSharded;
  GatheredParts parts_now = gather_parts(sharded);
  std::string problem;
  if (!sharded) {
    problem = rank0_outcome(
        *pg, [&] { checkpointer->save(state, parts_now.saved, config_yaml, best_yaml); });
  } else if (save_sharded(parts_now, best_yaml, periodic && config.checkpoint.async, timing,
                          problem)) {
    return;  // written in the background; settle_background_save concludes it
  }
  parts_now = {};
  release_free_memory();  // the gathered state's peak, not kept resident (Note [Allocator tuning])
  const std::string how = sharded ? "sharded" : "consolidated";
  if (problem.empty() && world.rank == 0)
    spdlog::info(
        "checkpoint of step {}: {} save took {:.3f} s (weights checked in {:.3f} s; training "
        "paused throughout); rank 0 resident {:.1f} MiB at its start, peak {:.1f} MiB",
        state.step, how, seconds_since(timing.began), timing.checked_s,
        static_cast<double>(timing.resident_at_start_kib) / 1024.0,
        static_cast<double>(resident_peak_kib()) / 1024.0);
  conclude_save(problem, best_yaml, state, how);
}

void Trainer::Impl::fill_saved_state() {
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
}

void Trainer::Impl::verify_weights_before_save() {
  // Only weights every rank agrees on are worth keeping. Under optim.zero 3
  // there are no replicas to compare: the shard seal, verified now, guards
  // each weight on its owner.
  if (run.sharded) {
    step->verify_seal(state.step);
  } else {
    check_weights(state.step, "checkpoint", CheckPolicy::kAbort);
  }
  refuse_nonfinite_weights();
}

Trainer::Impl::GatheredParts Trainer::Impl::gather_parts(bool sharded) {
  // Note [Stateful parts]: every part, every rank, in order (collectives:
  // the optimizer gathered from its owners, the generators, the hook).
  // Note [Sharded checkpoints]: a shardable part gives this rank's entries.
  GatheredParts out;
  for (const auto& part : parts) {
    if (sharded && part->shardable()) {
      for (auto& [name, t] : part->local_state_dict())
        out.pieces.emplace_back(part->file() + "/" + name, std::move(t));
      continue;
    }
    StateDict entries = part->state_dict();
    if (world.rank == 0 && (part->required() || !entries.empty()))
      out.saved.push_back({part->file(), std::move(entries)});
  }
  return out;
}

std::vector<std::string> Trainer::Impl::shard_index_order() const {
  std::vector<std::string> order;  // metadata.txt's order: the state dict's
  if (world.rank != 0) return order;
  for (const auto& [name, t] : state_dict_of(*model)) order.push_back("m:" + name);
  for (const auto& [name, p] : trainable_parameters(*model)) order.push_back("p:" + name);
  return order;
}

bool Trainer::Impl::save_sharded(GatheredParts& gathered, const std::string& best_yaml,
                                 bool in_background, const SaveTiming& timing,
                                 std::string& problem) {
  const bool best = !best_yaml.empty();
  const std::string staging = checkpointer->staging_folder(state.step, best, staging_pid);
  problem = rank0_outcome(*pg, [&] { checkpointer->create_staging(staging, state.step, best); });
  std::vector<std::string> order = shard_index_order();
  if (in_background && problem.empty()) {
    int64_t bytes = 0;
    const auto copy_began = std::chrono::steady_clock::now();
    problem = agreed_problem([&] { bytes = copy_to_host(gathered.pieces); });
    const double copy_s = seconds_since(copy_began);
    if (problem.empty()) {
      write_in_background(staging, std::move(gathered), std::move(order), timing.began);
      if (world.rank == 0)
        spdlog::info(
            "checkpoint of step {}: training paused {:.3f} s (weights checked in {:.3f} s, this "
            "rank's {:.1f} MiB copied to memory in {:.3f} s); rank 0 resident {:.1f} MiB at its "
            "start, peak {:.1f} MiB; written in the background",
            state.step, seconds_since(timing.began), timing.checked_s,
            static_cast<double>(bytes) / (1 << 20), copy_s,
            static_cast<double>(timing.resident_at_start_kib) / 1024.0,
            static_cast<double>(resident_peak_kib()) / 1024.0);
      return true;
    }
  }
  const int rank = world.rank, size = world.world_size;
  const int64_t zero_stage = config.optim.zero, at_step = state.step;
  if (problem.empty() && !in_background)
    problem = agreed_problem(
        [&] { write_rank_shard(staging, rank, zero_stage, at_step, gathered.pieces); });
  gathered.pieces.clear();
  if (problem.empty() && !in_background) {
    problem = rank0_outcome(*pg, [&] {
      const ShardIndex index =
          merge_shard_parts(staging, size, zero_stage, at_step, order, std::chrono::seconds(10));
      checkpointer->save(state, gathered.saved, config_yaml, best_yaml, &index, staging);
    });
  }
  if (!problem.empty() && world.rank == 0) Checkpointer::discard_staging(staging);
  return false;
}

int64_t Trainer::Impl::copy_to_host(ShardPieces& pieces) {
  // The pause: this rank's entries copied to host memory, into the arena of
  // the last async save (its write has ended: settled before), so that only
  // the first save pays for fresh pages; it stays mapped for the run.
  const auto aligned = [](size_t n) { return (n + 63) / 64 * 64; };
  size_t total = 0;
  for (const auto& [name, t] : pieces) total += aligned(t.nbytes());
  char* at = host_arena.reserve(total);
  int64_t bytes = 0;
  for (auto& [name, t] : pieces) {
    at::Tensor copy = at::from_blob(at, t.sizes(), t.options().device(at::kCPU));
    copy.copy_(t);
    t = copy;
    at += aligned(t.nbytes());
    bytes += static_cast<int64_t>(t.nbytes());
  }
  return bytes;
}

void Trainer::Impl::write_in_background(const std::string& staging, GatheredParts gathered,
                                        std::vector<std::string> order,
                                        std::chrono::steady_clock::time_point began) {
  in_flight = state;
  in_flight_since = began;
  in_flight_staging = staging;
  const int rank = world.rank, size = world.world_size;
  const int64_t zero_stage = config.optim.zero, at_step = state.step;
  Checkpointer* writer = checkpointer.get();
  BackgroundSave* job = &background;
  // The thread never removes the staging folder: other ranks may still
  // write into it; settle_background_save does, once all have ended.
  background.start([staging, rank, size, zero_stage, at_step, writer, job,
                    pieces = std::move(gathered.pieces), saved = std::move(gathered.saved),
                    order = std::move(order), saved_state = state, yaml = config_yaml] {
    try {
      write_rank_shard(staging, rank, zero_stage, at_step, pieces);
    } catch (...) {
      job->mark_written(false);
      throw;
    }
    job->mark_written(true);
    if (rank != 0) return;
    const ShardIndex index = merge_shard_parts(staging, size, zero_stage, at_step, order,
                                               std::chrono::seconds(1800), job->cancelled());
    writer->save(saved_state, saved, yaml, "", &index, staging);
  });
}

std::string Trainer::Impl::agreed_problem(const std::function<void()>& body) {
  try {
    agree_on_failure(*pg, [&] {
      try {
        body();
      } catch (const Error&) {
        throw;
      } catch (const std::exception& e) {
        // Memory or LibTorch: words every rank can act on alike.
        if (is_out_of_memory(e)) throw StorageError("an allocation failed: " + what_of(e));
        throw StorageError(what_of(e));
      }
    });
  } catch (const std::exception& e) {
    return what_of(e);
  }
  return "";
}

void Trainer::Impl::settle_background_save() {
  if (!in_flight) return;
  const auto wait_began = std::chrono::steady_clock::now();
  // Every rank's own shard first: when one failed, rank 0 stops waiting
  // for its part at once instead of for the merge's timeout.
  const bool written = background.wait_written();
  if (max_over_ranks(*pg, int64_t{written ? 0 : 1}) != 0) background.cancel();
  const std::string mine = background.wait();
  const double waited = seconds_since(wait_began);
  const TrainerState saved_state = *in_flight;
  in_flight.reset();
  const std::string problem = agreed_problem([&] {
    if (!mine.empty()) throw StorageError(mine);
  });
  if (!problem.empty() && world.rank == 0) Checkpointer::discard_staging(in_flight_staging);
  if (world.rank == 0 && problem.empty())
    spdlog::info("checkpoint of step {}: written in the background, {:.2f} s after its step{}",
                 saved_state.step,
                 std::chrono::duration<double>(background.finished() - in_flight_since).count(),
                 waited > 0.01 ? " (training waited " + std::to_string(waited).substr(0, 5) +
                                     " s for it: one save in flight at most)"
                               : std::string());
  conclude_save(problem, "", saved_state, "sharded, in the background");
}

void Trainer::Impl::conclude_save(const std::string& problem, const std::string& best_yaml,
                                  const TrainerState& saved_state, const std::string& how) {
  const bool best = !best_yaml.empty();
  const std::string folder = folder_of(run_dir, saved_state.step, best);
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
    if (!best) {
      ++failed_saves;
      last_save_problem = problem;
    }
    return;
  }
  if (best) {
    last_best = folder;
    if (world.rank == 0)
      spdlog::info("best checkpoint: {} (step {})", absolute_path(folder), saved_state.step);
  } else {
    ++saves;
    last_checkpoint = folder;
    if (world.rank == 0) spdlog::info("checkpoint: {} ({})", absolute_path(folder), how);
  }
  for (auto& c : callbacks) c->on_checkpoint(saved_state, folder);
}

}  // namespace lockstep
