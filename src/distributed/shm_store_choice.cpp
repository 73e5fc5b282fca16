#include "shm_store_choice.h"

#include <algorithm>
#include <cstdlib>

#include "lockstep/util/error.h"

// Note [Choosing the stores]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// Streaming stores into the slots (Note [Streaming into the slots],
// shm_reduce.cpp) win when the ranks' cores do not share a cache: a plain
// store must first take each line from the other core, a streaming one
// writes it to memory. When they share one, the other core's reads come
// from that cache with plain stores and from memory with streaming ones,
// and plain stores win. On a guest whose two vCPUs moved between both
// states over time, each kind was well ahead in one state and well behind
// in the other (`lockstep bench allreduce` with LOCKSTEP_SHM_STREAMING
// on/off; the figures: docs/lab/shm-allreduce.md, "Note [Choosing the
// stores]"). Which state a rank is in is not visible from inside a guest,
// and changes within seconds, so the backend measures. Per size class (a
// power of two of bytes) it keeps each kind's last kKept times per byte,
// counted from the operation's start to its end less its barrier waits
// (this rank's own work: a late peer is not counted against the stores),
// and takes their minimum as the estimate:
// interference only ever makes a time longer, so a minimum ignores it,
// and the kKept-th new time after a change of state replaces the last old
// one. The first four operations of a class alternate (streamed, plain,
// streamed, plain); after that each uses the kind with the lower estimate,
// and every kExplore-th the other, so that a change is seen within one
// exploration. Every rank asks for the same operations in the same order,
// so the ranks explore together; their estimates are their own, so they
// may come to choose differently (each one's time then mixes its stores
// with the others'). Both kinds write the same values: only speed depends
// on the choice, and ranks that chose differently still agree bit for bit.
// A broadcast keeps plain stores: only its root writes, and what its
// stores cost shows in the readers' times, which the root does not see.
// Where SSE2 is missing there is nothing to choose: plain stores.
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

double ShmStoreChoice::estimate(const Kind& kind) {
  const auto n = static_cast<int>(std::min<uint64_t>(kind.taken, kKept));
  if (n == 0) return 0.0;
  return *std::min_element(kind.recent.begin(), kind.recent.begin() + n);
}

bool ShmStoreChoice::stream(std::size_t bytes) {
  if (mode_ != ShmStreaming::kAuto) return mode_ == ShmStreaming::kOn;
  if (bytes < kMinBytes) return false;
  Class& c = classes_[class_of(bytes)];
  const uint64_t n = c.calls++;
  if (n < 4) return n % 2 == 0;
  const double plain = estimate(c.kinds[0]), streamed = estimate(c.kinds[1]);
  if (streamed == 0.0) return true;  // a kind whose operations all failed
  if (plain == 0.0) return false;
  const bool best = streamed < plain;
  return n % kExplore == 0 ? !best : best;
}

bool ShmStoreChoice::took(std::size_t bytes, bool streamed, double seconds) {
  if (mode_ != ShmStreaming::kAuto || bytes < kMinBytes || seconds <= 0.0) return false;
  Kind& kind = classes_[class_of(bytes)].kinds[streamed ? 1 : 0];
  kind.recent[kind.taken % kKept] = seconds * 1e9 / static_cast<double>(bytes);
  ++kind.taken;
  return true;
}

double ShmStoreChoice::ns_per_byte(std::size_t bytes, bool streamed) const {
  return estimate(classes_[class_of(bytes)].kinds[streamed ? 1 : 0]);
}

}  // namespace lockstep
