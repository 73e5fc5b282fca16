// A c10d backend whose collectives run one at a time, in issue order, each
// as an asynchronous work with a future (as Gloo's do): the base of the shm
// and hierarchical backends. A worker thread of its own runs them, and a
// thread that waits for a work runs the queued ones itself, in order, while
// the worker is idle (Note [Waiting runs the queue]). After one collective
// fails, every later one fails at once with the first reason.
#pragma once

#include <ATen/core/ivalue.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "lockstep/distributed/torch_compat.h"

namespace lockstep {

struct SerialQueue;

class SerialWork : public C10dWork {
 public:
  SerialWork(std::vector<at::Tensor> outputs, std::weak_ptr<SerialQueue> queue);
  void complete(std::exception_ptr error);
  // Runs queued collectives up to this one on the calling thread where the
  // worker is not running one, then waits as c10d's works do.
  bool wait(std::chrono::milliseconds timeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override { return outputs_; }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::weak_ptr<SerialQueue> queue_;
};

class SerialBackend : public C10dBackend {
 public:
  SerialBackend(int rank, int size, std::string name);
  ~SerialBackend() override;  // call stop_worker() first in derived destructors
  const std::string getBackendName() const override { return name_; }

  // Around the launch of a collective the calling thread waits for at once
  // (ProcessGroup's blocking calls): its job is not handed to the worker.
  class WaitAtOnce {
   public:
    WaitAtOnce();
    ~WaitAtOnce();
    WaitAtOnce(const WaitAtOnce&) = delete;
    WaitAtOnce& operator=(const WaitAtOnce&) = delete;

   private:
    bool before_;
  };
  // The mark WaitAtOnce sets on this thread; returns the one it replaces.
  static bool mark_wait_at_once(bool on);

 protected:
  // Queues `body`; its work completes (with body's exception, if any) after it ran.
  Ptr<C10dWork> enqueue(std::vector<at::Tensor> outputs, std::function<void()> body);
  void stop_worker();
  std::atomic<bool> stop_{false};

 private:
  std::string name_;
  std::shared_ptr<SerialQueue> queue_;
  std::thread worker_;
};

}  // namespace lockstep
