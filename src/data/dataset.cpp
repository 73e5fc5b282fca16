// Synthetic datasets, the embedded digits, and the train/validation split.
// (CSV and MNIST readers live in csv.cpp and mnist.cpp.)
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <zlib.h>

#include <cmath>

#include "lockstep/data/dataset.h"
#include "lockstep/util/error.h"

namespace lockstep {
namespace embedded {
extern const uint8_t digits_csv_gz[];
extern const size_t digits_csv_gz_size;
}  // namespace embedded

namespace {

void check_positive(int64_t value, const char* what) {
  if (value < 1)
    throw ConfigError(std::string(what) + "=" + std::to_string(value) + " must be >= 1");
}

std::string gunzip(const uint8_t* data, size_t size, const std::string& source) {
  z_stream stream{};
  // 16 + MAX_WBITS: expect a gzip header.
  if (inflateInit2(&stream, 16 + MAX_WBITS) != Z_OK)
    throw DataError(source + ": inflateInit failed");
  stream.next_in = const_cast<Bytef*>(data);
  stream.avail_in = static_cast<uInt>(size);
  std::string out;
  char chunk[1 << 16];
  int status = Z_OK;
  while (status != Z_STREAM_END) {
    stream.next_out = reinterpret_cast<Bytef*>(chunk);
    stream.avail_out = sizeof chunk;
    status = inflate(&stream, Z_NO_FLUSH);
    if (status != Z_OK && status != Z_STREAM_END) {
      inflateEnd(&stream);
      throw DataError(source + ": corrupt gzip data");
    }
    out.append(chunk, sizeof chunk - stream.avail_out);
  }
  inflateEnd(&stream);
  return out;
}

}  // namespace

TensorDataset dataset_synthetic_classification(int64_t size, int64_t features, int64_t classes,
                                               uint64_t seed) {
  check_positive(size, "size");
  check_positive(features, "features");
  if (classes < 2) throw ConfigError("classes=" + std::to_string(classes) + " must be >= 2");
  auto gen = at::detail::createCPUGenerator(seed);
  TensorDataset data;
  data.name = "synthetic-classification";
  data.features = at::randn({size, features}, gen, at::kFloat);
  const auto teacher = at::randn({features, classes}, gen, at::kFloat);
  data.targets = at::matmul(data.features, teacher).argmax(1);
  data.num_classes = classes;
  return data;
}

TensorDataset dataset_synthetic_regression(int64_t size, int64_t features, uint64_t seed) {
  check_positive(size, "size");
  check_positive(features, "features");
  auto gen = at::detail::createCPUGenerator(seed);
  TensorDataset data;
  data.name = "synthetic-regression";
  data.features = at::randn({size, features}, gen, at::kFloat);
  const auto w = at::randn({features}, gen, at::kFloat);
  data.targets = at::matmul(data.features, w) + 0.1 * at::randn({size}, gen, at::kFloat);
  return data;
}

TensorDataset dataset_digits() {
  CsvOptions options;
  options.header = CsvOptions::Header::kNo;
  options.num_classes = 10;
  auto data = dataset_csv_text(
      gunzip(embedded::digits_csv_gz, embedded::digits_csv_gz_size, "embedded digits.csv.gz"),
      "embedded digits.csv.gz", options);
  data.name = "digits";
  data.features.div_(16.0);  // pixel counts 0..16
  return data;
}

DatasetSplit dataset_split(const TensorDataset& data, double validation_fraction, uint64_t seed) {
  if (!(validation_fraction >= 0 && validation_fraction < 1)) {
    throw ConfigError("validation fraction " + std::to_string(validation_fraction) +
                      " must be in [0, 1)");
  }
  const int64_t n = data.size();
  const auto count =
      static_cast<int64_t>(std::llround(static_cast<double>(n) * validation_fraction));
  auto gen = at::detail::createCPUGenerator(seed);
  const auto perm = at::randperm(n, gen, at::kLong);
  auto take = [&](const at::Tensor& idx, const std::string& suffix) {
    TensorDataset part;
    part.name = data.name + suffix;
    part.features = data.features.index_select(0, idx);
    part.targets = data.targets.index_select(0, idx);
    part.num_classes = data.num_classes;
    return part;
  };
  return {take(perm.slice(0, count, n), "/train"), take(perm.slice(0, 0, count), "/validation")};
}

}  // namespace lockstep
