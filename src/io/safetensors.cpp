#include "lockstep/io/safetensors.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>
#include <vector>

#include "lockstep/util/error.h"
#include "lockstep/util/fs.h"
#include "lockstep/util/utf8.h"

namespace lockstep {

// Note [Untrusted safetensors]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A safetensors file comes from anywhere (a model hub, a colleague), so
// nothing in it is trusted before it is checked: the header length against
// the file and a 100 MB cap, the header's JSON nesting (at most 4 levels:
// entries hold flat lists; deeper is refused before the parser sees it),
// every entry's dtype against the known ones, its shape (each dimension in
// [0, 2^40], the product's bytes without overflow) against its offsets, and
// the offsets against the data's size and each other (sorted, no overlap).
// Memory: the tensors' own bytes, which the file holds, plus the header.
namespace {

// GPT-2's header is 15 KB; yaml-cpp takes ~80x a header's size in nodes,
// so the cap bounds that at a few hundred MB.
constexpr uint64_t kMaxHeader = 4u << 20;

// A JSON whole number as the spec writes them: digits only (yaml-cpp would
// also take 0x10, 1e3 or "4").
bool whole_number(const YAML::Node& node, uint64_t& out) {
  if (!node.IsScalar() || node.Tag() == "!") return false;  // "!" : a quoted scalar
  const std::string& text = node.Scalar();
  if (text.empty() || text.size() > 19) return false;
  out = 0;
  for (const char c : text) {
    if (c < '0' || c > '9') return false;
    out = out * 10 + static_cast<uint64_t>(c - '0');
  }
  return true;
}

struct Dtype {
  const char* name;
  at::ScalarType type;
  size_t bytes;
};
constexpr Dtype kDtypes[] = {
    {"F64", at::kDouble, 8},    {"F32", at::kFloat, 4}, {"F16", at::kHalf, 2},
    {"BF16", at::kBFloat16, 2}, {"I64", at::kLong, 8},  {"I32", at::kInt, 4},
    {"I16", at::kShort, 2},     {"I8", at::kChar, 1},   {"U8", at::kByte, 1},
    {"BOOL", at::kBool, 1},
};

const Dtype* dtype_named(const std::string& name) {
  for (const auto& d : kDtypes)
    if (name == d.name) return &d;
  return nullptr;
}
const Dtype* dtype_of(at::ScalarType type) {
  for (const auto& d : kDtypes)
    if (type == d.type) return &d;
  return nullptr;
}

// JSON nesting outside strings, without parsing: a deep header would
// exhaust the parser's stack.
size_t nesting(const std::string& json) {
  size_t depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < json.size(); ++i) {
    const char c = json[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == '}' || c == ']') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

struct Entry {
  std::string name;
  const Dtype* dtype;
  std::vector<int64_t> shape;
  uint64_t begin, end;
};

// An error in the file `path`, which it names.
DataError load_error(const std::string& path, const std::string& why) {
  return DataError("'" + path + "': " + why);
}

// Exactly n bytes at offset `at` of fd, or a DataError.
void read_at(int fd, const std::string& path, void* out, uint64_t n, uint64_t at) {
  uint64_t done = 0;
  while (done < n) {
    const ssize_t got =
        ::pread(fd, static_cast<char*>(out) + done, n - done, static_cast<off_t>(at + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      throw load_error(path, "cannot read bytes " + std::to_string(at) + ".." +
                                 std::to_string(at + n) + " (it changed while being read?)");
    done += static_cast<uint64_t>(got);
  }
}

// The JSON header's bytes, its length checked against the file's `size`.
std::string read_header(int fd, const std::string& path, uint64_t size) {
  if (size < 8)
    throw load_error(path, "shorter than the 8-byte header length: not a safetensors file");
  unsigned char length_bytes[8];
  read_at(fd, path, length_bytes, 8, 0);
  uint64_t header_length = 0;
  for (int i = 7; i >= 0; --i) header_length = header_length << 8 | length_bytes[i];
  if (header_length > kMaxHeader || header_length > size - 8)
    throw load_error(path, "header length " + std::to_string(header_length) +
                               " is past the file's " + std::to_string(size) +
                               " bytes or over 4 MB: not a safetensors file");
  std::string header(header_length, '\0');
  read_at(fd, path, header.data(), header_length, 8);
  return header;
}

// The header as a JSON object, its nesting checked before it is parsed.
YAML::Node parse_header(const std::string& header, const std::string& path) {
  if (nesting(header) > 4)
    throw load_error(path, "the header nests deeper than safetensors' entries do");
  YAML::Node root;
  try {
    root = YAML::Load(header);
  } catch (const YAML::Exception& e) {
    throw load_error(path, std::string("the header is not JSON: ") + e.what());
  }
  if (!root.IsMap()) throw load_error(path, "the header is not a JSON object of entries");
  return root;
}

// One tensor's entry: its dtype, its shape, and its data_offsets inside the
// data's `data_size` bytes, holding exactly the shape's bytes.
Entry parse_entry(const std::string& name, const YAML::Node& e, uint64_t data_size,
                  const std::string& path) {
  const auto in = [&](const std::string& why) {
    return load_error(path, "entry '" + name + "': " + why);
  };
  if (!e.IsMap() || !e["dtype"] || !e["shape"] || !e["data_offsets"])
    throw in("needs dtype, shape and data_offsets");
  Entry entry;
  entry.name = name;
  entry.dtype = e["dtype"].IsScalar() ? dtype_named(e["dtype"].Scalar()) : nullptr;
  if (entry.dtype == nullptr)
    throw in("dtype '" + (e["dtype"].IsScalar() ? e["dtype"].Scalar() : std::string("?")) +
             "' is not one of F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL");
  if (!e["shape"].IsSequence() || e["shape"].size() > 16)
    throw in("shape: a list of up to 16 sizes");
  uint64_t elements = 1;
  bool overflow = false;
  for (const auto& dim : e["shape"]) {
    uint64_t value = 0;
    const int64_t d =
        whole_number(dim, value) && value <= (uint64_t{1} << 40) ? static_cast<int64_t>(value) : -1;
    if (d < 0) throw in("shape: each size an integer in [0, 2^40]");
    entry.shape.push_back(d);
    if (d != 0 && elements > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(d) /
                                 entry.dtype->bytes)
      overflow = true;
    elements *= static_cast<uint64_t>(d);
  }
  if (!e["data_offsets"].IsSequence() || e["data_offsets"].size() != 2)
    throw in("data_offsets: [begin, end]");
  if (!whole_number(e["data_offsets"][0], entry.begin) ||
      !whole_number(e["data_offsets"][1], entry.end))
    throw in("data_offsets: two whole numbers");
  if (entry.begin > entry.end || entry.end > data_size)
    throw in("data_offsets [" + std::to_string(entry.begin) + ", " + std::to_string(entry.end) +
             "] outside the data's " + std::to_string(data_size) + " bytes");
  if (overflow || elements * entry.dtype->bytes != entry.end - entry.begin)
    throw in(
        "its shape needs " +
        (overflow ? std::string("more than 2^64") : std::to_string(elements * entry.dtype->bytes)) +
        " bytes, its data_offsets hold " + std::to_string(entry.end - entry.begin));
  return entry;
}

// The header's tensor entries in its order; __metadata__'s strings go to
// `metadata` (when given).
std::vector<Entry> parse_entries(const YAML::Node& root, uint64_t data_size,
                                 const std::string& path,
                                 std::map<std::string, std::string>* metadata) {
  std::vector<Entry> entries;
  std::set<std::string> names;
  for (const auto& item : root) {
    if (!item.first.IsScalar()) throw load_error(path, "an entry's name is not a string");
    const std::string name = item.first.Scalar();
    const auto in = [&](const std::string& why) {
      return load_error(path, "entry '" + name + "': " + why);
    };
    if (name == "__metadata__") {
      if (!item.second.IsMap()) throw in("must be an object of strings");
      for (const auto& kv : item.second) {
        if (!kv.first.IsScalar() || !kv.second.IsScalar()) throw in("must be an object of strings");
        if (metadata != nullptr) (*metadata)[kv.first.Scalar()] = kv.second.Scalar();
      }
      continue;
    }
    if (!names.insert(name).second) throw in("appears twice");
    entries.push_back(parse_entry(name, item.second, data_size, path));
  }
  return entries;
}

// The entries by offset, no two holding the same bytes.
std::vector<const Entry*> by_offset(const std::vector<Entry>& entries, const std::string& path) {
  std::vector<const Entry*> sorted;
  for (const auto& e : entries) sorted.push_back(&e);
  std::stable_sort(sorted.begin(), sorted.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  const Entry* last = nullptr;  // the last entry holding bytes (empty ones overlap nothing)
  for (const Entry* e : sorted) {
    if (e->begin == e->end) continue;
    if (last != nullptr && e->begin < last->end)
      throw load_error(path, "entries '" + last->name + "' and '" + e->name + "' overlap");
    last = e;
  }
  return sorted;
}

// The tensors, read in the order of their bytes; `data_start`: where the
// data begins in the file.
StateDict read_tensors(int fd, const std::string& path, const std::vector<const Entry*>& entries,
                       uint64_t data_start) {
  StateDict state;
  for (const Entry* e : entries) {
    at::Tensor t = at::empty(e->shape, at::TensorOptions().dtype(e->dtype->type));
    read_at(fd, path, t.data_ptr(), e->end - e->begin, data_start + e->begin);
    state.emplace_back(e->name, t);
  }
  return state;
}

}  // namespace

StateDict safetensors_load(const std::string& path, std::map<std::string, std::string>* metadata) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw load_error(path, std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) throw load_error(path, "not a regular file");
  const auto size = static_cast<uint64_t>(st.st_size);
  const std::string header = read_header(fd, path, size);
  const YAML::Node root = parse_header(header, path);
  const uint64_t data_size = size - 8 - header.size();
  const std::vector<Entry> entries = parse_entries(root, data_size, path, metadata);
  return read_tensors(fd, path, by_offset(entries, path), 8 + header.size());
}

void safetensors_save(const StateDict& state, const std::string& path,
                      const std::map<std::string, std::string>& metadata) {
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      header += (first ? "" : ",") + json_quoted(k) + ":" + json_quoted(v);
      first = false;
    }
    header += "}";
  }
  std::vector<at::Tensor> data;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : state) {
    const Dtype* dtype = dtype_of(tensor.scalar_type());
    if (dtype == nullptr)
      throw DataError("safetensors: '" + name + "' has a dtype safetensors does not hold");
    const at::Tensor t = tensor.detach().to(at::kCPU).contiguous();
    const uint64_t bytes = static_cast<uint64_t>(t.numel()) * dtype->bytes;
    header += std::string(header.size() > 1 ? "," : "") + json_quoted(name) + ":{\"dtype\":\"" +
              dtype->name + "\",\"shape\":[";
    for (int64_t i = 0; i < t.dim(); ++i) header += (i ? "," : "") + std::to_string(t.size(i));
    header += "],\"data_offsets\":[" + std::to_string(offset) + "," +
              std::to_string(offset + bytes) + "]}";
    offset += bytes;
    data.push_back(t);
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(header.size() >> (8 * i) & 0xff);
  bytes += header;
  bytes.reserve(bytes.size() + offset);
  for (const auto& t : data)
    bytes.append(static_cast<const char*>(t.data_ptr()), t.numel() * t.element_size());
  write_file_replacing(path, bytes);
}

}  // namespace lockstep
