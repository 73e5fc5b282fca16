// Communication hooks: how one bucket's gradients are reduced across ranks.
//
// The Reducer hands a hook a flat bucket whose values are already divided by
// the world size (Note [Pre-divided buckets] in reducer.cpp), so a SUM across
// ranks yields the mean gradient. A hook starts the exchange and returns a
// HookWork; after work completes, finish() must leave the reduced values in
// the bucket (e.g. cast back from fp16).
//
// Threads: run() is called from autograd's thread during backward, finish()
// from the thread that finalizes backward. Both on the same rank, in bucket
// order, identical on every rank.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>

#include "lockstep/ddp/ddp_options.h"
#include "lockstep/distributed/process_group.h"

namespace lockstep {

struct HookWork {
  Ptr<C10dWork> work;            // in flight; nullptr when nothing to wait for
  std::function<void()> finish;  // after work: leave the result in the bucket
};

class CommHook {
 public:
  virtual ~CommHook() = default;
  virtual std::string name() const = 0;
  virtual HookWork run(ProcessGroup& pg, at::Tensor& bucket) = 0;
  // Called once, collectively, when DDP is constructed: throws ConfigError
  // (on every rank alike) if this hook cannot run on `pg`.
  virtual void check_supported(ProcessGroup& pg) {}
};

// SUM all-reduce of the bucket as it is (PyTorch DDP's default).
class AllReduceHook : public CommHook {
 public:
  std::string name() const override { return "allreduce"; }
  HookWork run(ProcessGroup& pg, at::Tensor& bucket) override;
};

// Casts the bucket to a 16-bit type, all-reduces that (half the bytes on the
// wire) and casts back: PyTorch's fp16_compress_hook / bf16_compress_hook.
class CompressHook : public CommHook {
 public:
  explicit CompressHook(at::ScalarType wire_type);
  std::string name() const override;
  HookWork run(ProcessGroup& pg, at::Tensor& bucket) override;
  // Probes a one-element all-reduce in the wire type: Gloo in LibTorch 1.13
  // has no bfloat16 and fails it before any byte is exchanged, on every rank.
  void check_supported(ProcessGroup& pg) override;

 private:
  at::ScalarType wire_type_;
};

// The built-in hook of that kind (kCommHookKindNames in ddp_options.h).
std::shared_ptr<CommHook> comm_hook_create(CommHookKind kind);

}  // namespace lockstep
