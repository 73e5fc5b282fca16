#include "lockstep/ddp/comm_hooks.h"

#include <ATen/ATen.h>

#include "lockstep/util/error.h"

namespace lockstep {

HookWork AllReduceHook::run(ProcessGroup& pg, at::Tensor& bucket) {
  return {pg.allreduce_async(bucket, ReduceKind::kSum), nullptr};
}

CompressHook::CompressHook(at::ScalarType wire_type) : wire_type_(wire_type) {}

std::string CompressHook::name() const {
  return wire_type_ == at::kHalf ? "fp16" : "bf16";
}

HookWork CompressHook::run(ProcessGroup& pg, at::Tensor& bucket) {
  auto wire = bucket.to(wire_type_);
  auto work = pg.allreduce_async(wire, ReduceKind::kSum);
  // `wire` is captured: it must outlive the collective.
  return {work, [bucket, wire]() mutable { bucket.copy_(wire); }};
}

void CompressHook::check_supported(ProcessGroup& pg) {
  auto probe = at::zeros({1}, at::TensorOptions(wire_type_).device(pg.device()));
  try {
    pg.allreduce(probe, ReduceKind::kSum);
  } catch (const CommError& e) {
    throw ConfigError("comm hook '" + name() + "': the " + backend_kind_name(pg.kind()) +
                      " backend of this LibTorch cannot all-reduce " + c10::toString(wire_type_) +
                      " (" + e.what() +
                      "); use the fp16 hook, or a backend that supports it (NCCL)");
  }
}

std::shared_ptr<CommHook> comm_hook_create(CommHookKind kind) {
  switch (kind) {
    case CommHookKind::kFp16:
      return std::make_shared<CompressHook>(at::kHalf);
    case CommHookKind::kBf16:
      return std::make_shared<CompressHook>(at::kBFloat16);
    case CommHookKind::kAllreduce:
      break;
  }
  return std::make_shared<AllReduceHook>();
}

}  // namespace lockstep
