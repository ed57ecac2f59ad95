/* bn_ukernels_scalar.c - the portable micro-kernels, one instance per storage dtype. */
#include <math.h>
#include <stddef.h>

#include "convert.h"
#include "ukernels.h"

#define UK_T float
#define UK_S float
#define UK_LOAD(v) (v)
#define UK_STORE(v) (v)
#define UK_NAME(f) f##_f32
#define UK_ANCHOR bn_stats_anchor_f32
#define UK_EXP expf
#define UK_SCALE bn_stats_scale_f32
#include "bn_ukernels_generic.inc"
#undef UK_T
#undef UK_S
#undef UK_LOAD
#undef UK_STORE
#undef UK_NAME
#undef UK_ANCHOR
#undef UK_EXP
#undef UK_SCALE

#define UK_T double
#define UK_S double
#define UK_LOAD(v) (v)
#define UK_STORE(v) (v)
#define UK_NAME(f) f##_f64
#define UK_ANCHOR bn_stats_anchor_f64
#define UK_EXP exp
#define UK_SCALE bn_stats_scale_f64
#include "bn_ukernels_generic.inc"
#undef UK_T
#undef UK_S
#undef UK_LOAD
#undef UK_STORE
#undef UK_NAME
#undef UK_ANCHOR
#undef UK_EXP
#undef UK_SCALE

#define UK_T float
#define UK_S uint16_t
#define UK_LOAD(v) norma__f16_to_f32(v)
#define UK_STORE(v) norma__f32_to_f16(v)
#define UK_NAME(f) f##_f16
#define UK_ANCHOR bn_stats_anchor_f32
#define UK_EXP expf
#define UK_SCALE bn_stats_scale_f32
#include "bn_ukernels_generic.inc"
#undef UK_T
#undef UK_S
#undef UK_LOAD
#undef UK_STORE
#undef UK_NAME
#undef UK_ANCHOR
#undef UK_EXP
#undef UK_SCALE

#define UK_T float
#define UK_S uint16_t
#define UK_LOAD(v) norma__bf16_to_f32(v)
#define UK_STORE(v) norma__f32_to_bf16(v)
#define UK_NAME(f) f##_bf16
#define UK_ANCHOR bn_stats_anchor_f32
#define UK_EXP expf
#define UK_SCALE bn_stats_scale_f32
#include "bn_ukernels_generic.inc"
#undef UK_T
#undef UK_S
#undef UK_LOAD
#undef UK_STORE
#undef UK_NAME
#undef UK_ANCHOR
#undef UK_EXP
#undef UK_SCALE

const bn_ukernels *bn_ukernels_scalar(norma_dtype t) {
  switch (t) {
    case NORMA_F32: return &table_f32;
    case NORMA_F64: return &table_f64;
    case NORMA_F16: return &table_f16;
    case NORMA_BF16: return &table_bf16;
  }
  return NULL;
}
