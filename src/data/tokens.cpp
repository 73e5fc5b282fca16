#include "lockstep/data/tokens.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "lockstep/util/error.h"

// Note [Token files]
// ~~~~~~~~~~~~~~~~~~
// A token file is mapped read-only and read window by window, so a 10 GB
// file costs what the windows in flight touch, not its size: the kernel
// pages in what is read and may drop it again (MADV_RANDOM: no read-ahead
// beyond the window). Nothing is scanned at open: the vocabulary is checked
// on each window as it is read, naming the position of a token outside it.
// llm.c's header is checked against the file size before anything is read.
// What cannot be guarded against is the file shrinking while it is mapped
// (another process truncating it): reads past its new end fault (SIGBUS),
// as they would for any mmap reader; do not rewrite a dataset under a run.

namespace lockstep {
namespace {

constexpr int32_t kLlmcMagic = 20240520;
constexpr std::size_t kLlmcHeader = 256 * sizeof(int32_t);

int32_t int32_at(const unsigned char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return static_cast<int32_t>(v);
}

}  // namespace

std::shared_ptr<const TokenFile> TokenFile::open(const std::string& path, TokenFormat format) {
  auto fail = [&](const std::string& why) {
    return DataError("token file '" + path + "': " + why);
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw fail(std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw fail("not a regular file");
  }
  const auto size = static_cast<std::size_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    throw fail("empty: no tokens");
  }
  void* base = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  if (base == MAP_FAILED) throw fail(std::string("cannot map it: ") + std::strerror(err));
  madvise(base, size, MADV_RANDOM);

  std::shared_ptr<TokenFile> file(new TokenFile());
  file->path_ = path;
  file->base_ = static_cast<const unsigned char*>(base);
  file->mapped_ = size;
  file->tokens_ = file->base_;
  file->format_ = format;
  if (format == TokenFormat::kBytes) {
    file->count_ = static_cast<int64_t>(size);
    return file;
  }
  const bool llmc = size >= kLlmcHeader && int32_at(file->base_) == kLlmcMagic;
  if (format == TokenFormat::kLlmc && !llmc)
    throw fail("no llm.c header (magic " + std::to_string(kLlmcMagic) + ")");
  if (llmc) {
    const int32_t version = int32_at(file->base_ + 4);
    const int64_t count = int32_at(file->base_ + 8);
    if (version != 1 && version != 2)
      throw fail("llm.c header version " + std::to_string(version) + " (expected 1 or 2)");
    if (count < 0 || kLlmcHeader + 2 * static_cast<std::size_t>(count) > size)
      throw fail("the llm.c header announces " + std::to_string(count) + " tokens but the file " +
                 "holds " + std::to_string((size - kLlmcHeader) / 2) + " (truncated?)");
    file->format_ = TokenFormat::kLlmc;
    file->tokens_ = file->base_ + kLlmcHeader;
    file->count_ = count;
    return file;
  }
  if (size % 2 != 0)
    throw fail("an odd size (" + std::to_string(size) +
               " bytes) for uint16 tokens: not a nanoGPT .bin (for text use data.name: text)");
  file->count_ = static_cast<int64_t>(size / 2);
  return file;
}

TokenFile::~TokenFile() {
  if (base_ != nullptr) munmap(const_cast<unsigned char*>(base_), mapped_);
}

void TokenFile::read(int64_t begin, int64_t n, int64_t* out) const {
  if (begin < 0 || n < 0 || begin > count_ - n)
    throw InternalError("token file '" + path_ + "': tokens [" + std::to_string(begin) + ", " +
                        std::to_string(begin + n) + ") outside its " + std::to_string(count_));
  if (format_ == TokenFormat::kBytes) {
    for (int64_t i = 0; i < n; ++i) out[i] = tokens_[begin + i];
    return;
  }
  const unsigned char* p = tokens_ + 2 * begin;
  for (int64_t i = 0; i < n; ++i) out[i] = p[2 * i] | (p[2 * i + 1] << 8);
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
      throw DataError("token file '" + file_->path() + "': token " + std::to_string(window[i]) +
                      " at position " + std::to_string(start + i) +
                      " is outside the vocabulary of " + std::to_string(vocab_size_) +
                      " (data.vocab_size)");
  }
}

Example TokenWindows::get(int64_t index) const {
  auto window = at::empty({block_size_ + 1}, at::kLong);
  fill(index, window.data_ptr<int64_t>());
  return {window.narrow(0, 0, block_size_).clone(), window.narrow(0, 1, block_size_).clone()};
}

Batch TokenWindows::get_batch(const std::vector<int64_t>& indices) const {
  const auto n = static_cast<int64_t>(indices.size());
  auto windows = at::empty({n, block_size_ + 1}, at::kLong);
  int64_t* data = windows.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) fill(indices[i], data + i * (block_size_ + 1));
  return {windows.narrow(1, 0, block_size_).contiguous(),
          windows.narrow(1, 1, block_size_).contiguous()};
}

}  // namespace lockstep
