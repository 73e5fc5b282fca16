// BatchLoader: batches of a dataset in the order of a DistributedSampler (a
// new pass, reshuffled, for each epoch) or of a fixed list of indices,
// optionally assembled one batch ahead on a background thread. The order
// never depends on timing: the same indices give the same batches, prefetch
// or not. As PyTorch's DataLoader(dataset, sampler=sampler):
//
//   auto sampler = std::make_shared<lockstep::DistributedSampler>(n, shard);
//   lockstep::BatchLoader loader(dataset, sampler, {batch_size});
//   for (int64_t epoch = 0; epoch < epochs; ++epoch) {
//     sampler->set_epoch(epoch);                 // or loader.set_epoch(epoch)
//     for (const lockstep::Batch& batch : loader) { ... }
//   }
//
// The loader shares its dataset (a TensorDataset's tensors, or a Dataset
// held by shared_ptr) and its sampler: a temporary passed in cannot dangle,
// and the sampler's set_epoch reaches the loader.
#pragma once

#include <ATen/core/Tensor.h>

#include <condition_variable>
#include <deque>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "lockstep/data/dataset.h"
#include "lockstep/data/sampler.h"

namespace lockstep {

struct Batch {
  at::Tensor x;
  at::Tensor y;
};

struct Example {
  at::Tensor x;
  at::Tensor y;
};

// Any dataset that yields examples by index: files read on demand, a
// generator, or a TensorDataset (TensorExamples). get() may be called from
// the loader's background thread.
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual Example get(int64_t index) const = 0;
  // The examples at `indices` stacked along a new first dimension. The
  // default stacks get(); override it when a batch is cheaper whole.
  virtual Batch get_batch(const std::vector<int64_t>& indices) const;
  // For error messages.
  virtual std::string name() const { return "dataset"; }
  // A dataset read from files while training (token files): whether it
  // checks them, and the check, which throws DataError naming a file that
  // changed under the job. The trainer agrees on it across ranks before
  // every step (Note [Token files]).
  virtual bool file_backed() const { return false; }
  virtual void check_unchanged() const {}
};

// A TensorDataset as a Dataset: a batch is one index_select.
class TensorExamples : public Dataset {
 public:
  explicit TensorExamples(TensorDataset data) : data_(std::move(data)) {}
  int64_t size() const override { return data_.size(); }
  Example get(int64_t index) const override;
  Batch get_batch(const std::vector<int64_t>& indices) const override;
  std::string name() const override { return data_.name; }

 private:
  TensorDataset data_;
};

struct LoaderOptions {
  int64_t batch_size = 32;  // per rank
  bool drop_last = false;   // drop a final short batch
  bool prefetch = true;     // assemble the next batch on a background thread
};

class BatchLoader {
 public:
  // One order for every pass. Throws ConfigError for batch_size < 1 and
  // DataError for an empty dataset or an index outside it.
  BatchLoader(std::shared_ptr<const Dataset> data, std::vector<int64_t> indices,
              LoaderOptions options);
  // The sampler's order; each pass reads it for the sampler's epoch then.
  BatchLoader(std::shared_ptr<const Dataset> data, std::shared_ptr<DistributedSampler> sampler,
              LoaderOptions options);
  // The same over a TensorDataset, whose tensors the loader shares.
  BatchLoader(const TensorDataset& data, std::vector<int64_t> indices, LoaderOptions options);
  BatchLoader(const TensorDataset& data, std::shared_ptr<DistributedSampler> sampler,
              LoaderOptions options);
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  // The sampler's set_epoch (a loader over fixed indices refuses it); the
  // next pass follows the new order.
  void set_epoch(int64_t epoch);
  int64_t num_batches() const { return num_batches_; }
  // The next batch of this pass, or nullopt after its last one.
  std::optional<Batch> next();

  // Range-for: begin() starts a new pass, unless this one is untouched and
  // the sampler's epoch is still the one it was read for.
  class iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    using pointer = const Batch*;
    using reference = const Batch&;
    iterator() = default;
    explicit iterator(BatchLoader* loader) : loader_(loader) { ++*this; }
    const Batch& operator*() const { return *current_; }
    const Batch* operator->() const { return &*current_; }
    iterator& operator++() {
      current_ = loader_->next();
      if (!current_) loader_ = nullptr;
      return *this;
    }
    bool operator==(const iterator& other) const { return loader_ == other.loader_; }
    bool operator!=(const iterator& other) const { return !(*this == other); }

   private:
    BatchLoader* loader_ = nullptr;
    std::optional<Batch> current_;
  };
  iterator begin();
  iterator end() { return iterator(); }

 private:
  void start_pass();
  void stop_worker();
  Batch assemble(int64_t batch) const;
  void produce();

  std::shared_ptr<const Dataset> data_;
  std::shared_ptr<DistributedSampler> sampler_;
  int64_t pass_epoch_ = 0;  // the sampler's epoch this pass was read for
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
