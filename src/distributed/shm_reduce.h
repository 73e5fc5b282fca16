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

// Whether shm_reduce_lines takes a scale for this dtype (float32, float64).
bool scaled_sum_supported(c10::ScalarType dtype);

// The reduction of `n` inputs (in rank order, with shm_reduce's arithmetic;
// scale != 1, a SUM of float32/float64 only: each input times `scale`,
// rounded to the dtype as at::mul_ rounds it, then summed) written into
// each of `m` outputs, one 64-byte line at a time: a line is read from every
// input and written into every output before the next (Note [Reducing a
// line into every copy]). An output may be one of the inputs.
struct ShmLines {
  const void* const* inputs;
  int n;
  void* const* outputs;
  int m;
  // Bit r set: output r is written with streaming stores (Note [Streaming
  // into the slots]) where a line of outputs[0] is whole and output r's
  // address there is 16-byte aligned (outputs[0]'s always is), plainly
  // elsewhere; fenced before the call returns. The same bits either way.
  unsigned streamed = 0;
};
void shm_reduce_lines(const ShmLines& lines, std::size_t count, c10::ScalarType dtype, ShmOp op,
                      double scale);

// In place over `n` copies of `count` elements (each rank's copy of a
// bucket's range, at the same offset in every buffer): element i of every
// copy becomes the reduction of all copies' element i (shm_reduce_lines
// with the copies as inputs and outputs).
void shm_reduce_copies(void* const* copies, int n, std::size_t count, c10::ScalarType dtype,
                       ShmOp op, double scale);

// memcpy, but with streaming (non-temporal) stores where `to` allows it,
// fenced before it returns: for lines another core reads next (Note
// [Streaming into the slots]). Plain memcpy where SSE2 is not there.
void shm_stream_copy(void* to, const void* from, std::size_t bytes);

// Whether streaming stores exist here (SSE2); without them both of the
// above store plainly.
bool shm_streaming_supported();

}  // namespace lockstep
