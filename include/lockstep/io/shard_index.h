// A sharded checkpoint's index (metadata.txt) and its shard files
// (Note [Shard index], shard_index.cpp; docs/checkpoints.md): each rank
// writes the whole tensors it owns, back to back at 64-byte offsets, to
// shard_<rank>.bin; the index names every tensor's dtype, shape, file and
// byte range. Read as hostile: every number is checked against the files
// before a byte of a tensor is read, and a tensor is read with pread from
// its range alone.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/util/fs.h"
#include "lockstep/util/sha256.h"

namespace lockstep {

struct ShardEntry {
  std::string
      name;  // "<part file>/<entry>": "model.pt/fc1.weight", "optimizer.pt/fc1.weight.exp_avg"
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  size_t file = 0;  // index into ShardIndex::files
  uint64_t offset = 0, bytes = 0;
};

struct ShardFile {
  std::string name;  // "shard_00001.bin"
  uint64_t size = 0;
  std::string sha256;  // hex, as the MANIFEST lists it
};

struct ShardIndex {
  int64_t world_size = 1, zero = 0, step = 0;
  std::vector<ShardFile> files;
  std::vector<ShardEntry> entries;  // in the writer's state-dict order

  std::string to_text() const;
  // `source` names the file in errors. DataError for anything malformed:
  // an unknown line or dtype, a shape whose bytes overflow or differ from the
  // range, a range outside its file, two ranges overlapping, a name twice.
  static ShardIndex parse(const std::string& text, const std::string& source);
  // Each file present in `folder` as a regular file of the listed size;
  // DataError naming the first that is missing or another size.
  void check_files(const std::string& folder) const;
  // The entries whose name starts with "<part>/", in order.
  std::vector<const ShardEntry*> part(const std::string& part) const;
};

// "shard_00003.bin".
std::string shard_file_name(int rank);
// PyTorch's name of a dtype as the index writes it ("float32", "bfloat16").
const char* shard_dtype_name(at::ScalarType dtype);
// The file name of an index (metadata.txt) and the dtype names it uses
// (PyTorch's: "float32", "bfloat16", ...).
inline constexpr const char* kShardIndexFile = "metadata.txt";

// One entry read from its byte range (pread; CPU, owning its memory).
// DataError naming the file when it is shorter than the index says.
at::Tensor shard_read(const std::string& folder, const ShardIndex& index, const ShardEntry& entry);

// Writes one shard file: tensors appended at 64-byte offsets, the SHA-256
// taken as the bytes go out (nothing read back), fsynced by finish().
class ShardWriter {
 public:
  explicit ShardWriter(std::string path);
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;
  // Appends `t` (CPU, any layout: written contiguous); returns its entry
  // (file index 0: the caller sets it).
  ShardEntry append(const std::string& name, const at::Tensor& t);
  // Size and SHA-256 (hex) of the whole file; syncs and closes it.
  ShardFile finish();

 private:
  void write(const void* data, size_t size);
  std::string path_;
  FileWriter out_;
  uint64_t size_ = 0;
  Sha256 sha_;
};

}  // namespace lockstep
