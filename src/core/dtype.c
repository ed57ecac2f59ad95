/* dtype.c - scalar element access by dtype, for the reference kernels and the checks. */
#include "convert.h"
#include "internal.h"

double norma__load(norma_dtype t, const void *p, int64_t i) {
  switch (t) {
    case NORMA_F32: return ((const float *)p)[i];
    case NORMA_F64: return ((const double *)p)[i];
    case NORMA_F16: return norma__f16_to_f32(((const uint16_t *)p)[i]);
    case NORMA_BF16: return norma__bf16_to_f32(((const uint16_t *)p)[i]);
  }
  return 0.0;
}

void norma__store(norma_dtype t, void *p, int64_t i, double v) {
  switch (t) {
    case NORMA_F32: ((float *)p)[i] = (float)v; break;
    case NORMA_F64: ((double *)p)[i] = v; break;
    /* double -> float -> half double-rounds; the reference accepts that (the difference is
       below the tolerance of 16-bit storage), the fast kernels round from f32 as well. */
    case NORMA_F16: ((uint16_t *)p)[i] = norma__f32_to_f16((float)v); break;
    case NORMA_BF16: ((uint16_t *)p)[i] = norma__f32_to_bf16((float)v); break;
  }
}

