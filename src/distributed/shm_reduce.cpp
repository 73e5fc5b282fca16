#include "shm_reduce.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <string>

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

// No contraction into fused multiply-adds (the build sets
// -ffp-contract=off for this file): each product is rounded before the sum.
template <typename T>
void scaled_sum(T* out, const void* const* inputs, int n, std::size_t count, T scale) {
  constexpr std::size_t kBlock = 1024;
  T acc[kBlock];
  for (std::size_t begin = 0; begin < count; begin += kBlock) {
    const std::size_t len = std::min(kBlock, count - begin);
    const T* __restrict first = static_cast<const T*>(inputs[0]) + begin;
    for (std::size_t i = 0; i < len; ++i) acc[i] = first[i] * scale;
    for (int r = 1; r < n; ++r) {
      const T* __restrict in = static_cast<const T*>(inputs[r]) + begin;
      for (std::size_t i = 0; i < len; ++i) {
        const T product = in[i] * scale;
        acc[i] = acc[i] + product;
      }
    }
    for (std::size_t i = 0; i < len; ++i) out[begin + i] = acc[i];
  }
}

}  // namespace

bool scaled_sum_supported(c10::ScalarType dtype) {
  return dtype == c10::ScalarType::Float || dtype == c10::ScalarType::Double;
}

void shm_scaled_sum(void* out, const void* const* inputs, int n, std::size_t count,
                    c10::ScalarType dtype, double scale) {
  if (dtype == c10::ScalarType::Float)
    return scaled_sum<float>(static_cast<float*>(out), inputs, n, count, static_cast<float>(scale));
  if (dtype == c10::ScalarType::Double)
    return scaled_sum<double>(static_cast<double*>(out), inputs, n, count, scale);
  throw CommError(std::string("shm backend: a scaled sum of ") + c10::toString(dtype));
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

}  // namespace lockstep
