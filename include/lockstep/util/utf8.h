// Bytes streamed out as UTF-8 text: a byte-level language model emits one
// byte at a time, and a character may take up to four of them, or the model
// may emit bytes that are no UTF-8 at all. Utf8Stream passes complete, valid
// characters on as they form and replaces each invalid sequence with U+FFFD,
// counting them, so the output is always valid UTF-8. Plain C++.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace lockstep {

class Utf8Stream {
 public:
  explicit Utf8Stream(std::function<void(const std::string&)> out) : out_(std::move(out)) {}
  void put(unsigned char byte);  // passes on what became complete
  void finish();                 // an unfinished character at the end: U+FFFD
  std::size_t replaced() const { return replaced_; }

 private:
  void flush_invalid();
  std::function<void(const std::string&)> out_;
  std::string pending_;   // the bytes of a character begun
  std::size_t need_ = 0;  // its length
  std::size_t replaced_ = 0;
};

// `raw` as a JSON string: quoted, escaped, and valid UTF-8 (bytes that are
// no UTF-8, as a path may hold, become U+FFFD).
std::string json_quoted(const std::string& raw);

// Appends code point `cp` (below 0x110000, no surrogate) as UTF-8.
void append_utf8(uint32_t cp, std::string& out);

// Whether `text` is valid UTF-8 throughout (what Utf8Stream would pass on
// unchanged).
bool utf8_valid(const std::string& text);

}  // namespace lockstep
