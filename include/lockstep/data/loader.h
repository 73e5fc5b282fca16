// BatchLoader: batches of a TensorDataset in the order of a list of indices
// (usually DistributedSampler::indices()), optionally assembled one batch
// ahead on a background thread. The order never depends on timing: the same
// indices give the same batches, prefetch or not.
#pragma once

#include <ATen/core/Tensor.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "lockstep/data/dataset.h"

namespace lockstep {

struct Batch {
  at::Tensor x;
  at::Tensor y;
};

struct LoaderOptions {
  int64_t batch_size = 32;  // per rank
  bool drop_last = false;   // drop a final short batch
  bool prefetch = true;     // assemble the next batch on a background thread
};

class BatchLoader {
 public:
  // Throws ConfigError for batch_size < 1 and DataError for an empty dataset
  // or an index outside it.
  BatchLoader(const TensorDataset& data, std::vector<int64_t> indices, LoaderOptions options);
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  int64_t num_batches() const { return num_batches_; }
  // The next batch, or nullopt after the last one.
  std::optional<Batch> next();

 private:
  Batch assemble(int64_t batch) const;
  void produce();

  const TensorDataset& data_;
  std::vector<int64_t> indices_;
  LoaderOptions options_;
  int64_t num_batches_ = 0;
  int64_t consumed_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Batch> ready_;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread worker_;
};

}  // namespace lockstep
