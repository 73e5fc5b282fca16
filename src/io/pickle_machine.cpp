#include "pickle_machine.h"

#include <algorithm>
#include <cstring>

#include "lockstep/util/error.h"

namespace lockstep::pickle {
namespace {

std::string hex(uint8_t v) {
  const char* d = "0123456789abcdef";
  return {d[v >> 4], d[v & 15]};
}
ValuePtr integer(int64_t v) {
  auto out = make(Value::Kind::kInt);
  out->i = v;
  return out;
}

}  // namespace

ValuePtr make(Value::Kind kind) {
  auto v = std::make_shared<Value>();
  v->kind = kind;
  return v;
}

void Machine::fail(const std::string& why) const {
  throw DataError(path_ + ": " + why);
}
ValuePtr Machine::peek() {
  if (stack_.empty()) fail("malformed pickle (memo of an empty stack)");
  return stack_.back();
}
// `container` now holds `item` (or, without one, its items): depth check.
void Machine::nest(const ValuePtr& container, const ValuePtr& item) {
  container->depth = std::max(container->depth, item->depth + 1);
  if (container->depth > kMaxDepth) {
    fail("containers nested more than " + std::to_string(kMaxDepth) + " deep");
  }
}
void Machine::nest(const ValuePtr& container) {
  for (const auto& item : container->items) nest(container, item);
}
ValuePtr Machine::pop() {
  if (stack_.empty()) fail("malformed pickle (stack underflow)");
  auto v = stack_.back();
  stack_.pop_back();
  return v;
}
ValuePtr Machine::top(Value::Kind kind) {
  if (stack_.empty() || stack_.back()->kind != kind)
    fail("malformed pickle (unexpected container)");
  return stack_.back();
}
ValuePtr Machine::memo(uint32_t key) {
  auto it = memo_.find(key);
  if (it == memo_.end()) fail("malformed pickle (unknown memo entry)");
  return it->second;
}
std::vector<ValuePtr> Machine::pop_to_mark() {
  std::vector<ValuePtr> items;
  while (true) {
    auto v = pop();
    if (v->kind == Value::Kind::kMark) break;
    items.push_back(v);
  }
  return {items.rbegin(), items.rend()};
}

ValuePtr Machine::reduce(const ValuePtr& callable, const ValuePtr& args) {
  if (callable->kind != Value::Kind::kGlobal || args->kind != Value::Kind::kTuple) {
    fail("malformed pickle (REDUCE of a non-global)");
  }
  return resolver_.reduce(callable->global, args);
}

ValuePtr Machine::run(const char* data, size_t size) {
  size_t pos = 0;
  auto need = [&](size_t n) {
    if (pos + n > size) fail("truncated pickle");
  };
  auto u8 = [&] {
    need(1);
    return static_cast<uint8_t>(data[pos++]);
  };
  auto u16 = [&] {
    need(2);
    uint16_t v;
    std::memcpy(&v, data + pos, 2);
    pos += 2;
    return v;
  };
  auto u32 = [&] {
    need(4);
    uint32_t v;
    std::memcpy(&v, data + pos, 4);
    pos += 4;
    return v;
  };
  auto line = [&] {
    const char* end = static_cast<const char*>(std::memchr(data + pos, '\n', size - pos));
    if (end == nullptr) fail("truncated pickle");
    std::string s(data + pos, end);
    pos = static_cast<size_t>(end - data) + 1;
    return s;
  };
  while (true) {
    const uint8_t op = u8();
    switch (op) {
      case 0x80:
        u8();
        break;  // PROTO
      case '.':
        return pop();  // STOP
      case '(':
        push(make(Value::Kind::kMark));
        break;  // MARK
      case 'N':
        push(make(Value::Kind::kNone));
        break;
      case 0x88:
      case 0x89: {  // NEWTRUE, NEWFALSE
        auto v = make(Value::Kind::kBool);
        v->i = op == 0x88;
        push(v);
        break;
      }
      case 'K':
        push(integer(u8()));
        break;  // BININT1
      case 'M':
        push(integer(u16()));
        break;  // BININT2
      case 'J':
        push(integer(static_cast<int32_t>(u32())));
        break;      // BININT
      case 0x8a: {  // LONG1
        const uint8_t n = u8();
        if (n > 8) fail("integer wider than 64 bits");
        need(n);
        int64_t v = 0;
        for (int k = n - 1; k >= 0; --k) v = (v << 8) | static_cast<uint8_t>(data[pos + k]);
        if (n > 0 && n < 8 && (static_cast<uint8_t>(data[pos + n - 1]) & 0x80))
          v -= int64_t{1} << (8 * n);
        pos += n;
        push(integer(v));
        break;
      }
      case 'G': {  // BINFLOAT (big-endian)
        need(8);
        uint64_t bits = 0;
        for (int k = 0; k < 8; ++k) bits = (bits << 8) | static_cast<uint8_t>(data[pos + k]);
        pos += 8;
        auto v = make(Value::Kind::kFloat);
        std::memcpy(&v->f, &bits, 8);
        push(v);
        break;
      }
      case 'X':
      case 'U':
      case 'T': {  // BINUNICODE, SHORT_BINSTRING, BINSTRING
        const uint32_t n = op == 'U' ? u8() : u32();
        need(n);
        auto v = make(Value::Kind::kString);
        v->s.assign(data + pos, n);
        pos += n;
        push(v);
        break;
      }
      case 'c': {  // GLOBAL
        auto v = make(Value::Kind::kGlobal);
        v->global.module = line();
        v->global.name = line();
        push(v);
        break;
      }
      case ')':
        push(make(Value::Kind::kTuple));
        break;  // EMPTY_TUPLE
      case ']':
        push(make(Value::Kind::kList));
        break;  // EMPTY_LIST
      case '}':
        push(make(Value::Kind::kDict));
        break;  // EMPTY_DICT
      case 0x85:
      case 0x86:
      case 0x87: {  // TUPLE1..3
        auto v = make(Value::Kind::kTuple);
        v->items.resize(op - 0x84);
        for (size_t k = v->items.size(); k-- > 0;) v->items[k] = pop();
        nest(v);
        push(v);
        break;
      }
      case 't': {  // TUPLE
        auto v = make(Value::Kind::kTuple);
        v->items = pop_to_mark();
        nest(v);
        push(v);
        break;
      }
      case 'a': {  // APPEND
        auto item = pop();
        auto list = top(Value::Kind::kList);
        list->items.push_back(item);
        nest(list, item);
        break;
      }
      case 'e': {  // APPENDS
        auto items = pop_to_mark();
        auto list = top(Value::Kind::kList);
        list->items.insert(list->items.end(), items.begin(), items.end());
        for (const auto& item : items) nest(list, item);
        break;
      }
      case 's': {  // SETITEM
        auto value = pop();
        auto key = pop();
        auto dict = top(Value::Kind::kDict);
        dict->entries.emplace_back(key, value);
        nest(dict, key);
        nest(dict, value);
        break;
      }
      case 'u': {  // SETITEMS
        auto items = pop_to_mark();
        auto dict = top(Value::Kind::kDict);
        if (items.size() % 2 != 0) fail("malformed pickle (odd SETITEMS)");
        for (size_t k = 0; k + 1 < items.size(); k += 2) {
          dict->entries.emplace_back(items[k], items[k + 1]);
          nest(dict, items[k]);
          nest(dict, items[k + 1]);
        }
        break;
      }
      case 'b':
        pop();
        break;  // BUILD: state (e.g. _metadata) ignored
      case 'q':
        memo_[u8()] = peek();
        break;  // BINPUT
      case 'r':
        memo_[u32()] = peek();
        break;  // LONG_BINPUT
      case 'h':
        push(memo(u8()));
        break;  // BINGET
      case 'j':
        push(memo(u32()));
        break;  // LONG_BINGET
      case 'Q':
        push(resolver_.persistent(pop()));
        break;     // BINPERSID
      case 'R': {  // REDUCE
        auto args = pop();
        auto callable = pop();
        push(reduce(callable, args));
        break;
      }
      default:
        fail("unsupported pickle opcode 0x" + hex(op) + " (not a plain state dict?)");
    }
  }
}

}  // namespace lockstep::pickle
