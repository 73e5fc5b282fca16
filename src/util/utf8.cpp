#include "lockstep/util/utf8.h"

#include <cstdio>

namespace lockstep {
namespace {

constexpr const char* kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// The length of a character that starts with `lead`, or 0 when no character
// starts with it (a continuation byte, 0xC0/0xC1, 0xF5 and above).
std::size_t length_from(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

// Whether `byte` may follow `pending` (Unicode's table 3-7: no overlong
// forms, no surrogates, nothing above U+10FFFF).
bool may_continue(const std::string& pending, unsigned char byte) {
  if ((byte & 0xC0) != 0x80) return false;
  if (pending.size() != 1) return true;
  const auto lead = static_cast<unsigned char>(pending[0]);
  if (lead == 0xE0) return byte >= 0xA0;
  if (lead == 0xED) return byte <= 0x9F;
  if (lead == 0xF0) return byte >= 0x90;
  if (lead == 0xF4) return byte <= 0x8F;
  return true;
}

}  // namespace

void Utf8Stream::flush_invalid() {
  out_(kReplacement);
  ++replaced_;
  pending_.clear();
  need_ = 0;
}

void Utf8Stream::put(unsigned char byte) {
  if (!pending_.empty()) {
    if (may_continue(pending_, byte)) {
      pending_.push_back(static_cast<char>(byte));
      if (pending_.size() == need_) {
        out_(pending_);
        pending_.clear();
        need_ = 0;
      }
      return;
    }
    flush_invalid();  // the character broke off; the byte starts afresh
  }
  const std::size_t n = length_from(byte);
  if (n == 0) {
    out_(kReplacement);
    ++replaced_;
  } else if (n == 1) {
    out_(std::string(1, static_cast<char>(byte)));
  } else {
    pending_.assign(1, static_cast<char>(byte));
    need_ = n;
  }
}

void Utf8Stream::finish() {
  if (!pending_.empty()) flush_invalid();
}

std::string json_quoted(const std::string& raw) {
  std::string text;
  Utf8Stream utf8([&](const std::string& s) { text += s; });
  for (const unsigned char c : raw) utf8.put(c);
  utf8.finish();
  std::string out = "\"";
  for (const unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
      out += escaped;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool utf8_valid(const std::string& text) {
  Utf8Stream utf8([](const std::string&) {});
  for (const unsigned char c : text) utf8.put(c);
  utf8.finish();
  return utf8.replaced() == 0;
}

}  // namespace lockstep
