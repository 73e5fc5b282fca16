#include "lockstep/ddp/ddp.h"

#include <spdlog/spdlog.h>

#include "lockstep/dist/coalesced.h"

namespace lockstep {

DdpCore::DdpCore(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<ProcessGroup> pg,
                 DdpOptions options)
    : module_(std::move(module)), pg_(std::move(pg)), options_(std::move(options)) {
  std::vector<std::string> names;
  std::vector<at::Tensor> all;  // parameters, then buffers
  std::vector<std::string> grad_names;
  std::vector<at::Tensor> grad_params;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    names.push_back(item.key());
    all.push_back(item.value());
    if (item.value().requires_grad()) {
      grad_names.push_back(item.key());
      grad_params.push_back(item.value());
    }
  }
  for (const auto& item : module_->named_buffers(/*recurse=*/true)) {
    names.push_back("buffer " + item.key());
    all.push_back(item.value());
    buffers_.push_back(item.value());
  }
  if (pg_->size() == 1) return;  // nothing to agree on, nothing to exchange

  verify_same_tensors(*pg_, names, all);
  broadcast_coalesced(*pg_, all, /*root=*/0);

  if (options_.comm_hook) options_.comm_hook->check_supported(*pg_);

  ReducerOptions reducer;
  reducer.caps.bytes = static_cast<size_t>(options_.bucket_cap_mb * (1 << 20));
  reducer.caps.first_bytes = static_cast<size_t>(options_.first_bucket_cap_mb * (1 << 20));
  reducer.gradient_as_bucket_view = options_.gradient_as_bucket_view;
  reducer.find_unused_parameters = options_.find_unused_parameters;
  reducer.hook = options_.comm_hook;
  reducer_ = std::make_unique<Reducer>(grad_params, grad_names, pg_, reducer);
  spdlog::debug("ddp: {} parameters in {} buckets, {} buffers", grad_params.size(),
                reducer_->bucket_indices().size(), buffers_.size());
}

DdpCore::~DdpCore() = default;

void DdpCore::pre_forward() {
  if (pg_->size() == 1) return;
  if (options_.broadcast_buffers && !buffers_.empty()) {
    broadcast_coalesced(*pg_, buffers_, /*root=*/0);
  }
  if (sync_ && reducer_) reducer_->prepare_for_backward();
}

}  // namespace lockstep
