// train.precision that knows the CPU: a start-up probe of fp32 against
// bf16/fp16 products, a warning where the lower precision is slower, and
// train.precision: auto resolved to the faster.
#include <ATen/ATen.h>

#include <spdlog/spdlog.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "lockstep/distributed/agree.h"
#include "lockstep/distributed/process_group.h"
#include "lockstep/train/precision.h"
#include "lockstep/util/matmul_peak.h"
#include "lockstep/util/torch_compat.h"

namespace lockstep {

// Note [Precision that knows the CPU]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// bf16 pays on a CPU whose products have native bf16 kernels (AVX512_BF16,
// AMX): several times fp32's. Without them oneDNN emulates or falls back,
// and a bf16 run can be an order of magnitude slower than fp32, silently
// (the measurements: docs/lab/amp.md, "Note [Precision that knows the
// CPU]"). So a CPU run asked for bf16 or fp16 first times both
// precisions (rank 0, ~0.1 s: alternating n^3 products, the best of each)
// and warns, with the ratio and the flag to set, where the lower
// precision is slower; `train.precision: auto` takes bf16 where its
// products are at least kAutoBf16Speedup x fp32's and fp32 otherwise, and
// says which. Rank 0 measures and broadcasts, so every rank runs the same
// precision. The matrix products are most of a step's time in the models
// where precision matters (docs/performance.md, "Mixed precision"); the
// probe does not see the casts autocast adds, which the 1.2 margin covers.
PrecisionVerdict precision_verdict(Precision asked, const PrecisionProbe& probe,
                                   const std::string& flags) {
  PrecisionVerdict v;
  v.chosen = asked;
  if (asked == Precision::kFp32) return v;
  const bool fp16 = asked == Precision::kFp16;
  const char* low = fp16 ? "fp16" : "bf16";
  const double ratio = probe.fp32_gflops > 0 ? probe.low_gflops / probe.fp32_gflops : 0;
  char measured[200];
  std::snprintf(measured, sizeof measured,
                "this CPU's %s products ran at %.1f GFLOP/s against %.1f in fp32 (%.2fx, %lld^3; "
                "%s)",
                low, probe.low_gflops, probe.fp32_gflops, ratio, static_cast<long long>(probe.n),
                flags.empty()
                    ? (fp16 ? "no avx512_fp16 or amx_fp16 flag" : "no avx512_bf16 or amx_bf16 flag")
                    : ("native: " + flags).c_str());
  if (asked == Precision::kAuto) {
    v.chosen = ratio >= kAutoBf16Speedup ? Precision::kBf16 : Precision::kFp32;
    v.message = std::string("train.precision: auto chose ") +
                (v.chosen == Precision::kBf16 ? "bf16" : "fp32") + ": " + measured +
                (v.chosen == Precision::kBf16 ? "" : "; bf16 is chosen from 1.2x");
    return v;
  }
  v.warn = ratio < 1.0;
  v.message = v.warn ? std::string("train.precision: ") + low +
                           " is slower than fp32 here: " + measured +
                           "; set train.precision: fp32 (or auto, which picks the faster)"
                     : std::string("train.precision: ") + low + ": " + measured;
  return v;
}

std::string cpu_low_precision_flags(Precision precision) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::string word, found;
    const bool fp16 = precision == Precision::kFp16;
    while (words >> word) {
      if (word == (fp16 ? "avx512_fp16" : "avx512_bf16") ||
          word == (fp16 ? "amx_fp16" : "amx_bf16"))
        found += (found.empty() ? "" : " ") + word;
    }
    return found;
  }
  return "";
}

namespace {

PrecisionProbe probe(Precision asked) {
  const at::ScalarType low = asked == Precision::kFp16 ? at::kHalf : at::kBFloat16;
  PrecisionProbe p;
  p.n = 384;
  // Alternating rounds, the best of each: a busy moment costs both alike.
  for (int round = 0; round < 3; ++round) {
    p.fp32_gflops = std::max(p.fp32_gflops, matmul_peak_gflops(at::kFloat, p.n, 0.02));
    p.low_gflops = std::max(p.low_gflops, matmul_peak_gflops(low, p.n, 0.02));
  }
  return p;
}

}  // namespace

void resolve_precision(Config& config, at::Device device, ProcessGroup& pg) {
  Precision& precision = config.train.precision;
  if (precision == Precision::kFp32) return;
  if (device.is_cuda()) {
    if (precision == Precision::kAuto) {
      precision = Precision::kBf16;
      if (pg.rank() == 0) spdlog::info("train.precision: auto chose bf16 on {}", device.str());
    }
    return;
  }
  // fp16 where this LibTorch cannot autocast it on the CPU: MixedPrecision
  // says so; nothing to time.
  if (precision == Precision::kFp16 && !autocast_unsupported(at::kCPU, at::kHalf).empty()) return;
  PrecisionProbe p;
  if (pg.rank() == 0) p = probe(precision);
  // Rank 0's figures on every rank (the others give 0): one verdict.
  const auto agreed = max_over_ranks(pg, std::vector<double>{p.fp32_gflops, p.low_gflops});
  p.fp32_gflops = agreed[0];
  p.low_gflops = agreed[1];
  p.n = 384;
  const PrecisionVerdict v = precision_verdict(precision, p, cpu_low_precision_flags(precision));
  precision = v.chosen;
  if (pg.rank() != 0 || v.message.empty()) return;
  if (v.warn)
    spdlog::warn("{}", v.message);
  else
    spdlog::info("{}", v.message);
}

}  // namespace lockstep
