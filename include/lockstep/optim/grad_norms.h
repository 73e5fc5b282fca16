// Gradient norms and clipping's scaling as torch.nn.utils.clip_grad_norm_
// computes them (Note [Clipping's kernels]).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace lockstep {

// Each tensor's 2-norm, in order (0-dim, the tensor's dtype and device).
std::vector<at::Tensor> tensor_norms(const std::vector<at::Tensor>& tensors);

// Every tensor times the 0-dim `factor`, in place (the factor is moved to
// their device once).
void scale_tensors(const std::vector<at::Tensor>& tensors, const at::Tensor& factor);

}  // namespace lockstep
