/* ukernels_avx512bf16.c - the bf16 vector micro-kernels (ukernels_vec.inc) on simd_avx512.h
   with AVX512-BF16 rounding on store (vcvtneps2bf16, see simd_avx512.h); chosen at run time
   for bf16 on CPUs that have it (ukernels.c).  Same bits as ukernels_avx512.c. */
#define NORMA_SIMD_AVX512BF16 1
#define VEC_BF16_ONLY 1
#include "simd_avx512.h"
#define VEC_TABLE_FN bn_ukernels_avx512bf16
#include "ukernels_vec.inc"
