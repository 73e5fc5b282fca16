// The shared-memory backend's options (shm_backend.h), apart from it so that
// the process group's, init's and the config's defaults come from here.
#pragma once

#include <chrono>
#include <cstddef>

#include "lockstep/util/timeouts.h"
#include "lockstep/util/units.h"

namespace lockstep {

struct ShmOptions {
  // Bytes moved per step through each rank's slot (dist.shm_chunk_mb): a
  // multiple of 64, at least 4096. The segment holds 2 x (ranks + 1) chunks.
  // 256 KiB: a step's lines stay in the cores' caches (Note [The chunk's
  // size], shm_backend.cpp).
  std::size_t chunk_bytes = kMiB / 4;
  // A rank that does not arrive within this time fails the collective; a
  // rank whose process is gone fails it at once.
  std::chrono::milliseconds timeout{kCollectiveTimeout};
};

// A chunk of `mib` MiB, rounded down to a multiple of 64 bytes.
constexpr std::size_t shm_chunk_bytes_from_mib(double mib) {
  return mib_to_bytes(mib) / 64 * 64;
}

}  // namespace lockstep
