// This core's matrix-product peak: the GFLOP/s of large square products
// (LibTorch's own kernels: OpenBLAS or MKL in float32, oneDNN in bfloat16),
// the limit a model's achieved FLOP/s is measured against (MFU).
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>

namespace lockstep {

// The best of a few timed n x n x n products (2 n^3 floating-point
// operations each; a @ b, a @ b^T and a^T @ b in turn, Note [Every layout
// of the product]) over about `seconds`, after one untimed each. Uses the
// threads LibTorch is set to (1 per rank under lockstep-run). On a GPU
// (`device` not the CPU) the products run there and are timed in groups
// that end in a synchronisation (Note [Timing on a GPU]); a GPU wants
// n = kGpuMatmulPeakN to reach its peak.
double matmul_peak_gflops(at::ScalarType dtype, int64_t n = 1024, double seconds = 0.5,
                          c10::Device device = c10::Device(c10::kCPU));

// The product size at which a GPU's peak is measured (8192: an H100/H200
// reaches ~80% of its datasheet's dense bf16 figure there, as log.mfu
// measured it in scripts/gpu_check.sh's GPT steps).
inline constexpr int64_t kGpuMatmulPeakN = 8192;

}  // namespace lockstep
