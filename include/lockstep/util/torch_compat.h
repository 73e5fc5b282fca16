// Where LibTorch 1.13 and 2.x differ for tensors, autograd and optimizers:
// half of lockstep's one compatibility layer, the half that needs no c10d
// (the other, for process groups and stores, is distributed/torch_compat.h,
// which includes this). Nothing else in the tree tests TORCH_VERSION; code
// that must behave differently calls something declared in these two.
// (docs/compatibility.md has the table.)
//
// Optimizer state. 1.13 keys Optimizer::state() by the parameter's
//   TensorImpl address printed as a string, 2.x by the address itself:
//   optimizer_state_key() follows the map's key type, not a version number.
// Attention. 2.x has at::scaled_dot_product_attention (fused kernels);
//   1.13 has not: causal_attention() spells out the same product there
//   (torch_compat.cpp), as a Python model on 1.13 would.
// Autocast. 1.13 switches it per device with set_enabled (CUDA) and
//   set_cpu_enabled, its dtype with set_autocast_{gpu,cpu}_dtype; 2.4+ with
//   set_autocast_enabled(device type, on) and set_autocast_dtype (the old
//   names deprecated). CPU autocast to float16 came in 2.4 (1.13's CPU
//   autocast casts to bfloat16 only): autocast_unsupported() says so.
// Gradient accumulators. grad_accumulator() hands out a
//   std::shared_ptr<Node> up to 2.11 and a c10::intrusive_ptr<Node> in
//   2.15 (autograd's nodes became intrusive): AccumulatorHook holds it, as
//   decltype spells it, and adds and removes the post hook
//   (LambdaPostHook, add/del_post_hook read the same in all).
// Multi-tensor scaling by a tensor. 2.1+ has _foreach_mul_(TensorList,
//   Tensor), the factor staying on the device; 1.13 and 2.0 have not:
//   foreach_mul_by() multiplies tensor by tensor there.
// Unchanged, checked by the suite on all: the engine's queue_callback,
//   torch::pickle_save/pickle_load.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/version.h>

#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace lockstep {

// For the rare test or message that must know the version; code paths that
// differ belong in these two headers, not behind this constant.
constexpr int kTorchVersionMajor = TORCH_VERSION_MAJOR;
constexpr int kTorchVersionMinor = TORCH_VERSION_MINOR;

template <typename T>
using Ptr = c10::intrusive_ptr<T>;

// Causal self-attention of q, k, v [batch, heads, time, head size]: softmax
// of q k^T / sqrt(head size), masked above the diagonal, dropout p when
// training, times v.
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            double dropout, bool training);

// Autocast on `device` (kCPU or kCUDA) to `dtype`, or off; this thread only
// (autocast state is thread-local, as in PyTorch).
void autocast_set(at::DeviceType device, bool enabled, at::ScalarType dtype);
bool autocast_is_enabled(at::DeviceType device);
at::ScalarType autocast_dtype(at::DeviceType device);
// "" when this LibTorch autocasts to `dtype` on `device`, else why not.
std::string autocast_unsupported(at::DeviceType device, at::ScalarType dtype);

// Every tensor of `tensors` times the 0-dim `factor` (on their device), in
// place: one multi-tensor kernel where LibTorch has it.
void foreach_mul_by(const std::vector<at::Tensor>& tensors, const at::Tensor& factor);

// The key under which `optimizer.state()` holds `param`'s state.
template <typename Optimizer>
auto optimizer_state_key(const Optimizer& optimizer, const at::Tensor& param) {
  using Key = typename std::decay_t<decltype(optimizer.state())>::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream address;  // what c10::guts::to_string(TensorImpl*) printed
    address << param.unsafeGetTensorImpl();
    return address.str();
  } else {
    return static_cast<Key>(param.unsafeGetTensorImpl());
  }
}

// A post hook on a parameter's gradient accumulator (autograd's
// AccumulateGrad): `hook` runs after each backward has accumulated the
// parameter's .grad. The accumulator is held while this lives (a tensor
// holds its own weakly, and a new one would have no hook); destroying this
// removes the hook. nullptr when `param` is not a leaf that requires grad.
class AccumulatorHook {
 public:
  static std::unique_ptr<AccumulatorHook> add(const at::Tensor& param, std::function<void()> hook);
  ~AccumulatorHook();
  AccumulatorHook(const AccumulatorHook&) = delete;
  AccumulatorHook& operator=(const AccumulatorHook&) = delete;

 private:
  struct Held;
  explicit AccumulatorHook(std::unique_ptr<Held> held);
  std::unique_ptr<Held> held_;
};

}  // namespace lockstep
