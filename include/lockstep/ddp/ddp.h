// lockstep::DistributedDataParallel: PyTorch's DDP for LibTorch modules.
//
//   auto model = std::make_shared<Net>();            // or a TORCH_MODULE holder
//   lockstep::DistributedDataParallel ddp(model, pg); // verifies + syncs ranks
//   auto loss = loss_fn(ddp.forward(x), y);          // broadcasts buffers
//   loss.backward();                                 // bucketed async all-reduce
//   optimizer.step();                                // same update everywhere
//   { auto guard = ddp.no_sync(); ... backward ... } // local accumulation only
//
// Construction (collective: every rank must construct, in the same order):
//   1. lists parameters and buffers once each (a tied parameter, registered
//      under two names, is reduced once, under its first name); refuses
//      modules that make sparse gradients (Embedding/EmbeddingBag with
//      sparse(true));
//   2. verifies that every rank holds the same parameters and buffers (names,
//      shapes, dtypes, requires_grad); a mismatch throws ConfigError naming
//      the rank and the first differing tensor, on every rank (no hang);
//   3. broadcasts parameters and buffers from rank 0, coalesced;
//   4. builds the Reducer (hooks, buckets) over the parameters that require
//      grad. World size 1: steps 2-4 are skipped, nothing is communicated.
//
// Each forward, as PyTorch's: buffers are broadcast from rank 0 when the
// previous forward synchronised (grad mode on, not under no_sync; true
// before the first), and the Reducer is armed only when this one will
// (a forward under NoGradGuard or inside no_sync does not arm it).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <type_traits>
#include <utility>

#include "lockstep/ddp/comm_hooks.h"
#include "lockstep/ddp/ddp_options.h"
#include "lockstep/ddp/reducer.h"
#include "lockstep/distributed/process_group.h"
#include "lockstep/util/unit_call.h"

namespace lockstep {

// The type-independent part of DistributedDataParallel.
class DdpCore {
 public:
  DdpCore(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<ProcessGroup> pg,
          DdpOptions options);
  virtual ~DdpCore();

  // While alive, backward only accumulates gradients locally; the next
  // synchronised backward reduces what accumulated.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DdpCore& ddp) : ddp_(ddp), previous_(ddp.sync_) { ddp.sync_ = false; }
    ~NoSyncGuard() { ddp_.sync_ = previous_; }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DdpCore& ddp_;
    bool previous_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*this); }
  // While alive, backward is not DDP's at all: nothing is exchanged and
  // nothing counts toward the next synchronised backward (a recompute of
  // another rank's batch, check/corruption.h). Forward the module itself.
  class UnseenGuard {
   public:
    explicit UnseenGuard(DdpCore& ddp) : no_sync_(ddp), reducer_(ddp.reducer_.get()) {
      if (reducer_) reducer_->set_ignore_hooks(true);
    }
    ~UnseenGuard() {
      if (reducer_) reducer_->set_ignore_hooks(false);
    }
    UnseenGuard(const UnseenGuard&) = delete;
    UnseenGuard& operator=(const UnseenGuard&) = delete;

   private:
    NoSyncGuard no_sync_;
    Reducer* reducer_;
  };
  [[nodiscard]] UnseenGuard unseen() { return UnseenGuard(*this); }
  bool gradients_synchronised() const { return sync_; }

  // Uneven inputs, as PyTorch's Join: ranks may run different numbers of
  // iterations inside the scope.
  //
  //   auto join = ddp.join();
  //   for (auto& batch : my_batches) { ...forward, backward, step... }
  //   join.finish();   // collective: returns when every rank has finished
  //
  // While a Join is alive every forward tells the others this rank is still
  // active (one small all-reduce). finish() makes this rank shadow the
  // collectives of the ranks still training (zeros for its gradients, so
  // gradients are averaged over the initial world size), then every rank
  // takes the parameters and buffers of the rank that finished last. A Join
  // destroyed without finish() (an exception) communicates nothing.
  // Note [Join] (reducer.cpp).
  class Join {
   public:
    explicit Join(DdpCore& ddp);
    ~Join();
    Join(const Join&) = delete;
    Join& operator=(const Join&) = delete;
    // Returns the number of iterations this rank shadowed.
    int64_t finish();

   private:
    DdpCore& ddp_;
    bool finished_ = false;
  };
  [[nodiscard]] Join join() { return Join(*this); }

  // Broadcasts buffers and arms the reducer; the typed forward() calls it.
  void pre_forward();

  ProcessGroup& process_group() { return *pg_; }
  // nullptr at world size 1.
  const Reducer* reducer() const { return reducer_.get(); }
  // Note [Restored bucket order] (reducer.cpp): before the first forward.
  void restore_bucket_order(const std::vector<int64_t>& order) {
    if (reducer_) reducer_->restore_bucket_order(order);
  }
  void set_tracer(std::shared_ptr<Tracer> tracer) {
    if (reducer_) reducer_->set_tracer(std::move(tracer));
  }
  // Each parameter's local gradient, before the exchange (ddp/local_grads.h;
  // nothing at world size 1, where nothing is exchanged).
  void set_local_grad_observer(std::shared_ptr<LocalGradObserver> observer) {
    if (reducer_) reducer_->set_local_grad_observer(std::move(observer));
  }

 private:
  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<ProcessGroup> pg_;
  DdpOptions options_;
  void broadcast_buffers_if_due();

  std::vector<at::Tensor> params_;  // once each, registration order
  std::vector<at::Tensor> buffers_;
  std::unique_ptr<Reducer> reducer_;
  bool sync_ = true;
  // PyTorch's require_forward_param_sync: the last forward synchronised.
  bool last_forward_synced_ = true;
  bool joining_ = false;  // a Join is alive
};

template <typename T>
std::shared_ptr<torch::nn::Module> ddp_module_ptr(const std::shared_ptr<T>& module) {
  return module;
}
template <typename T>
std::shared_ptr<torch::nn::Module> ddp_module_ptr(const torch::nn::ModuleHolder<T>& module) {
  return module.ptr();
}

// ModuleType: std::shared_ptr<SomeModule> or a ModuleHolder (TORCH_MODULE).
template <typename ModuleType>
class DistributedDataParallel : public DdpCore {
 public:
  DistributedDataParallel(ModuleType module, std::shared_ptr<ProcessGroup> pg,
                          DdpOptions options = {})
      : DdpCore(ddp_module_ptr(module), std::move(pg), std::move(options)),
        module_(std::move(module)) {}

  // The module's forward, through call_unit (util/unit_call.h) where it
  // returns a tensor: fully sharded parameters gather the root's there.
  template <typename... Args>
  decltype(auto) forward(Args&&... args) {
    pre_forward();
    using Out = decltype(module_->forward(std::forward<Args>(args)...));
    if constexpr (std::is_same_v<std::decay_t<Out>, at::Tensor>) {
      return call_unit(*ddp_module_ptr(module_), [&]() -> at::Tensor {
        return module_->forward(std::forward<Args>(args)...);
      });
    } else {
      return module_->forward(std::forward<Args>(args)...);
    }
  }
  template <typename... Args>
  decltype(auto) operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }

  ModuleType& module() { return module_; }

 private:
  ModuleType module_;
};

// Throws ConfigError on every rank when the ranks' tensors differ in number,
// name, dtype or shape, naming the first differing tensor and the ranks.
void verify_same_tensors(ProcessGroup& pg, const std::vector<std::string>& names,
                         const std::vector<at::Tensor>& tensors);

}  // namespace lockstep
