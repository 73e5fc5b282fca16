// The definitions behind torch_compat.h that need ATen's operators.
#include "lockstep/distributed/torch_compat.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>

namespace lockstep {

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            double dropout, bool training) {
  const double p = training ? dropout : 0.0;
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, p, /*is_causal=*/true);
#else
  const int64_t t = q.size(-2);
  auto att =
      at::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  const auto mask = at::ones({t, t}, q.options().dtype(at::kBool)).tril();
  att = att.masked_fill(mask.logical_not(), -std::numeric_limits<double>::infinity());
  att = at::softmax(att, -1);
  if (p > 0) att = at::dropout(att, p, /*train=*/true);
  return at::matmul(att, v);
#endif
}

}  // namespace lockstep
