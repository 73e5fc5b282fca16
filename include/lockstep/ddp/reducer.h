// Reducer: turns each backward into bucketed, overlapped gradient all-reduces.
//
// Lifecycle of one synchronised iteration (see docs/ddp.md for a diagram):
//   prepare_for_backward()  - DDP's forward arms the hooks (not under no_sync);
//                             before the second synchronised iteration it
//                             also rebuilds the buckets in the observed order
//   hook(i) per parameter   - fires after autograd accumulated .grad; copies
//                             it, divided by world size, into its bucket;
//                             when every bucket up to k is full, launches
//                             their all-reduces in bucket order
//   finalize()              - autograd engine callback at the end of backward:
//                             marks unused parameters (or reports them),
//                             waits for every bucket, writes results to .grad
//
// Threads: hooks run on autograd's thread(s); state is guarded by a mutex.
// Collectives are issued in bucket order only, identical on every rank.
// Ownership: the Reducer keeps each parameter's gradient accumulator alive
// and removes its hooks in its destructor.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "lockstep/ddp/buckets.h"
#include "lockstep/ddp/comm_hooks.h"
#include "lockstep/ddp/local_grads.h"
#include "lockstep/distributed/process_group.h"
#include "lockstep/distributed/torch_compat.h"
#include "lockstep/util/trace.h"

namespace lockstep {

struct ReducerOptions {
  BucketCaps caps;
  // .grad becomes a tensor on the bucket's storage: no copy back after the
  // all-reduce, and no second copy of the gradients in memory.
  bool gradient_as_bucket_view = true;
  // Parameters with no gradient in an iteration are reduced as zeros (or as
  // their accumulated .grad under no_sync) instead of being an error.
  bool find_unused_parameters = false;
  std::shared_ptr<CommHook> hook;  // default: AllReduceHook
};

// Per-iteration figures, for metrics and for the overlap test.
struct ReducerStats {
  size_t buckets = 0;
  size_t launched_during_backward = 0;  // all-reduces started before finalize
  double wait_ms = 0;                   // time finalize spent waiting
  int64_t bytes = 0;                    // this rank's payload in the hooks' collectives
};

class Reducer {
 public:
  // `params` must require grad and be leaves; `names` are for error messages.
  Reducer(std::vector<at::Tensor> params, std::vector<std::string> names,
          std::shared_ptr<ProcessGroup> pg, ReducerOptions options);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Arms the hooks for the next backward. Called by DDP's forward when
  // gradients are to be synchronised (grad mode on, not under no_sync).
  void prepare_for_backward();
  // Called by every DDP forward: resets an iteration that was armed but saw
  // no gradient, and throws CommError, now and at every later call, when the
  // last synchronised backward stopped half way. Note [Interrupted backward].
  void ensure_prior_iteration_finished();
  // On a rank that joined (ran out of inputs): the collectives one
  // synchronised backward of the others issues, contributing zeros.
  // Note [Join] (reducer.cpp).
  void shadow_iteration();

  const std::vector<std::vector<size_t>>& bucket_indices() const { return bucket_indices_; }
  // The parameters in the order the buckets hold them (bucket 0 first),
  // once the one-time rebuild is done; empty before it (a run resumed from
  // there rebuilds as the uninterrupted one did).
  std::vector<int64_t> bucket_order() const;
  // Lays the buckets out in `order` (a bucket_order() saved with a stateful
  // comm hook's state) and skips the one-time rebuild; before the first
  // forward (UsageError after it). Throws DataError unless `order` is a
  // permutation of the parameters. Note [Restored bucket order].
  void restore_bucket_order(const std::vector<int64_t>& order);
  // Records each bucket's all-reduce (launch to completion) and the end of
  // backward's wait; nullptr (the default) records nothing.
  void set_tracer(std::shared_ptr<Tracer> tracer) { tracer_ = std::move(tracer); }
  // While set, backward passes are not DDP's at all (a replay of another
  // rank's batch, check/corruption.h): no hook marks anything.
  void set_ignore_hooks(bool ignore) { ignore_hooks_ = ignore; }
  // Sees each local gradient before its bucket takes it (ddp/local_grads.h).
  void set_local_grad_observer(std::shared_ptr<LocalGradObserver> observer) {
    local_grads_ = std::move(observer);
  }
  ReducerStats last_stats() const;

 private:
  struct Bucket {
    at::Tensor contents;            // flat buffer
    std::vector<size_t> params;     // indices into params_
    std::vector<at::Tensor> views;  // per param: aliases `contents`
    std::vector<int64_t> offsets;   // per param: first element in `contents`
    size_t pending = 0;             // gradients still to arrive
    bool launched = false;
    bool scale_in_reduce = false;  // Note [Pre-divided buckets]: the all-reduce divides
    bool shared = false;           // contents made in shared memory (bucket_zeros)
    HookWork work;
  };
  struct Locator {
    size_t bucket = 0;
    size_t slot = 0;
  };

  std::vector<size_t> reverse_registration_order() const;
  void build_buckets(const std::vector<size_t>& order);
  void rebuild_buckets();
  void hook(size_t index);
  void mark_ready(size_t index, bool from_hook);
  void launch_ready_buckets(bool during_backward);
  // The hook's view of bucket b with `buffer` as its contents (the bucket's
  // own, or a joined rank's zeros).
  GradBucket grad_bucket(size_t b, const at::Tensor& buffer) const;
  // Waits for every bucket's exchange, second stages included, and finishes them.
  void complete_works(std::vector<HookWork>& works, const std::string& what);
  void finalize();
  void write_back(const std::vector<int>& used_anywhere);
  void reset_iteration();

  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  std::shared_ptr<ProcessGroup> pg_;
  ReducerOptions options_;
  at::Tensor divisor_;  // 1 / world size, as a wrapped number

  std::vector<std::vector<size_t>> bucket_indices_;
  std::vector<Bucket> buckets_;
  std::vector<Locator> locators_;
  std::vector<std::unique_ptr<AccumulatorHook>> accumulator_hooks_;  // one per parameter

  mutable std::mutex mu_;
  bool expect_hooks_ = false;
  bool ignore_hooks_ = false;
  bool finalize_queued_ = false;
  size_t next_bucket_ = 0;
  std::vector<char> ready_;
  std::vector<int> used_since_sync_;  // hook fired since the last sync (no_sync too)
  std::shared_ptr<LocalGradObserver> local_grads_;
  std::shared_ptr<Tracer> tracer_;
  // Note [Bucket rebuild] (reducer.cpp).
  std::vector<size_t> ready_order_;  // first synchronised iteration's arrival order
  bool order_recorded_ = false;
  bool rebuilt_ = false;
  std::string failure_;  // Note [Interrupted backward]: set, every forward throws it
  ReducerStats stats_;
};

}  // namespace lockstep
