// XXH3-128 of each of a list of tensors' bytes, computed by a thread of idle
// scheduling priority (SCHED_IDLE): it runs on cycles no other thread of the
// machine wants, so hashing the weights while a rank waits for its peers
// costs the step nothing. finish() takes over whatever is left, without
// waiting for the thread, and ends it in the caller's thread, so a machine
// with no idle time pays what hashing in place costs.
// Note [Idle-priority hashing] in idle_hasher.cpp.
#pragma once

#include <ATen/core/Tensor.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "xxh3.h"

namespace lockstep {

class IdleHasher {
 public:
  // The hasher of the calling thread (its idle thread starts on first use
  // and ends with the calling thread).
  static IdleHasher& instance();
  ~IdleHasher();

  // Starts hashing the bytes of `tensors` (contiguous, on the CPU) and
  // returns the job's number. The values must stay unchanged until finish()
  // returns; the job keeps the tensors alive for as long as the thread may
  // read them. One job at a time: a job still open is cancelled first.
  uint64_t start(std::vector<at::Tensor> tensors);
  // Job `job`'s digests, one per tensor (16 bytes each): what the thread has
  // not hashed yet is hashed here. Also says how many bytes the idle thread
  // had hashed. Throws InternalError if `job` is not the open job (a later
  // start cancelled it).
  std::vector<std::string> finish(uint64_t job, size_t* idle_bytes = nullptr);
  // Drops job `job` if it is still open.
  void cancel(uint64_t job);

 private:
  struct Job {
    std::vector<at::Tensor> tensors;  // kept alive while the thread reads them
  };
  IdleHasher();
  void run();
  // With the lock held: the current tensor is hashed; on to the next.
  void end_tensor();

  std::mutex mutex_;
  std::condition_variable wake_;  // a job arrived or shutdown
  std::shared_ptr<Job> job_;      // the open job (null: none)
  uint64_t job_number_ = 0;
  size_t tensor_ = 0;                 // next tensor to hash
  size_t offset_ = 0;                 // bytes of it hashed
  Xxh3Stream stream_;                 // of tensor_'s first offset_ bytes
  std::vector<std::string> digests_;  // of the tensors before it
  size_t hashed_by_thread_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace lockstep
