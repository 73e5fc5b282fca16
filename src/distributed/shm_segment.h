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
#include <vector>

namespace lockstep {

// What an all-reduce reduces, published with its first arrival (Note
// [Buckets in shared memory], shm_backend.cpp): a buffer every rank maps
// (region 0: none), the byte range in it, and the dtype and operation.
struct ShmDescriptor {
  uint64_t region = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  uint64_t kind = 0;
  uint64_t scale = 0;  // a double's bits
  bool operator==(const ShmDescriptor& o) const {
    return region == o.region && offset == o.offset && bytes == o.bytes && kind == o.kind &&
           scale == o.scale;
  }
};

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
  // Once every rank's pid is published: holds a pidfd of each other rank,
  // so that wait_all sees a death at once, reaped or not (a zombie's pid
  // still answers kill(pid, 0)), and never mistakes a reused pid for it.
  // Without pidfds (kernels before 5.3), /proc/<pid>/stat's state decides.
  void watch_peers(int me);
  bool peer_alive(int rank) const;
  // Whether `pid` has not ended, by /proc: a zombie (ended, not yet reaped)
  // has. The fallback of peer_alive, and remove_orphans' test.
  static bool process_running(int pid);
  // This rank leaves (its backend is destroyed): waiters learn it at once.
  void depart(int rank);

  // Arrival at barrier number `generation` (the same on every rank).
  void arrive(int rank, uint32_t generation);
  // This rank's descriptor, written before an arrival and read by the others
  // after it (the arrival's store releases it).
  void describe(int rank, const ShmDescriptor& d);
  ShmDescriptor described(int rank) const;
  // Waits until every rank has arrived at `generation`: spinning for up to
  // `spin` per rank waited for, then sleeping on its futex (Note [How long
  // to spin], shm_backend.cpp), or sleeping at once for a rank that last
  // arrived on the CPU this thread runs on (Note [A peer on the same core]),
  // which `*shared_core` counts. Returns "" or why it gave up: a rank that
  // left or died (its pid is gone), the deadline, or `stop`.
  std::string wait_all(uint32_t generation, std::chrono::steady_clock::time_point deadline,
                       const std::atomic<bool>& stop, std::chrono::microseconds spin,
                       int64_t* shared_core = nullptr) const;

 private:
  ShmSegment(void* base, std::size_t size, int world, std::size_t chunk);
  struct Header;
  struct alignas(64) Flag {
    std::atomic<uint32_t> arrived;
    std::atomic<uint32_t> sleepers;
    std::atomic<int32_t> cpu;            // 1 + the CPU of the rank's last arrival; 0: not known
    std::atomic<uint64_t> described[5];  // ShmDescriptor's fields
  };
  Header* header() const;
  Flag* flag(int rank) const;

  static constexpr int kGone = -2;  // a pidfd slot whose process had ended already

  void* base_ = nullptr;
  std::size_t size_ = 0;
  int world_ = 0;
  std::size_t chunk_ = 0;
  std::vector<int> pidfds_;  // by rank; -1 where not watched
};

// The name of a segment rank 0 created, unlinked when this goes out of
// scope and by SIGTERM, SIGINT or SIGHUP before that (Note [Segment name]).
class ShmName {
 public:
  explicit ShmName(std::string name);
  ~ShmName();
  ShmName(const ShmName&) = delete;
  ShmName& operator=(const ShmName&) = delete;
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  bool armed_ = false;
};

}  // namespace lockstep
