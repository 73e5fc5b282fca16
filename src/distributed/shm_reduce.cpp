#include "shm_reduce.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "lockstep/util/error.h"

namespace lockstep {
namespace {

template <typename T, typename Acc, typename Combine>
void combine(T* __restrict out, const void* const* inputs, int n, std::size_t count, Combine f) {
  constexpr std::size_t kBlock = 1024;  // keeps the accumulator block in L1
  Acc acc[kBlock];
  for (std::size_t begin = 0; begin < count; begin += kBlock) {
    const std::size_t len = std::min(kBlock, count - begin);
    const T* __restrict first = static_cast<const T*>(inputs[0]) + begin;
    for (std::size_t i = 0; i < len; ++i) acc[i] = static_cast<Acc>(first[i]);
    for (int r = 1; r < n; ++r) {
      const T* __restrict in = static_cast<const T*>(inputs[r]) + begin;
      for (std::size_t i = 0; i < len; ++i) acc[i] = f(acc[i], static_cast<Acc>(in[i]));
    }
    for (std::size_t i = 0; i < len; ++i) out[begin + i] = static_cast<T>(acc[i]);
  }
}

template <typename T, typename Acc>
void reduce_typed(void* out, const void* const* inputs, int n, std::size_t count, ShmOp op) {
  T* o = static_cast<T*>(out);
  switch (op) {
    case ShmOp::kSum:
      return combine<T, Acc>(o, inputs, n, count, [](Acc a, Acc b) { return a + b; });
    case ShmOp::kAvg:
      combine<T, Acc>(o, inputs, n, count, [](Acc a, Acc b) { return a + b; });
      // As the Gloo path does it: the sum, then one division (truncating for integers).
      for (std::size_t i = 0; i < count; ++i)
        o[i] = static_cast<T>(static_cast<Acc>(o[i]) / static_cast<Acc>(n));
      return;
    case ShmOp::kMin:
      return combine<T, Acc>(o, inputs, n, count, [](Acc a, Acc b) { return b < a ? b : a; });
    case ShmOp::kMax:
      return combine<T, Acc>(o, inputs, n, count, [](Acc a, Acc b) { return a < b ? b : a; });
    case ShmOp::kProduct:
      return combine<T, Acc>(o, inputs, n, count, [](Acc a, Acc b) { return a * b; });
  }
}

// Note [Reducing a line into every copy]
// An all-reduce in place (Note [Buckets in shared memory], shm_backend.cpp)
// reduces each line of a rank's share over every rank's copy and writes the
// result into every copy at once, one 64-byte line at a time: each line
// comes from the core that wrote it and goes back while this core still
// holds it, not in a later pass (as when a block is reduced into scratch
// and then copied into each output). The segment path's reduction writes
// the shared result and the rank's own tensor the same way. The arithmetic
// per element is combine()'s (with a scale, each product rounded before
// the sum: -ffp-contract=off for this file): the same bits. One build of
// the kernel serves every vector width: what it waits for is lines
// crossing between cores, not arithmetic. (The experiments behind this
// choice: docs/lab/shm-allreduce.md, "Note [Reducing a line into every
// copy]".)
//
// Note [Streaming into the slots]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The segment's slots and result areas are written by one core and read by
// another, and the next time round written again by the first: each store
// into a line the other core read last must first take that line from the
// other core's cache. Streaming stores write the line to memory without
// reading it first: where the two cores share no cache, they move several
// times the bytes per second into such lines that memcpy, an AVX2 loop or
// rep movsb do, and the other core reads the streamed lines faster from
// memory than it reads plain ones from the writer's cache
// (scripts/bench_cross_core.sh measures both; the figures:
// docs/lab/shm-allreduce.md, "Note [Streaming into the slots]"). So a
// collective through the segment may write its slot and the result area
// with streaming stores (where they are faster: Note [Choosing the
// stores], shm_store_choice.cpp), and its own tensor (read next by this
// core) always with plain ones. The stores are weakly ordered: an sfence
// before the barrier's release makes them visible first. Values are
// untouched: the same bits either way.
#if defined(__SSE2__)
inline bool stream_line(void* to, const void* line) {
  if (reinterpret_cast<std::uintptr_t>(to) % 16 != 0) return false;
  auto* d = static_cast<__m128i*>(to);
  const auto* s = static_cast<const __m128i*>(line);
  for (int i = 0; i < 4; ++i) _mm_stream_si128(d + i, _mm_loadu_si128(s + i));
  return true;
}
inline void stream_fence() {
  _mm_sfence();
}
constexpr bool kStreaming = true;
#else
inline bool stream_line(void*, const void*) {
  return false;
}
inline void stream_fence() {}
constexpr bool kStreaming = false;
#endif

template <typename T, typename Acc, typename Load, typename Combine, typename Finish>
__attribute__((always_inline)) inline void reduce_line(const ShmLines& lines, std::size_t at,
                                                       std::size_t len, Load load, Combine f,
                                                       Finish finish) {
  constexpr std::size_t kLine = 64 / sizeof(T);
  Acc acc[kLine];
  const T* __restrict first = static_cast<const T*>(lines.inputs[0]) + at;
  for (std::size_t i = 0; i < len; ++i) acc[i] = load(first[i]);
  for (int r = 1; r < lines.n; ++r) {
    const T* __restrict in = static_cast<const T*>(lines.inputs[r]) + at;
    for (std::size_t i = 0; i < len; ++i) acc[i] = f(acc[i], load(in[i]));
  }
  T result[kLine];
  for (std::size_t i = 0; i < len; ++i) result[i] = finish(acc[i]);
  for (int r = 0; r < lines.m; ++r) {
    T* __restrict out = static_cast<T*>(lines.outputs[r]) + at;
    if (len == kLine && (lines.streamed >> r & 1u) != 0 && stream_line(out, result)) continue;
    for (std::size_t i = 0; i < len; ++i) out[i] = result[i];
  }
}

template <typename T, typename Acc, typename Load, typename Combine, typename Finish>
void reduce_lines(const ShmLines& lines, std::size_t count, Load load, Combine f, Finish finish) {
  constexpr std::size_t kLine = 64 / sizeof(T);
  // Up to the first output's line boundary, then whole lines (a constant
  // length: vector code), then the rest.
  const auto address = reinterpret_cast<std::uintptr_t>(lines.outputs[0]);
  const std::size_t head = std::min(count, ((64 - address % 64) % 64) / sizeof(T));
  if (head > 0) reduce_line<T, Acc>(lines, 0, head, load, f, finish);
  std::size_t at = head;
  for (; at + kLine <= count; at += kLine) reduce_line<T, Acc>(lines, at, kLine, load, f, finish);
  if (at < count) reduce_line<T, Acc>(lines, at, count - at, load, f, finish);
  if (lines.streamed != 0) stream_fence();
}

template <typename T, typename Acc>
void reduce_lines_typed(const ShmLines& lines, std::size_t count, ShmOp op) {
  auto load = [](T x) { return static_cast<Acc>(x); };
  auto round = [](Acc a) { return static_cast<T>(a); };
  const int n = lines.n;
  switch (op) {
    case ShmOp::kSum:
      return reduce_lines<T, Acc>(
          lines, count, load, [](Acc a, Acc b) { return a + b; }, round);
    case ShmOp::kAvg:
      // As combine() then its division: the sum rounded to T, then divided.
      return reduce_lines<T, Acc>(
          lines, count, load, [](Acc a, Acc b) { return a + b; },
          [n](Acc a) {
            return static_cast<T>(static_cast<Acc>(static_cast<T>(a)) / static_cast<Acc>(n));
          });
    case ShmOp::kMin:
      return reduce_lines<T, Acc>(
          lines, count, load, [](Acc a, Acc b) { return b < a ? b : a; }, round);
    case ShmOp::kMax:
      return reduce_lines<T, Acc>(
          lines, count, load, [](Acc a, Acc b) { return a < b ? b : a; }, round);
    case ShmOp::kProduct:
      return reduce_lines<T, Acc>(
          lines, count, load, [](Acc a, Acc b) { return a * b; }, round);
  }
}

template <typename T>
void scaled_lines(const ShmLines& lines, std::size_t count, T scale) {
  reduce_lines<T, T>(
      lines, count, [scale](T x) { return x * scale; }, [](T a, T b) { return a + b; },
      [](T a) { return a; });
}

}  // namespace

bool scaled_sum_supported(c10::ScalarType dtype) {
  return dtype == c10::ScalarType::Float || dtype == c10::ScalarType::Double;
}

void shm_reduce(void* out, const void* const* inputs, int n, std::size_t count,
                c10::ScalarType dtype, ShmOp op) {
  switch (dtype) {
    case c10::ScalarType::Float:
      return reduce_typed<float, float>(out, inputs, n, count, op);
    case c10::ScalarType::Double:
      return reduce_typed<double, double>(out, inputs, n, count, op);
    case c10::ScalarType::Half:
      return reduce_typed<c10::Half, float>(out, inputs, n, count, op);
    case c10::ScalarType::BFloat16:
      return reduce_typed<c10::BFloat16, float>(out, inputs, n, count, op);
    case c10::ScalarType::Int:
      return reduce_typed<int32_t, int32_t>(out, inputs, n, count, op);
    case c10::ScalarType::Long:
      return reduce_typed<int64_t, int64_t>(out, inputs, n, count, op);
    case c10::ScalarType::Byte:
      return reduce_typed<uint8_t, uint8_t>(out, inputs, n, count, op);
    case c10::ScalarType::Char:
      return reduce_typed<int8_t, int8_t>(out, inputs, n, count, op);
    default:
      throw CommError(std::string("shm backend: all-reduce of ") + c10::toString(dtype) +
                      " is not supported (float32/64, float16, bfloat16, int8/32/64, uint8)");
  }
}

void shm_reduce_lines(const ShmLines& lines, std::size_t count, c10::ScalarType dtype, ShmOp op,
                      double scale) {
  if (lines.n < 1 || lines.m < 1)
    throw CommError("shm backend: a reduction with no input or output");
  if (scale != 1.0) {
    if (op != ShmOp::kSum || !scaled_sum_supported(dtype))
      throw CommError(std::string("shm backend: a scaled ") + (op == ShmOp::kSum ? "sum" : "op") +
                      " of " + c10::toString(dtype));
    if (dtype == c10::ScalarType::Float)
      return scaled_lines<float>(lines, count, static_cast<float>(scale));
    return scaled_lines<double>(lines, count, scale);
  }
  switch (dtype) {
    case c10::ScalarType::Float:
      return reduce_lines_typed<float, float>(lines, count, op);
    case c10::ScalarType::Double:
      return reduce_lines_typed<double, double>(lines, count, op);
    case c10::ScalarType::Half:
      return reduce_lines_typed<c10::Half, float>(lines, count, op);
    case c10::ScalarType::BFloat16:
      return reduce_lines_typed<c10::BFloat16, float>(lines, count, op);
    case c10::ScalarType::Int:
      return reduce_lines_typed<int32_t, int32_t>(lines, count, op);
    case c10::ScalarType::Long:
      return reduce_lines_typed<int64_t, int64_t>(lines, count, op);
    case c10::ScalarType::Byte:
      return reduce_lines_typed<uint8_t, uint8_t>(lines, count, op);
    case c10::ScalarType::Char:
      return reduce_lines_typed<int8_t, int8_t>(lines, count, op);
    default:
      throw CommError(std::string("shm backend: all-reduce of ") + c10::toString(dtype) +
                      " is not supported (float32/64, float16, bfloat16, int8/32/64, uint8)");
  }
}

bool shm_streaming_supported() {
  return kStreaming;
}

void shm_stream_copy(void* to, const void* from, std::size_t bytes) {
  auto* d = static_cast<char*>(to);
  const auto* s = static_cast<const char*>(from);
  const std::size_t head = std::min(bytes, (64 - reinterpret_cast<std::uintptr_t>(d) % 64) % 64);
  std::memcpy(d, s, head);
  std::size_t at = head;
  bool streamed = false;
  for (; at + 64 <= bytes; at += 64) {
    if (!stream_line(d + at, s + at)) break;
    streamed = true;
  }
  std::memcpy(d + at, s + at, bytes - at);
  if (streamed) stream_fence();
}

void shm_reduce_copies(void* const* copies, int n, std::size_t count, c10::ScalarType dtype,
                       ShmOp op, double scale) {
  shm_reduce_lines({copies, n, copies, n}, count, dtype, op, scale);
}

}  // namespace lockstep
