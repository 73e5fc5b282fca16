#include "serial_backend.h"

#include "lockstep/util/error.h"

namespace lockstep {

SerialWork::SerialWork(std::vector<at::Tensor> outputs)
    : outputs_(std::move(outputs)),
      future_(
          c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {
}

void SerialWork::complete(std::exception_ptr error) {
  if (error) {
    future_->setError(error);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
  finish(error);
}

SerialBackend::SerialBackend(int rank, int size, std::string name)
    : C10dBackend(rank, size), name_(std::move(name)) {
  worker_ = std::thread([this] { run(); });
}

SerialBackend::~SerialBackend() {
  stop_worker();
}

void SerialBackend::stop_worker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

Ptr<C10dWork> SerialBackend::enqueue(std::vector<at::Tensor> outputs, std::function<void()> body) {
  auto work = c10::make_intrusive<SerialWork>(std::move(outputs));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.emplace_back(work, std::move(body));
  }
  cv_.notify_one();
  return work;
}

void SerialBackend::run() {
  while (true) {
    std::pair<c10::intrusive_ptr<SerialWork>, std::function<void()>> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    std::exception_ptr error;
    try {
      if (!broken_.empty())
        throw CommError(name_ + " backend: an earlier collective failed: " + broken_);
      if (stop_) throw CommError(name_ + " backend: the process group is shutting down");
      job.second();
    } catch (const std::exception& e) {
      if (broken_.empty()) broken_ = e.what();
      error = std::current_exception();
    }
    job.first->complete(error);
  }
}

}  // namespace lockstep
