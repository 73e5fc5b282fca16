// Compiled with -mavx512f (CMake); only called when the CPU has AVX-512F.
#define XXH3_KERNEL_NAME xxh3_128_avx512
#include "xxh3_kernel.inc"
