#include "lockstep/util/fs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

#include "lockstep/util/error.h"

namespace lockstep {

void make_directories(const std::string& path) {
  for (size_t pos = 1; pos <= path.size(); ++pos) {
    if (pos == path.size() || path[pos] == '/') {
      const std::string prefix = path.substr(0, pos);
      if (mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
        throw DataError("cannot create '" + prefix + "': " + std::strerror(errno));
      }
    }
  }
}

int open_regular_file(const std::string& path, uint64_t* size) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw DataError("cannot open '" + path + "': " + std::strerror(errno));
  struct stat info {};
  if (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    close(fd);
    throw DataError("'" + path + "' is not a regular file");
  }
  if (size != nullptr) *size = static_cast<uint64_t>(info.st_size);
  return fd;
}

std::string read_regular_file(const std::string& path, size_t max_bytes) {
  uint64_t size = 0;
  const int fd = open_regular_file(path, &size);
  if (size > max_bytes) {
    close(fd);
    throw DataError("'" + path + "' is " + std::to_string(size) + " bytes, over the " +
                    std::to_string(max_bytes) + " read whole here");
  }
  std::string bytes(static_cast<size_t>(size), '\0');
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  close(fd);
  if (done != bytes.size()) {
    throw DataError("cannot read '" + path + "' whole (it changed while being read?)");
  }
  return bytes;
}

namespace {
// "ENOSPC: No space left on device (the disk holding it is full)": the
// errno's name too, so a full disk is plain whatever the locale.
std::string write_errno_text(int err) {
  if (err == ENOSPC) return "ENOSPC: no space left on device (the disk holding it is full)";
  if (err == EDQUOT) return "EDQUOT: disk quota exceeded";
  return std::strerror(err);
}
}  // namespace

FileWriter::FileWriter(std::string path) : path_(std::move(path)) {
  fd_ = open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw StorageError("cannot create '" + path_ + "': " + write_errno_text(errno));
}

FileWriter::~FileWriter() {
  if (fd_ >= 0) close(fd_);
}

void FileWriter::append(const void* data, size_t size) {
  const char* bytes = static_cast<const char*>(data);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd_, bytes + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      throw StorageError("cannot write '" + path_ + "': " + write_errno_text(err));
    }
    done += static_cast<size_t>(n);
  }
}

void FileWriter::finish() {
  const int synced = fsync(fd_);
  const int sync_err = errno;
  const int closed = close(fd_);
  const int close_err = errno;
  fd_ = -1;
  if (closed != 0 || synced != 0) {
    throw StorageError("cannot write '" + path_ +
                       "': " + write_errno_text(synced != 0 ? sync_err : close_err));
  }
}

void write_file(const std::string& path, const std::string& bytes) {
  FileWriter file(path);
  file.append(bytes.data(), bytes.size());
  file.finish();
}

void write_file_replacing(const std::string& path, const std::string& bytes) {
  write_file_replacing(path, [&](FileWriter& file) { file.append(bytes.data(), bytes.size()); });
}

void write_file_replacing(const std::string& path, const std::function<void(FileWriter&)>& write) {
  const std::string tmp = path + ".tmp";
  try {
    FileWriter file(tmp);
    write(file);
    file.finish();
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    throw StorageError("cannot rename '" + tmp + "' to '" + path + "': " + write_errno_text(err));
  }
}

std::string absolute_path(const std::string& path) {
  std::error_code error;
  const auto absolute = std::filesystem::absolute(path, error);
  return error ? path : absolute.lexically_normal().string();
}

bool path_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace lockstep
