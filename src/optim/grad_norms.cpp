#include "lockstep/optim/grad_norms.h"

#include <ATen/ATen.h>

#include "lockstep/util/torch_compat.h"

namespace lockstep {
namespace {

// Note [Clipping's kernels]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// PyTorch 2.x's clip_grad_norm_ takes the gradients' norms and scales them
// with multi-tensor kernels (_foreach_norm, _foreach_mul_) where the device
// has them (CUDA), and one tensor at a time elsewhere (the CPU). lockstep
// does the same, so that its clipping is PyTorch's on both, bit for bit,
// and a GPU step launches a few kernels instead of two per parameter. Each
// norm is its own tensor's reduction whatever else is in the list (the
// multi-tensor kernel reduces a tensor's chunks in a fixed order), so a
// ZeRO owner's norms of its own gradients are those of the whole list.
bool multi_tensor(const std::vector<at::Tensor>& tensors) {
  if (tensors.empty()) return false;
  const auto device = tensors.front().device();
  if (!device.is_cuda()) return false;
  for (const auto& t : tensors)
    if (t.device() != device) return false;
  return true;
}

}  // namespace

std::vector<at::Tensor> tensor_norms(const std::vector<at::Tensor>& tensors) {
  if (multi_tensor(tensors)) return at::_foreach_norm(tensors, 2);
  std::vector<at::Tensor> out;
  out.reserve(tensors.size());
  for (const auto& t : tensors) out.push_back(t.norm(2));
  return out;
}

void scale_tensors(const std::vector<at::Tensor>& tensors, const at::Tensor& factor) {
  if (tensors.empty()) return;
  if (multi_tensor(tensors)) {
    foreach_mul_by(tensors, factor.to(tensors.front().device()));
    return;
  }
  for (const auto& t : tensors) t.mul_(factor.to(t.device()));
}

}  // namespace lockstep
