// Buffers that every rank of one host maps (Note [Buckets in shared
// memory], shm_backend.cpp): each rank's own /dev/shm file and the others'.
// Plain POSIX, no LibTorch; the backend agrees on them collectively.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace lockstep {

// One rank's view of one shared buffer: its own mapping and the others'.
class ShmBuffer {
 public:
  // Creates this rank's file `name` of `bytes` (O_EXCL, 0600, space
  // reserved with posix_fallocate: a full /dev/shm is an error now, not a
  // SIGBUS later) and maps it. Refuses (ConfigError) a buffer whose `world`
  // files would take more than half of /dev/shm's free space.
  static std::unique_ptr<ShmBuffer> create(const std::string& name, std::size_t bytes, int world,
                                           int me);
  ~ShmBuffer();
  ShmBuffer(const ShmBuffer&) = delete;
  ShmBuffer& operator=(const ShmBuffer&) = delete;

  // Maps rank `rank`'s file; throws CommError when it is missing or not
  // `bytes()` long.
  void map_peer(int rank, const std::string& name);
  char* base(int rank) const { return static_cast<char*>(bases_[rank]); }
  std::size_t bytes() const { return bytes_; }

 private:
  ShmBuffer(std::size_t bytes, int world) : bases_(world, nullptr), bytes_(bytes) {}
  std::vector<void*> bases_;
  std::size_t bytes_;
};

// The shared buffers a backend made, found by address. Shared with the
// tensors over them, whose deleters remove theirs (unmapping it here).
class ShmBuffers {
 public:
  void add(uint64_t id, std::shared_ptr<ShmBuffer> buffer);
  void remove(uint64_t id);
  struct Found {
    uint64_t id;
    std::size_t offset;
    std::shared_ptr<ShmBuffer> buffer;
  };
  // The buffer whose own mapping holds [data, data + bytes), if any.
  std::optional<Found> find(const void* data, std::size_t bytes, int me) const;

 private:
  mutable std::mutex mutex_;
  std::vector<std::pair<uint64_t, std::shared_ptr<ShmBuffer>>> buffers_;
};

}  // namespace lockstep
