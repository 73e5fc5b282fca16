// XXH3-128 over a list of byte ranges, with the widest build of the kernel
// the CPU runs: AVX-512, AVX2 or baseline x86-64. The digest is the same
// bits from every build; the speed is not (hashing 8 MB that sit in cache,
// measured here: baseline 8.9, AVX2 19.4, AVX-512 22.0 GB/s; 1 MB: 10.3,
// 25.1, 33.6 GB/s). Debian's libxxhash is built for the baseline.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace lockstep {
namespace detail {
using Xxh3Chunks = std::vector<std::pair<const void*, size_t>>;
std::string xxh3_128_generic(const Xxh3Chunks& chunks);
std::string xxh3_128_avx2(const Xxh3Chunks& chunks);
std::string xxh3_128_avx512(const Xxh3Chunks& chunks);

enum class Xxh3Kernel { kGeneric, kAvx2, kAvx512 };
inline Xxh3Kernel xxh3_widest_kernel() {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f")) return Xxh3Kernel::kAvx512;
  if (__builtin_cpu_supports("avx2")) return Xxh3Kernel::kAvx2;
#endif
  return Xxh3Kernel::kGeneric;
}
}  // namespace detail

inline std::string xxh3_128(const detail::Xxh3Chunks& chunks) {
  static const detail::Xxh3Kernel kernel = detail::xxh3_widest_kernel();
#if defined(__x86_64__)
  if (kernel == detail::Xxh3Kernel::kAvx512) return detail::xxh3_128_avx512(chunks);
  if (kernel == detail::Xxh3Kernel::kAvx2) return detail::xxh3_128_avx2(chunks);
#endif
  return detail::xxh3_128_generic(chunks);
}

}  // namespace lockstep
