// XXH3-128 over a list of byte ranges, with the AVX2 build of the kernel
// when the CPU has it (about twice as fast as Debian's baseline libxxhash
// on the weights of a fingerprint) and the baseline build otherwise.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace lockstep {
namespace detail {
std::string xxh3_128_generic(const std::vector<std::pair<const void*, size_t>>& chunks);
std::string xxh3_128_avx2(const std::vector<std::pair<const void*, size_t>>& chunks);
}  // namespace detail

inline std::string xxh3_128(const std::vector<std::pair<const void*, size_t>>& chunks) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return detail::xxh3_128_avx2(chunks);
#endif
  return detail::xxh3_128_generic(chunks);
}

}  // namespace lockstep
