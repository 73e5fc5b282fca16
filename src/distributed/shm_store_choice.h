// Which stores the shm backend's collectives that go through the segment
// (a private tensor's all-reduce, reduce-scatter, all-gather) write their
// slots and result areas with: plain or streaming, chosen by measuring
// (Note [Choosing the stores], shm_store_choice.cpp). Plain C++, no LibTorch.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace lockstep {

enum class ShmStreaming { kAuto, kOn, kOff };

// LOCKSTEP_SHM_STREAMING: unset or "auto", "1"/"on", "0"/"off". Throws
// ConfigError naming the variable and its value for anything else.
ShmStreaming shm_streaming_from_env();

class ShmStoreChoice {
 public:
  explicit ShmStoreChoice(ShmStreaming mode = ShmStreaming::kAuto) : mode_(mode) {}

  // Below this an operation writes with plain stores and is not measured.
  static constexpr std::size_t kMinBytes = std::size_t{64} << 10;
  // One operation in this many of a size class tries the other stores.
  static constexpr uint64_t kExplore = 16;

  // Whether the next operation of `bytes` streams. Every rank asks for the
  // same operations in the same order, so every rank tries the other
  // stores in the same operation.
  bool stream(std::size_t bytes);
  // How long that operation took: from its start to its end, less the time
  // it waited in barriers. Whether the time was recorded (auto, kMinBytes
  // or more).
  bool took(std::size_t bytes, bool streamed, double seconds);

  // The estimate of nanoseconds per byte for the size class of `bytes`, by
  // stores: the least of the last kKept times (0: not measured yet).
  double ns_per_byte(std::size_t bytes, bool streamed) const;

 private:
  // The last kKept times per byte of each kind (plain, streamed); the
  // estimate is their minimum (Note [Choosing the stores]).
  static constexpr int kKept = 4;
  struct Kind {
    std::array<double, kKept> recent{};
    uint64_t taken = 0;  // how many were ever recorded
  };
  struct Class {
    Kind kinds[2];
    uint64_t calls = 0;
  };
  static std::size_t class_of(std::size_t bytes);
  static double estimate(const Kind& kind);

  ShmStreaming mode_;
  std::array<Class, 64> classes_{};
};

}  // namespace lockstep
