// XXH3 for AVX-512: about 1.5-2x the AVX2 speed on a block in L2.
#define HP_SIMD(name) name##_avx512
#include "checksum_simd.inc"
