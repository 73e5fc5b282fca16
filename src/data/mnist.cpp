// MNIST's idx files (http://yann.lecun.com/exdb/mnist/ format): a big-endian
// header (magic 2051 for images, 2049 for labels; then counts and sizes),
// then unsigned bytes. Read whole, checked against their headers.
#include <ATen/ATen.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "lockstep/data/dataset.h"
#include "lockstep/util/error.h"
#include "lockstep/util/fs.h"

namespace lockstep {
namespace {

std::string read_file(const std::string& path) {
  try {
    return read_regular_file(path);
  } catch (const DataError& e) {
    throw DataError(std::string(e.what()) +
                    " (MNIST needs the four idx files, uncompressed, in one folder)");
  }
}

uint32_t big_endian(const std::string& bytes, size_t offset) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data()) + offset;
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
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
  const std::string images_path = prefix + "-images-idx3-ubyte";
  const std::string labels_path = prefix + "-labels-idx1-ubyte";
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
