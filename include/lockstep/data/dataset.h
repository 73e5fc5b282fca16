// Datasets held in memory as two tensors. All lockstep datasets are small
// enough for that (MNIST's 60,000 images are 188 MB as float32), and it makes
// batching an index_select.
//
// Readers throw DataError naming the file (and line) on missing or
// unreadable files, malformed rows, labels out of range and empty data.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace lockstep {

struct TensorDataset {
  std::string name;
  at::Tensor features;      // [N, ...] float32
  at::Tensor targets;       // [N]: int64 class labels, or float32 for regression
  int64_t num_classes = 0;  // 0 for regression
  int64_t size() const { return features.defined() ? features.size(0) : 0; }
};

// Seeded synthetic data: Gaussian features, labels from a fixed random
// linear teacher (so the task is learnable), any size.
TensorDataset dataset_synthetic_classification(int64_t size, int64_t features, int64_t classes,
                                               uint64_t seed);
// y = x . w + 0.1 * noise, with w drawn from the seed.
TensorDataset dataset_synthetic_regression(int64_t size, int64_t features, uint64_t seed);

struct CsvOptions {
  // The label column: a header name, or an index (negative counts from the
  // end: -1 is the last column).
  std::string label_column = "-1";
  enum class Header { kAuto, kYes, kNo };
  // kAuto: the first line is a header if any of its fields is not a number.
  Header header = Header::kAuto;
  bool regression = false;
  // Classification: labels must be integers in [0, num_classes); 0 infers
  // num_classes as the largest label + 1.
  int64_t num_classes = 0;
  // With num_classes inferred: a label at or above this is an error, not
  // a model with millions of outputs.
  int64_t max_classes = 100000;
  char delimiter = ',';
};

TensorDataset dataset_csv(const std::string& path, const CsvOptions& options = {});
// The same parser over text already in memory; `source` names it in errors.
TensorDataset dataset_csv_text(const std::string& text, const std::string& source,
                               const CsvOptions& options = {});

// MNIST's idx files in `dir`: train-images-idx3-ubyte/train-labels-idx1-ubyte
// (train) or t10k-*. Images [N, 1, 28, 28] scaled to [0, 1].
TensorDataset dataset_mnist(const std::string& dir, bool train);

// The 8x8 handwritten digits compiled into the library (data/README.md):
// 1,797 images as [N, 64] features scaled to [0, 1], 10 classes.
TensorDataset dataset_digits();

struct DatasetSplit {
  TensorDataset train;
  TensorDataset validation;
};
// Deterministic: a permutation drawn from `seed`; the first
// round(size * validation_fraction) examples of it validate.
DatasetSplit dataset_split(const TensorDataset& data, double validation_fraction, uint64_t seed);

}  // namespace lockstep
