// Activation recompute (activation checkpointing, model.activation_checkpointing)
// for LibTorch: torch.utils.checkpoint's recompute (Note [Activation
// checkpointing], recompute.cpp).
//
//   x = lockstep::recompute(*block, [&](const at::Tensor& in) { return block->forward(in); }, x);
//
// The forward runs without keeping its activations (only `input` is
// saved); backward runs it again, with the random generator and the
// autocast state of the first run, and takes the gradients from that.
// Gradients are bit-identical to a run without it.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <functional>

namespace lockstep {

// `fn(input)` recomputed in backward. `module`: whose parameters `fn` uses
// (their gradients flow through the outer backward, so DDP's hooks and
// gradient accumulation see them as without checkpointing); a tensor `fn`
// uses that is not among them (a weight tied from elsewhere) gets no
// gradient through it, and the backward is first-order only (no
// create_graph). Without grad mode (evaluation) it is just fn(input).
at::Tensor recompute(torch::nn::Module& module,
                     const std::function<at::Tensor(const at::Tensor&)>& fn,
                     const at::Tensor& input);

}  // namespace lockstep
