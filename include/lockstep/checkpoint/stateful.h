// State that checkpoints itself (Note [Stateful parts], checkpoint.cpp):
// each part of a run (model, optimizer, RNG, comm hook) says which file of
// a checkpoint folder it owns, gives its state as named tensors and takes
// it back; the checkpointer saves and restores a list of them, as
// torchtitan's CheckpointManager composes MODEL, OPTIMIZER, LR_SCHEDULER.
#pragma once

#include <string>

#include "lockstep/io/state_dict.h"

namespace lockstep {

class Stateful {
 public:
  virtual ~Stateful() = default;
  // The part's file in a checkpoint folder ("model.pt").
  virtual std::string file() const = 0;
  // Whether every checkpoint holds the file (false: only when the part has
  // state, as comm_hook.pt for a stateful hook).
  virtual bool required() const { return true; }
  // Whether the part can take its state only once the DDP wrapper exists
  // (a comm hook's state is per bucket); the others are restored before
  // DDP is built, whose broadcast then starts every rank alike.
  virtual bool needs_ddp() const { return false; }
  // Collective: every rank calls it, parts in the same order. Rank 0's
  // result is written; empty (on rank 0, for an optional part): no file.
  virtual StateDict state_dict() = 0;
  // Every rank, with the file's entries as read from a verified folder
  // (empty when an optional part's file is absent). `source` names the
  // file in errors (DataError / ConfigError).
  virtual void load_state_dict(const StateDict& saved, const std::string& source) = 0;

  // Sharded checkpoints (checkpoint.format: sharded; Note [Sharded
  // checkpoints], sharded_checkpoint.cpp). Whether the part's entries go
  // to the ranks' shard files, each entry written once by the rank a
  // fixed rule names (false: the part's file, from rank 0, as above).
  virtual bool shardable() const { return false; }
  // The entries this rank writes, in the part's order. Not collective.
  virtual StateDict local_state_dict() { return {}; }
  // Loading: whether every rank needs every entry (each then read by one
  // rank and broadcast); otherwise each rank reads the entries for which
  // reads() holds, and only those reach load_state_dict.
  virtual bool needs_every_entry() const { return true; }
  virtual bool reads(const std::string& /*entry*/) const { return true; }
};

// A part's state as the checkpointer writes it: `file` holds `entries` as a
// torch.save'd dict, or, for a single entry named "", that tensor alone
// (rng.pt: torch.load gives the tensor).
struct SavedPart {
  std::string file;
  StateDict entries;
};

}  // namespace lockstep
