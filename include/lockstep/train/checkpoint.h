// Checkpoints: crash-safe on disk, verifiable, readable from Python.
//
// <run dir>/checkpoints/step_00000120/
//   model.pt      the state dict: torch::pickle_save of {name: tensor}, which
//                 Python opens with torch.load(path)
//   optimizer.pt  LibTorch's optimizer archive
//   rng.pt        every rank's CPU generator state, [world, bytes] uint8
//   state.yaml    step, epoch, position in the epoch, world size, model
//   config.yaml   the resolved configuration
//   MANIFEST      "<sha256>  <file>" for each file above
//
// Writing (rank 0): into .tmp-step_..., every file fsynced, then renamed
// and the parent fsynced, so a crash leaves either the old set or the new
// one, never a torn one. Loading verifies the manifest first and refuses a
// mismatch, naming the file. Only the newest `keep` are kept.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace torch::optim {
class Optimizer;
}
namespace torch::nn {
class Module;
}

namespace lockstep {

struct TrainerState {
  int64_t step = 0;            // optimizer steps done
  int64_t epoch = 0;           // current epoch
  int64_t batch_in_epoch = 0;  // micro-batches of this epoch already consumed
  int64_t world_size = 1;
  std::string model;
};

using StateDict = std::vector<std::pair<std::string, at::Tensor>>;

StateDict state_dict_of(const torch::nn::Module& module);
// Copies `state` into the module's parameters and buffers. Strict: every
// tensor must exist with the same shape and dtype, and no extra ones.
// Throws DataError naming `source` and the tensor.
void state_dict_load(torch::nn::Module& module, const StateDict& state, const std::string& source);

// torch.save-compatible file of a {name: tensor} dict, and back. Reads files
// written by Python's torch.save(model.state_dict(), path) too.
void state_dict_save_file(const StateDict& state, const std::string& path);
// Loading treats the file as hostile (Note [Untrusted state dicts],
// torch_pickle.cpp): anything malformed or oversized is a DataError naming
// the file, never a crash, and memory stays within a small multiple of the
// file's size. The path must be a regular file.
StateDict state_dict_load_file(const std::string& path);
// The same from bytes in memory (`name` for messages).
StateDict state_dict_from_bytes(const std::string& bytes, const std::string& name);
// A file holding one tensor (torch.save(tensor), or lockstep's rng.pt).
at::Tensor tensor_from_bytes(const std::string& bytes, const std::string& name);

class Checkpointer {
 public:
  Checkpointer(std::string run_dir, int64_t keep);

  // Rank 0 only. Returns the checkpoint folder. Written in a temporary
  // folder, fsynced, renamed. Any failure (a full disk: ENOSPC) is a
  // DataError naming the file and errno; the temporary folder is removed and
  // the previous checkpoint is untouched (Note [Failed checkpoint]).
  std::string save(const TrainerState& state, const StateDict& model,
                   torch::optim::Optimizer& optimizer, const at::Tensor& rng_states,
                   const std::string& config_yaml);

  // The newest checkpoint folder, whether or not it verifies.
  std::optional<std::string> newest() const;

  struct Loaded {
    TrainerState state;
    StateDict model;
    at::Tensor rng_states;
    std::string folder;
  };
  // Verifies the manifest, then reads. The optimizer is loaded in place.
  static Loaded load(const std::string& folder, torch::optim::Optimizer& optimizer);
  // Throws DataError naming the first file whose SHA-256 differs.
  static void verify(const std::string& folder);

 private:
  void write_folder(const std::string& tmp, const TrainerState& state, const StateDict& model,
                    torch::optim::Optimizer& optimizer, const at::Tensor& rng_states,
                    const std::string& config_yaml);
  void rotate();

  std::string dir_;
  int64_t keep_;
};

}  // namespace lockstep
