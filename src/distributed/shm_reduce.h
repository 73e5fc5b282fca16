// Element-wise reductions of the shm backend: out[i] = in[0][i] op in[1][i]
// op ... in rank order, so every rank's result is the same bits and a run
// is reproducible. Loops the compiler vectorises; float16/bfloat16 are summed
// in float32 in rank order and rounded once.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstddef>

namespace lockstep {

enum class ShmOp { kSum, kAvg, kMin, kMax, kProduct };

// Throws CommError for a dtype the backend does not reduce.
void shm_reduce(void* out, const void* const* inputs, int n, std::size_t count,
                c10::ScalarType dtype, ShmOp op);

// out[i] = in[0][i] * scale + in[1][i] * scale + ... in rank order, each
// product rounded to the dtype first: the bits of multiplying every input
// by `scale` (as at::mul_ does: the scale rounded to the dtype) and then
// summing. float32 and float64 only (scaled_sum_supported).
bool scaled_sum_supported(c10::ScalarType dtype);
void shm_scaled_sum(void* out, const void* const* inputs, int n, std::size_t count,
                    c10::ScalarType dtype, double scale);

}  // namespace lockstep
