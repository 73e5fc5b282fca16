#include "lockstep/optim/grad_norms.h"

#include <ATen/ATen.h>

#include <map>
#include <utility>

#include "lockstep/util/torch_compat.h"

namespace lockstep {
namespace {

// Note [Clipping's kernels]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// PyTorch 2.x's clip_grad_norm_ groups the gradients by device and dtype
// and takes each group's norms and scales it with multi-tensor kernels
// (_foreach_norm, _foreach_mul_). On a GPU those are a few launches instead
// of two per parameter; on the CPU they loop over the tensors, the same
// per-tensor arithmetic lockstep runs there. lockstep groups alike, so its
// clipping is PyTorch's on both. Within a group (one GPU, one dtype) the
// kernel reduces each tensor's chunks on their own, in a fixed order: a
// norm does not depend on the rest of the group, so a ZeRO owner's norms of
// its own gradients are those of the whole list, bit for bit (grouping by
// dtype keeps that for mixed lists too: a mixed list would leave ATen's
// fast route for all of them).
using Groups = std::map<std::pair<c10::DeviceIndex, at::ScalarType>, std::vector<size_t>>;

// The CUDA tensors' indices by (device, dtype); the others are left out.
Groups cuda_groups(const std::vector<at::Tensor>& tensors) {
  Groups groups;
  for (size_t i = 0; i < tensors.size(); ++i)
    if (tensors[i].device().is_cuda())
      groups[{tensors[i].device().index(), tensors[i].scalar_type()}].push_back(i);
  return groups;
}

std::vector<at::Tensor> pick(const std::vector<at::Tensor>& tensors,
                             const std::vector<size_t>& indices) {
  std::vector<at::Tensor> out;
  out.reserve(indices.size());
  for (const size_t i : indices) out.push_back(tensors[i]);
  return out;
}

}  // namespace

std::vector<at::Tensor> tensor_norms(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> out(tensors.size());
  for (const auto& [key, indices] : cuda_groups(tensors)) {
    const auto norms = at::_foreach_norm(pick(tensors, indices), 2);
    for (size_t j = 0; j < indices.size(); ++j) out[indices[j]] = norms[j];
  }
  for (size_t i = 0; i < tensors.size(); ++i)
    if (!out[i].defined()) out[i] = tensors[i].norm(2);
  return out;
}

void scale_tensors(const std::vector<at::Tensor>& tensors, const at::Tensor& factor) {
  for (const auto& [key, indices] : cuda_groups(tensors))
    foreach_mul_by(pick(tensors, indices), factor.to(at::Device(at::kCUDA, key.first)));
  for (const auto& t : tensors)
    if (!t.device().is_cuda()) t.mul_(factor.to(t.device()));
}

}  // namespace lockstep
