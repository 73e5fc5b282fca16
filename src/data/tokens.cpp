#include "lockstep/data/tokens.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "lockstep/util/error.h"

// Note [Token files]
// ~~~~~~~~~~~~~~~~~~
// A token file is read window by window with pread(), so a 10 GB file costs
// what the windows in flight hold, not its size; the page cache does the
// rest. Nothing is scanned at open: the vocabulary is checked on each
// window as it is read, naming the position of a token outside it. llm.c's
// header is checked against the file size before anything is read.
//
// A dataset rewritten under a running job (a user regenerating train.bin)
// is an error naming the file on every rank, never a signal: a memory map
// of a file that shrinks faults with SIGBUS (exit 135, no file named), so
// the file is read with pread(), whose short read is an error, and its size
// (fstat of the open descriptor) and identity (stat of the path: another
// file renamed over it) are compared with those at open: at every batch,
// and before every training step by the trainer on every rank with one
// agreed verdict (agree_on_failure), so every rank stops at the same step
// with the same words, before reading a window of the new file.
// Modification times are not compared: a `touch`, or a copy that keeps
// the bytes, is not a change worth stopping a job for; a rewrite of the
// same size in place is not seen while running (state.yaml's data_id sees
// it at the next resume).
//
// llm.c's headers: 256 little-endian int32, [magic, version, token count,
// 0...]. 20240520 with version 1 or 2 holds uint16 tokens (GPT-2's
// tokenizer), 20240801 with version 7 uint32 (Llama 3's). A header is
// recognised by a date-like magic (20000101 to 29991231), a positive
// version and its zero tail (entries 3..255), which no token stream holds
// by chance; one with another such magic
// or version is refused, listing the known ones, rather than read as
// nanoGPT's uint16 (header and half-tokens trained on).

namespace lockstep {
namespace {

constexpr int32_t kLlmcMagic = 20240520;    // uint16 tokens, versions 1 and 2
constexpr int32_t kLlmc32Magic = 20240801;  // uint32 tokens, version 7
constexpr std::size_t kLlmcHeader = 256 * sizeof(int32_t);
constexpr const char* kKnownHeaders =
    "known: llm.c's magic 20240520 version 1 or 2 (uint16 tokens) and magic 20240801 version 7 "
    "(uint32 tokens); nanoGPT's .bin has no header";

int32_t int32_at(const unsigned char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return static_cast<int32_t>(v);
}

// pread until `n` bytes or the end; returns the bytes read, -1 on error.
ssize_t read_at(int fd, unsigned char* out, std::size_t n, int64_t offset) {
  std::size_t done = 0;
  while (done < n) {
    const ssize_t got =
        ::pread(fd, out + done, n - done, static_cast<off_t>(offset) + static_cast<off_t>(done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return -1;
    if (got == 0) break;
    done += static_cast<std::size_t>(got);
  }
  return static_cast<ssize_t>(done);
}

}  // namespace

std::string TokenFile::described() const {
  return std::string(format_ == TokenFormat::kBytes ? "text" : "token") + " file '" + path_ + "'";
}

std::shared_ptr<const TokenFile> TokenFile::open(const std::string& path, TokenFormat format) {
  auto fail = [&](const std::string& why) {
    return DataError(std::string(format == TokenFormat::kBytes ? "text" : "token") + " file '" +
                     path + "': " + why);
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw fail(std::strerror(errno));
  std::shared_ptr<TokenFile> file(new TokenFile());  // closes fd from here on
  file->fd_ = fd;
  file->path_ = path;
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) throw fail("not a regular file");
  const auto size = static_cast<std::size_t>(st.st_size);
  if (size == 0) throw fail("empty: no tokens");
  file->bytes_ = static_cast<int64_t>(size);
  file->dev_ = static_cast<uint64_t>(st.st_dev);
  file->ino_ = static_cast<uint64_t>(st.st_ino);
  file->format_ = format;
  if (format == TokenFormat::kBytes) {
    file->count_ = static_cast<int64_t>(size);
    return file;
  }
  std::vector<unsigned char> head;
  if (size >= kLlmcHeader) {
    head.resize(kLlmcHeader);
    if (read_at(fd, head.data(), kLlmcHeader, 0) != static_cast<ssize_t>(kLlmcHeader))
      throw fail(std::string("cannot read its first 1024 bytes: ") + std::strerror(errno));
  }
  // A date-like magic (llm.c's are YYYYMMDD), a positive version, a count,
  // then zeros: no nanoGPT stream starts so.
  const int32_t magic0 = head.empty() ? 0 : int32_at(head.data());
  bool header =
      !head.empty() && magic0 >= 20000101 && magic0 <= 29991231 && int32_at(head.data() + 4) > 0;
  for (std::size_t i = 3; header && i < 256; ++i) header = int32_at(head.data() + 4 * i) == 0;
  if ((format == TokenFormat::kLlmc || format == TokenFormat::kLlmc32) && !header)
    throw fail(std::string("no llm.c header (256 int32: magic, version, count, then zeros); ") +
               kKnownHeaders);
  if (header) {
    const int32_t magic = int32_at(head.data()), version = int32_at(head.data() + 4);
    const int64_t count = int32_at(head.data() + 8);
    if (magic == kLlmcMagic && (version == 1 || version == 2)) {
      file->format_ = TokenFormat::kLlmc;
      file->width_ = 2;
    } else if (magic == kLlmc32Magic && version == 7) {
      file->format_ = TokenFormat::kLlmc32;
      file->width_ = 4;
    } else {
      throw fail("an llm.c-style header with magic " + std::to_string(magic) + " and version " +
                 std::to_string(version) + ", which lockstep does not know (" + kKnownHeaders +
                 ")");
    }
    const auto width = static_cast<std::size_t>(file->width_);
    // llm.c writes the header and exactly its count of tokens: fewer is a
    // truncated file, more (or a stray byte) one whose tail training would
    // silently leave out.
    if (count < 0) throw fail("the llm.c header announces a negative token count");
    if (kLlmcHeader + width * static_cast<std::size_t>(count) != size) {
      const std::size_t held = (size - kLlmcHeader) / width;
      const bool stray = (size - kLlmcHeader) % width != 0;
      throw fail("the llm.c header announces " + std::to_string(count) +
                 " tokens but the file holds " + std::to_string(held) +
                 (stray ? " and a stray byte" : "") +
                 (held < static_cast<std::size_t>(count) ? " (truncated?)"
                                                         : " (its tail would go unread)"));
    }
    file->offset_ = static_cast<int64_t>(kLlmcHeader);
    file->count_ = count;
    return file;
  }
  if (size % 2 != 0)
    throw fail("an odd size (" + std::to_string(size) +
               " bytes) for uint16 tokens: not a nanoGPT .bin (for text use data.name: text)");
  file->width_ = 2;
  file->count_ = static_cast<int64_t>(size / 2);
  return file;
}

TokenFile::~TokenFile() {
  if (fd_ >= 0) ::close(fd_);
}

void TokenFile::check_unchanged() const {
  struct stat now {};
  std::string what;
  if (fstat(fd_, &now) != 0) {
    what = std::string("cannot stat it: ") + std::strerror(errno);
  } else if (static_cast<int64_t>(now.st_size) != bytes_) {
    what = "its size changed from " + std::to_string(bytes_) + " to " +
           std::to_string(static_cast<int64_t>(now.st_size)) + " bytes";
  } else {
    struct stat named {};
    if (::stat(path_.c_str(), &named) != 0)
      what = std::string("it was removed (") + std::strerror(errno) + ")";
    else if (static_cast<uint64_t>(named.st_dev) != dev_ ||
             static_cast<uint64_t>(named.st_ino) != ino_)
      what = "another file was put in its place";
  }
  if (!what.empty())
    throw DataError(described() + " changed under the running job: " + what +
                    ". Do not rewrite a dataset a job reads; restart the job on the new data "
                    "(checkpoint.resume with checkpoint.allow_data_change: true to continue "
                    "from a checkpoint)");
}

void TokenFile::read(int64_t begin, int64_t n, int64_t* out) const {
  if (begin < 0 || n < 0 || begin > count_ - n)
    throw InternalError(described() + ": tokens [" + std::to_string(begin) + ", " +
                        std::to_string(begin + n) + ") outside its " + std::to_string(count_));
  const auto bytes = static_cast<std::size_t>(n) * static_cast<std::size_t>(width_);
  std::vector<unsigned char> buf(bytes);
  const ssize_t got = read_at(fd_, buf.data(), bytes, offset_ + begin * width_);
  if (got != static_cast<ssize_t>(bytes)) {
    check_unchanged();  // the usual reason: it shrank
    throw DataError(described() + ": cannot read tokens [" + std::to_string(begin) + ", " +
                    std::to_string(begin + n) +
                    "): " + (got < 0 ? std::strerror(errno) : "the file ends early"));
  }
  const unsigned char* p = buf.data();
  switch (width_) {
    case 1:
      for (int64_t i = 0; i < n; ++i) out[i] = p[i];
      break;
    case 2:
      for (int64_t i = 0; i < n; ++i) out[i] = p[2 * i] | (p[2 * i + 1] << 8);
      break;
    default:
      for (int64_t i = 0; i < n; ++i)
        out[i] = static_cast<int64_t>(static_cast<uint32_t>(int32_at(p + 4 * i)));
  }
}

TokenWindows::TokenWindows(std::shared_ptr<const TokenFile> file, int64_t begin, int64_t end,
                           int64_t block_size, int64_t vocab_size)
    : file_(std::move(file)),
      begin_(begin),
      end_(end),
      block_size_(block_size),
      vocab_size_(vocab_size),
      windows_(token_window_count(end - begin, block_size)) {
  if (begin_ < 0 || end_ < begin_ || end_ > file_->size() || block_size_ < 1 || vocab_size_ < 1)
    throw InternalError("token windows [" + std::to_string(begin_) + ", " + std::to_string(end_) +
                        ") of '" + file_->path() + "'");
}

std::string TokenWindows::name() const {
  return file_->path();
}

void TokenWindows::fill(int64_t index, int64_t* window) const {
  if (index < 0 || index >= windows_)
    throw InternalError("window " + std::to_string(index) + " of " + std::to_string(windows_));
  const int64_t start = begin_ + index * block_size_;
  file_->read(start, block_size_ + 1, window);
  for (int64_t i = 0; i <= block_size_; ++i) {
    if (window[i] >= vocab_size_)
      throw DataError(file_->described() + ": token " + std::to_string(window[i]) +
                      " at position " + std::to_string(start + i) +
                      " is outside the vocabulary of " + std::to_string(vocab_size_) +
                      " (data.vocab_size)");
  }
}

Example TokenWindows::get(int64_t index) const {
  file_->check_unchanged();
  auto window = at::empty({block_size_ + 1}, at::kLong);
  fill(index, window.data_ptr<int64_t>());
  return {window.narrow(0, 0, block_size_).clone(), window.narrow(0, 1, block_size_).clone()};
}

Batch TokenWindows::get_batch(const std::vector<int64_t>& indices) const {
  const auto n = static_cast<int64_t>(indices.size());
  file_->check_unchanged();
  auto windows = at::empty({n, block_size_ + 1}, at::kLong);
  int64_t* data = windows.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) fill(indices[i], data + i * (block_size_ + 1));
  return {windows.narrow(1, 0, block_size_).contiguous(),
          windows.narrow(1, 1, block_size_).contiguous()};
}

}  // namespace lockstep
