// Units of a module's forward that something outside the model manages
// (fully sharded parameters: optim/fully_shard.h). LibTorch's modules have
// no forward hooks, so a model calls its parts through call_unit():
//
//   x = lockstep::call_unit(*block, [&] { return block->forward(x); });
//
// With nothing registered for `block` that is block->forward(x). With a
// UnitWrapper registered (fully_shard does it for each unit it manages) the
// wrapper runs before the forward (gathers the unit's parameters) and sees
// its output (frees them, and arms their gathering again for backward).
// Lockstep's GPT calls its blocks so; DDP's forward and the evaluation call
// the whole model so (its root unit).
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <utility>

namespace torch::nn {
class Module;
}

namespace lockstep {

class UnitWrapper {
 public:
  virtual ~UnitWrapper() = default;
  // Before `unit`'s forward.
  virtual void before_forward(const torch::nn::Module& unit) = 0;
  // After it, with its output; returns what the caller gets (the output,
  // or an alias of it that carries a backward hook).
  virtual at::Tensor after_forward(const torch::nn::Module& unit, const at::Tensor& output) = 0;
};

// Registers `wrapper` for `unit` (nullptr: removes it). The registry holds
// a weak reference: a wrapper that dies is gone. Thread-safe.
void set_unit_wrapper(const torch::nn::Module& unit, const std::shared_ptr<UnitWrapper>& wrapper);
// The wrapper registered for `unit`, or nullptr.
std::shared_ptr<UnitWrapper> unit_wrapper(const torch::nn::Module& unit);

// `forward()` (returning the unit's output), wrapped as registered.
template <typename Forward>
at::Tensor call_unit(const torch::nn::Module& unit, Forward&& forward) {
  const auto wrapper = unit_wrapper(unit);
  if (!wrapper) return std::forward<Forward>(forward)();
  wrapper->before_forward(unit);
  return wrapper->after_forward(unit, std::forward<Forward>(forward)());
}

}  // namespace lockstep
