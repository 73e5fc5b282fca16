// Token streams for language models, read window by window from the file
// and never loaded whole (Note [Token files]): any file as bytes (text:
// vocabulary 256), nanoGPT's flat uint16 .bin, and llm.c's .bin (a header
// of 256 int32: magic 20240520 with uint16 tokens, GPT-2's; magic 20240801
// version 7 with uint32 tokens, Llama 3's). An example is a
// window of block_size + 1 consecutive tokens: x its first block_size, y
// the same shifted by one.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "lockstep/data/loader.h"

namespace lockstep {

enum class TokenFormat {
  kBytes,   // one token per byte
  kUint16,  // nanoGPT: little-endian uint16, no header
  kLlmc,    // llm.c: 256 x int32 header (magic 20240520, version 1|2, count), then uint16
  kLlmc32,  // llm.c: 256 x int32 header (magic 20240801, version 7, count), then uint32
};

// A file of tokens, mapped read-only. Shared by the windows over it.
class TokenFile {
 public:
  // kUint16 also accepts llm.c's headers (detected as 256 int32 whose
  // entries 3..255 are zero). Throws DataError naming the file: missing,
  // unreadable, not a regular file, an odd size for uint16, a header of an
  // unknown magic or version (the known ones listed), a header that lies
  // about the count.
  static std::shared_ptr<const TokenFile> open(const std::string& path, TokenFormat format);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  int64_t size() const { return count_; }  // tokens
  TokenFormat format() const { return format_; }
  const std::string& path() const { return path_; }
  // "text file '<path>'" (data.name: text, read as bytes) or "token file
  // '<path>'", for messages.
  std::string described() const;
  // Tokens [begin, begin + n) as int64 into `out`; checked against the
  // count. Throws DataError naming the file when it changed since open
  // (shrunk, rewritten or replaced: Note [Token files]).
  void read(int64_t begin, int64_t n, int64_t* out) const;
  // Throws that DataError when the file's size or identity changed since
  // open; cheap (two stat calls), done once per batch.
  void check_unchanged() const;

 private:
  TokenFile() = default;
  std::string path_;
  TokenFormat format_ = TokenFormat::kBytes;
  int fd_ = -1;
  int64_t offset_ = 0;  // bytes before the first token (llm.c's header)
  int width_ = 1;       // bytes per token
  int64_t count_ = 0;
  // What the file was at open: size, device and inode.
  int64_t bytes_ = 0;
  uint64_t dev_ = 0, ino_ = 0;
};

// Windows over tokens [begin, end) of a file: window i starts at
// begin + i * block_size, so consecutive windows share one token and every
// token but the first is a target once per epoch. Tokens at or above
// vocab_size are a DataError naming the file and the position.
class TokenWindows : public Dataset {
 public:
  TokenWindows(std::shared_ptr<const TokenFile> file, int64_t begin, int64_t end,
               int64_t block_size, int64_t vocab_size);
  int64_t size() const override { return windows_; }
  Example get(int64_t index) const override;
  Batch get_batch(const std::vector<int64_t>& indices) const override;
  std::string name() const override;
  bool file_backed() const override { return true; }
  void check_unchanged() const override { file_->check_unchanged(); }
  int64_t block_size() const { return block_size_; }
  int64_t tokens() const { return end_ - begin_; }

 private:
  void fill(int64_t index, int64_t* window) const;  // block_size + 1 tokens
  std::shared_ptr<const TokenFile> file_;
  int64_t begin_, end_, block_size_, vocab_size_, windows_;
};

// The number of windows of block_size + 1 tokens, block_size apart, in n tokens.
inline int64_t token_window_count(int64_t n, int64_t block_size) {
  return n > block_size ? (n - 1) / block_size : 0;
}

}  // namespace lockstep
