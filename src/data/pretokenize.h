// The pre-tokenizers of byte-level BPE (Note [Pre-tokenizers],
// pretokenize.cpp): the character classes their patterns use and UTF-8
// decoding that takes any bytes. Private to the data layer; the scanners
// themselves are declared in lockstep/data/bpe.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace lockstep {

// A character of the text: a code point, or an invalid UTF-8 byte on its own.
struct Utf8Char {
  uint32_t cp;  // kInvalidByte: a byte that starts no valid UTF-8 sequence here
  size_t len;
};
constexpr uint32_t kInvalidByte = 0xFFFFFFFFu;

// The character at `i` (strict UTF-8: no overlongs, surrogates or values
// over U+10FFFF), or an invalid byte of length 1.
Utf8Char utf8_char_at(std::string_view s, size_t i);

// \p{L}, \p{N}, \s (Unicode's White_Space, as Python's regex module and
// Rust's regex crate read it) or anything else; an invalid byte is "other".
enum class CharClass { kLetter, kNumber, kSpace, kOther };
CharClass char_class(uint32_t cp);

}  // namespace lockstep
