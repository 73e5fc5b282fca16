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

#include "lockstep/io/state_dict.h"
#include "lockstep/util/error.h"
#include "pickle_machine.h"
#include "zip_records.h"

namespace lockstep {
namespace {

using pickle::Global;
using pickle::make;
using pickle::Value;
using pickle::ValuePtr;

constexpr size_t kMaxDims = 64;

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

// The tensors of a torch.save archive: storages from its data/<key> records,
// checked against the records before allocation; views rebuilt inside them;
// OrderedDict and parameters; nothing else.
class TensorResolver : public pickle::Resolver {
 public:
  TensorResolver(caffe2::serialize::PyTorchStreamReader& reader,
                 const std::map<std::string, ZipRecord>& records, std::string path)
      : reader_(reader), records_(records), path_(std::move(path)) {}

  // ('storage', torch.<T>Storage, key, location, numel) -> a flat CPU tensor.
  ValuePtr persistent(const ValuePtr& pid) override {
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

  ValuePtr reduce(const Global& g, const ValuePtr& args) override {
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

 private:
  [[noreturn]] void fail(const std::string& why) const { throw DataError(path_ + ": " + why); }

  caffe2::serialize::PyTorchStreamReader& reader_;
  const std::map<std::string, ZipRecord>& records_;
  std::string path_;
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
    TensorResolver tensors(*reader, records, name);
    pickle::Machine machine(tensors, name);
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
