#include "lockstep/zero/zero.h"

#include <ATen/ATen.h>
#include <torch/optim.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <tuple>

#include "lockstep/distributed/coalesced.h"
#include "lockstep/optim/grad_norms.h"
#include "lockstep/optim/optim.h"
#include "lockstep/util/error.h"
#include "lockstep/util/module_tensors.h"

#include <spdlog/spdlog.h>

// Note [ZeRO]
// ~~~~~~~~~~~
// The partition is by whole parameter (PyTorch's ZeroRedundancyOptimizer,
// sorted-greedy), not by flat ranges (llm.c): the owner steps the very
// tensor plain DDP would step, with the same LibTorch optimizer, so every
// element sees the same arithmetic and ZeRO's weights are bit-identical to
// optim.zero 0's. Flat ranges would balance better, but they cut tensors
// and the optimizer's kernels treat a tensor's tail differently from its
// body, which costs bit-identity. Balance: the largest rank holds at most
// the largest parameter more than the mean.
//
// Stage 1: the gradients are all-reduced as in plain DDP; only the owner
// steps a parameter, then each rank broadcasts what it owns (coalesced).
// Stage 2: each bucket is reduce-scattered instead (ZeroGradHook): packed
// into one equal-sized chunk per owner (the largest owner's share, zero
// padded), so the owner receives the sum of its gradients and no rank
// receives the others'. A bucket whose padded input would exceed its size
// by more than a quarter (one owner holds most of it, e.g. a large
// parameter alone in its bucket) is all-reduced instead: about the same
// traffic, and no packing buffer. The reduce-scatter sums in rank order on shm, as its
// all-reduce does: the same bits. Where the backend has no reduce-scatter
// (LibTorch 1's Gloo, hierarchical) the bucket is all-reduced as it is: the
// same bits too, at stage 0's traffic. A native reduce-scatter of another
// backend (NCCL, MPI, LibTorch 2's Gloo) sums in its own order: with 3 or
// more ranks the last bits may differ from its all-reduce's. After backward the other ranks'
// gradients of a parameter are released (.grad undefined). Clipping and the reported norm: each
// owner computes its gradients' norms, an all-reduce of [norms, present] (exact: one non-zero term
// per entry) gives every rank all of them, and the total is the 2-norm of that vector in parameter
// order, as torch::nn::utils::clip_grad_norm_ computes it: the same bits as without sharding.
// Checkpoints: the owners' state is gathered on rank 0 (one broadcast per
// state tensor from its owner; checkpoint time only) into the state dict
// optimizer_state_dict() writes for an unsharded optimizer, in parameter
// order: optimizer.pt is the same file whatever the stage and world size,
// and any of them resumes from it.
// Stage 3 (fully_shard.h): the gradients as stage 2's, but the weights stay
// with their owners after the step (no broadcast): every rank gathers a
// unit's weights when it needs them.

namespace lockstep {

std::vector<int> zero_partition(const std::vector<at::Tensor>& params, int world) {
  if (world < 1) throw UsageError("zero_partition: world size " + std::to_string(world));
  std::vector<size_t> order(params.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return params[a].numel() > params[b].numel(); });
  std::vector<int64_t> load(static_cast<size_t>(world), 0);
  std::vector<int> owners(params.size(), 0);
  for (size_t i : order) {
    const auto least = std::min_element(load.begin(), load.end()) - load.begin();
    owners[i] = static_cast<int>(least);
    load[static_cast<size_t>(least)] += params[i].numel();
  }
  return owners;
}

namespace {

std::vector<torch::optim::OptimizerParamGroup> all_of(const NamedTensors& named) {
  std::vector<at::Tensor> params;
  for (const auto& [name, p] : named) params.push_back(p);
  return {torch::optim::OptimizerParamGroup(params)};
}

// Field ids of the consolidation's metadata.
const char* const kFields[] = {"momentum_buffer", "exp_avg", "exp_avg_sq", "max_exp_avg_sq",
                               "step"};
constexpr int64_t kStepField = 4;

int64_t field_id(const std::string& field) {
  for (int64_t i = 0; i < 5; ++i)
    if (field == kFields[i]) return i;
  throw InternalError("optimizer state field '" + field + "'");
}

}  // namespace

ZeroOptimizer::ZeroOptimizer(std::shared_ptr<ProcessGroup> pg, const OptimConfig& config,
                             NamedTensors named_params, int stage, std::vector<int> owners)
    : torch::optim::Optimizer(all_of(named_params),
                              std::make_unique<torch::optim::SGDOptions>(config.lr)),
      pg_(std::move(pg)),
      named_(std::move(named_params)),
      stage_(stage) {
  if (stage_ < 1 || stage_ > 3)
    throw ConfigError("optim.zero=" + std::to_string(stage_) + " must be 0, 1, 2 or 3");
  std::vector<at::Tensor> params;
  for (const auto& [name, p] : named_) {
    params.push_back(p);
    shapes_.push_back(p.sizes().vec());
  }
  owners_ = owners.empty() ? zero_partition(params, pg_->size()) : std::move(owners);
  if (owners_.size() != params.size())
    throw InternalError("ZeroOptimizer: " + std::to_string(owners_.size()) + " owners for " +
                        std::to_string(params.size()) + " parameters");
  std::vector<at::Tensor> mine;
  for (size_t i = 0; i < params.size(); ++i)
    if (owns(i)) mine.push_back(params[i]);
  local_ = optimizer_create(config, mine);
}

ZeroOptimizer::~ZeroOptimizer() = default;

NamedTensors ZeroOptimizer::owned_named() const {
  NamedTensors out;
  for (size_t i = 0; i < named_.size(); ++i)
    if (owns(i)) out.push_back(named_[i]);
  return out;
}

at::Tensor ZeroOptimizer::step(LossClosure closure) {
  if (closure) throw UsageError("ZeroOptimizer::step: closures are not supported");
  optimizer_set_lr(*local_, param_groups().front().options().get_lr());
  local_->step();
  if (stage_ == 3) return {};  // the weights stay with their owners (fully_shard.h)
  at::NoGradGuard no_grad;
  std::vector<std::vector<at::Tensor>> by_owner(static_cast<size_t>(pg_->size()));
  for (size_t i = 0; i < named_.size(); ++i)
    by_owner[static_cast<size_t>(owners_[i])].push_back(named_[i].second);
  for (int r = 0; r < pg_->size(); ++r) {
    if (!by_owner[static_cast<size_t>(r)].empty())
      broadcast_coalesced(*pg_, by_owner[static_cast<size_t>(r)], r);
  }
  return {};
}

int64_t ZeroOptimizer::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& t : optimizer_state_tensors(*local_, owned_named()))
    bytes += static_cast<int64_t>(t.tensor.nbytes());
  return bytes;
}

std::vector<int64_t> ZeroOptimizer::owned_elements() const {
  std::vector<int64_t> out(static_cast<size_t>(pg_->size()), 0);
  for (size_t i = 0; i < named_.size(); ++i)
    out[static_cast<size_t>(owners_[i])] += named_[i].second.numel();
  return out;
}

void ZeroOptimizer::release_unowned_grads() {
  for (size_t i = 0; i < named_.size(); ++i)
    if (!owns(i)) named_[i].second.mutable_grad().reset();
}

at::Tensor ZeroOptimizer::grad_norms() {
  const int64_t n = static_cast<int64_t>(named_.size());
  // The norms' dtype, the same on every rank: the parameters' (promoted),
  // as torch::stack would make it of all the norms.
  at::ScalarType dtype = named_.empty() ? at::kFloat : named_.front().second.scalar_type();
  for (const auto& [name, p] : named_) dtype = at::promoteTypes(dtype, p.scalar_type());
  std::vector<int64_t> mine;  // this rank's parameters with a gradient
  std::vector<at::Tensor> grads;
  for (int64_t i = 0; i < n; ++i) {
    const at::Tensor& g = named_[static_cast<size_t>(i)].second.grad();
    if (owns(static_cast<size_t>(i)) && g.defined()) {
      mine.push_back(i);
      grads.push_back(g.detach());
    }
  }
  // Each norm as DDP's clipping takes it (Note [Clipping's kernels]).
  std::vector<at::Tensor> norms = tensor_norms(grads);
  for (auto& norm : norms) norm = norm.to(at::kDouble);
  const auto device = pg_->device();
  // [norms, present]: doubles carry a float's or a bfloat16's norm exactly,
  // and each entry has one non-zero term, so the sum is exact too.
  at::Tensor packed = at::zeros({2 * n}, at::TensorOptions().dtype(at::kDouble).device(device));
  if (!mine.empty()) {
    const auto at_ = at::tensor(mine, at::kLong).to(device);
    // The gradients' device may not be the group's: Gloo reduces CUDA
    // tensors from a CPU group (seen on the first GPU run, docs/gpu.md).
    packed.index_copy_(0, at_, at::stack(norms).to(device));
    packed.index_fill_(0, at_ + n, 1.0);
  }
  pg_->allreduce(packed, ReduceKind::kSum);
  const auto keep = packed.narrow(0, n, n).nonzero().view({-1});
  if (keep.numel() == 0) return at::Tensor();
  return packed.index_select(0, keep).to(dtype);
}

NamedTensors ZeroOptimizer::consolidated_state_dict() {
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < named_.size(); ++i) index[named_[i].first] = i;
  const auto long_options = at::TensorOptions().dtype(at::kLong).device(pg_->device());
  std::vector<std::pair<size_t, std::pair<std::string, at::Tensor>>> gathered;
  for (int r = 0; r < pg_->size(); ++r) {
    NamedTensors mine;
    if (r == pg_->rank()) mine = optimizer_state_dict(*local_, owned_named());
    at::Tensor count = at::full({1}, static_cast<int64_t>(mine.size()), long_options);
    pg_->broadcast(count, r);
    const int64_t k = count.cpu().item<int64_t>();
    at::Tensor meta = at::zeros({std::max<int64_t>(1, 3 * k)}, long_options);
    if (r == pg_->rank()) {
      auto m = meta.cpu();
      for (int64_t e = 0; e < k; ++e) {
        const auto& [key, value] = mine[static_cast<size_t>(e)];
        const auto dot = key.rfind('.');
        const int64_t field = field_id(key.substr(dot + 1));
        m[3 * e] = static_cast<int64_t>(index.at(key.substr(0, dot)));
        m[3 * e + 1] = field;
        m[3 * e + 2] = field == kStepField ? value.item<int64_t>() : 0;
      }
      meta.copy_(m);
    }
    pg_->broadcast(meta, r);
    const auto m = meta.cpu();
    for (int64_t e = 0; e < k; ++e) {
      const int64_t p = m[3 * e].item<int64_t>(), field = m[3 * e + 1].item<int64_t>();
      if (p < 0 || p >= static_cast<int64_t>(named_.size()) || field < 0 || field > kStepField)
        throw InternalError("ZeRO consolidation: rank " + std::to_string(r) + " sent bad metadata");
      const auto& [name, param] = named_[static_cast<size_t>(p)];
      const std::string key = name + "." + kFields[field];
      if (field == kStepField) {
        if (pg_->rank() == 0)
          gathered.push_back({static_cast<size_t>(p),
                              {key, at::scalar_tensor(m[3 * e + 2].item<int64_t>(), at::kLong)}});
        continue;
      }
      // The owner's own tensor is sent as it is (nothing changes it during
      // the save): no copy of this rank's state.
      at::Tensor t = r == pg_->rank() ? mine[static_cast<size_t>(e)].second.contiguous()
                                      : at::empty(shapes_[static_cast<size_t>(p)], param.options());
      pg_->broadcast(t, r);
      if (pg_->rank() == 0) gathered.push_back({static_cast<size_t>(p), {key, t.cpu()}});
    }
  }
  std::stable_sort(gathered.begin(), gathered.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  NamedTensors out;
  for (auto& g : gathered) out.push_back(std::move(g.second));
  return out;
}

void ZeroOptimizer::load_state_dict(const NamedTensors& state, const std::string& source) {
  std::vector<std::string> elsewhere;
  for (size_t i = 0; i < named_.size(); ++i)
    if (!owns(i)) elsewhere.push_back(named_[i].first);
  optimizer_load_state_dict(*local_, owned_named(), state, elsewhere, source);
}

}  // namespace lockstep
