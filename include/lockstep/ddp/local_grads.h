// What this rank alone computed: each parameter's local gradient in a
// synchronised backward, after its backward and before it enters the
// exchange (its bucket, before any comm hook; under optim.zero 3 before its
// unit's reduce-scatter). The silent-corruption checks watch here
// (check/corruption.h, Note [Silent corruption]): once the exchange has run,
// a wrong local gradient is averaged into every rank alike and no weight
// check can see it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>

namespace lockstep {

class LocalGradObserver {
 public:
  virtual ~LocalGradObserver() = default;
  // `index`: the parameter's, in the order the DDP wrapper lists them
  // (trainable_parameters). Called on autograd's thread, once per
  // parameter per synchronised backward; never under no_sync. `grad` is
  // the gradient about to be exchanged (accumulated over no_sync
  // micro-batches); only fault injection modifies it.
  virtual void local_grad(size_t index, const at::Tensor& grad) = 0;
};

}  // namespace lockstep
