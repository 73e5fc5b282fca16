#include "lockstep/util/blas_probe.h"

#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>

namespace lockstep {
namespace {

// OpenBLAS cores whose kernels predate AVX2 (OpenBLAS's own names,
// compared in lower case). Unknown names are given the benefit of the doubt.
constexpr const char* kPreAvx2Cores[] = {
    "prescott",    "core2",   "penryn",     "dunnington", "nehalem",   "atom",
    "sandybridge", "opteron", "barcelona",  "bobcat",     "bulldozer", "piledriver",
    "nano",        "katmai",  "coppermine", "northwood",  "banias",    "steamroller"};

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

}  // namespace

std::string blas_core_warning(const std::string& core, CpuVectors cpu,
                              const std::string& coretype_env) {
  if (!cpu.avx2 || !coretype_env.empty() || core.empty()) return "";
  const std::string name = lower(core);
  const bool old = std::any_of(std::begin(kPreAvx2Cores), std::end(kPreAvx2Cores),
                               [&](const char* c) { return name == c; });
  if (!old) return "";
  const char* better = cpu.avx512 ? "SkylakeX" : "Haswell";
  return "OpenBLAS chose its " + core + " kernels, which use no AVX2, on a CPU with " +
         (cpu.avx512 ? "AVX-512" : "AVX2") +
         " (this OpenBLAS does not know the CPU's model): matrix products run several times "
         "slower than they can (3.3x on lockstep's large benchmark MLP). Set "
         "OPENBLAS_CORETYPE=" +
         better + " in every rank's environment (docs/performance.md, \"The BLAS\")";
}

std::string blas_core_name() {
  using Corename = char* (*)();
  auto* corename = reinterpret_cast<Corename>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (corename == nullptr) return "";  // not OpenBLAS (MKL, reference BLAS, none)
  const char* core = corename();
  return core ? core : "";
}

std::string blas_core_warning() {
  CpuVectors cpu;
#if defined(__x86_64__)
  cpu.avx2 = __builtin_cpu_supports("avx2");
  cpu.avx512 = __builtin_cpu_supports("avx512f");
#endif
  const char* env = std::getenv("OPENBLAS_CORETYPE");
  return blas_core_warning(blas_core_name(), cpu, env ? env : "");
}

}  // namespace lockstep
