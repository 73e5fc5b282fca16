// A module's tensors with their dotted names, in registration order:
// parameters, then (on request) buffers. The one place that walks a module
// for state dicts, fingerprints and optimizer-state lookups.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

namespace torch::nn {
class Module;
}

namespace lockstep {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// One tensor with its name (fingerprints, the optimizer's state tensors).
struct NamedTensor {
  std::string name;
  at::Tensor tensor;
};

// Parameters, then buffers when `buffers` (each buffer's name prefixed with
// `buffer_prefix`, e.g. "buffer " where parameters and buffers share a list).
NamedTensors module_tensors(const torch::nn::Module& module, bool buffers,
                            const std::string& buffer_prefix = "");

// The parameters DDP reduces, in its order: each once (a tied parameter
// under the first name it was registered with), only those that require a
// gradient. ZeRO partitions these (optim/zero.h), so that its indices are
// the Reducer's.
NamedTensors trainable_parameters(const torch::nn::Module& module);

}  // namespace lockstep
