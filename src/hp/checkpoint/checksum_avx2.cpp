// XXH3 for AVX2: about twice the SSE2 speed of the system library.
#define HP_SIMD(name) name##_avx2
#include "checksum_simd.inc"
