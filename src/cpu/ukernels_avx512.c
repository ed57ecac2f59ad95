/* ukernels_avx512.c - the vector micro-kernels (ukernels_vec.inc) on simd_avx512.h: AVX-512
   F/BW/VL/DQ, 16 lanes. */
#include "simd_avx512.h"
#define VEC_TABLE_FN bn_ukernels_avx512
#include "ukernels_vec.inc"
