// Reads a state dict that Python wrote with torch.save(model.state_dict()).
//
// Why not torch::pickle_load: LibTorch's unpickler turns collections.OrderedDict
// (what state_dict() returns) into None, because TorchScript never needs it.
// This is a small pickle machine for exactly what torch.save emits for a
// state dict (protocol 2): dicts, tuples, lists, scalars, strings, and tensors
// rebuilt by torch._utils._rebuild_tensor_v2 from storages that live in the
// zip archive's data/<key> records (read with LibTorch's PyTorchStreamReader).
// Anything else (an arbitrary pickled object) is an error, not code execution.
//
// Note [Untrusted state dicts]: every state dict lockstep loads (init_from,
// resume's model.pt and rng.pt) comes through here, never through
// LibTorch's pickle_load, which crashes on a few malformed bytes. The input
// is hostile until proven otherwise: every opcode checks its stack and memo
// operands; containers nest at most kMaxDepth deep; the zip directory is
// read first (zip_records.h), so a compressed record or one that points
// outside the file is refused before any byte is inflated; a storage's size
// is checked against its record before it is allocated; and a tensor's
// sizes, strides and offset must stay inside its storage and may not
// describe more elements than the storage holds (no stride-0 blow-up).
// Memory is thus bounded by a small multiple of the file's size. The fuzz
// target (tests/fuzz/) and its corpus, replayed in the suite, exercise this.
#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>

#include <cstring>
#include <map>
#include <memory>
#include <sstream>

#include "lockstep/train/checkpoint.h"
#include "lockstep/util/error.h"
#include "zip_records.h"

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
  int depth = 0;  // containers nested inside this value
};

constexpr int kMaxDepth = 64;
constexpr size_t kMaxDims = 64;

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
  Machine(caffe2::serialize::PyTorchStreamReader& reader,
          const std::map<std::string, ZipRecord>& records, std::string path)
      : reader_(reader), records_(records), path_(std::move(path)) {}

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
  ValuePtr peek() {
    if (stack_.empty()) fail("malformed pickle (memo of an empty stack)");
    return stack_.back();
  }
  // `container` now holds `item` (or, without one, its items): depth check.
  void nest(const ValuePtr& container, const ValuePtr& item) {
    container->depth = std::max(container->depth, item->depth + 1);
    if (container->depth > kMaxDepth) {
      fail("containers nested more than " + std::to_string(kMaxDepth) + " deep");
    }
  }
  void nest(const ValuePtr& container) {
    for (const auto& item : container->items) nest(container, item);
  }
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
    using K = Value::Kind;
    if (pid->kind != K::kTuple || pid->items.size() < 5 || pid->items[0]->kind != K::kString ||
        pid->items[0]->s != "storage" || pid->items[1]->kind != K::kGlobal ||
        pid->items[2]->kind != K::kString || pid->items[4]->kind != K::kInt) {
      fail("unsupported persistent id (not a tensor storage)");
    }
    const std::string& key = pid->items[2]->s;
    auto cached = storages_.find(key);
    if (cached != storages_.end()) return cached->second;
    const auto dtype = storage_dtype(pid->items[1]->global.name, path_);
    const int64_t numel = pid->items[4]->i;
    auto record = records_.find("data/" + key);
    if (record == records_.end()) fail("storage " + key + " has no record in the archive");
    const uint64_t element = c10::elementSize(dtype);
    if (numel < 0 || static_cast<uint64_t>(numel) > record->second.size / element ||
        static_cast<uint64_t>(numel) * element != record->second.size) {
      fail("storage " + key + " claims " + std::to_string(numel) + " elements but its record has " +
           std::to_string(record->second.size) + " bytes");
    }
    auto [ptr, bytes] = reader_.getRecord("data/" + key);
    if (bytes != record->second.size) fail("storage " + key + " has the wrong size");
    auto tensor = at::empty({numel}, at::TensorOptions(dtype));
    if (bytes > 0) std::memcpy(tensor.data_ptr(), ptr.get(), bytes);
    auto v = make(K::kTensor);
    v->tensor = tensor;
    storages_[key] = v;
    return v;
  }

  std::vector<int64_t> ints(const ValuePtr& tuple, const char* what) {
    if (tuple->kind != Value::Kind::kTuple || tuple->items.size() > kMaxDims) {
      fail(std::string("malformed tensor ") + what);
    }
    std::vector<int64_t> out;
    for (const auto& item : tuple->items) {
      if (item->kind != Value::Kind::kInt || item->i < 0) {
        fail(std::string("malformed tensor ") + what + " (not a non-negative integer)");
      }
      out.push_back(item->i);
    }
    return out;
  }

  // torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...): the
  // view must lie inside the storage and hold no more elements than it.
  at::Tensor rebuild(const std::vector<ValuePtr>& a) {
    if (a.size() < 4 || a[0]->kind != Value::Kind::kTensor || a[1]->kind != Value::Kind::kInt) {
      fail("malformed tensor");
    }
    const at::Tensor& storage = a[0]->tensor;
    const auto sizes = ints(a[2], "sizes");
    const auto strides = ints(a[3], "strides");
    const int64_t offset = a[1]->i;
    const int64_t available = storage.numel();
    if (sizes.size() != strides.size() || offset < 0 || offset > available) {
      fail("malformed tensor (sizes, strides and offset do not fit)");
    }
    int64_t numel = 1, last = offset;
    for (size_t d = 0; d < sizes.size(); ++d) {
      int64_t reach = 0;
      if (__builtin_mul_overflow(numel, sizes[d], &numel) ||
          (sizes[d] > 0 && (__builtin_mul_overflow(sizes[d] - 1, strides[d], &reach) ||
                            __builtin_add_overflow(last, reach, &last)))) {
        fail("malformed tensor (sizes overflow)");
      }
    }
    if (numel > 0 && last >= available) {
      fail("tensor of " + std::to_string(numel) + " elements reaches past its storage of " +
           std::to_string(available));
    }
    if (numel > available) {
      fail("tensor of " + std::to_string(numel) + " elements over a storage of " +
           std::to_string(available) + " (overlapping strides are not loaded)");
    }
    return storage.as_strided(sizes, strides, offset).clone();
  }

  ValuePtr reduce(const ValuePtr& callable, const ValuePtr& args) {
    if (callable->kind != Value::Kind::kGlobal || args->kind != Value::Kind::kTuple) {
      fail("malformed pickle (REDUCE of a non-global)");
    }
    const auto& g = callable->global;
    if (g.module == "collections" && g.name == "OrderedDict") return make(Value::Kind::kDict);
    if (g.module == "torch._utils" && g.name == "_rebuild_tensor_v2") {
      auto v = make(Value::Kind::kTensor);
      v->tensor = rebuild(args->items);
      return v;
    }
    if (g.module == "torch._utils" && g.name == "_rebuild_parameter") {
      if (args->items.empty()) fail("malformed parameter");
      return args->items[0];
    }
    fail("unsupported object " + g.module + "." + g.name + " (not a plain state dict?)");
  }

  caffe2::serialize::PyTorchStreamReader& reader_;
  const std::map<std::string, ZipRecord>& records_;
  std::string path_;
  std::vector<ValuePtr> stack_;
  std::map<uint32_t, ValuePtr> memo_;
  std::map<std::string, ValuePtr> storages_;
};

// The root value of a torch.save archive held in `bytes`.
ValuePtr load_root(const std::string& bytes, const std::string& name) {
  const auto records = zip_records(bytes, name);
  if (records.count("data.pkl") == 0) throw DataError(name + ": has no data.pkl");
  std::istringstream in(bytes);
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> reader;
  try {
    reader = std::make_unique<caffe2::serialize::PyTorchStreamReader>(&in);
  } catch (const std::exception& e) {
    throw DataError(name + ": not a torch.save file (" + what_of(e).substr(0, 200) + ")");
  }
  // LibTorch's reader (and ATen) report with c10::Error: a malformed file
  // is the user's bad input, so every such error is a DataError here.
  try {
    auto [ptr, size] = reader->getRecord("data.pkl");
    Machine machine(*reader, records, name);
    return machine.run(static_cast<const char*>(ptr.get()), size);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw DataError(name + ": malformed archive (" + what_of(e).substr(0, 200) + ")");
  }
}

}  // namespace

StateDict state_dict_from_bytes(const std::string& bytes, const std::string& name) {
  const auto root = load_root(bytes, name);
  if (root->kind != Value::Kind::kDict) throw DataError(name + ": holds no {name: tensor} dict");
  StateDict out;
  for (const auto& [key, value] : root->entries) {
    if (key->kind != Value::Kind::kString || value->kind != Value::Kind::kTensor) {
      throw DataError(name + ": holds an entry that is not name -> tensor");
    }
    out.emplace_back(key->s, value->tensor);
  }
  return out;
}

at::Tensor tensor_from_bytes(const std::string& bytes, const std::string& name) {
  const auto root = load_root(bytes, name);
  if (root->kind != Value::Kind::kTensor) throw DataError(name + ": holds no tensor");
  return root->tensor;
}

}  // namespace lockstep
