#include "lockstep/util/json.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "lockstep/util/error.h"
#include "lockstep/util/utf8.h"

namespace lockstep {

// Recursive descent over the text, appending nodes in document order
// (Note [Bounded JSON]); depth is capped, so the recursion is too.
class JsonParser {
 public:
  JsonParser(JsonDocument& doc, std::string_view text, const std::string& source, size_t max_values,
             int max_depth)
      : doc_(doc), s_(text), source_(source), max_values_(max_values), max_depth_(max_depth) {}

  void parse() {
    if (s_.substr(0, 3) == "\xEF\xBB\xBF") i_ = 3;  // a byte-order mark
    value(0);
    skip();
    if (i_ != s_.size()) fail("text after the value");
  }

 private:
  using Node = JsonDocument::Node;

  [[noreturn]] void fail(const std::string& what) const {
    throw DataError(source_ + ": not valid JSON at byte " + std::to_string(i_) + ": " + what);
  }
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void skip() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\r' || s_[i_] == '\t'))
      ++i_;
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++i_;
  }
  bool literal(std::string_view word) {
    if (s_.substr(i_, word.size()) != word) return false;
    i_ += word.size();
    return true;
  }
  // A new node (its `end` set to self + 1; containers fix theirs).
  uint32_t add(JsonKind kind, uint8_t flags, uint64_t payload) {
    if (doc_.nodes_.size() >= max_values_)
      fail("more than " + std::to_string(max_values_) + " values");
    const auto index = static_cast<uint32_t>(doc_.nodes_.size());
    doc_.nodes_.push_back(Node{kind, flags, 0, index + 1, payload});
    return index;
  }
  void value(int depth) {
    if (depth > max_depth_) fail("nested deeper than " + std::to_string(max_depth_));
    skip();
    const char c = peek();
    if (c == '{' || c == '[') return container(depth, c == '{');
    if (c == '"') return string_node();
    if (literal("true")) return (void)add(JsonKind::kBool, 1, 0);
    if (literal("false")) return (void)add(JsonKind::kBool, 0, 0);
    if (literal("null")) return (void)add(JsonKind::kNull, 0, 0);
    number();
  }
  void container(int depth, bool object) {
    const uint32_t self = add(object ? JsonKind::kObject : JsonKind::kArray, 0, 0);
    ++i_;
    skip();
    const char close = object ? '}' : ']';
    if (peek() != close) {
      for (;;) {
        skip();
        if (object) {
          if (peek() != '"') fail("expected a member's name");
          string_node();
          skip();
          expect(':');
        }
        value(depth + 1);
        skip();
        if (peek() != ',') break;
        ++i_;
      }
    }
    expect(close);
    doc_.nodes_[self].end = static_cast<uint32_t>(doc_.nodes_.size());
  }
  void number() {
    const size_t start = i_;
    if (peek() == '-') ++i_;
    if (!(peek() >= '0' && peek() <= '9')) fail("not a value");
    if (peek() == '0' && i_ + 1 < s_.size() && s_[i_ + 1] >= '0' && s_[i_ + 1] <= '9')
      fail("a number with a leading zero");
    while (peek() >= '0' && peek() <= '9') ++i_;
    bool whole = s_[start] != '-' && i_ - start <= 15;
    if (peek() == '.') {
      whole = false;
      ++i_;
      if (!(peek() >= '0' && peek() <= '9')) fail("a bad number");
      while (peek() >= '0' && peek() <= '9') ++i_;
    }
    if (peek() == 'e' || peek() == 'E') {
      whole = false;
      ++i_;
      if (peek() == '+' || peek() == '-') ++i_;
      if (!(peek() >= '0' && peek() <= '9')) fail("a bad number");
      while (peek() >= '0' && peek() <= '9') ++i_;
    }
    const double v = std::strtod(std::string(s_.substr(start, i_ - start)).c_str(), nullptr);
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof bits);
    add(JsonKind::kNumber, whole ? 1 : 0, bits);
  }
  uint32_t hex4() {
    if (i_ + 4 > s_.size()) fail("a short \\u escape");
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = s_[i_++];
      v <<= 4;
      if (c >= '0' && c <= '9') {
        v |= static_cast<uint32_t>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        v |= static_cast<uint32_t>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        v |= static_cast<uint32_t>(c - 'A' + 10);
      } else {
        fail("a bad \\u escape");
      }
    }
    return v;
  }
  void escape(std::string& out) {
    const char e = peek();
    ++i_;
    switch (e) {
      case '"':
      case '\\':
      case '/':
        out.push_back(e);
        return;
      case 'b':
        out.push_back('\b');
        return;
      case 'f':
        out.push_back('\f');
        return;
      case 'n':
        out.push_back('\n');
        return;
      case 'r':
        out.push_back('\r');
        return;
      case 't':
        out.push_back('\t');
        return;
      case 'u':
        break;
      default:
        fail("a bad escape");
    }
    uint32_t cp = hex4();
    if (cp >= 0xD800 && cp <= 0xDBFF) {
      if (i_ + 2 > s_.size() || s_[i_] != '\\' || s_[i_ + 1] != 'u') fail("a lone surrogate");
      i_ += 2;
      const uint32_t low = hex4();
      if (low < 0xDC00 || low > 0xDFFF) fail("a lone surrogate");
      cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
    } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
      fail("a lone surrogate");
    }
    append_utf8(cp, out);
  }
  // A string, unescaped into the arena (never longer than its text).
  void string_node() {
    expect('"');
    std::string& out = doc_.arena_;
    const size_t offset = out.size();
    for (;;) {
      if (i_ >= s_.size()) fail("an unterminated string");
      const char c = s_[i_++];
      if (c == '"') break;
      if (static_cast<unsigned char>(c) < 0x20) fail("a control character in a string");
      if (c == '\\') {
        escape(out);
      } else {
        out.push_back(c);
      }
    }
    const uint64_t length = out.size() - offset;
    add(JsonKind::kString, 0, (static_cast<uint64_t>(offset) << 32) | length);
  }

  JsonDocument& doc_;
  std::string_view s_;
  const std::string& source_;
  size_t max_values_;
  int max_depth_;
  size_t i_ = 0;
};

JsonDocument::JsonDocument(std::string_view text, const std::string& source, size_t max_values,
                           int max_depth)
    : source_(source) {
  if (text.size() > (size_t{1} << 31))
    throw DataError(source + ": " + std::to_string(text.size()) +
                    " bytes of JSON, over the 2 GiB read here");
  // Note [Bounded JSON]: reserved once, never grown by doubling.
  nodes_.reserve(std::min(max_values, text.size() / 2 + 2));
  arena_.reserve(text.size());
  JsonParser(*this, text, source, max_values, max_depth).parse();
}

size_t JsonDocument::reserved_bytes() const {
  return nodes_.capacity() * sizeof(Node) + arena_.capacity();
}

JsonKind JsonValue::kind() const {
  return doc_ == nullptr ? JsonKind::kNull : doc_->nodes_[node_].kind;
}

bool JsonValue::boolean() const {
  return is(JsonKind::kBool) && (doc_->nodes_[node_].flags & 1) != 0;
}

double JsonValue::number() const {
  if (!is(JsonKind::kNumber)) return 0;
  double v = 0;
  std::memcpy(&v, &doc_->nodes_[node_].payload, sizeof v);
  return v;
}

bool JsonValue::whole() const {
  return is(JsonKind::kNumber) && (doc_->nodes_[node_].flags & 1) != 0;
}

std::string_view JsonValue::text() const {
  if (!is(JsonKind::kString)) return {};
  const uint64_t p = doc_->nodes_[node_].payload;
  return std::string_view(doc_->arena_).substr(p >> 32, p & 0xFFFFFFFFu);
}

std::string_view JsonValue::key() const {
  if (doc_ == nullptr || key_ == UINT32_MAX) return {};
  return JsonValue(doc_, key_, UINT32_MAX).text();
}

JsonValue::Iterator JsonValue::begin() const {
  if (!is(JsonKind::kArray) && !is(JsonKind::kObject)) return end();
  const bool object = is(JsonKind::kObject);
  return Iterator(doc_, node_ + 1, object);
}

JsonValue::Iterator JsonValue::end() const {
  const uint32_t last = doc_ == nullptr ? 0 : doc_->nodes_[node_].end;
  return Iterator(doc_, (!is(JsonKind::kArray) && !is(JsonKind::kObject)) ? 0 : last,
                  is(JsonKind::kObject));
}

JsonValue JsonValue::Iterator::operator*() const {
  // In an object, node_ is the member's key; its value follows.
  return object_ ? JsonValue(doc_, node_ + 1, node_) : JsonValue(doc_, node_, UINT32_MAX);
}

JsonValue::Iterator& JsonValue::Iterator::operator++() {
  const uint32_t value = object_ ? node_ + 1 : node_;
  node_ = doc_->nodes_[value].end;
  return *this;
}

size_t JsonValue::size() const {
  size_t n = 0;
  for (auto it = begin(); it != end(); ++it) ++n;
  return n;
}

JsonValue JsonValue::at(size_t index) const {
  size_t n = 0;
  for (auto it = begin(); it != end(); ++it, ++n)
    if (n == index) return *it;
  return JsonValue();
}

JsonValue JsonValue::get(std::string_view name) const {
  if (!is(JsonKind::kObject)) return JsonValue();
  JsonValue found;
  for (auto it = begin(); it != end(); ++it) {
    const JsonValue v = *it;
    if (v.key() != name) continue;
    if (!found.missing())
      throw DataError(doc_->source_ + ": the key \"" + std::string(name.substr(0, 80)) +
                      "\" is given twice in one object");
    found = v;
  }
  return found;
}

}  // namespace lockstep
