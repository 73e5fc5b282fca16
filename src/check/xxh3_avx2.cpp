// Compiled with -mavx2 (CMake); only called when the CPU has AVX2.
#define XXH3_KERNEL_NAME xxh3_128_avx2
#include "xxh3_kernel.inc"
