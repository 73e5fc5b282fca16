// The opcode machine of lockstep's pickle reader (Note [Untrusted state
// dicts], torch_pickle.cpp): protocol-2 opcodes into a tree of Values, every
// opcode checking its stack and memo operands, containers nested at most
// kMaxDepth deep. What a pickle may build beyond plain data (storages from
// persistent ids, objects from REDUCE) is decided by a Resolver: the machine
// itself knows no tensor and runs no code.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace lockstep::pickle {

struct Value;
using ValuePtr = std::shared_ptr<Value>;
struct Global {
  std::string module, name;
};
struct Value {
  enum class Kind {
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kTuple,
    kList,
    kDict,
    kGlobal,
    kTensor,
    kMark
  };
  Kind kind = Kind::kNone;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::vector<ValuePtr> items;                         // tuple, list
  std::vector<std::pair<ValuePtr, ValuePtr>> entries;  // dict, in order
  Global global;
  at::Tensor tensor;
  int depth = 0;  // containers nested inside this value
};

constexpr int kMaxDepth = 64;  // containers nested at most this deep

ValuePtr make(Value::Kind kind);

// What BINPERSID and REDUCE make; throw DataError for anything not allowed.
class Resolver {
 public:
  virtual ~Resolver() = default;
  virtual ValuePtr persistent(const ValuePtr& pid) = 0;
  virtual ValuePtr reduce(const Global& callable, const ValuePtr& args) = 0;
};

class Machine {
 public:
  // `path` names the file in errors (DataError "<path>: ...").
  Machine(Resolver& resolver, std::string path) : resolver_(resolver), path_(std::move(path)) {}
  // Runs the pickle in data[0, size) to its STOP; returns the value on top.
  ValuePtr run(const char* data, size_t size);

 private:
  [[noreturn]] void fail(const std::string& why) const;
  void push(ValuePtr v) { stack_.push_back(std::move(v)); }
  ValuePtr peek();
  ValuePtr pop();
  ValuePtr top(Value::Kind kind);
  ValuePtr memo(uint32_t key);
  std::vector<ValuePtr> pop_to_mark();
  void nest(const ValuePtr& container, const ValuePtr& item);
  void nest(const ValuePtr& container);
  ValuePtr reduce(const ValuePtr& callable, const ValuePtr& args);

  Resolver& resolver_;
  std::string path_;
  std::vector<ValuePtr> stack_;
  std::map<uint32_t, ValuePtr> memo_;
};

}  // namespace lockstep::pickle
