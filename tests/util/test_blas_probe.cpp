// The BLAS probe: which OpenBLAS cores on which CPUs draw the warning, and
// that the probe reads the core of the OpenBLAS this process has loaded.
#include "support/catch.h"

#include <fstream>
#include <string>

#include "lockstep/util/blas_probe.h"

using namespace lockstep;
using lockstep::testing::Contains;

TEST_CASE("blas probe: pre-AVX2 kernels on an AVX2 or AVX-512 CPU draw the warning", "[blas]") {
  const CpuVectors avx512{true, true}, avx2{true, false}, sse{false, false};
  const auto on512 = blas_core_warning("Prescott", avx512, "");
  CHECK_THAT(on512, Contains("OpenBLAS chose its Prescott kernels"));
  CHECK_THAT(on512, Contains("AVX-512"));
  CHECK_THAT(on512, Contains("OPENBLAS_CORETYPE=SkylakeX"));
  CHECK_THAT(blas_core_warning("Nehalem", avx2, ""), Contains("OPENBLAS_CORETYPE=Haswell"));
  CHECK_THAT(blas_core_warning("CORE2", avx2, ""), Contains("CORE2 kernels"));
  // Kernels that use the CPU, a CPU without AVX2, a user's own choice, an
  // unknown name: nothing to say.
  for (const char* core : {"Haswell", "SkylakeX", "Cooperlake", "SapphireRapids", "Zen"})
    CHECK(blas_core_warning(core, avx512, "") == "");
  CHECK(blas_core_warning("Prescott", sse, "") == "");
  CHECK(blas_core_warning("Prescott", avx512, "Prescott") == "");
  CHECK(blas_core_warning("SomeFutureCore", avx512, "") == "");
  CHECK(blas_core_warning("", avx512, "") == "");
}

TEST_CASE("blas probe: reads the core of the OpenBLAS this process loaded", "[blas]") {
  std::ifstream maps("/proc/self/maps");
  const std::string text((std::istreambuf_iterator<char>(maps)), std::istreambuf_iterator<char>());
  if (text.find("libopenblas") == std::string::npos) {
    CHECK(blas_core_name() == "");  // no OpenBLAS: no core, no warning
    CHECK(blas_core_warning() == "");
    return;
  }
  const std::string core = blas_core_name();
  INFO("core: " << core);
  CHECK(!core.empty());
  CHECK(core.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") ==
        std::string::npos);
}
