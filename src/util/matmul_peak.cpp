#include "lockstep/util/matmul_peak.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <array>
#include <chrono>

namespace lockstep {

// Note [Every layout of the product]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Which kernel ATen picks depends on the operands' layout, and on a core
// without bf16 instructions the difference is large: there a bf16 a @ b
// can run several times slower than a @ b^T or a^T @ b, where float32
// runs all three alike. A linear layer's forward is x @ w^T, its backward
// the other two, so a peak timed on one layout can put the GPT's bf16 MFU
// far above 100%. The peak is the best of the three. (The measurements:
// docs/lab/gpt-demo.md, "Note [Every layout of the product]".)
//
// Note [Timing on a GPU]
// ~~~~~~~~~~~~~~~~~~~~~~
// A GPU's products are queued, not run, when mm_out returns: a group of 5
// products is timed from the host up to a synchronisation (copying one
// element to the host waits for the stream), and the group's time per
// product counted. The copy's few microseconds are under 1% of a group of
// 8192-sized products (~1.4 ms each in bf16 on an H200: ~784 TFLOP/s, the
// peak log.mfu measured in scripts/gpu_check.sh's first device run,
// docs/lab/gpu-runs.md).
double matmul_peak_gflops(at::ScalarType dtype, int64_t n, double seconds, c10::Device device) {
  const auto options = at::TensorOptions().dtype(dtype).device(device);
  const bool host = device.is_cpu();
  // Made where they are used (8192^2 on one CPU thread would take seconds).
  const auto a = host ? at::randn({n, n}).to(options) : at::randn({n, n}, options);
  const auto b = host ? at::randn({n, n}).to(options) : at::randn({n, n}, options);
  const int group = host ? 1 : 5;
  const auto sync = [&](const at::Tensor& t) {
    if (!host) (void)t.view({-1}).narrow(0, 0, 1).cpu();
  };
  const std::array<std::pair<at::Tensor, at::Tensor>, 3> layouts{{{a, b}, {a, b.t()}, {a.t(), b}}};
  auto c = at::empty({n, n}, options);
  for (const auto& [x, y] : layouts) at::mm_out(c, x, y);  // warm: kernels chosen
  sync(c);
  using Clock = std::chrono::steady_clock;
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  double best = 0;
  int runs = 0;
  while (runs < static_cast<int>(layouts.size()) || Clock::now() < end) {
    const auto& [x, y] = layouts[runs % layouts.size()];
    const auto start = Clock::now();
    for (int g = 0; g < group; ++g) at::mm_out(c, x, y);
    sync(c);
    const double s = std::chrono::duration<double>(Clock::now() - start).count() / group;
    best = std::max(best, 2.0 * static_cast<double>(n) * n * n / s / 1e9);
    if (++runs >= 3000) break;
  }
  return best;
}

}  // namespace lockstep
