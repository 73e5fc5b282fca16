// Small filesystem helpers shared by the launcher (no LibTorch) and the library.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>

namespace lockstep {

// mkdir -p: creates `path` and its missing parents. Throws DataError naming
// the component that could not be created and why.
void make_directories(const std::string& path);

// Opens `path` for reading if it is a regular file (not a folder, a device
// or a FIFO: refused before a byte is read) and returns the descriptor,
// which the caller closes; `size`, when given, receives the file's size.
// Throws DataError naming the path and why.
int open_regular_file(const std::string& path, uint64_t* size = nullptr);

// Reads a whole regular file (not a folder, a device such as /dev/zero, or a
// FIFO: those are refused before a byte is read). Throws DataError naming
// the path and why; a file over `max_bytes` is refused unread.
std::string read_regular_file(const std::string& path,
                              size_t max_bytes = std::numeric_limits<size_t>::max());

// Writes `bytes` to `path` (created or truncated) and fsyncs it. Every byte
// is checked: a full disk (ENOSPC), a quota or an I/O error is a DataError
// naming the file and the errno, never a silently short file.
void write_file(const std::string& path, const std::string& bytes);
// The same, streamed: created (truncated) at construction, each append()
// written through, finish() syncs and closes; StorageError naming the path
// (ENOSPC said plainly) from any of them. Destroyed unfinished, it closes.
class FileWriter {
 public:
  explicit FileWriter(std::string path);
  ~FileWriter();
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;
  void append(const void* data, size_t size);
  void finish();

 private:
  std::string path_;
  int fd_ = -1;
};
// write_file_replacing, streamed: `write` appends to PATH.tmp (not to be
// finished by it), renamed over `path` once it is whole.
void write_file_replacing(const std::string& path, const std::function<void(FileWriter&)>& write);
// write_file to `path`.tmp, then renamed over `path`: a failure leaves no
// half-written `path` (the temporary is removed).
void write_file_replacing(const std::string& path, const std::string& bytes);

// `path` made absolute against the working directory (normalised), for
// messages a user may paste into a config from anywhere; `path` itself when
// the working directory cannot be read.
std::string absolute_path(const std::string& path);

// Whether something exists at `path`, and whether it is a folder (stat).
bool path_exists(const std::string& path);
bool is_directory(const std::string& path);

}  // namespace lockstep
