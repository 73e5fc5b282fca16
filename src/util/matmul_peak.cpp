#include "lockstep/util/matmul_peak.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>

namespace lockstep {

double matmul_peak_gflops(at::ScalarType dtype, int64_t n, double seconds) {
  const auto options = at::TensorOptions().dtype(dtype);
  const auto a = at::randn({n, n}).to(options);
  const auto b = at::randn({n, n}).to(options);
  auto c = at::mm(a, b);  // warm: kernels chosen, buffers touched
  using Clock = std::chrono::steady_clock;
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  double best = 0;
  int runs = 0;
  while (runs < 3 || Clock::now() < end) {
    const auto start = Clock::now();
    at::mm_out(c, a, b);
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    best = std::max(best, 2.0 * static_cast<double>(n) * n * n / s / 1e9);
    if (++runs >= 1000) break;
  }
  return best;
}

}  // namespace lockstep
