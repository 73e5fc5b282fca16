// ZeRO for LibTorch: the optimizer state (stage 1) and the gradients
// (stage 2) sharded across the ranks of a DDP job (Note [ZeRO], zero.cpp;
// docs/zero.md).
//
// Every parameter has one owner rank, chosen by zero_partition(). The owner
// alone keeps the parameter's optimizer state and steps it; then every
// parameter is broadcast from its owner, so all ranks hold the same
// weights. Stage 2 also reduce-scatters each gradient bucket to the owners
// (ZeroGradHook, ddp/zero_grad_hook.h), and releases the other ranks' copies of each gradient.
#pragma once

#include <torch/optim/optimizer.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/distributed/process_group.h"
#include "lockstep/optim/optim_config.h"
#include "lockstep/util/module_tensors.h"

namespace lockstep {

// PyTorch's ZeroRedundancyOptimizer partition: parameters sorted by element
// count, largest first (ties: the earlier parameter first); each goes to the
// rank holding the fewest elements so far (ties: the lower rank). Returns
// each parameter's owner. Deterministic: every rank computes the same.
std::vector<int> zero_partition(const std::vector<at::Tensor>& params, int world);

class ZeroOptimizer : public torch::optim::Optimizer {
 public:
  // `named_params`: trainable_parameters(model) (util/module_tensors.h):
  // DDP's parameters in its order, with their state dict names. `stage` 1, 2 or 3 (3: the step
  // broadcasts nothing, fully_shard.h holds the weights). Every rank
  // constructs it alike.
  // `owners`: one rank per parameter (empty: zero_partition's; stage 3 takes
  // fully_shard_partition's, balanced per unit).
  ZeroOptimizer(std::shared_ptr<ProcessGroup> pg, const OptimConfig& config,
                NamedTensors named_params, int stage, std::vector<int> owners = {});
  ~ZeroOptimizer() override;

  // The owner's step of its parameters (the learning rate of this object's
  // param group), then every parameter from its owner to all ranks.
  // Collective: every rank calls it for every step. Not for uneven inputs
  // (DdpCore::Join): a joined rank would not take part in the broadcasts.
  at::Tensor step(LossClosure closure = nullptr) override;

  int stage() const { return stage_; }
  const std::vector<int>& owners() const { return owners_; }
  bool owns(size_t index) const { return owners_[index] == pg_->rank(); }
  // This rank's optimizer over its own parameters.
  torch::optim::Optimizer& local() { return *local_; }
  const torch::optim::Optimizer& local() const { return *local_; }
  // Bytes of optimizer state this rank holds.
  int64_t state_bytes() const;
  // Elements of the parameters each rank owns.
  std::vector<int64_t> owned_elements() const;

  // Stage 2: drops the gradients of the parameters this rank does not own
  // (after the exchange: they hold only this rank's local values).
  void release_unowned_grads();
  // The global per-parameter gradient norms (2-norm of each gradient that
  // exists on its owner), in parameter order, the same on every rank, so
  // that the total is summed in the same order as without sharding.
  // Collective (an all-reduce of two floats per parameter).
  at::Tensor grad_norms();

  // The whole optimizer state as optimizer_state_dict() names it, gathered
  // from the owners: complete on rank 0, empty elsewhere. Collective.
  NamedTensors consolidated_state_dict();
  // Takes this rank's parameters' entries from a whole state dict (written
  // at any world size and any stage); throws DataError naming `source`.
  void load_state_dict(const NamedTensors& state, const std::string& source);

 private:
  NamedTensors owned_named() const;

  std::shared_ptr<ProcessGroup> pg_;
  NamedTensors named_;
  std::vector<int> owners_;
  std::vector<std::vector<int64_t>> shapes_;  // each parameter's (under stage 3 a placeholder's)
  int stage_;
  std::unique_ptr<torch::optim::Optimizer> local_;
};

}  // namespace lockstep
