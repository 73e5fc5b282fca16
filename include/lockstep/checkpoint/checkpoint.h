// Checkpoints: crash-safe on disk, verifiable, readable from Python.
//
// <run dir>/checkpoints/step_00000120/
//   model.pt      the state dict: torch::pickle_save of {name: tensor}, which
//                 Python opens with torch.load(path)
//   optimizer.pt  the optimizer state as a state dict, "<param>.<field>"
//                 (optim/optim.h: optimizer_state_dict), whatever the
//                 world size and optim.zero that wrote it; torch.load reads
//                 it. Checkpoints of lockstep before ZeRO hold LibTorch's
//                 optimizer archive here: still read (same world size).
//   rng.pt        every rank's CPU generator state, [world, bytes] uint8
//   comm_hook.pt  only for a stateful comm hook (PowerSGD): every rank's
//                 state, keys "rank<r>.<key>" (a state dict, torch.load)
//   state.yaml    step, epoch, position in the epoch (epoch_offset,
//                 batch_in_epoch), world size, optim.zero, model, the
//                 training split's size and identity (data_size, data_id);
//                 with train.precision fp16 the GradScaler's state under
//                 `scaler:` (torch.amp.GradScaler.state_dict()'s keys)
//   config.yaml   the resolved configuration
//   MANIFEST      "<sha256>  <file>" for each file above
//
// checkpoint.format: sharded (Note [Sharded checkpoints]) holds, instead of
// model.pt and optimizer.pt, shard_<rank>.bin (each rank's entries, written
// by that rank) and metadata.txt (io/shard_index.h: every tensor's dtype,
// shape, file and byte range); the MANIFEST lists them too.
//
// Writing (rank 0): into .tmp-step_..., every file fsynced, then renamed
// and the parent fsynced, so a crash leaves either the old set or the new
// one, never a torn one. Loading verifies the manifest first and refuses a
// mismatch, naming the file. Only the newest `keep` are kept.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "lockstep/checkpoint/run_state.h"
#include "lockstep/checkpoint/stateful.h"
#include "lockstep/io/shard_index.h"
#include "lockstep/io/state_dict.h"

namespace torch::optim {
class Optimizer;
}

namespace lockstep {

class Checkpointer {
 public:
  Checkpointer(std::string run_dir, int64_t keep);

  // Rank 0 only. Returns the checkpoint folder. Written in a temporary
  // folder, fsynced, renamed. Any failure is a DataError naming the file and
  // errno (StorageError for a full disk: ENOSPC, and other write failures)
  // and saying whether an earlier checkpoint exists; the temporary folder
  // is removed and the previous checkpoint is untouched (Note [Failed
  // checkpoint]). Rotation keeps the newest `keep`, never removing the one
  // just written. `best`: into checkpoints/best instead (not rotated; the
  // previous best replaced so that some best/ always exists: Note
  // [Replacing a checkpoint folder]), with best.yaml (metric, value, step)
  // in its MANIFEST.
  // `parts`: the Stateful parts' files (stateful.h), model.pt, optimizer.pt
  // and rng.pt among them.
  // `shards` (sharded format): the merged index of the shard files every
  // rank has written into `staging` (staging_folder(), made by
  // create_staging()), which becomes the folder.
  std::string save(const TrainerState& state, const std::vector<SavedPart>& parts,
                   const std::string& config_yaml, const std::string& best_yaml = "",
                   const ShardIndex* shards = nullptr, const std::string& staging = "");
  // The staging folder of a sharded save of `step` (or best/), named with
  // rank 0's pid (`writer_pid`) so that repair() knows its writer.
  std::string staging_folder(int64_t step, bool best, long writer_pid) const;
  // Rank 0: an empty staging folder (an older one removed); a failure is
  // a StorageError saying what it leaves, as save()'s.
  void create_staging(const std::string& staging, int64_t step, bool best);
  // A failed sharded save's staging folder removed (best effort).
  static void discard_staging(const std::string& staging);
  // A consolidated checkpoint folder at `out` (consolidate): written in a
  // sibling temporary folder and renamed; `out` must not exist.
  static void write_consolidated(const std::string& out, const TrainerState& state,
                                 const std::vector<SavedPart>& parts,
                                 const std::string& config_yaml);

  // The newest checkpoint folder, whether or not it verifies.
  std::optional<std::string> newest() const;

  // Rank 0, at start: a best/ (or step folder) lost between two renames
  // put back, the .tmp-* and .old-* folders of writers that are gone
  // removed. Returns what it did, a line each.
  std::vector<std::string> repair();

  struct Loaded {
    TrainerState state;
    // Each .pt file the MANIFEST lists, by file name (rng.pt: one entry
    // named ""); optimizer.pt absent when `legacy_optimizer`.
    std::map<std::string, StateDict> parts;
    // A sharded checkpoint's index (its model.pt and optimizer.pt parts are
    // read from the shards: all of them by load(), or by the caller).
    std::optional<ShardIndex> shards;
    bool legacy_optimizer = false;  // an archive, loaded into the optimizer given
    std::string folder;
    // The file's entries; empty when the folder has no such file.
    const StateDict& part(const std::string& file) const;
    // rng.pt's tensor (undefined when absent).
    at::Tensor rng_states() const;
  };
  // Verifies the manifest, then reads state.yaml and the .pt files named in
  // `files` that the MANIFEST lists (empty: every .pt file it lists). An
  // optimizer.pt of the older archive form is loaded in place into `legacy`
  // (nullptr: refused, DataError).
  // A sharded checkpoint's parts asked for are read from its shards whole,
  // each shard holding them hashed first, unless `read_shards` is false:
  // then no shard is hashed or read (the trainer does both across its
  // ranks: sharded_checkpoint.h).
  static Loaded load(const std::string& folder, torch::optim::Optimizer* legacy,
                     const std::vector<std::string>& files = {}, bool read_shards = true);
  // Throws DataError naming the first file whose SHA-256 differs (the
  // shard files of a sharded checkpoint only with `shards`).
  static void verify(const std::string& folder, bool shards = true);
  // The values read as hostile (Note [Checkpoint values]): every floating
  // tensor of optimizer.pt and comm_hook.pt, and model.pt's `parameters`,
  // finite and in its range, rng.pt one state of `generator_bytes` per
  // writing rank. Throws DataError naming the file, the entry and the value.
  static void check_values(const Loaded& loaded, const std::set<std::string>& parameters,
                           int64_t generator_bytes);
  // model.pt's part of it alone (lockstep generate): `parameters` finite,
  // buffers without NaN. `file` names it in the error.
  static void check_model_values(const StateDict& model, const std::set<std::string>& parameters,
                                 const std::string& file);

 private:
  static void write_folder(const std::string& tmp, const TrainerState& state,
                           const std::vector<SavedPart>& parts, const std::string& config_yaml,
                           const std::string& best_yaml, const ShardIndex* shards);
  void rotate(const std::string& just_written);

  std::string dir_;
  int64_t keep_;
};

}  // namespace lockstep
