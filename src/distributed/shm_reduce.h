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

}  // namespace lockstep
