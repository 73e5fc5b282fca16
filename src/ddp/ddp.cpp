#include "lockstep/ddp/ddp.h"
#include "lockstep/distributed/agree.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/nn/modules/embedding.h>

#include <spdlog/spdlog.h>

#include <unordered_set>

#include "lockstep/distributed/coalesced.h"
#include "lockstep/util/error.h"
#include "lockstep/util/module_tensors.h"

namespace lockstep {
namespace {

// Embedding and EmbeddingBag with sparse(true) make sparse gradients, which
// the bucketed dense all-reduce cannot carry. Refused up front, by name.
void refuse_sparse_modules(const torch::nn::Module& module) {
  for (const auto& item : module.named_modules("", /*include_self=*/true)) {
    bool sparse = false;
    if (const auto* e = dynamic_cast<const torch::nn::EmbeddingImpl*>(item.value().get())) {
      sparse = e->options.sparse();
    } else if (const auto* b =
                   dynamic_cast<const torch::nn::EmbeddingBagImpl*>(item.value().get())) {
      sparse = b->options.sparse();
    }
    if (sparse) {
      const std::string name = item.key().empty() ? "the module itself" : "'" + item.key() + "'";
      throw ConfigError("module " + name +
                        " is an embedding with sparse(true): its gradients are sparse, and "
                        "DistributedDataParallel reduces dense gradients only. Construct it "
                        "with sparse(false)");
    }
  }
}

}  // namespace

DdpCore::DdpCore(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<ProcessGroup> pg,
                 DdpOptions options)
    : module_(std::move(module)), pg_(std::move(pg)), options_(std::move(options)) {
  refuse_sparse_modules(*module_);
  std::vector<std::string> names;
  std::vector<at::Tensor> all;  // parameters, then buffers
  // The parameters reduced: trainable_parameters (util/module_tensors.h),
  // the one list ZeRO partitions too, so its indices are the Reducer's.
  std::vector<std::string> grad_names;
  std::vector<at::Tensor> grad_params;
  for (auto& [name, p] : trainable_parameters(*module_)) {
    grad_names.push_back(name);
    grad_params.push_back(p);
  }
  // Every parameter, frozen ones too, is checked and broadcast; LibTorch's
  // named_parameters() lists a tied one under each name it was registered
  // with, and it is taken once.
  std::unordered_set<const void*> seen;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    if (!seen.insert(item.value().unsafeGetTensorImpl()).second) continue;
    names.push_back(item.key());
    all.push_back(item.value());
    params_.push_back(item.value());
  }
  for (const auto& item : module_->named_buffers(/*recurse=*/true)) {
    if (!seen.insert(item.value().unsafeGetTensorImpl()).second) continue;
    names.push_back("buffer " + item.key());
    all.push_back(item.value());
    buffers_.push_back(item.value());
  }
  if (pg_->size() == 1) return;  // nothing to agree on, nothing to exchange

  verify_same_tensors(*pg_, names, all);
  broadcast_coalesced(*pg_, all, /*root=*/0);

  if (!options_.reduce_gradients) return;
  if (options_.comm_hook) options_.comm_hook->check_supported(*pg_);

  ReducerOptions reducer;
  reducer.caps.bytes = mib_to_bytes(options_.bucket_cap_mb);
  reducer.caps.first_bytes = mib_to_bytes(options_.first_bucket_cap_mb);
  reducer.gradient_as_bucket_view = options_.gradient_as_bucket_view;
  reducer.find_unused_parameters = options_.find_unused_parameters;
  reducer.hook = options_.comm_hook;
  reducer_ = std::make_unique<Reducer>(grad_params, grad_names, pg_, reducer);
  spdlog::debug("ddp: {} parameters in {} buckets, {} buffers", grad_params.size(),
                reducer_->bucket_indices().size(), buffers_.size());
}

DdpCore::~DdpCore() = default;

void DdpCore::broadcast_buffers_if_due() {
  if (last_forward_synced_ && options_.broadcast_buffers && !buffers_.empty()) {
    broadcast_coalesced(*pg_, buffers_, /*root=*/0);
  }
}

void DdpCore::pre_forward() {
  if (pg_->size() == 1) return;
  if (reducer_) reducer_->ensure_prior_iteration_finished();
  const bool will_sync = sync_ && at::GradMode::is_enabled();
  if (joining_) {
    // Note [Join]: [1, will_sync] from every active rank, zeros from joined ones.
    auto flags = at::tensor({int64_t{1}, int64_t{will_sync}}, at::kLong).to(pg_->device());
    pg_->allreduce(flags, ReduceKind::kSum);
  }
  // PyTorch's order and rule: buffers first, when the previous forward
  // synchronised (require_forward_param_sync), then arm the Reducer.
  broadcast_buffers_if_due();
  if (will_sync && reducer_) reducer_->prepare_for_backward();
  last_forward_synced_ = will_sync;
}

DdpCore::Join::Join(DdpCore& ddp) : ddp_(ddp) {
  if (ddp_.joining_) throw ConfigError("DistributedDataParallel::join(): a Join is already alive");
  ddp_.joining_ = true;
}

DdpCore::Join::~Join() {
  ddp_.joining_ = false;
  if (!finished_) {
    spdlog::warn(
        "ddp: a Join ended without finish(): the other ranks' collectives are not shadowed");
  }
}

int64_t DdpCore::Join::finish() {
  finished_ = true;
  ddp_.joining_ = false;
  auto& pg = *ddp_.pg_;
  if (pg.size() == 1) return 0;
  if (ddp_.reducer_) ddp_.reducer_->ensure_prior_iteration_finished();
  // Shadow every forward (and synchronised backward) of the ranks still
  // active until all of them have finished: the first all-reduce that
  // counts no active rank ends the loop on every rank at once.
  int64_t shadowed = 0;
  bool last_joiner = false;
  for (bool first = true;; first = false) {
    auto flags = at::zeros({2}, at::kLong).to(pg.device());
    pg.allreduce(flags, ReduceKind::kSum);
    flags = flags.cpu();
    const int64_t active = flags[0].item<int64_t>();
    const int64_t syncing = flags[1].item<int64_t>();
    if (active == 0) {
      last_joiner = first;
      break;
    }
    if (syncing != 0 && syncing != active) {
      throw ConfigError("rank " + std::to_string(pg.rank()) + ": inside join(), " +
                        std::to_string(syncing) + " of " + std::to_string(active) +
                        " active ranks synchronise this iteration: every active rank must use "
                        "no_sync (or NoGradGuard) on the same iterations");
    }
    ddp_.broadcast_buffers_if_due();
    if (syncing > 0 && ddp_.reducer_) {
      ddp_.reducer_->shadow_iteration();
      ++shadowed;
    }
    ddp_.last_forward_synced_ = syncing > 0;
  }
  // The rank that finished last trained on every iteration: its weights and
  // buffers are the model's (PyTorch's _sync_final_model).
  const int root_rank = static_cast<int>(max_over_ranks(pg, int64_t{last_joiner ? pg.rank() : -1}));
  std::vector<at::Tensor> state = ddp_.params_;
  state.insert(state.end(), ddp_.buffers_.begin(), ddp_.buffers_.end());
  {
    at::NoGradGuard no_grad;
    broadcast_coalesced(pg, state, root_rank);
  }
  spdlog::debug("ddp: join finished after shadowing {} iterations; final model from rank {}",
                shadowed, root_rank);
  return shadowed;
}

}  // namespace lockstep
