#include "idle_hasher.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <string>

#include "lockstep/util/error.h"

// Note [Idle-priority hashing]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The every-step consistency check hashes every weight after the optimizer
// step (XXH3-128; `scripts/bench_check.sh` times it; a figure:
// docs/lab/ddp-bench.md, "Note [Idle-priority hashing]"). Done in place,
// that is added to every step on a machine whose cores the ranks keep
// busy. But a data-parallel step is not
// all compute: a rank waits for its peers in collectives and at the end of
// backward, and a core idles then. The hash of step s's weights is not
// needed before step s + 1's optimizer step (nothing writes the parameters
// before it), so one thread per process hashes them at SCHED_IDLE: the
// kernel runs it only on cycles nothing else wants and preempts it the
// moment something does. There is one such thread for each thread that
// checks (a rank's main thread; each rank of the threaded tests).
//
// The thread hashes 64 KiB pieces into a copy of the stream's state and
// publishes the copy (under the lock) only if the job is still open.
// finish() closes the job and carries on from the last published state in
// the caller's thread, never waiting for the thread: a SCHED_IDLE thread
// preempted in the middle of a piece on a busy core could otherwise hold
// finish() for milliseconds. The digest is exactly XXH3-128 over the same
// bytes in the same order, whoever hashed which piece. A piece the thread
// was in the middle of is discarded; the thread may still be reading it
// while the optimizer writes the tensor, which changes nothing but the
// discarded bytes (the job's tensors stay alive until it lets go of them).
//
// What is traded: nothing in strength. A machine with no idle time hashes in
// finish() what it would have hashed in place.

namespace lockstep {
namespace {
constexpr size_t kPiece = 64 << 10;
}  // namespace

IdleHasher& IdleHasher::instance() {
  thread_local IdleHasher hasher;
  return hasher;
}

IdleHasher::IdleHasher() {
  thread_ = std::thread([this] { run(); });
}

IdleHasher::~IdleHasher() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void IdleHasher::run() {
  // Best effort: where SCHED_IDLE is refused the thread keeps normal
  // priority, and hashing competes with the step as it would in place.
  sched_param param{};
  param.sched_priority = 0;
  pthread_setschedparam(pthread_self(), SCHED_IDLE, &param);
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    wake_.wait(lock, [&] { return stop_ || (job_ && tensor_ < job_->tensors.size()); });
    if (stop_) return;
    // One piece outside the lock, into a copy of the state.
    const std::shared_ptr<Job> job = job_;
    const at::Tensor& tensor = job->tensors[tensor_];
    const size_t size = tensor.nbytes();
    const size_t n = std::min(kPiece, size - offset_);
    const char* data = static_cast<const char*>(tensor.data_ptr()) + offset_;
    Xxh3Stream next = stream_;
    lock.unlock();
    next.update(data, n);
    lock.lock();
    if (job_ != job) continue;  // finish() or cancel() came first: discard
    stream_ = next;
    hashed_by_thread_ += n;
    offset_ += n;
    if (offset_ == size) end_tensor();
  }
}

void IdleHasher::end_tensor() {
  digests_.push_back(stream_.digest());
  stream_ = Xxh3Stream();
  ++tensor_;
  offset_ = 0;
}

uint64_t IdleHasher::start(std::vector<at::Tensor> tensors) {
  std::unique_lock<std::mutex> lock(mutex_);
  job_ = std::make_shared<Job>(Job{std::move(tensors)});
  digests_.clear();
  tensor_ = 0;
  offset_ = 0;
  stream_ = Xxh3Stream();
  hashed_by_thread_ = 0;
  const uint64_t number = ++job_number_;
  lock.unlock();
  wake_.notify_one();
  return number;
}

std::vector<std::string> IdleHasher::finish(uint64_t job, size_t* idle_bytes) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (job != job_number_ || !job_)
    throw InternalError("idle hasher: job " + std::to_string(job) +
                        " was cancelled by a later one (one PendingCheck at a time)");
  const std::shared_ptr<Job> mine = std::move(job_);  // closed: the thread publishes no more
  while (tensor_ < mine->tensors.size()) {
    const at::Tensor& tensor = mine->tensors[tensor_];
    stream_.update(static_cast<const char*>(tensor.data_ptr()) + offset_,
                   tensor.nbytes() - offset_);
    end_tensor();
  }
  if (idle_bytes != nullptr) *idle_bytes = hashed_by_thread_;
  return std::move(digests_);
}

void IdleHasher::cancel(uint64_t job) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (job == job_number_) job_.reset();
}

}  // namespace lockstep
