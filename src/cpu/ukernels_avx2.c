/* ukernels_avx2.c - the vector micro-kernels (ukernels_vec.inc) on simd_avx2.h: AVX2 + FMA +
   F16C, 8 lanes. */
#include "simd_avx2.h"
#define VEC_TABLE_FN bn_ukernels_avx2
#include "ukernels_vec.inc"
