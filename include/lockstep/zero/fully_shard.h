// Fully sharded parameters for LibTorch (ZeRO-3, PyTorch's FSDP):
// Note [Fully sharded parameters], fully_shard.cpp; docs/zero.md.
//
// Every trainable parameter has one owner rank (zero_partition, whole
// parameters). Between uses a parameter exists only on its owner; the
// others keep a placeholder of the same shape (one NaN, broadcast: reading
// it gives NaN, writing it fails loudly) and no storage. A unit is a
// module whose forward the model runs through call_unit()
// (util/unit_call.h): before its forward the unit's parameters are
// all-gathered (the next unit's gather started ahead, `prefetch`), after it
// they are freed again (`reshard_after_forward`), gathered again before its
// backward, and once backward has produced all of the unit's gradients they
// are reduce-scattered to their owners (the mean, as DDP's) and freed on
// the other ranks. The root unit (the model itself, for every parameter in
// no other unit) is gathered from its forward until its gradients are
// reduced. The owner's optimizer (ZeroOptimizer, stage 3) steps only its
// own parameters.
//
//   auto units = gpt->sharding_units();              // the blocks
//   auto sharded = lockstep::fully_shard(model, pg, units, {});
//   auto out = lockstep::call_unit(*model, [&] { return model->forward(x); });
//   loss_fn(out, y).backward();                       // gradients on their owners
//
// Collective: every rank builds it alike and runs the same forwards and
// backwards (a rank that skips one hangs the others until the timeout).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/ddp/local_grads.h"
#include "lockstep/distributed/process_group.h"
#include "lockstep/util/module_tensors.h"

namespace lockstep {

struct FullyShardOptions {
  // Free a unit's gathered parameters after its forward (gathered again for
  // backward); false keeps them until its gradients are reduced (faster,
  // more memory: ZeRO-2's parameters during the step). The root unit is
  // always kept.
  bool reshard_after_forward = true;
  // Start the next unit's gather (in the order of the last forward, or its
  // reverse in backward) before running the current one.
  bool prefetch = true;
};

class FullyShardedParameters;

// Owners for fully_shard: whole parameters, balanced within each unit
// (largest first, to the rank holding the least of that unit; ties: the
// least overall), so that a unit's gather is padded by at most about one
// parameter per rank. One rank per parameter of trainable_parameters(root).
std::vector<int> fully_shard_partition(const torch::nn::Module& root,
                                       const std::vector<std::shared_ptr<torch::nn::Module>>& units,
                                       int world);

// Shards `root`'s trainable parameters (trainable_parameters(root), the
// order ZeroOptimizer and DDP use) over `pg` with `owners` (one per
// parameter; empty: fully_shard_partition's), with `units` (modules under
// `root`, none inside another, each with a trainable parameter) as the
// units; once per root. Parameters must be whole and equal on
// every rank (after DDP's broadcast). Registers a UnitWrapper for `root`
// and each unit; they stay registered while the result lives.
std::shared_ptr<FullyShardedParameters> fully_shard(
    torch::nn::Module& root, std::shared_ptr<ProcessGroup> pg, const std::vector<int>& owners,
    const std::vector<std::shared_ptr<torch::nn::Module>>& units, FullyShardOptions options = {});

class FullyShardedParameters {
 public:
  virtual ~FullyShardedParameters() = default;
  // Whether backward reduces the gradients (false: under no_sync they
  // accumulate whole on every rank, reduced at the next synchronised
  // backward). Asked at each unit's reduction.
  virtual void set_gradient_sync(std::function<bool()> synchronised) = 0;
  // Each parameter's local gradient before its unit's reduce-scatter
  // (ddp/local_grads.h).
  virtual void set_local_grad_observer(std::shared_ptr<LocalGradObserver> observer) = 0;
  // Every parameter whole on every rank (collective) until reshard_all():
  // for a state dict, a weight load, or a forward outside call_unit.
  virtual void unshard_all() = 0;
  virtual void reshard_all() = 0;
  // Collective: each unit gathered in turn (never more than one), `fn`
  // called with each of its parameters whole (index: in
  // trainable_parameters' order), then freed again: a state dict without
  // the whole model gathered at once.
  virtual void visit_whole(
      const std::function<void(size_t index, const at::Tensor& whole)>& fn) = 0;
  // Bytes of parameters this rank holds now: its own shard, plus whatever
  // is gathered at this moment.
  virtual int64_t resident_parameter_bytes() const = 0;
  // The most bytes of gathered parameters held at once so far.
  virtual int64_t peak_gathered_bytes() const = 0;
  virtual const std::vector<int>& owners() const = 0;
  // Units, the root last, with their parameter counts (for messages).
  virtual std::vector<std::string> describe_units() const = 0;
};

}  // namespace lockstep
