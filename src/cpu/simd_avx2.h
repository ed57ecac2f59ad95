/* simd_avx2.h - the vector layer of ukernels_vec.inc for AVX2 + FMA + F16C: 8 f32 lanes.
 * Each ISA layer defines the same small set of operations (vf: a vector of VW floats, vm: a
 * lane mask); the kernels are written once against them.  Storage types: f32, f16 (widened by
 * F16C), bf16 (a 16-bit shift; rounded to nearest even on store with integer arithmetic).
 * Tails never read or write past the last value: masked f32 loads, staged 16-bit ones.
 */
#ifndef NORMA_SIMD_AVX2_H
#define NORMA_SIMD_AVX2_H

#include "simd_avx2_ops.h"

#define VW 8
#define VAI static inline __attribute__((always_inline))

typedef __m256 vf;
typedef __m256 vm; /* all-ones lanes */

VAI vf vzero(void) { return _mm256_setzero_ps(); }
VAI vf vset1(float a) { return _mm256_set1_ps(a); }
VAI vf vadd(vf a, vf b) { return _mm256_add_ps(a, b); }
VAI vf vsub(vf a, vf b) { return _mm256_sub_ps(a, b); }
VAI vf vmul(vf a, vf b) { return _mm256_mul_ps(a, b); }
VAI vf vdiv(vf a, vf b) { return _mm256_div_ps(a, b); }
VAI vf vmin(vf a, vf b) { return _mm256_min_ps(a, b); }
VAI vf vor_bits(vf a, vf b) { return _mm256_or_ps(a, b); } /* the lanes' bit patterns ORed */
VAI vf vmax(vf a, vf b) { return _mm256_max_ps(a, b); }
VAI vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); } /* a * b + c */
/* max(0, v), NaN passing through (max returns its second operand on NaN) */
VAI vf vmax0(vf v) { return _mm256_max_ps(_mm256_setzero_ps(), v); }

VAI vm vmask_first(int n) { return a8_first(n); }
VAI vf vand_m(vf v, vm m) { return _mm256_and_ps(v, m); }
VAI vf vblend_m(vm m, vf a, vf b) { return _mm256_blendv_ps(a, b, m); } /* m ? b : a */
VAI vm vgt(vf a, vf b) { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }
/* g where y > 0, else 0 */
VAI vf vkeep_pos(vf g, vf y) {
  return _mm256_and_ps(g, _mm256_cmp_ps(y, _mm256_setzero_ps(), _CMP_GT_OQ));
}

/* ---- loads and stores by storage type (dt is a constant after inlining) ---- */

VAI vf vld(const void *p, int64_t i, const int dt) { return a8_ld(p, i, dt); }

/* the first n (0 < n < VW) values, zeros after; never reads past them */
VAI vf vld_part(const void *p, int64_t i, int n, const int dt) {
  if (dt == S_F32)
    return _mm256_maskload_ps((const float *)p + i, _mm256_castps_si256(vmask_first(n)));
  uint16_t t[8] = {0};
  memcpy(t, (const uint16_t *)p + i, (size_t)n * 2);
  return vld(t, 0, dt);
}

VAI void vst(void *p, int64_t i, vf v, const int dt) { a8_st(p, i, v, dt); }

VAI void vst_part(void *p, int64_t i, vf v, int n, const int dt) {
  if (dt == S_F32) {
    _mm256_maskstore_ps((float *)p + i, _mm256_castps_si256(vmask_first(n)), v);
    return;
  }
  uint16_t t[8];
  vst(t, 0, v, dt);
  memcpy((uint16_t *)p + i, t, (size_t)n * 2);
}

/* vst through the write-combining buffers when asked and the address allows it */
VAI void vst_nt(void *p, int64_t i, vf v, const int dt, int nt) {
  if (nt) {
    const uintptr_t a = (uintptr_t)((float *)p + i);
    if (dt == S_F32 && (a & 31) == 0) {
      _mm256_stream_ps((float *)p + i, v);
      return;
    }
    if (dt == S_F32 && (a & 15) == 0) { /* malloc's 16-byte alignment: two halves */
      _mm_stream_ps((float *)p + i, _mm256_castps256_ps128(v));
      _mm_stream_ps((float *)p + i + 4, _mm256_extractf128_ps(v, 1));
      return;
    }
    if (dt != S_F32 && (((uintptr_t)((uint16_t *)p + i)) & 15) == 0) {
      __m128i h = a8_narrow(v, dt);
      _mm_stream_si128((__m128i *)((uint16_t *)p + i), h);
      return;
    }
  }
  vst(p, i, v, dt);
}

/* values before the next boundary the streaming stores need (32 bytes for f32, 16 for 16-bit
   data) at p + i, at most n */
VAI int64_t vto_boundary(const void *p, int64_t i, int64_t n, const int dt) {
  const uintptr_t es = dt == S_F32 ? 4 : 2, al = dt == S_F32 ? 32 : 16;
  const uintptr_t a = (uintptr_t)p + (uintptr_t)i * es;
  int64_t k = (int64_t)(((al - (a & (al - 1))) & (al - 1)) / es);
  return k < n ? k : n;
}

/* per-channel constants: n (< VW: zeros after) or VW floats from k */
VAI vf vldk(const float *k, int n) {
  if (n == VW) return _mm256_loadu_ps(k);
  return _mm256_maskload_ps(k, _mm256_castps_si256(vmask_first(n)));
}
VAI vf vload_a(const float *p) { return _mm256_load_ps(p); }
VAI void vstore_a(float *p, vf v) { _mm256_store_ps(p, v); }
VAI vf vloadu(const float *p) { return _mm256_loadu_ps(p); }
VAI void vstoreu(float *p, vf v) { _mm256_storeu_ps(p, v); }

/* ---- reductions ---- */

/* the 32-lane sum of the accumulators a[0..3] (value i in lane i % 32) by halving:
   32 -> 16 -> 8 -> 4 -> 2 -> 1, the portable kernels' order */
VAI double vreduce32(const vf *a) {
  return a8_sum(_mm256_add_ps(_mm256_add_ps(a[0], a[2]), _mm256_add_ps(a[1], a[3])));
}
VAI float vhmin(vf v) { return a8_min(v); }
VAI float vhmax(vf v) { return a8_max(v); }

/* n (<= VW) lanes of v as doubles into o */
VAI void vstore_sums(double *o, vf v, int n) {
  double t[8];
  a8_store_pd(t, v);
  memcpy(o, t, (size_t)n * sizeof(double));
}

/* ---- integer-level pieces of the anchor and of exp ---- */

VAI vf vanchor(vf sum, vf mn, vf mx, vf inv) { return a8_anchor(sum, mn, mx, inv); }
VAI vf vpow2i(vf n) { return a8_pow2i(n); }
/* round to the nearest integer (even on ties) */
VAI vf vround(vf v) { return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }

#endif
