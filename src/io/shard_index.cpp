#include "lockstep/io/shard_index.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <sstream>

#include "lockstep/util/error.h"
#include "lockstep/util/fs.h"
#include "lockstep/util/hex.h"
#include "lockstep/util/utf8.h"

namespace lockstep {

// Note [Shard index]
// ~~~~~~~~~~~~~~~~~~
// metadata.txt is plain text, one record per line, fields separated by one
// space (names never hold spaces: PyTorch's dotted names), so that a person
// reads it and Python parses it with split():
//   lockstep-sharded-checkpoint 1
//   world_size 2 / zero 3 / step 120
//   file shard_00000.bin <bytes> <sha256>            one per writing rank
//   tensor <part>/<entry> <dtype> <d0,d1,...|-> <file index> <offset> <bytes>
//   end
// A tensor is one piece: lockstep's owners hold whole tensors (ZeRO's
// partition and fully_shard's are by parameter), so resharding is choosing
// which rank reads which tensor, never cutting one. Offsets are multiples of
// 64 (aligned reads). The reader trusts nothing: at most 64 MiB of text,
// 2^20 tensors (a million: no model has more), 2^16 files, 16 dimensions each in [0, 2^40]; bytes =
// elements x the dtype's size without overflow; every range inside its
// file's listed size, no two ranges of a file overlapping, no name twice;
// then check_files() holds the listed sizes against the files on disk
// before any tensor is read (pread of its own range alone), and the
// MANIFEST's SHA-256s prove the bytes (checkpoint.cpp).
namespace {

constexpr uint64_t kAlign = 64;
constexpr size_t kMaxEntries = size_t{1} << 20, kMaxFiles = size_t{1} << 16, kMaxDims = 16;
constexpr int64_t kMaxDim = int64_t{1} << 40;

struct Dtype {
  const char* name;
  at::ScalarType type;
};
constexpr Dtype kDtypes[] = {{"float32", at::kFloat}, {"float64", at::kDouble},
                             {"float16", at::kHalf},  {"bfloat16", at::kBFloat16},
                             {"int64", at::kLong},    {"int32", at::kInt},
                             {"int16", at::kShort},   {"int8", at::kChar},
                             {"uint8", at::kByte},    {"bool", at::kBool}};

const char* dtype_name(at::ScalarType t) {
  for (const auto& d : kDtypes)
    if (d.type == t) return d.name;
  throw InternalError(std::string("sharded checkpoint: no name for dtype ") + c10::toString(t));
}

// Non-empty, at most `max` bytes, valid UTF-8 without spaces or control
// characters (a pickled dict's keys must decode in Python).
bool plain_name(const std::string& s, size_t max) {
  if (s.empty() || s.size() > max) return false;
  for (const unsigned char c : s)
    if (c <= ' ' || c == 0x7f) return false;
  Utf8Stream check([](const std::string&) {});
  for (const unsigned char c : s) check.put(c);
  check.finish();
  return check.replaced() == 0;
}

// "<part>.pt/<entry>" with both halves non-empty.
bool entry_name(const std::string& s) {
  const auto slash = s.find(".pt/");
  return plain_name(s, 1024) && slash != std::string::npos && slash > 0 && slash + 4 < s.size();
}

bool parse_u64(const std::string& s, uint64_t& out) {
  if (s.empty() || s.size() > 19 || s.find_first_not_of("0123456789") != std::string::npos)
    return false;
  out = std::stoull(s);
  return true;
}

std::vector<std::string> split(const std::string& line) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t space = line.find(' ', start);
    out.push_back(line.substr(start, space - start));
    if (space == std::string::npos) return out;
    start = space + 1;
  }
}

// The DataError of line `line_no` of the index `source`.
struct LineError {
  const std::string& source;
  const size_t& line_no;
  [[noreturn]] void operator()(const std::string& why) const {
    throw DataError(source + ": line " + std::to_string(line_no) + ": " + why);
  }
};

// Which of world_size, zero and step the index has set.
struct Settings {
  bool world = false, zero = false, step = false;
};

// "world_size <n>", "zero <n>" or "step <n>".
void parse_setting(const std::vector<std::string>& f, const LineError& bad, ShardIndex& index,
                   Settings& have) {
  uint64_t v = 0;
  if (!parse_u64(f[1], v) || v > (uint64_t{1} << 53)) bad(f[0] + " is not a whole number");
  if (f[0] == "world_size") {
    if (v < 1 || v > (1u << 20)) bad("world_size outside [1, 2^20]");
    index.world_size = static_cast<int64_t>(v);
    have.world = true;
  } else if (f[0] == "zero") {
    if (v > 3) bad("zero outside [0, 3]");
    index.zero = static_cast<int64_t>(v);
    have.zero = true;
  } else {
    index.step = static_cast<int64_t>(v);
    have.step = true;
  }
}

// "file <name> <bytes> <sha256>": a shard file of the index's folder.
void parse_file(const std::vector<std::string>& f, const LineError& bad, ShardIndex& index) {
  ShardFile file;
  file.name = f[1];
  if (!plain_name(file.name, 64) || file.name[0] == '.' ||
      file.name.find('/') != std::string::npos) {
    // Named: GCC 12 warns falsely (-Wstringop-overflow) on "'" + substr() here.
    const std::string shown = file.name.substr(0, 64);
    bad("'" + shown + "' is no file name of this folder");
  }
  if (!parse_u64(f[2], file.size)) bad("the size of " + file.name + " is not a whole number");
  if (f[3].size() != 64 || f[3].find_first_not_of("0123456789abcdef") != std::string::npos)
    bad("the SHA-256 of " + file.name + " is not 64 hex digits");
  file.sha256 = f[3];
  for (const auto& other : index.files)
    if (other.name == file.name) bad(file.name + " is listed twice");
  if (index.files.size() >= kMaxFiles) bad("over 65536 files");
  index.files.push_back(file);
}

// The shape "d0,d1,..." ("-": none) into e.shape; returns its elements.
uint64_t parse_shape(const std::string& text, ShardEntry& e, const LineError& bad) {
  // `elements` the tensor's; `extent` the product with zeros as ones,
  // which bounds the strides a shape with a zero still gets.
  uint64_t elements = 1, extent = 1;
  if (text == "-") return elements;
  size_t from = 0;
  for (;;) {
    const size_t comma = text.find(',', from);
    uint64_t d = 0;
    if (!parse_u64(text.substr(from, comma - from), d) || d > static_cast<uint64_t>(kMaxDim) ||
        e.shape.size() >= kMaxDims)
      bad("'" + e.name + "': the shape '" + text.substr(0, 60) +
          "' is not up to 16 whole numbers in [0, 2^40] joined by commas");
    e.shape.push_back(static_cast<int64_t>(d));
    const uint64_t one = std::max<uint64_t>(d, 1);
    if (extent > (uint64_t{1} << 62) / one) bad("'" + e.name + "': the shape's size overflows");
    extent *= one;
    elements *= d;
    if (comma == std::string::npos) break;
    from = comma + 1;
  }
  return elements;
}

// e's byte range inside its file's listed size.
void check_range(const ShardEntry& e, const ShardIndex& index, const LineError& bad) {
  const uint64_t size = index.files[e.file].size;
  if (e.offset > size || e.bytes > size - e.offset)
    bad("'" + e.name + "': bytes " + std::to_string(e.offset) + ".." +
        std::to_string(e.offset + e.bytes) + " lie outside " + index.files[e.file].name + " (" +
        std::to_string(size) + " bytes)");
}

// "tensor <part>/<entry> <dtype> <shape> <file index> <offset> <bytes>";
// `names`: those of the tensors so far.
void parse_tensor(const std::vector<std::string>& f, const LineError& bad, ShardIndex& index,
                  std::set<std::string>& names) {
  ShardEntry e;
  e.name = f[1];
  if (!entry_name(e.name))
    bad("the tensor name '" + e.name.substr(0, 80) +
        "' is not '<part>.pt/<entry>' in UTF-8 without spaces");
  if (!names.insert(e.name).second) bad("'" + e.name + "' is listed twice");
  if (index.entries.size() >= kMaxEntries) bad("over 2^20 tensors");
  const Dtype* dtype = nullptr;
  for (const auto& d : kDtypes)
    if (f[2] == d.name) dtype = &d;
  if (dtype == nullptr) bad("'" + e.name + "': unknown dtype '" + f[2].substr(0, 20) + "'");
  e.dtype = dtype->type;
  const uint64_t elements = parse_shape(f[3], e, bad);
  const uint64_t item = c10::elementSize(e.dtype);
  uint64_t file = 0;
  if (!parse_u64(f[4], file) || file >= index.files.size())
    bad("'" + e.name + "': file index " + f[4].substr(0, 20) + " names no 'file' line above");
  e.file = static_cast<size_t>(file);
  if (!parse_u64(f[5], e.offset) || !parse_u64(f[6], e.bytes))
    bad("'" + e.name + "': offset and bytes are not whole numbers");
  if (e.offset % kAlign != 0) bad("'" + e.name + "': offset " + f[5] + " is not a multiple of 64");
  if (elements > (uint64_t{1} << 62) / item || e.bytes != elements * item)
    bad("'" + e.name + "': " + std::to_string(e.bytes) + " bytes for a " + f[2] +
        " tensor of shape " + f[3] + " (it needs elements x " + std::to_string(item) + ")");
  check_range(e, index, bad);
  index.entries.push_back(std::move(e));
}

// No two ranges of one file overlap: by offset, each non-empty range
// starts at or after the furthest end so far (an empty one between two
// overlapping ranges hides nothing), so every byte is read at most once.
void check_overlaps(const ShardIndex& index, const std::string& source) {
  std::vector<const ShardEntry*> sorted;
  for (const auto& e : index.entries)
    if (e.bytes > 0) sorted.push_back(&e);
  std::sort(sorted.begin(), sorted.end(), [](const ShardEntry* a, const ShardEntry* b) {
    return a->file != b->file ? a->file < b->file : a->offset < b->offset;
  });
  const ShardEntry* furthest = nullptr;
  for (const ShardEntry* e : sorted) {
    if (furthest != nullptr && furthest->file == e->file &&
        furthest->offset + furthest->bytes > e->offset)
      throw DataError(source + ": '" + furthest->name + "' and '" + e->name + "' overlap in " +
                      index.files[e->file].name);
    if (furthest == nullptr || furthest->file != e->file ||
        e->offset + e->bytes > furthest->offset + furthest->bytes)
      furthest = e;
  }
}

}  // namespace

const char* shard_dtype_name(at::ScalarType dtype) {
  return dtype_name(dtype);
}

std::string shard_file_name(int rank) {
  char name[32];
  std::snprintf(name, sizeof name, "shard_%05d.bin", rank);
  return name;
}

std::string ShardIndex::to_text() const {
  std::ostringstream out;
  out << "lockstep-sharded-checkpoint 1\nworld_size " << world_size << "\nzero " << zero
      << "\nstep " << step << "\n";
  for (const auto& f : files) out << "file " << f.name << " " << f.size << " " << f.sha256 << "\n";
  for (const auto& e : entries) {
    if (!plain_name(e.name, 1024))
      throw InternalError("sharded checkpoint: the entry name '" + e.name.substr(0, 80) +
                          "' is empty or holds a space or a control character");
    out << "tensor " << e.name << " " << dtype_name(e.dtype) << " ";
    if (e.shape.empty()) out << "-";
    for (size_t d = 0; d < e.shape.size(); ++d) out << (d ? "," : "") << e.shape[d];
    out << " " << e.file << " " << e.offset << " " << e.bytes << "\n";
  }
  out << "end\n";
  return out.str();
}

ShardIndex ShardIndex::parse(const std::string& text, const std::string& source) {
  ShardIndex index;
  size_t line_no = 0, start = 0;
  const LineError bad{source, line_no};
  bool header = false, ended = false;
  Settings have;
  std::set<std::string> names;
  while (start < text.size()) {
    const size_t nl = text.find('\n', start);
    if (nl == std::string::npos) {
      ++line_no;
      bad("the file does not end with a line break (truncated?)");
    }
    const std::string line = text.substr(start, nl - start);
    start = nl + 1;
    ++line_no;
    if (ended) bad("text after 'end'");
    const auto f = split(line);
    if (!header) {
      if (line != "lockstep-sharded-checkpoint 1")
        bad("not a lockstep sharded-checkpoint index of version 1 (first line '" +
            line.substr(0, 60) + "')");
      header = true;
      continue;
    }
    if ((f[0] == "world_size" || f[0] == "zero" || f[0] == "step") && f.size() == 2) {
      parse_setting(f, bad, index, have);
    } else if (f[0] == "file" && f.size() == 4) {
      parse_file(f, bad, index);
    } else if (f[0] == "tensor" && f.size() == 7) {
      parse_tensor(f, bad, index, names);
    } else if (line == "end") {
      ended = true;
    } else {
      bad("unknown record '" + line.substr(0, 60) + "'");
    }
  }
  if (!header) throw DataError(source + ": empty");
  if (!ended) throw DataError(source + ": no 'end' line (truncated)");
  if (!have.world || !have.zero || !have.step)
    throw DataError(source + ": world_size, zero and step are each required");
  check_overlaps(index, source);
  return index;
}

void ShardIndex::check_files(const std::string& folder) const {
  for (const auto& f : files) {
    const std::string path = folder + "/" + f.name;
    struct stat st {};
    if (lstat(path.c_str(), &st) != 0)
      throw DataError("sharded checkpoint '" + folder + "': the shard " + f.name + " is missing (" +
                      std::strerror(errno) + ")");
    if (!S_ISREG(st.st_mode))
      throw DataError("sharded checkpoint '" + folder + "': " + f.name + " is not a regular file");
    if (static_cast<uint64_t>(st.st_size) != f.size)
      throw DataError("sharded checkpoint '" + folder + "': " + f.name + " is " +
                      std::to_string(st.st_size) + " bytes, its index says " +
                      std::to_string(f.size) + " (truncated or replaced)");
  }
}

std::vector<const ShardEntry*> ShardIndex::part(const std::string& part) const {
  std::vector<const ShardEntry*> out;
  const std::string prefix = part + "/";
  for (const auto& e : entries)
    if (e.name.compare(0, prefix.size(), prefix) == 0) out.push_back(&e);
  return out;
}

at::Tensor shard_read(const std::string& folder, const ShardIndex& index, const ShardEntry& entry) {
  const std::string path = folder + "/" + index.files.at(entry.file).name;
  at::Tensor t = at::empty(entry.shape, at::TensorOptions().dtype(entry.dtype));
  if (entry.bytes == 0) return t;
  const int fd = open_regular_file(path);
  char* out = static_cast<char*>(t.data_ptr());
  uint64_t done = 0;
  while (done < entry.bytes) {
    const ssize_t n =
        pread(fd, out + done, entry.bytes - done, static_cast<off_t>(entry.offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<uint64_t>(n);
  }
  close(fd);
  if (done != entry.bytes)
    throw DataError("'" + path + "' ends before '" + entry.name + "' (bytes " +
                    std::to_string(entry.offset) + ".." +
                    std::to_string(entry.offset + entry.bytes) + "): truncated");
  return t;
}

ShardWriter::ShardWriter(std::string path) : path_(path), out_(std::move(path)) {}

void ShardWriter::write(const void* data, size_t size) {
  out_.append(data, size);
  sha_.update(data, size);
  size_ += size;
}

ShardEntry ShardWriter::append(const std::string& name, const at::Tensor& tensor) {
  static const char kZeros[kAlign] = {};
  if (size_ % kAlign != 0) write(kZeros, kAlign - size_ % kAlign);
  const at::Tensor t = tensor.detach().cpu().contiguous();
  ShardEntry e;
  e.name = name;
  e.dtype = t.scalar_type();
  dtype_name(e.dtype);  // a dtype the index can name
  e.shape = t.sizes().vec();
  e.offset = size_;
  e.bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
  if (e.bytes > 0) write(t.data_ptr(), e.bytes);
  return e;
}

ShardFile ShardWriter::finish() {
  out_.finish();
  ShardFile f;
  const auto slash = path_.rfind('/');
  f.name = slash == std::string::npos ? path_ : path_.substr(slash + 1);
  f.size = size_;
  f.sha256 = hex_of(sha_.finish());
  return f;
}

}  // namespace lockstep
