// MNIST's idx files (http://yann.lecun.com/exdb/mnist/ format): a big-endian
// header (magic 2051 for images, 2049 for labels; then counts and sizes),
// then unsigned bytes. Read whole (gunzipped when only the .gz is there),
// checked against their headers.
#include <ATen/ATen.h>
#include <sys/stat.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "lockstep/data/dataset.h"
#include "lockstep/util/error.h"
#include "lockstep/util/fs.h"

namespace lockstep {
namespace {

uint32_t big_endian(const std::string& bytes, size_t offset) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data()) + offset;
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

// The bytes an idx file's header promises, header included, once `bytes`
// holds the header (0: not yet; kNoLimit: not an idx header, let the
// header check say so).
constexpr size_t kNoLimit = ~size_t{0};
size_t promised_size(const std::string& bytes) {
  if (bytes.size() < 4) return 0;
  const size_t dims = static_cast<unsigned char>(bytes[3]);
  if (bytes[0] != 0 || bytes[1] != 0 || dims == 0 || dims > 4) return kNoLimit;
  if (bytes.size() < 4 + 4 * dims) return 0;
  uint64_t total = 1;
  for (size_t d = 0; d < dims; ++d)
    if (__builtin_mul_overflow(total, uint64_t{big_endian(bytes, 4 + 4 * d)}, &total))
      return kNoLimit;
  return total > (uint64_t{1} << 34) ? kNoLimit : 4 + 4 * dims + static_cast<size_t>(total);
}

// A gzipped idx file (Debian's dataset-fashion-mnist ships them so),
// decompressed in pieces of 64 KiB, stopping at the first piece past what
// its header promises (a gzip bomb stops there; idx_header then names the
// excess); a promise no gzip file of this size can keep is refused unread.
std::string gunzip_idx(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw DataError(path + ": cannot open: " + std::strerror(errno));
  // Deflate expands at most 1032:1: a header that promises more than the
  // file can hold is refused before anything is inflated or reserved.
  const size_t most = 1032 * static_cast<size_t>(st.st_size) + (1 << 20);
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) throw DataError(path + ": cannot open: " + std::strerror(errno));
  std::string bytes;
  char piece[1 << 16];
  bool reserved = false;
  for (;;) {
    const size_t limit = promised_size(bytes);
    if (limit != 0 && limit != kNoLimit && !reserved) {
      if (limit > most) {
        gzclose(file);
        throw DataError(path + ": its idx header promises " + std::to_string(limit) +
                        " bytes, more than a gzip file of " + std::to_string(st.st_size) +
                        " bytes can hold");
      }
      bytes.reserve(limit + sizeof piece);
      reserved = true;
    }
    if (limit != 0 && limit != kNoLimit && bytes.size() > limit) break;
    const int n = gzread(file, piece, sizeof piece);
    if (n < 0) {
      int code = 0;
      const std::string why = gzerror(file, &code);
      gzclose(file);
      throw DataError(path + ": not a readable gzip file: " + why);
    }
    if (n == 0) {
      int code = Z_OK;
      const std::string why = gzerror(file, &code);
      if (code != Z_OK) {  // cut short: zlib says so only here
        gzclose(file);
        throw DataError(path + ": not a readable gzip file: " + why);
      }
      break;
    }
    bytes.append(piece, static_cast<size_t>(n));
    if (promised_size(bytes) == kNoLimit) break;  // the header check says what is wrong
  }
  gzclose(file);
  return bytes;
}

// `path`, or `path`.gz where only that exists: the file read.
std::string present(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 && ::stat((path + ".gz").c_str(), &st) == 0)
    return path + ".gz";
  return path;
}

std::string read_file(const std::string& path) {
  if (path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0) return gunzip_idx(path);
  try {
    return read_regular_file(path);
  } catch (const DataError& e) {
    throw DataError(std::string(e.what()) +
                    " (MNIST needs the four idx files in one folder, uncompressed or as .gz)");
  }
}

// Returns the header's dimensions after checking magic and size.
std::vector<int64_t> idx_header(const std::string& bytes, const std::string& path, uint32_t magic,
                                size_t dims) {
  const size_t header = 4 + 4 * dims;
  if (bytes.size() < header) throw DataError(path + ": truncated idx header");
  if (big_endian(bytes, 0) != magic) {
    throw DataError(path + ": magic number " + std::to_string(big_endian(bytes, 0)) + " is not " +
                    std::to_string(magic) + " (not an idx file of this kind, or still gzipped?)");
  }
  std::vector<int64_t> shape;
  int64_t total = 1;
  for (size_t d = 0; d < dims; ++d) {
    shape.push_back(big_endian(bytes, 4 + 4 * d));
    if (shape.back() == 0 || __builtin_mul_overflow(total, shape.back(), &total)) {
      throw DataError(path + ": header dimension " + std::to_string(d) + " is " +
                      std::to_string(shape.back()) +
                      (shape.back() == 0 ? " (empty images or no examples)" : " (sizes overflow)"));
    }
  }
  if (bytes.size() != header + static_cast<size_t>(total)) {
    throw DataError(path + ": holds " + std::to_string(bytes.size() - header) +
                    " data bytes, its header promises " + std::to_string(total));
  }
  return shape;
}

}  // namespace

TensorDataset dataset_mnist(const std::string& dir, bool train) {
  const std::string prefix = dir + "/" + (train ? "train" : "t10k");
  const std::string images_path = present(prefix + "-images-idx3-ubyte");
  const std::string labels_path = present(prefix + "-labels-idx1-ubyte");
  const std::string images = read_file(images_path);
  const std::string labels = read_file(labels_path);
  const auto shape = idx_header(images, images_path, 2051, 3);
  const auto count = idx_header(labels, labels_path, 2049, 1);
  if (shape[0] != count[0]) {
    throw DataError(images_path + " has " + std::to_string(shape[0]) + " images but " +
                    labels_path + " has " + std::to_string(count[0]) + " labels");
  }
  if (shape[0] == 0) throw DataError(images_path + ": no images");
  TensorDataset data;
  data.name = std::string("mnist/") + (train ? "train" : "test");
  data.features = at::from_blob(const_cast<char*>(images.data()) + 16,
                                {shape[0], 1, shape[1], shape[2]}, at::kByte)
                      .to(at::kFloat)
                      .div_(255.0);
  data.targets =
      at::from_blob(const_cast<char*>(labels.data()) + 8, {count[0]}, at::kByte).to(at::kLong);
  const int64_t largest = data.targets.max().item<int64_t>();
  if (largest > 9) {
    throw DataError(labels_path + ": label " + std::to_string(largest) + " is not a digit 0..9");
  }
  data.num_classes = 10;
  return data;
}

}  // namespace lockstep
