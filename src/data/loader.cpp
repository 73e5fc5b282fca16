#include "lockstep/data/loader.h"

#include <ATen/ATen.h>

#include "lockstep/util/error.h"

namespace lockstep {
namespace {
constexpr size_t kAhead = 2;  // batches assembled ahead of the consumer
}

BatchLoader::BatchLoader(const TensorDataset& data, std::vector<int64_t> indices,
                         LoaderOptions options)
    : data_(data), indices_(std::move(indices)), options_(options) {
  if (options_.batch_size < 1) {
    throw ConfigError("batch size " + std::to_string(options_.batch_size) + " must be >= 1");
  }
  if (data_.size() == 0) throw DataError("dataset '" + data_.name + "' is empty");
  for (int64_t i : indices_) {
    if (i < 0 || i >= data_.size()) {
      throw DataError("index " + std::to_string(i) + " is outside dataset '" + data_.name +
                      "' of size " + std::to_string(data_.size()));
    }
  }
  const auto n = static_cast<int64_t>(indices_.size());
  num_batches_ = options_.drop_last ? n / options_.batch_size
                                    : (n + options_.batch_size - 1) / options_.batch_size;
  if (options_.prefetch && num_batches_ > 0) worker_ = std::thread([this] { produce(); });
}

BatchLoader::~BatchLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

Batch BatchLoader::assemble(int64_t batch) const {
  const int64_t begin = batch * options_.batch_size;
  const int64_t end = std::min<int64_t>(begin + options_.batch_size, indices_.size());
  const auto idx =
      at::tensor(std::vector<int64_t>(indices_.begin() + begin, indices_.begin() + end), at::kLong);
  return {data_.features.index_select(0, idx), data_.targets.index_select(0, idx)};
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
