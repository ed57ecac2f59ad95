/* ukernels_emu16.c - the AVX-512 instance's code on simd_emu16.h (two AVX2 halves): the stand-in
   for the avx512 level under NORMA_EMULATE_AVX512=1 on CPUs without AVX-512 (testing). */
#include "simd_emu16.h"
#define VEC_TABLE_FN bn_ukernels_emu16
#include "ukernels_vec.inc"
