// Communication hooks: how one bucket's gradients are reduced across ranks.
//
// The Reducer hands a hook a flat bucket whose values are already divided by
// the world size (Note [Pre-divided buckets] in reducer.cpp), so a SUM across
// ranks yields the mean gradient; a hook whose predivided() is false gets
// the local sum instead and divides itself (PyTorch hands every registered
// hook undivided buckets; PowerSGD's error feedback needs them). A hook
// starts the exchange and returns a HookWork; after work completes, then()
// (if set) may start a second exchange, and finish() must leave the reduced
// values in the bucket (e.g. cast back from fp16).
//
// Threads: run() is called from autograd's thread during backward, then()
// and finish() from the thread that finalizes backward. All on the same
// rank, in bucket order, identical on every rank: every first-stage
// exchange is issued before any then() (the order cannot depend on timing).
//
// By name: ddp.comm_hook in the config picks a built-in hook or one a
// program registered with register_comm_hook("name", factory).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/ddp/ddp_options.h"
#include "lockstep/distributed/process_group.h"

#include "lockstep/util/module_tensors.h"

namespace lockstep {

struct HookWork {
  Ptr<C10dWork> work;  // in flight; nullptr when nothing to wait for
  // After work: a second exchange (PowerSGD's Q), whose HookWork replaces
  // this one (two stages at most; a first stage with then() has no
  // finish()). Empty: none.
  std::function<HookWork()> then;
  std::function<void()> finish;  // after the last work: leave the result in the bucket
  int64_t bytes = 0;             // this rank's payload in the collectives started
};

// One bucket as a hook sees it (PyTorch's dist.GradBucket).
struct GradBucket {
  size_t index = 0;                   // in the order buckets are exchanged
  size_t count = 0;                   // buckets in the model
  at::Tensor buffer;                  // flat: every gradient of the bucket
  std::vector<at::Tensor> gradients;  // per parameter, its shape, aliasing `buffer`
  std::vector<int64_t> offsets;       // each gradient's first element in `buffer`
  std::vector<int64_t> params;        // each gradient's parameter (DDP's parameter order)
  bool is_last() const { return index + 1 == count; }
};

// A hook's state as named tensors (a state dict; io/state_dict.h's type).
using HookState = NamedTensors;

class CommHook {
 public:
  virtual ~CommHook() = default;
  virtual std::string name() const = 0;
  // Implement one of the two: run() for hooks that need only the flat
  // buffer, run_bucket() for those that need the bucket's gradients.
  virtual HookWork run(ProcessGroup& pg, at::Tensor& bucket);
  virtual HookWork run_bucket(ProcessGroup& pg, GradBucket& bucket) {
    return run(pg, bucket.buffer);
  }
  // false: buckets arrive undivided (the local gradient sum), and the hook
  // divides by the world size itself.
  virtual bool predivided() const { return true; }
  // Called once, collectively, when DDP is constructed: throws ConfigError
  // (on every rank alike) if this hook cannot run on `pg`.
  virtual void check_supported(ProcessGroup& pg) {}
  // A stateful hook's state (this rank's), for checkpoints; load throws
  // DataError naming `source` if the state does not fit.
  virtual HookState state_dict() const { return {}; }
  virtual void load_state_dict(const HookState& state, const std::string& source) {}
  // Whether a state entry may differ between ranks; the others must be
  // equal on every rank in a checkpoint, or resuming is refused.
  virtual bool state_per_rank(const std::string& key) const { return true; }
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

struct PowerSgdOptions;  // ddp/powersgd.h

// The built-in hook of that kind (kCommHookKindNames in ddp_options.h);
// PowerSGD with `powersgd` (its defaults when nullptr).
std::shared_ptr<CommHook> comm_hook_create(CommHookKind kind,
                                           const PowerSgdOptions* powersgd = nullptr);

// A hook of one's own, chosen by ddp.comm_hook: name. The factory is called
// once per DistributedDataParallel. A built-in name is refused (ConfigError);
// registering a name again replaces it, as register_model does.
using CommHookFactory = std::function<std::shared_ptr<CommHook>()>;
void register_comm_hook(const std::string& name, CommHookFactory factory);
// Built-in names, then the registered ones.
std::vector<std::string> comm_hook_names();
// ddp.comm_hook's name: a built-in or registered hook; nullptr for plain
// all-reduce. ConfigError listing the names for an unknown one.
std::shared_ptr<CommHook> comm_hook_create(const std::string& name,
                                           const PowerSgdOptions& powersgd);

}  // namespace lockstep
