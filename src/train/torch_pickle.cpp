// Reads a state dict that Python wrote with torch.save(model.state_dict()).
//
// Why not torch::pickle_load: LibTorch's unpickler turns collections.OrderedDict
// (what state_dict() returns) into None, because TorchScript never needs it.
// This is a small pickle machine for exactly what torch.save emits for a
// state dict (protocol 2): dicts, tuples, lists, scalars, strings, and tensors
// rebuilt by torch._utils._rebuild_tensor_v2 from storages that live in the
// zip archive's data/<key> records (read with LibTorch's PyTorchStreamReader).
// Anything else (an arbitrary pickled object) is an error, not code execution.
#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>

#include <cstring>
#include <map>
#include <memory>
#include <variant>

#include "lockstep/train/checkpoint.h"
#include "lockstep/util/error.h"

namespace lockstep {
namespace {

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
};

ValuePtr make(Value::Kind kind) {
  auto v = std::make_shared<Value>();
  v->kind = kind;
  return v;
}

at::ScalarType storage_dtype(const std::string& name, const std::string& path) {
  static const std::map<std::string, at::ScalarType> kTypes{
      {"FloatStorage", at::kFloat}, {"DoubleStorage", at::kDouble},
      {"HalfStorage", at::kHalf},   {"BFloat16Storage", at::kBFloat16},
      {"LongStorage", at::kLong},   {"IntStorage", at::kInt},
      {"ShortStorage", at::kShort}, {"CharStorage", at::kChar},
      {"ByteStorage", at::kByte},   {"BoolStorage", at::kBool}};
  auto it = kTypes.find(name);
  if (it == kTypes.end()) throw DataError(path + ": unsupported storage type torch." + name);
  return it->second;
}

class Machine {
 public:
  Machine(caffe2::serialize::PyTorchStreamReader& reader, std::string path)
      : reader_(reader), path_(std::move(path)) {}

  ValuePtr run(const char* data, size_t size) {
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
          push(v);
          break;
        }
        case 't': {  // TUPLE
          auto v = make(Value::Kind::kTuple);
          v->items = pop_to_mark();
          push(v);
          break;
        }
        case 'a': {  // APPEND
          auto item = pop();
          top(Value::Kind::kList)->items.push_back(item);
          break;
        }
        case 'e': {  // APPENDS
          auto items = pop_to_mark();
          auto list = top(Value::Kind::kList);
          list->items.insert(list->items.end(), items.begin(), items.end());
          break;
        }
        case 's': {  // SETITEM
          auto value = pop();
          auto key = pop();
          top(Value::Kind::kDict)->entries.emplace_back(key, value);
          break;
        }
        case 'u': {  // SETITEMS
          auto items = pop_to_mark();
          auto dict = top(Value::Kind::kDict);
          for (size_t k = 0; k + 1 < items.size(); k += 2)
            dict->entries.emplace_back(items[k], items[k + 1]);
          break;
        }
        case 'b':
          pop();
          break;  // BUILD: state (e.g. _metadata) ignored
        case 'q':
          memo_[u8()] = stack_.back();
          break;  // BINPUT
        case 'r':
          memo_[u32()] = stack_.back();
          break;  // LONG_BINPUT
        case 'h':
          push(memo(u8()));
          break;  // BINGET
        case 'j':
          push(memo(u32()));
          break;  // LONG_BINGET
        case 'Q':
          push(persistent(pop()));
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

 private:
  [[noreturn]] void fail(const std::string& why) const { throw DataError(path_ + ": " + why); }
  static std::string hex(uint8_t v) {
    const char* d = "0123456789abcdef";
    return {d[v >> 4], d[v & 15]};
  }
  static ValuePtr integer(int64_t v) {
    auto out = make(Value::Kind::kInt);
    out->i = v;
    return out;
  }
  void push(ValuePtr v) { stack_.push_back(std::move(v)); }
  ValuePtr pop() {
    if (stack_.empty()) fail("malformed pickle (stack underflow)");
    auto v = stack_.back();
    stack_.pop_back();
    return v;
  }
  ValuePtr top(Value::Kind kind) {
    if (stack_.empty() || stack_.back()->kind != kind)
      fail("malformed pickle (unexpected container)");
    return stack_.back();
  }
  ValuePtr memo(uint32_t key) {
    auto it = memo_.find(key);
    if (it == memo_.end()) fail("malformed pickle (unknown memo entry)");
    return it->second;
  }
  std::vector<ValuePtr> pop_to_mark() {
    std::vector<ValuePtr> items;
    while (true) {
      auto v = pop();
      if (v->kind == Value::Kind::kMark) break;
      items.push_back(v);
    }
    return {items.rbegin(), items.rend()};
  }

  // ('storage', torch.<T>Storage, key, location, numel) -> a flat CPU tensor.
  ValuePtr persistent(const ValuePtr& pid) {
    if (pid->kind != Value::Kind::kTuple || pid->items.size() < 5 ||
        pid->items[0]->s != "storage") {
      fail("unsupported persistent id");
    }
    const std::string& key = pid->items[2]->s;
    auto cached = storages_.find(key);
    if (cached != storages_.end()) return cached->second;
    const auto dtype = storage_dtype(pid->items[1]->global.name, path_);
    const int64_t numel = pid->items[4]->i;
    auto [ptr, bytes] = reader_.getRecord("data/" + key);
    auto tensor = at::empty({numel}, at::TensorOptions(dtype));
    if (bytes != static_cast<size_t>(tensor.nbytes()))
      fail("storage " + key + " has the wrong size");
    std::memcpy(tensor.data_ptr(), ptr.get(), bytes);
    auto v = make(Value::Kind::kTensor);
    v->tensor = tensor;
    storages_[key] = v;
    return v;
  }

  static std::vector<int64_t> ints(const ValuePtr& tuple) {
    std::vector<int64_t> out;
    for (const auto& item : tuple->items) out.push_back(item->i);
    return out;
  }

  ValuePtr reduce(const ValuePtr& callable, const ValuePtr& args) {
    const auto& g = callable->global;
    if (g.module == "collections" && g.name == "OrderedDict") return make(Value::Kind::kDict);
    if (g.module == "torch._utils" && g.name == "_rebuild_tensor_v2") {
      const auto& a = args->items;
      if (a.size() < 4 || a[0]->kind != Value::Kind::kTensor) fail("malformed tensor");
      auto v = make(Value::Kind::kTensor);
      v->tensor = a[0]->tensor.as_strided(ints(a[2]), ints(a[3]), a[1]->i).clone();
      return v;
    }
    if (g.module == "torch._utils" && g.name == "_rebuild_parameter") return args->items.at(0);
    fail("unsupported object " + g.module + "." + g.name + " (not a plain state dict?)");
  }

  caffe2::serialize::PyTorchStreamReader& reader_;
  std::string path_;
  std::vector<ValuePtr> stack_;
  std::map<uint32_t, ValuePtr> memo_;
  std::map<std::string, ValuePtr> storages_;
};

}  // namespace

StateDict state_dict_load_python(const std::string& path) {
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> reader;
  try {
    reader = std::make_unique<caffe2::serialize::PyTorchStreamReader>(path);
  } catch (const std::exception& e) {
    throw DataError(path + ": not a torch.save file (" + what_of(e).substr(0, 200) + ")");
  }
  if (!reader->hasRecord("data.pkl")) throw DataError(path + ": has no data.pkl");
  auto [ptr, size] = reader->getRecord("data.pkl");
  Machine machine(*reader, path);
  const auto root = machine.run(static_cast<const char*>(ptr.get()), size);
  if (root->kind != Value::Kind::kDict) throw DataError(path + ": holds no {name: tensor} dict");
  StateDict out;
  for (const auto& [key, value] : root->entries) {
    if (key->kind != Value::Kind::kString || value->kind != Value::Kind::kTensor) {
      throw DataError(path + ": holds an entry that is not name -> tensor");
    }
    out.emplace_back(key->s, value->tensor);
  }
  return out;
}

}  // namespace lockstep
