// DistributedDataParallel's options and the built-in comm hooks' names: the
// one home of DDP's defaults (the config's ddp section takes them from here).
// Plain data: no LibTorch or c10d headers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "lockstep/util/names.h"
#include "lockstep/util/units.h"

namespace lockstep {

class CommHook;  // ddp/comm_hooks.h

// The built-in comm hooks (comm_hook_create in comm_hooks.h).
enum class CommHookKind { kAllreduce, kFp16, kBf16, kPowerSgd };
inline constexpr NameTable<CommHookKind, 4> kCommHookKindNames{
    {{CommHookKind::kAllreduce, "allreduce"},
     {CommHookKind::kFp16, "fp16"},
     {CommHookKind::kBf16, "bf16"},
     {CommHookKind::kPowerSgd, "powersgd"}}};
// Whether ddp.comm_hook's `name` is the built-in hook `kind`.
inline bool is_comm_hook(std::string_view name, CommHookKind kind) {
  return value_named(kCommHookKindNames, name) == kind;
}

// PowerSGD's settings (ddp/powersgd.h): PyTorch's PowerSGDState, defaults
// included.
struct PowerSgdOptions {
  int64_t matrix_approximation_rank = 1;
  int64_t start_iter = 1000;  // PyTorch's start_powerSGD_iter
  double min_compression_rate = 2;
  bool use_error_feedback = true;
  bool warm_start = true;
  double orthogonalization_epsilon = 0;
  uint32_t random_seed = 0;
  bool batch_tensors_with_same_shape = false;
};

// Throws ConfigError naming the bad field: rank >= 1, start_iter >= 0 (> 1
// with error feedback or warm start: the buckets are rebuilt after the
// first iteration), min_compression_rate >= 0, epsilon >= 0.
void powersgd_validate(const PowerSgdOptions& options);

// PyTorch DDP's bucket caps (bucket_cap_mb 25, the first bucket 1 MiB);
// BucketCaps (ddp/buckets.h) defaults to them too.
inline constexpr size_t kBucketCapBytes = size_t{25} << 20;
inline constexpr size_t kFirstBucketCapBytes = size_t{1} << 20;

struct DdpOptions {
  // Cap of every bucket but the first.
  double bucket_cap_mb = bytes_to_mib(kBucketCapBytes);
  // The first bucket: small, so the exchange starts early.
  double first_bucket_cap_mb = bytes_to_mib(kFirstBucketCapBytes);
  bool gradient_as_bucket_view = true;
  bool find_unused_parameters = false;
  bool broadcast_buffers = true;  // rank 0's buffers, before forwards that follow a synced one
  std::shared_ptr<CommHook> comm_hook;  // nullptr: plain SUM all-reduce
  // false: no Reducer; something else exchanges the gradients (fully
  // sharded parameters, optim/fully_shard.h) and DDP keeps the rest (the
  // parameters' check and broadcast at start, buffers, no_sync's flag).
  bool reduce_gradients = true;
};

}  // namespace lockstep
