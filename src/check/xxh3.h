// XXH3-128 over a list of byte ranges, at once or streamed, with the widest
// build of the kernel the CPU runs: AVX-512, AVX2 or baseline x86-64. The
// digest is the same bits from every build; the speed is not: on data in
// cache the AVX2 and AVX-512 builds are far faster than the baseline (the
// measurements: docs/lab/ddp-bench.md, "XXH3's builds (src/check/xxh3.h)").
// Debian's libxxhash is built for the baseline.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace lockstep {
namespace detail {
using Xxh3Chunks = std::vector<std::pair<const void*, size_t>>;

// Room for xxhash's XXH3_state_t (576 bytes in 0.8; checked where it is known).
struct alignas(64) Xxh3State {
  unsigned char bytes[640];
};

#define LOCKSTEP_XXH3_KERNEL(name)                                     \
  std::string name(const Xxh3Chunks& chunks);                          \
  void name##_reset(Xxh3State* state);                                 \
  void name##_update(Xxh3State* state, const void* data, size_t size); \
  std::string name##_digest(const Xxh3State* state);
LOCKSTEP_XXH3_KERNEL(xxh3_128_generic)
LOCKSTEP_XXH3_KERNEL(xxh3_128_avx2)
LOCKSTEP_XXH3_KERNEL(xxh3_128_avx512)
#undef LOCKSTEP_XXH3_KERNEL

enum class Xxh3Kernel { kGeneric, kAvx2, kAvx512 };
inline Xxh3Kernel xxh3_widest_kernel() {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f")) return Xxh3Kernel::kAvx512;
  if (__builtin_cpu_supports("avx2")) return Xxh3Kernel::kAvx2;
#endif
  return Xxh3Kernel::kGeneric;
}

struct Xxh3Functions {
  std::string (*all)(const Xxh3Chunks&);
  void (*reset)(Xxh3State*);
  void (*update)(Xxh3State*, const void*, size_t);
  std::string (*digest)(const Xxh3State*);
};
inline const Xxh3Functions& xxh3_functions() {
  static const Xxh3Functions kFunctions = [] {
    switch (xxh3_widest_kernel()) {
#if defined(__x86_64__)
      case Xxh3Kernel::kAvx512:
        return Xxh3Functions{xxh3_128_avx512, xxh3_128_avx512_reset, xxh3_128_avx512_update,
                             xxh3_128_avx512_digest};
      case Xxh3Kernel::kAvx2:
        return Xxh3Functions{xxh3_128_avx2, xxh3_128_avx2_reset, xxh3_128_avx2_update,
                             xxh3_128_avx2_digest};
#endif
      default:
        return Xxh3Functions{xxh3_128_generic, xxh3_128_generic_reset, xxh3_128_generic_update,
                             xxh3_128_generic_digest};
    }
  }();
  return kFunctions;
}
}  // namespace detail

inline std::string xxh3_128(const detail::Xxh3Chunks& chunks) {
  return detail::xxh3_functions().all(chunks);
}

// XXH3-128 fed piece by piece: the same digest as xxh3_128 over the pieces.
class Xxh3Stream {
 public:
  Xxh3Stream() { detail::xxh3_functions().reset(&state_); }
  void update(const void* data, size_t size) {
    detail::xxh3_functions().update(&state_, data, size);
  }
  std::string digest() const { return detail::xxh3_functions().digest(&state_); }

 private:
  detail::Xxh3State state_;
};

}  // namespace lockstep
