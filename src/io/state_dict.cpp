#include "lockstep/io/state_dict.h"

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/nn/module.h>

#include <cstdio>
#include <exception>
#include <map>
#include <sstream>

#include "lockstep/util/error.h"
#include "lockstep/util/fs.h"
#include "lockstep/util/module_tensors.h"

namespace lockstep {
namespace {

std::string shape_of(const at::Tensor& t) {
  std::string s;
  for (auto d : t.sizes()) s += (s.empty() ? "" : ", ") + std::to_string(d);
  return "[" + s + "]";
}

}  // namespace

StateDict state_dict_of(const torch::nn::Module& module) {
  return module_tensors(module, /*buffers=*/true);
}

void state_dict_load(torch::nn::Module& module, const StateDict& state, const std::string& source) {
  std::map<std::string, at::Tensor> given(state.begin(), state.end());
  const auto mine = state_dict_of(module);
  at::NoGradGuard no_grad;
  for (const auto& [name, tensor] : mine) {
    auto it = given.find(name);
    if (it == given.end()) {
      throw DataError(source + ": has no tensor '" + name +
                      "' (a state dict of a different model?)");
    }
    if (it->second.sizes() != tensor.sizes()) {
      throw DataError(source + ": tensor '" + name + "' has shape " + shape_of(it->second) +
                      " but the model's is " + shape_of(tensor) + " (a different model?)");
    }
    tensor.copy_(it->second);
    given.erase(it);
  }
  if (!given.empty()) {
    throw DataError(source + ": has tensor '" + given.begin()->first +
                    "' that the model does not (a state dict of a different model?)");
  }
}

// Note [Untagged pickles]: torch::pickle_save tags typed dicts and lists
// with torch.jit._pickle.restore_type_tag, a global that torch.load's default
// unpickler since PyTorch 2.6 (weights_only=True) refuses: a user's plain
// `torch.load("model.pt")` would fail. This writes the same zip archive
// (data.pkl + data/<n> records) without the tags, which every torch.load
// (1.13 and 2.x, weights_only or not) and torch::pickle_load read.
static void pickle_untagged(const c10::IValue& value, FileWriter& file) {
  std::vector<char> pickled;
  torch::jit::Pickler pickler(
      [&](const char* data, size_t size) { pickled.insert(pickled.end(), data, data + size); },
      /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
      /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  // Streamed to the file (no copy of the archive in memory). A failure
  // inside the writer (a full disk) must not unwind through miniz:
  // PyTorchStreamWriter's destructor would finish the archive at a position
  // it no longer agrees on and throw from a destructor (abort). The writer
  // takes every byte as written, and the failure is raised after.
  std::exception_ptr failure;
  {
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t size) {
      if (failure) return size;
      try {
        file.append(data, size);
      } catch (...) {
        failure = std::current_exception();
      }
      return size;
    });
    torch::jit::writeArchiveAndTensors("data", pickled.data(), pickled.size(), pickler.tensorData(),
                                       writer);
    writer.writeEndOfFile();
  }
  if (failure) std::rethrow_exception(failure);
}

void state_dict_save_file(const StateDict& state, const std::string& path) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, tensor] : state) dict.insert(name, tensor.detach().cpu().contiguous());
  // Through a temporary: a failure leaves an existing file at `path` as it was.
  write_file_replacing(path, [&](FileWriter& file) { pickle_untagged(c10::IValue(dict), file); });
}

StateDict state_dict_load_file(const std::string& path) {
  return state_dict_from_bytes(read_regular_file(path), path);
}

}  // namespace lockstep
