// The one conversion between the MiB a config or a flag speaks and the bytes
// the code counts (bucket caps, shared-memory chunks).
#pragma once

#include <cstddef>

namespace lockstep {

constexpr std::size_t kMiB = std::size_t{1} << 20;

constexpr std::size_t mib_to_bytes(double mib) {
  return static_cast<std::size_t>(mib * static_cast<double>(kMiB));
}

constexpr double bytes_to_mib(std::size_t bytes) {
  return static_cast<double>(bytes) / static_cast<double>(kMiB);
}

}  // namespace lockstep
