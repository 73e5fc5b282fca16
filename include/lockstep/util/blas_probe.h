// Is the BLAS running kernels far older than the CPU?
//
// OpenBLAS picks its kernels from the CPU model at load time. A model it does
// not know (Debian 12's 0.3.21 on Sapphire Rapids) falls back to its
// Prescott (SSE3) kernels: the large benchmark MLP's forward and backward
// took several times as long (docs/lab/blas.md). PyTorch's own DDP from
// the same Debian is slowed alike, so nothing compares badly, and nothing
// says so. OPENBLAS_CORETYPE chooses the kernels.
#pragma once

#include <string>

namespace lockstep {

struct CpuVectors {
  bool avx2 = false;
  bool avx512 = false;
};

// The warning for an OpenBLAS that chose `core` (openblas_get_corename())
// on a CPU with `cpu`, "" when there is nothing to say: the core is one
// built for AVX2 or later, is unknown, or OPENBLAS_CORETYPE chose it
// (`coretype_env` non-empty).
std::string blas_core_warning(const std::string& core, CpuVectors cpu,
                              const std::string& coretype_env);

// The core the OpenBLAS in this process runs ("" when no OpenBLAS is loaded).
std::string blas_core_name();

// blas_core_warning for this process: its OpenBLAS, CPU and environment.
std::string blas_core_warning();

}  // namespace lockstep
