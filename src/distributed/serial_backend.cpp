#include "serial_backend.h"

#include <c10/core/GradMode.h>

#include <algorithm>

#include "lockstep/util/error.h"

namespace lockstep {

// Note [Waiting runs the queue]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A collective handed to the worker thread and waited for at once costs two
// thread wake-ups per rank (the worker's, then the waiter's), each tens of
// microseconds on a loaded host: a small all-reduce on the shm backend
// spent almost all its time waking threads (docs/lab/gpt-demo.md, "What
// went past PyTorch"). So the thread that waits for a work runs the queue
// itself: while the work is not done and no thread is running a
// collective, it takes the front job and runs it. Jobs still run
// one at a time and in issue order (one `running` flag under the queue's
// mutex), so every rank runs the same sequence whichever thread runs it;
// what the DDP Reducer launches during backward still runs on the worker,
// overlapping the backward. A job completes (its future's callbacks run)
// before the next may start, as on the worker. The queue is shared with the
// works, so a work waited for after its backend is gone finds the queue
// stopped and fails rather than touching the backend.
constexpr std::chrono::microseconds kGrace{50};
// Set by ProcessGroup's blocking collectives around their launch
// (WaitAtOnce): the job queued is waited for at once.
thread_local bool waited_at_once = false;

struct SerialQueue {
  struct Job {
    c10::intrusive_ptr<SerialWork> work;
    std::function<void()> body;
    std::chrono::steady_clock::time_point queued;
  };
  std::string name;
  std::mutex mutex;
  std::condition_variable cv;         // waiters: a job finished
  std::condition_variable worker_cv;  // the worker: a stop, or a job left to it
  std::deque<Job> jobs;
  bool running = false;
  bool stop = false;
  std::string broken;  // the first failure; read and written by the running thread only

  // With `lock` held: runs the front job, releasing the lock meanwhile.
  // Whatever the job or its future's callbacks throw, `running` is
  // released and the job's work completed.
  void run_front(std::unique_lock<std::mutex>& lock) {
    Job job = std::move(jobs.front());
    jobs.pop_front();
    running = true;
    const bool stopping = stop;
    lock.unlock();
    struct Release {
      SerialQueue& q;
      std::unique_lock<std::mutex>& lock;
      ~Release() {
        lock.lock();
        q.running = false;
        q.cv.notify_all();
        if (!q.jobs.empty()) q.worker_cv.notify_one();
      }
    } release{*this, lock};
    const RunningGuard inside(this);  // the body and the future's callbacks
    std::exception_ptr error;
    try {
      if (!broken.empty())
        throw CommError(name + " backend: an earlier collective failed: " + broken);
      if (stopping) throw CommError(name + " backend: the process group is shutting down");
      // The same on whichever thread runs it: no autograd on the buffers.
      c10::AutoGradMode no_grad(false);
      job.body();
    } catch (const std::exception& e) {
      if (broken.empty()) broken = e.what();
      error = std::current_exception();
    } catch (...) {
      if (broken.empty()) broken = "an exception that is not a std::exception";
      error = std::current_exception();
    }
    try {
      job.work->complete(error);
    } catch (...) {
      // A future's callback threw: the work is complete; the queue goes on.
    }
    job = Job();  // the body's captures released outside the lock
  }

  // The queue whose job this thread is running, if any: a wait from inside
  // a job (or a callback of one) for a later work of the same queue could
  // never be satisfied, and is refused instead of hanging.
  static thread_local const SerialQueue* running_here;
  // It also clears WaitAtOnce's mark for the job: a collective that a job
  // body (the hierarchical backend's) or a callback launches is not the
  // blocking call's, and may be left to a worker.
  struct RunningGuard {
    const SerialQueue* before;
    bool hinted;
    explicit RunningGuard(const SerialQueue* q) : before(running_here), hinted(waited_at_once) {
      running_here = q;
      waited_at_once = false;
    }
    ~RunningGuard() {
      running_here = before;
      waited_at_once = hinted;
    }
  };
};

thread_local const SerialQueue* SerialQueue::running_here = nullptr;

SerialWork::SerialWork(std::vector<at::Tensor> outputs, std::weak_ptr<SerialQueue> queue)
    : outputs_(std::move(outputs)),
      future_(
          c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))),
      queue_(std::move(queue)) {}

void SerialWork::complete(std::exception_ptr error) {
  if (error) {
    future_->setError(error);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
  finish(error);
}

bool SerialWork::wait(std::chrono::milliseconds timeout) {
  if (auto queue = queue_.lock()) {
    if (SerialQueue::running_here == queue.get() && !isCompleted())
      throw UsageError(queue->name +
                       " backend: a collective waited for from inside another collective of the "
                       "same process group (a job or a future callback) could never complete");
    // c10d's kNoTimeout (0): as long as it takes (each job has its own
    // timeout), running the queue meanwhile. A bounded wait leaves the jobs
    // to the worker, so that it returns at its deadline, and wakes it: a job
    // launched under WaitAtOnce or WaitNext was not handed to it.
    if (timeout.count() > 0) queue->worker_cv.notify_one();
    if (timeout.count() <= 0) {
      std::unique_lock<std::mutex> lock(queue->mutex);
      while (!isCompleted()) {
        if (!queue->running && !queue->jobs.empty()) {
          queue->run_front(lock);
        } else {
          queue->cv.wait(lock);
        }
      }
    }
  }
  return C10dWork::wait(timeout);
}

SerialBackend::SerialBackend(int rank, int size, std::string name)
    : C10dBackend(rank, size), name_(std::move(name)), queue_(std::make_shared<SerialQueue>()) {
  queue_->name = name_;
  worker_ = std::thread([queue = queue_] {
    std::unique_lock<std::mutex> lock(queue->mutex);
    while (true) {
      // At a stop, not while a waiting thread still runs a job: the
      // backend's state must outlive it (the join in stop_worker).
      if (queue->stop && queue->jobs.empty() && !queue->running) return;
      if (queue->running || queue->jobs.empty()) {
        queue->worker_cv.wait(lock);
        continue;
      }
      const auto ready = queue->jobs.front().queued + kGrace;
      if (!queue->stop && std::chrono::steady_clock::now() < ready) {
        queue->worker_cv.wait_until(lock, ready);  // a waiter may claim it meanwhile
        continue;
      }
      queue->run_front(lock);
    }
  });
}

SerialBackend::WaitAtOnce::WaitAtOnce() : before_(mark_wait_at_once(true)) {}

SerialBackend::WaitAtOnce::~WaitAtOnce() {
  mark_wait_at_once(before_);
}

bool SerialBackend::mark_wait_at_once(bool on) {
  const bool before = waited_at_once;
  waited_at_once = on;
  return before;
}

SerialBackend::~SerialBackend() {
  stop_worker();
}

void SerialBackend::stop_worker() {
  stop_ = true;
  {
    std::lock_guard<std::mutex> lock(queue_->mutex);
    queue_->stop = true;
  }
  queue_->cv.notify_all();
  queue_->worker_cv.notify_all();
  if (worker_.joinable()) worker_.join();
}

Ptr<C10dWork> SerialBackend::enqueue(std::vector<at::Tensor> outputs, std::function<void()> body) {
  auto work = c10::make_intrusive<SerialWork>(std::move(outputs), queue_);
  {
    std::lock_guard<std::mutex> lock(queue_->mutex);
    queue_->jobs.push_back({work, std::move(body), std::chrono::steady_clock::now()});
  }
  // A collective a blocking call waits for at once is left to the waiting
  // thread: the worker is not woken (Note [Waiting runs the queue]).
  if (!waited_at_once) queue_->worker_cv.notify_one();
  return work;
}

}  // namespace lockstep
