// State dicts: a module's named tensors in and out, and the files that hold
// them: the writer whose files Python's torch.load opens, and the reader of
// torch.save files (Python's or ours), which treats every file as hostile
// (Note [Untrusted state dicts], src/io/torch_pickle.cpp). Checkpoint
// policy (folders, manifest, keep, resume) is train/checkpoint.h.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

namespace torch::nn {
class Module;
}

#include "lockstep/util/module_tensors.h"

namespace lockstep {

// Parameters then buffers, with PyTorch's dotted names.
// A state dict is named tensors in order (util/module_tensors.h), the one
// type for them; the name says what it is for.
using StateDict = NamedTensors;

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

}  // namespace lockstep
