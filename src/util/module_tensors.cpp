#include "lockstep/util/module_tensors.h"

#include <torch/nn/module.h>

#include <unordered_set>

namespace lockstep {

NamedTensors module_tensors(const torch::nn::Module& module, bool buffers,
                            const std::string& buffer_prefix) {
  NamedTensors out;
  for (const auto& p : module.named_parameters(/*recurse=*/true))
    out.emplace_back(p.key(), p.value());
  if (buffers) {
    for (const auto& b : module.named_buffers(/*recurse=*/true))
      out.emplace_back(buffer_prefix + b.key(), b.value());
  }
  return out;
}

NamedTensors trainable_parameters(const torch::nn::Module& module) {
  NamedTensors out;
  std::unordered_set<const void*> seen;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) {
    if (!seen.insert(p.value().unsafeGetTensorImpl()).second) continue;
    if (p.value().requires_grad()) out.emplace_back(p.key(), p.value());
  }
  return out;
}

}  // namespace lockstep
