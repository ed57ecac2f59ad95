/* bn_ukernels_avx2.c - AVX2 + FMA + F16C micro-kernels (placeholder: none yet, the driver
   falls back to the portable kernels). */
#include <stddef.h>

#include "ukernels.h"

const bn_ukernels *bn_ukernels_avx2(norma_dtype t) {
  (void)t;
  return NULL;
}
