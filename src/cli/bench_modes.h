// `lockstep bench ddp --modes`: what each mode name asks for, one table
// (kBenchModeNames) for parsing, the error's list of valid names and the
// flag's help.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

#include "lockstep/check/check_kinds.h"
#include "lockstep/ddp/ddp_options.h"
#include "lockstep/util/names.h"

namespace lockstep::cli {

// What a --modes name asks for: each mode is one row of kBenchModeNames, so
// the names are parsed, listed and documented in one place.
enum class BenchModeKind {
  kLocal,
  kLocalBarrier,
  kLocalAmpBf16,
  kDdp,
  kDdpAmpBf16,
  kDdpFp16,
  kDdpBf16,
  kDdpPowerSgd1,
  kDdpPowerSgd2,
  kDdpPowerSgd4,
  kDdpBucket1,
  kDdpBucket5,
  kDdpBucket25,
  kDdpBucket100,
  kDdpAccum4,
  kDdpCheck,
  kDdpCheckInplace,
  kDdpCheckSha256,
  kExchangeBucketed,
  kExchangeFlat
};
inline constexpr NameTable<BenchModeKind, 20> kBenchModeNames{{
    {BenchModeKind::kLocal, "local"},
    {BenchModeKind::kLocalBarrier, "local+barrier"},
    {BenchModeKind::kLocalAmpBf16, "local-amp-bf16"},
    {BenchModeKind::kDdp, "ddp"},
    {BenchModeKind::kDdpAmpBf16, "ddp-amp-bf16"},
    {BenchModeKind::kDdpFp16, "ddp-fp16"},
    {BenchModeKind::kDdpBf16, "ddp-bf16"},
    {BenchModeKind::kDdpPowerSgd1, "ddp-powersgd1"},
    {BenchModeKind::kDdpPowerSgd2, "ddp-powersgd2"},
    {BenchModeKind::kDdpPowerSgd4, "ddp-powersgd4"},
    {BenchModeKind::kDdpBucket1, "ddp-bucket1"},
    {BenchModeKind::kDdpBucket5, "ddp-bucket5"},
    {BenchModeKind::kDdpBucket25, "ddp-bucket25"},
    {BenchModeKind::kDdpBucket100, "ddp-bucket100"},
    {BenchModeKind::kDdpAccum4, "ddp-accum4"},
    {BenchModeKind::kDdpCheck, "ddp+check"},
    {BenchModeKind::kDdpCheckInplace, "ddp+check-inplace"},
    {BenchModeKind::kDdpCheckSha256, "ddp+check-sha256"},
    {BenchModeKind::kExchangeBucketed, "exchange-bucketed"},
    {BenchModeKind::kExchangeFlat, "exchange-flat"},
}};

struct BenchMode {
  std::string name;
  bool ddp = true;        // false: the model alone (local)
  bool barrier = false;   // a barrier after each backward: what keeping ranks in step costs
  bool autocast = false;  // forward and loss under bf16 autocast (train.precision: bf16)
  std::optional<CommHookKind> hook;
  int64_t powersgd_rank = 0;  // PowerSGD compressing from step 2, one bucket
  double bucket_mb = 0;       // 0: --bucket-cap-mb
  int micro = 1;              // micro-batches, no_sync on all but the last
  bool check = false;         // the fingerprint check after every step (check.every: 1)
  DigestMode digest = DigestMode::kXxh3;
  bool inplace = false;   // hashed in the step, not where the trainer would
  bool exchange = false;  // communication only
  bool flat = false;      // ... as one flat all-reduce instead of DDP's buckets
};

inline BenchMode bench_mode(const std::string& name) {
  using K = BenchModeKind;
  const K kind = parse_named(kBenchModeNames, name, "--modes");
  const auto any = [kind](std::initializer_list<K> kinds) {
    return std::find(kinds.begin(), kinds.end(), kind) != kinds.end();
  };
  BenchMode m;
  m.name = name;
  m.ddp = !any({K::kLocal, K::kLocalBarrier, K::kLocalAmpBf16});
  m.barrier = kind == K::kLocalBarrier;
  m.autocast = any({K::kLocalAmpBf16, K::kDdpAmpBf16});
  if (kind == K::kDdpFp16) m.hook = CommHookKind::kFp16;
  if (kind == K::kDdpBf16) m.hook = CommHookKind::kBf16;
  // ddp-powersgd<rank> and ddp-bucket<MiB>: the number the name ends in.
  if (any({K::kDdpPowerSgd1, K::kDdpPowerSgd2, K::kDdpPowerSgd4})) {
    m.hook = CommHookKind::kPowerSgd;
    m.powersgd_rank = kind == K::kDdpPowerSgd1 ? 1 : kind == K::kDdpPowerSgd2 ? 2 : 4;
  }
  if (any({K::kDdpBucket1, K::kDdpBucket5, K::kDdpBucket25, K::kDdpBucket100}))
    m.bucket_mb = kind == K::kDdpBucket1    ? 1
                  : kind == K::kDdpBucket5  ? 5
                  : kind == K::kDdpBucket25 ? 25
                                            : 100;
  m.micro = kind == K::kDdpAccum4 ? 4 : 1;
  m.check = any({K::kDdpCheck, K::kDdpCheckInplace, K::kDdpCheckSha256});
  m.inplace = kind == K::kDdpCheckInplace;
  m.digest = kind == K::kDdpCheckSha256 ? DigestMode::kSha256 : DigestMode::kXxh3;
  m.exchange = any({K::kExchangeBucketed, K::kExchangeFlat});
  m.flat = kind == K::kExchangeFlat;
  return m;
}

}  // namespace lockstep::cli
