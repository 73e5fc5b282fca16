// The shared-memory segment of the shm backend (Note [Shared-memory
// backend], shm_backend.cpp): a header with each rank's pid, one arrival
// flag per rank (a futex word), and double-buffered data areas (one slot per
// rank plus one result area, each `chunk` bytes). Plain POSIX, no LibTorch.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace lockstep {

class ShmSegment {
 public:
  static constexpr int kMaxRanks = 256;

  // Local rank 0 creates the segment (O_EXCL, 0600, space reserved with
  // posix_fallocate so that a full /dev/shm is an error now, not a SIGBUS
  // later); the others open it. Throws CommError/ConfigError naming the name.
  static ShmSegment create(const std::string& name, int world, std::size_t chunk);
  static ShmSegment open(const std::string& name, int world, std::size_t chunk);
  // Removes the name; the mapping stays valid until every rank unmaps it.
  static void unlink(const std::string& name);
  // Removes lockstep segments whose creator (the pid at the end of the
  // name) is gone: what a SIGKILL between create and unlink left behind.
  static int remove_orphans();

  ShmSegment(ShmSegment&& other) noexcept;
  ShmSegment& operator=(ShmSegment&&) = delete;
  ~ShmSegment();

  int world() const { return world_; }
  std::size_t chunk() const { return chunk_; }
  // Data areas of buffer set `set` (0 or 1): rank r's slot, and the result.
  char* slot(int set, int rank) const;
  char* result(int set) const;

  void publish_pid(int rank);
  int pid_of(int rank) const;
  // This rank leaves (its backend is destroyed): waiters learn it at once.
  void depart(int rank);

  // Arrival at barrier number `generation` (the same on every rank).
  void arrive(int rank, uint32_t generation);
  // Waits until every rank has arrived at `generation`. Returns "" or why it
  // gave up: a rank that left or died (its pid is gone), the deadline, or `stop`.
  std::string wait_all(uint32_t generation, std::chrono::steady_clock::time_point deadline,
                       const std::atomic<bool>& stop) const;

 private:
  ShmSegment(void* base, std::size_t size, int world, std::size_t chunk);
  struct Header;
  struct alignas(64) Flag {
    std::atomic<uint32_t> arrived;
    std::atomic<uint32_t> sleepers;
  };
  Header* header() const;
  Flag* flag(int rank) const;

  void* base_ = nullptr;
  std::size_t size_ = 0;
  int world_ = 0;
  std::size_t chunk_ = 0;
};

}  // namespace lockstep
