#include "lockstep/data/loader.h"

#include <ATen/ATen.h>

#include "lockstep/util/error.h"

namespace lockstep {
namespace {
constexpr size_t kAhead = 2;  // batches assembled ahead of the consumer
}

Batch Dataset::get_batch(const std::vector<int64_t>& indices) const {
  std::vector<at::Tensor> xs, ys;
  for (int64_t i : indices) {
    auto example = get(i);
    xs.push_back(std::move(example.x));
    ys.push_back(std::move(example.y));
  }
  return {at::stack(xs), at::stack(ys)};
}

Example TensorExamples::get(int64_t index) const {
  return {data_.features[index], data_.targets[index]};
}

Batch TensorExamples::get_batch(const std::vector<int64_t>& indices) const {
  const auto idx = at::tensor(indices, at::kLong);
  return {data_.features.index_select(0, idx), data_.targets.index_select(0, idx)};
}

BatchLoader::BatchLoader(std::shared_ptr<const Dataset> data, std::vector<int64_t> indices,
                         LoaderOptions options)
    : data_(std::move(data)), indices_(std::move(indices)), options_(options) {
  start_pass();
}

BatchLoader::BatchLoader(std::shared_ptr<const Dataset> data,
                         std::shared_ptr<DistributedSampler> sampler, LoaderOptions options)
    : data_(std::move(data)), sampler_(std::move(sampler)), options_(options) {
  if (!sampler_) throw UsageError("BatchLoader: the sampler is null");
  start_pass();
}

BatchLoader::BatchLoader(const TensorDataset& data, std::vector<int64_t> indices,
                         LoaderOptions options)
    : BatchLoader(std::make_shared<TensorExamples>(data), std::move(indices), options) {}

BatchLoader::BatchLoader(const TensorDataset& data, std::shared_ptr<DistributedSampler> sampler,
                         LoaderOptions options)
    : BatchLoader(std::make_shared<TensorExamples>(data), std::move(sampler), options) {}

BatchLoader::~BatchLoader() {
  stop_worker();
}

void BatchLoader::stop_worker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void BatchLoader::start_pass() {
  stop_worker();
  if (options_.batch_size < 1) {
    throw ConfigError("batch size " + std::to_string(options_.batch_size) + " must be >= 1");
  }
  if (!data_ || data_->size() == 0) {
    throw DataError("dataset '" + (data_ ? data_->name() : std::string("(none)")) + "' is empty");
  }
  if (sampler_) {
    indices_ = sampler_->indices();
    pass_epoch_ = sampler_->epoch();
  }
  for (int64_t i : indices_) {
    if (i < 0 || i >= data_->size()) {
      throw DataError("index " + std::to_string(i) + " is outside dataset '" + data_->name() +
                      "' of size " + std::to_string(data_->size()));
    }
  }
  const auto n = static_cast<int64_t>(indices_.size());
  num_batches_ = options_.drop_last ? n / options_.batch_size
                                    : (n + options_.batch_size - 1) / options_.batch_size;
  consumed_ = 0;
  ready_.clear();
  stop_ = false;
  error_ = nullptr;
  if (options_.prefetch && num_batches_ > 0) worker_ = std::thread([this] { produce(); });
}

void BatchLoader::set_epoch(int64_t epoch) {
  if (!sampler_) {
    throw UsageError(
        "BatchLoader::set_epoch: this loader follows a fixed list of indices; build it "
        "from a DistributedSampler to reshuffle per epoch");
  }
  sampler_->set_epoch(epoch);
  start_pass();
}

BatchLoader::iterator BatchLoader::begin() {
  if (consumed_ > 0 || (sampler_ && sampler_->epoch() != pass_epoch_)) start_pass();
  return iterator(this);
}

Batch BatchLoader::assemble(int64_t batch) const {
  const int64_t begin = batch * options_.batch_size;
  const int64_t end = std::min<int64_t>(begin + options_.batch_size, indices_.size());
  return data_->get_batch(std::vector<int64_t>(indices_.begin() + begin, indices_.begin() + end));
}

void BatchLoader::produce() {
  try {
    for (int64_t b = 0; b < num_batches_; ++b) {
      Batch batch = assemble(b);
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || ready_.size() < kAhead; });
      if (stop_) return;
      ready_.push_back(std::move(batch));
      cv_.notify_all();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::current_exception();
    cv_.notify_all();
  }
}

std::optional<Batch> BatchLoader::next() {
  if (consumed_ >= num_batches_) return std::nullopt;
  if (!worker_.joinable()) return assemble(consumed_++);
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !ready_.empty() || error_; });
  if (ready_.empty()) std::rethrow_exception(error_);
  Batch batch = std::move(ready_.front());
  ready_.pop_front();
  ++consumed_;
  cv_.notify_all();
  return batch;
}

}  // namespace lockstep
