#include "lockstep/ddp/comm_hooks.h"

#include <ATen/ATen.h>

#include "lockstep/ddp/powersgd.h"
#include "lockstep/util/error.h"
#include "lockstep/util/registry.h"

namespace lockstep {
HookWork CommHook::run(ProcessGroup&, at::Tensor&) {
  throw UsageError("comm hook '" + name() + "' implements neither run() nor run_bucket()");
}

HookWork AllReduceHook::run(ProcessGroup& pg, at::Tensor& bucket) {
  return {pg.allreduce_async(bucket, ReduceKind::kSum), nullptr, nullptr,
          static_cast<int64_t>(bucket.nbytes())};
}

CompressHook::CompressHook(at::ScalarType wire_type) : wire_type_(wire_type) {}

std::string CompressHook::name() const {
  return wire_type_ == at::kHalf ? "fp16" : "bf16";
}

HookWork CompressHook::run(ProcessGroup& pg, at::Tensor& bucket) {
  auto wire = bucket.to(wire_type_);
  auto work = pg.allreduce_async(wire, ReduceKind::kSum);
  // `wire` is captured: it must outlive the collective.
  return {work, nullptr, [bucket, wire]() mutable { bucket.copy_(wire); },
          static_cast<int64_t>(wire.nbytes())};
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

std::shared_ptr<CommHook> comm_hook_create(CommHookKind kind, const PowerSgdOptions* powersgd) {
  switch (kind) {
    case CommHookKind::kFp16:
      return std::make_shared<CompressHook>(at::kHalf);
    case CommHookKind::kBf16:
      return std::make_shared<CompressHook>(at::kBFloat16);
    case CommHookKind::kPowerSgd:
      return std::make_shared<PowerSgdHook>(powersgd ? *powersgd : PowerSgdOptions{});
    case CommHookKind::kAllreduce:
      break;
  }
  return std::make_shared<AllReduceHook>();
}

void register_comm_hook(const std::string& name, CommHookFactory factory) {
  if (name.empty() || !factory) throw ConfigError("register_comm_hook: empty name or factory");
  if (value_named(kCommHookKindNames, name)) {
    throw ConfigError("register_comm_hook: '" + name + "' is a built-in hook's name");
  }
  registry_of<CommHookFactory>().add(name, std::move(factory), /*replace=*/true);
}

std::vector<std::string> comm_hook_names() {
  auto names = names_of(kCommHookKindNames);
  for (const auto& name : registry_of<CommHookFactory>().names()) names.push_back(name);
  return names;
}

std::shared_ptr<CommHook> comm_hook_create(const std::string& name,
                                           const PowerSgdOptions& powersgd) {
  if (const auto kind = value_named(kCommHookKindNames, name)) {
    if (*kind == CommHookKind::kAllreduce) return nullptr;
    return comm_hook_create(*kind, &powersgd);
  }
  const CommHookFactory factory =
      registry_of<CommHookFactory>().find(name).value_or(CommHookFactory{});
  if (!factory) {
    std::string valid;
    for (const auto& n : comm_hook_names()) valid += (valid.empty() ? "" : ", ") + n;
    throw ConfigError("ddp.comm_hook: unknown hook '" + name + "' (valid: " + valid +
                      "; register_comm_hook adds your own)");
  }
  auto hook = factory();
  if (!hook) throw ConfigError("comm hook '" + name + "': its factory returned nothing");
  return hook;
}

}  // namespace lockstep
