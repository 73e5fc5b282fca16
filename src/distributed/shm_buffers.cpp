#include "shm_buffers.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "lockstep/util/error.h"

namespace lockstep {
namespace {

std::string mib(std::size_t bytes) {
  return std::to_string((bytes + (1 << 20) - 1) >> 20) + " MiB";
}

}  // namespace

std::unique_ptr<ShmBuffer> ShmBuffer::create(const std::string& name, std::size_t bytes, int world,
                                             int me) {
  struct statvfs v {};
  if (statvfs("/dev/shm", &v) != 0)
    throw ConfigError(std::string("cannot read /dev/shm's free space: ") + std::strerror(errno));
  const std::size_t free_bytes = static_cast<std::size_t>(v.f_bavail) * v.f_frsize;
  if (bytes > free_bytes / 2 / static_cast<std::size_t>(world))
    throw ConfigError("the " + std::to_string(world) + " ranks' copies (" +
                      mib(bytes * static_cast<std::size_t>(world)) +
                      ") would take more than half of /dev/shm's " + mib(free_bytes) + " free");
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) throw CommError("cannot create /dev/shm" + name + ": " + std::strerror(errno));
  std::unique_ptr<ShmBuffer> buffer(new ShmBuffer(bytes, world));
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0 ||
      (errno = posix_fallocate(fd, 0, static_cast<off_t>(bytes))) != 0) {
    const int err = errno;
    close(fd);
    shm_unlink(name.c_str());
    throw ConfigError("/dev/shm" + name + " could not reserve " + mib(bytes) + ": " +
                      std::strerror(err));
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) {
    shm_unlink(name.c_str());
    throw CommError("cannot map /dev/shm" + name + ": " + std::strerror(errno));
  }
  buffer->bases_[me] = base;
  return buffer;
}

ShmBuffer::~ShmBuffer() {
  for (void* base : bases_)
    if (base != nullptr) munmap(base, bytes_);
}

void ShmBuffer::map_peer(int rank, const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) throw CommError("cannot open /dev/shm" + name + ": " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) != bytes_) {
    close(fd);
    throw CommError("/dev/shm" + name + " is " + std::to_string(st.st_size) +
                    " bytes where this rank expects " + std::to_string(bytes_));
  }
  void* base = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED)
    throw CommError("cannot map /dev/shm" + name + ": " + std::strerror(errno));
  bases_[rank] = base;
}

void ShmBuffers::add(uint64_t id, std::shared_ptr<ShmBuffer> buffer) {
  std::lock_guard<std::mutex> lock(mutex_);
  buffers_.emplace_back(id, std::move(buffer));
}

void ShmBuffers::remove(uint64_t id) {
  std::shared_ptr<ShmBuffer> gone;  // unmapped outside the lock
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = buffers_.begin(); it != buffers_.end(); ++it) {
    if (it->first != id) continue;
    gone = std::move(it->second);
    buffers_.erase(it);
    return;
  }
}

std::optional<ShmBuffers::Found> ShmBuffers::find(const void* data, std::size_t bytes,
                                                  int me) const {
  const auto at = reinterpret_cast<std::uintptr_t>(data);
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [id, buffer] : buffers_) {
    const auto base = reinterpret_cast<std::uintptr_t>(buffer->base(me));
    if (at >= base && bytes <= buffer->bytes() && at - base <= buffer->bytes() - bytes)
      return Found{id, static_cast<std::size_t>(at - base), buffer};
  }
  return std::nullopt;
}

}  // namespace lockstep
