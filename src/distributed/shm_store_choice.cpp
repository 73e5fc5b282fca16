#include "shm_store_choice.h"

#include <cstdlib>

#include "lockstep/util/error.h"

// Note [Choosing the stores]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// Streaming stores into the slots (Note [Streaming into the slots],
// shm_reduce.cpp) win when the ranks' cores do not share a cache: a plain
// store must first take each line from the other core, a streaming one
// writes it to memory. When they share one, the other core's reads come
// from that cache with plain stores and from memory with streaming ones,
// and plain stores win. Measured on one AMD EPYC guest whose two vCPUs
// moved between both placements over time (docs/performance.md): with
// plain stores 9-11.5 GB/s at 1-8 MiB while the cache was shared, 2.7-3.1
// when it was not; streaming 8.4-9.6 in the second state, ~7 in the first.
// Which state a rank is in is not visible from inside a guest, and changes,
// so the backend measures: per size class (a power of two of bytes) it
// keeps each kind of store's time per byte (from the operation's first
// barrier, so a late peer's arrival is not counted), as a moving average
// that weighs the newest time one half; it uses the faster, and every
// kExplore-th operation of the class the other, so that a change of state
// is seen within a few explorations. The first two operations of a class
// try one each. Both kinds write the same values: only speed depends on
// the choice, and ranks that chose differently still agree bit for bit.
// LOCKSTEP_SHM_STREAMING=on/off fixes the choice (tests, measurements).

namespace lockstep {

ShmStreaming shm_streaming_from_env() {
  const char* value = std::getenv("LOCKSTEP_SHM_STREAMING");
  if (value == nullptr) return ShmStreaming::kAuto;
  const std::string v(value);
  if (v.empty() || v == "auto") return ShmStreaming::kAuto;
  if (v == "1" || v == "on") return ShmStreaming::kOn;
  if (v == "0" || v == "off") return ShmStreaming::kOff;
  throw ConfigError("LOCKSTEP_SHM_STREAMING='" + v + "': expected auto, on (1) or off (0)");
}

std::size_t ShmStoreChoice::class_of(std::size_t bytes) {
  std::size_t c = 0;
  while (bytes > 1 && c + 1 < 64) {
    bytes >>= 1;
    ++c;
  }
  return c;
}

bool ShmStoreChoice::stream(std::size_t bytes) {
  if (mode_ != ShmStreaming::kAuto) return mode_ == ShmStreaming::kOn;
  if (bytes < kMinBytes) return false;
  Class& c = classes_[class_of(bytes)];
  const uint64_t n = c.calls++;
  if (c.ns_per_byte[1] == 0.0) return true;
  if (c.ns_per_byte[0] == 0.0) return false;
  const bool best = c.ns_per_byte[1] < c.ns_per_byte[0];
  return n % kExplore == 0 ? !best : best;
}

void ShmStoreChoice::took(std::size_t bytes, bool streamed, double seconds) {
  if (mode_ != ShmStreaming::kAuto || bytes < kMinBytes || seconds <= 0.0) return;
  double& avg = classes_[class_of(bytes)].ns_per_byte[streamed ? 1 : 0];
  const double sample = seconds * 1e9 / static_cast<double>(bytes);
  avg = avg == 0.0 ? sample : 0.5 * avg + 0.5 * sample;
}

double ShmStoreChoice::ns_per_byte(std::size_t bytes, bool streamed) const {
  return classes_[class_of(bytes)].ns_per_byte[streamed ? 1 : 0];
}

}  // namespace lockstep
