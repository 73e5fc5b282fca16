// Resuming a checkpoint at any world size, batch size or accumulation
// (Note [Elastic resume]): reading and checking it, re-mapping the rest of
// the epoch, and restoring the Stateful parts once DDP exists.
#include "trainer_impl.h"

#include <ATen/ATen.h>

#include <spdlog/spdlog.h>

#include <set>
#include "lockstep/util/error.h"

#include "lockstep/distributed/agree.h"
#include "lockstep/optim/optim.h"
#include "lockstep/util/module_tensors.h"
#include "lockstep/util/text.h"

namespace lockstep {

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
// a schedule whose length came from the epochs becomes the steps done
// plus the steps left at W' (so a cosine still ends at the last step;
// Note [Schedule length]). Generators: ranks below W
// restore theirs, the others are seeded afresh (run.seed, rank).
void Trainer::Impl::remap_epoch(int64_t old_world) {
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

int64_t Trainer::Impl::steps_left() const {
  sampler->set_epoch(state.epoch);
  const int64_t in_epoch = steps_over(
      std::max<int64_t>(0, micro_in_epoch(*sampler, state.epoch_offset) - state.batch_in_epoch),
      config.train.accumulation_steps);
  const int64_t later = std::max<int64_t>(0, config.train.epochs - state.epoch - 1);
  return std::max<int64_t>(0, in_epoch) + later * plan.steps_per_epoch;
}

bool Trainer::Impl::check_data_unchanged(const TrainerState& saved,
                                         const std::string& folder) const {
  if (saved.data_size == 0) return false;  // written before lockstep recorded it
  const int64_t size = data.train->size();
  if (saved.data_size == size && saved.data_id == data_id) return false;
  const std::string what = "checkpoint '" + folder + "' was trained on " +
                           std::to_string(saved.data_size) + " training examples (data_id " +
                           saved.data_id + "), the training split now has " + std::to_string(size) +
                           " (data_id " + data_id +
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

// Resuming, in its phases: the folder found, the checkpoint loaded (and a
// sharded one's parts read by the ranks that need them), verified against
// this run (model, values, data), its position re-mapped onto this run's
// ranks and batches (Note [Elastic resume]) and the schedule re-planned.
// The parts themselves are restored later (restore_parts).
void Trainer::Impl::maybe_resume() {
  const std::string folder = resume_folder();
  if (folder.empty()) return;
  Checkpointer::Loaded loaded = load_resumed(folder);
  verify_resumed(loaded, folder);
  const bool data_changed = check_data_unchanged(loaded.state, folder);
  precision->load_state_dict(loaded.state.scaler, folder + "/state.yaml");
  const int64_t old_world = loaded.state.world_size;
  state = loaded.state;
  resumed = std::move(loaded);
  last_checkpoint = folder;
  resumed_from_folder = folder;
  const std::string where = "at step " + std::to_string(state.step) + " (epoch " +
                            std::to_string(state.epoch + 1) + ", after micro-batch " +
                            std::to_string(state.batch_in_epoch) + ")";
  std::string changed = remap_position(old_world, data_changed);
  changed += replan_schedule();
  spdlog::info("resumed from {} {}{}", folder, where, changed);
}

std::string Trainer::Impl::resume_folder() const {
  const std::string& folder = config.checkpoint.resume;
  if (folder != "auto") return folder;
  const auto newest = checkpointer->newest();
  if (!newest)
    spdlog::info("checkpoint.resume: auto: no checkpoint in {}/checkpoints, starting fresh",
                 run_dir);
  return newest.value_or("");
}

Checkpointer::Loaded Trainer::Impl::load_resumed(const std::string& folder) {
  auto loaded = reading_key("checkpoint.resume", [&] {
    std::vector<std::string> files;  // only what the parts restore is read
    for (const auto& part : parts) files.push_back(part->file());
    return Checkpointer::load(folder, zero != nullptr ? nullptr : optimizer.get(), files,
                              /*read_shards=*/false);
  });
  if (!loaded.shards) return loaded;
  // Note [Sharded checkpoints]: each shard file hashed on one rank, then
  // each rank reads the byte ranges it needs (failures agreed).
  reading_key("checkpoint.resume", [&] {
    verify_shards(*pg, folder, *loaded.shards);
    for (const auto& part : parts) {
      if (!part->shardable()) continue;
      Stateful& p = *part;
      loaded.parts[p.file()] =
          read_sharded_part(*pg, folder, *loaded.shards, p.file(), p.needs_every_entry(),
                            [&](const std::string& entry) { return p.reads(entry); });
    }
    return 0;
  });
  return loaded;
}

void Trainer::Impl::verify_resumed(const Checkpointer::Loaded& loaded, const std::string& folder) {
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
  std::set<std::string> parameters;
  for (const auto& [name, _] : trainable_parameters(*model)) parameters.insert(name);
  // A sharded checkpoint's owners check different entries: one verdict.
  const auto check = [&] {
    Checkpointer::check_values(loaded, parameters, generator_state().numel());
  };
  if (!loaded.shards) return check();
  reading_key("checkpoint.resume", [&] {
    agree_on_failure(*pg, check);
    return 0;
  });
}

std::string Trainer::Impl::remap_position(int64_t old_world, bool data_changed) {
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
    const double old_batch =
        static_cast<double>(old_bs) * static_cast<double>(old_world) * static_cast<double>(old_acc);
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
  return changed;
}

std::string Trainer::Impl::replan_schedule() {
  plan.total_steps = state.step + steps_left();
  // Note [Schedule length] (recipe.cpp): a length optim.decay_steps chose is
  // kept unless this config sets one; otherwise the length is this config's.
  plan_schedule(config, plan);
  if (config.optim.decay_steps == 0 && state.schedule_from == ScheduleFrom::kDecaySteps &&
      state.total_steps > 0) {
    plan.schedule_steps = state.total_steps;
    plan.schedule_from = state.schedule_from;
  }
  if (state.total_steps <= 0 || plan.schedule_steps == state.total_steps) return "";
  return "; schedule length " + std::to_string(state.total_steps) + " -> " +
         std::to_string(plan.schedule_steps) + " steps (from " +
         (plan.schedule_from == ScheduleFrom::kEpochs
              ? std::string("the epochs")
              : std::string(plan.schedule_from == ScheduleFrom::kMaxSteps ? "train.max_steps"
                                                                          : "optim.decay_steps")) +
         ")";
}

void Trainer::Impl::restore_parts(bool after_ddp) {
  if (!resumed) return;
  for (const auto& part : parts) {
    if (part->needs_ddp() != after_ddp) continue;
    const std::string file = part->file();
    // An older lockstep's optimizer archive was loaded in place already.
    if (file == "optimizer.pt" && resumed->legacy_optimizer) continue;
    reading_key("checkpoint.resume", [&] {
      part->load_state_dict(resumed->part(file), resumed->folder + "/" + file);
      return 0;
    });
    resumed->parts.erase(file);  // its memory back before the next part's
  }
  if (after_ddp) resumed.reset();
}

}  // namespace lockstep
