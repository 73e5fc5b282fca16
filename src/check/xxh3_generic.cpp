#define XXH3_KERNEL_NAME xxh3_128_generic
#include "xxh3_kernel.inc"
