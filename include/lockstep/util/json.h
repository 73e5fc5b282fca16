// JSON (RFC 8259) read from untrusted bytes into a compact document: every
// value one 16-byte node in one array, strings in one arena. Readers of
// vocabulary files (data/bpe.cpp) and Hugging Face config files walk it
// through JsonValue. Plain C++ (no LibTorch): fuzzed as it is.
//
// Note [Bounded JSON]
// ~~~~~~~~~~~~~~~~~~~
// A tree of std::vector/std::string nodes costs ~100 bytes a value plus the
// vectors' doubling: a 6 MB file of "[0,0,0,...]" (3 million values) held
// ~0.7 GB before it was refused. Here a value costs one 16-byte node, and
// the node array is reserved once from the text's size (a value takes at
// least one byte of text, and an array's or object's separators one more:
// at most (n + 1) / 2 + 1 nodes), so it never grows by doubling; strings
// are unescaped into an arena no longer than the text. So a document costs
// at most about 9 bytes per byte of text (reserved; resident only as
// touched), whatever the text holds, and `max_values` caps the nodes below
// that: the parser refuses the value past it before storing it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace lockstep {

class JsonDocument;

enum class JsonKind : uint8_t { kNull, kBool, kNumber, kString, kArray, kObject };

// A value inside a JsonDocument (which must outlive it). A missing value
// (get() of an absent key, or of a non-object) is null() and kind kNull.
class JsonValue {
 public:
  JsonValue() = default;  // missing
  JsonKind kind() const;
  bool missing() const { return doc_ == nullptr; }
  bool is(JsonKind k) const { return kind() == k; }
  bool boolean() const;           // false unless kBool true
  double number() const;          // 0 unless kNumber
  bool whole() const;             // a kNumber written as a non-negative integer of <= 15 digits
  std::string_view text() const;  // "" unless kString
  // Arrays: elements; objects: members (key(), value()) in file order.
  size_t size() const;
  JsonValue at(size_t index) const;  // the index-th element (linear)
  // The member named `key` (linear); DataError naming the document when
  // the object names it twice (which one is meant is anyone's guess).
  JsonValue get(std::string_view key) const;
  // Iteration over an array's elements or an object's values; key() of an
  // object member's value is its name.
  class Iterator {
   public:
    JsonValue operator*() const;
    Iterator& operator++();
    bool operator!=(const Iterator& o) const { return node_ != o.node_; }

   private:
    friend class JsonValue;
    Iterator(const JsonDocument* doc, uint32_t node, bool object)
        : doc_(doc), node_(node), object_(object) {}
    const JsonDocument* doc_;
    uint32_t node_;
    bool object_;
  };
  Iterator begin() const;
  Iterator end() const;
  std::string_view key() const;  // the member's name, for values inside an object

 private:
  friend class JsonDocument;
  JsonValue(const JsonDocument* doc, uint32_t node, uint32_t key_node)
      : doc_(doc), node_(node), key_(key_node) {}
  const JsonDocument* doc_ = nullptr;
  uint32_t node_ = 0;
  uint32_t key_ = UINT32_MAX;  // the key's node, or UINT32_MAX
};

class JsonDocument {
 public:
  // Parses `text` (a leading UTF-8 byte-order mark is skipped); throws
  // DataError "<source>: not valid JSON at byte N: why" for malformed text
  // (a number with a leading zero included), nesting deeper than
  // `max_depth`, or more than `max_values` values (Note [Bounded JSON]).
  // Text over 2^31 bytes is refused unread.
  JsonDocument(std::string_view text, const std::string& source, size_t max_values = 3000000,
               int max_depth = 64);
  JsonDocument(const JsonDocument&) = delete;  // its JsonValues point into it
  JsonDocument& operator=(const JsonDocument&) = delete;
  JsonValue root() const { return JsonValue(this, 0, UINT32_MAX); }
  // Bytes the document reserved (nodes and arena), for tests of the bound.
  size_t reserved_bytes() const;

 private:
  friend class JsonValue;
  friend class JsonParser;
  struct Node {
    JsonKind kind;
    uint8_t flags;  // bit 0: boolean true / number whole
    uint16_t unused;
    uint32_t end;      // arrays and objects: one past the subtree's last node; else self + 1
    uint64_t payload;  // a number's bits; a string's arena offset << 32 | length
  };
  static_assert(sizeof(Node) == 16, "a JSON value costs 16 bytes");
  std::vector<Node> nodes_;
  std::string arena_;
  std::string source_;
};

}  // namespace lockstep
