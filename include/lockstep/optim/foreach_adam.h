// Adam and AdamW whose step updates all of a group's parameters with a
// handful of multi-tensor (at::_foreach_*) kernels instead of ~9 kernels per
// parameter: what PyTorch's optimizers do by default when every parameter is
// on a GPU (foreach=None), where a GPT's ~150 parameters would otherwise
// launch ~1,400 small kernels a step. Note [Foreach optimizers].
#pragma once

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

namespace lockstep {

// Note [Foreach optimizers]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// Each is-a LibTorch optimizer with LibTorch's own state (AdamParamState,
// AdamWParamState): checkpoints, ZeRO, the state dict and the checks see no
// difference. The step is LibTorch's per-parameter step op for op (weight
// decay, the moments, sqrt, the division by sqrt(bias_correction2), eps, the
// addcdiv with -lr / bias_correction1; the bias corrections per parameter in
// double, as its own step count says), each op applied to the whole list: on
// a CPU the foreach ops run the same per-tensor kernels, so the result is
// bit-identical (tests/optim: every step, both LibTorch versions); on a GPU
// they are fused multi-tensor kernels of the same arithmetic. amsgrad falls
// back to LibTorch's step.
class ForeachAdam : public torch::optim::Adam {
 public:
  using torch::optim::Adam::Adam;
  at::Tensor step(LossClosure closure = nullptr) override;
};

class ForeachAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;
  at::Tensor step(LossClosure closure = nullptr) override;
};

}  // namespace lockstep
