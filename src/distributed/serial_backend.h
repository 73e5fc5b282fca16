// A c10d backend whose collectives run one at a time, in issue order, on a
// worker thread of its own, each as an asynchronous work with a future (as
// Gloo's do): the base of the shm and hierarchical backends. After one
// collective fails, every later one fails at once with the first reason.
#pragma once

#include <ATen/core/ivalue.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "lockstep/distributed/torch_compat.h"

namespace lockstep {

class SerialWork : public C10dWork {
 public:
  explicit SerialWork(std::vector<at::Tensor> outputs);
  void complete(std::exception_ptr error);
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override { return outputs_; }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

class SerialBackend : public C10dBackend {
 public:
  SerialBackend(int rank, int size, std::string name);
  ~SerialBackend() override;  // call stop_worker() first in derived destructors
  const std::string getBackendName() const override { return name_; }

 protected:
  // Queues `body`; its work completes (with body's exception, if any) after it ran.
  Ptr<C10dWork> enqueue(std::vector<at::Tensor> outputs, std::function<void()> body);
  void stop_worker();
  std::atomic<bool> stop_{false};

 private:
  void run();
  std::string name_;
  std::string broken_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::pair<c10::intrusive_ptr<SerialWork>, std::function<void()>>> queue_;
  std::thread worker_;
};

}  // namespace lockstep
