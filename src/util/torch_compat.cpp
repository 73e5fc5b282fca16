// The definitions behind util/torch_compat.h that need ATen's operators.
#include "lockstep/util/torch_compat.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <cmath>
#include <limits>

namespace lockstep {

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            double dropout, bool training) {
  const double p = training ? dropout : 0.0;
#if TORCH_VERSION_MAJOR >= 2
  if (q.device().is_cpu() && (q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf)) {
    // Autocast hands SDPA bf16/fp16 on the CPU, where 2.6's flash kernel in
    // those dtypes runs several times slower than in float32 at the GPT
    // demo's shape (the measurements: docs/lab/amp.md, "Mixed precision").
    // In float32 and back: faster, and no less exact. Autocast would cast
    // the float32 inputs down again (SDPA is on its lower-precision list):
    // its key is excluded for this one call, as its own wrappers do.
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
    const auto f32 = [](const at::Tensor& t) { return t.to(at::kFloat); };
    return at::scaled_dot_product_attention(f32(q), f32(k), f32(v), /*attn_mask=*/{}, p,
                                            /*is_causal=*/true)
        .to(q.scalar_type());
  }
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, p, /*is_causal=*/true);
#else
  // One product does the scaling and the causal mask: baddbmm adds a
  // [t, t] bias of 0 (kept) and -inf (masked) to scale x q k^T, the same
  // values as the written-out matmul, scale and masked_fill that PyTorch's
  // 1.13 GPT runs, without their two passes over the [b, h, t, t] scores
  // forward and backward (docs/lab/gpt-demo.md).
  const int64_t t = q.size(-2), hs = q.size(-1);
  const auto lead = q.sizes().slice(0, q.dim() - 2);
  const auto rows = [&](const at::Tensor& z) { return z.reshape({-1, z.size(-2), z.size(-1)}); };
  const auto bias = at::full({t, t}, -std::numeric_limits<double>::infinity(), q.options()).triu(1);
  auto att = at::baddbmm(bias, rows(q), rows(k).transpose(1, 2), /*beta=*/1,
                         /*alpha=*/1.0 / std::sqrt(static_cast<double>(hs)));
  att = at::softmax(att, -1);
  if (p > 0) att = at::dropout(att, p, /*train=*/true);
  std::vector<int64_t> shape(lead.begin(), lead.end());
  shape.push_back(t);
  shape.push_back(v.size(-1));
  return at::bmm(att, rows(v)).view(shape);
#endif
}

void foreach_mul_by(const std::vector<at::Tensor>& tensors, const at::Tensor& factor) {
#if TORCH_VERSION_MAJOR >= 2 && (TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 1)
  at::_foreach_mul_(tensors, factor);
#else
  for (const auto& t : tensors) t.mul_(factor);
#endif
}

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define LOCKSTEP_AUTOCAST_BY_DEVICE 1
#else
#define LOCKSTEP_AUTOCAST_BY_DEVICE 0
#endif

void autocast_set(at::DeviceType device, bool enabled, at::ScalarType dtype) {
#if LOCKSTEP_AUTOCAST_BY_DEVICE
  at::autocast::set_autocast_enabled(device, enabled);
  at::autocast::set_autocast_dtype(device, dtype);
#else
  if (device == at::kCUDA) {
    at::autocast::set_enabled(enabled);
    at::autocast::set_autocast_gpu_dtype(dtype);
  } else {
    at::autocast::set_cpu_enabled(enabled);
    at::autocast::set_autocast_cpu_dtype(dtype);
  }
#endif
}

bool autocast_is_enabled(at::DeviceType device) {
#if LOCKSTEP_AUTOCAST_BY_DEVICE
  return at::autocast::is_autocast_enabled(device);
#else
  return device == at::kCUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
#endif
}

at::ScalarType autocast_dtype(at::DeviceType device) {
#if LOCKSTEP_AUTOCAST_BY_DEVICE
  return at::autocast::get_autocast_dtype(device);
#else
  return device == at::kCUDA ? at::autocast::get_autocast_gpu_dtype()
                             : at::autocast::get_autocast_cpu_dtype();
#endif
}

std::string autocast_unsupported(at::DeviceType device, at::ScalarType dtype) {
  if (device != at::kCPU && device != at::kCUDA) {
    return std::string("autocast on ") + c10::DeviceTypeName(device) +
           " is not supported by lockstep (cpu and cuda are)";
  }
  if (dtype != at::kBFloat16 && dtype != at::kHalf) {
    return std::string("autocast to ") + c10::toString(dtype) +
           " is not supported (bfloat16 and float16 are)";
  }
  if (device == at::kCPU && dtype == at::kHalf && !LOCKSTEP_AUTOCAST_BY_DEVICE) {
    return std::string("float16 autocast on the CPU needs LibTorch 2.4 or later (this is ") +
           TORCH_VERSION + ", whose CPU autocast knows bfloat16 only)";
  }
  return "";
}

struct AccumulatorHook::Held {
  decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>())) node;
  uintptr_t key = 0;
};

AccumulatorHook::AccumulatorHook(std::unique_ptr<Held> held) : held_(std::move(held)) {}

std::unique_ptr<AccumulatorHook> AccumulatorHook::add(const at::Tensor& param,
                                                      std::function<void()> hook) {
  auto held = std::make_unique<Held>();
  held->node = torch::autograd::impl::grad_accumulator(param);
  if (!held->node) return nullptr;
  held->key = held->node->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
      [hook = std::move(hook)](const torch::autograd::variable_list& outputs,
                               const torch::autograd::variable_list&) {
        hook();
        return outputs;
      }));
  return std::unique_ptr<AccumulatorHook>(new AccumulatorHook(std::move(held)));
}

AccumulatorHook::~AccumulatorHook() {
  if (held_ && held_->node) held_->node->del_post_hook(held_->key);
}

}  // namespace lockstep
