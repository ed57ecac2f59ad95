/* simd_avx2.h - the vector layer of ukernels_vec.inc for AVX2 + FMA + F16C: 8 f32 lanes.
 * Each ISA layer defines the same small set of operations (vf: a vector of VW floats, vm: a
 * lane mask); the kernels are written once against them.  Storage types: f32, f16 (widened by
 * F16C), bf16 (a 16-bit shift; rounded to nearest even on store with integer arithmetic).
 * Tails never read or write past the last value: masked f32 loads, staged 16-bit ones.
 */
#ifndef NORMA_SIMD_AVX2_H
#define NORMA_SIMD_AVX2_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define VW 8
#define VAI static inline __attribute__((always_inline))

enum { S_F32 = 0, S_F16 = 1, S_BF16 = 2 };

typedef __m256 vf;
typedef __m256 vm; /* all-ones lanes */

VAI vf vzero(void) { return _mm256_setzero_ps(); }
VAI vf vset1(float a) { return _mm256_set1_ps(a); }
VAI vf vadd(vf a, vf b) { return _mm256_add_ps(a, b); }
VAI vf vsub(vf a, vf b) { return _mm256_sub_ps(a, b); }
VAI vf vmul(vf a, vf b) { return _mm256_mul_ps(a, b); }
VAI vf vdiv(vf a, vf b) { return _mm256_div_ps(a, b); }
VAI vf vmin(vf a, vf b) { return _mm256_min_ps(a, b); }
VAI vf vmax(vf a, vf b) { return _mm256_max_ps(a, b); }
VAI vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); } /* a * b + c */
/* max(0, v), NaN passing through (max returns its second operand on NaN) */
VAI vf vmax0(vf v) { return _mm256_max_ps(_mm256_setzero_ps(), v); }

VAI vm vmask_first(int n) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx));
}
VAI vf vand_m(vf v, vm m) { return _mm256_and_ps(v, m); }
VAI vf vblend_m(vm m, vf a, vf b) { return _mm256_blendv_ps(a, b, m); } /* m ? b : a */
VAI vm vgt(vf a, vf b) { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }
/* g where y > 0, else 0 */
VAI vf vkeep_pos(vf g, vf y) { return _mm256_and_ps(g, _mm256_cmp_ps(y, _mm256_setzero_ps(), _CMP_GT_OQ)); }

/* ---- loads and stores by storage type (dt is a constant after inlining) ---- */

VAI vf vld(const void *p, int64_t i, const int dt) {
  if (dt == S_F32) return _mm256_loadu_ps((const float *)p + i);
  __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
  if (dt == S_F16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* the first n (0 < n < VW) values, zeros after; never reads past them */
VAI vf vld_part(const void *p, int64_t i, int n, const int dt) {
  if (dt == S_F32)
    return _mm256_maskload_ps((const float *)p + i, _mm256_castps_si256(vmask_first(n)));
  uint16_t t[8] = {0};
  memcpy(t, (const uint16_t *)p + i, (size_t)n * 2);
  return vld(t, 0, dt);
}

VAI __m128i v_to_bf16(vf v) {
  /* round to nearest even on the dropped 16 bits; NaN made quiet */
  __m256i u = _mm256_castps_si256(v);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
  __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  __m256i q = _mm256_or_si256(u, _mm256_set1_epi32(0x400000));
  r = _mm256_blendv_epi8(r, q, nan);
  r = _mm256_srli_epi32(r, 16);
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

VAI void vst(void *p, int64_t i, vf v, const int dt) {
  if (dt == S_F32) _mm256_storeu_ps((float *)p + i, v);
  else if (dt == S_F16)
    _mm_storeu_si128((__m128i *)((uint16_t *)p + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  else _mm_storeu_si128((__m128i *)((uint16_t *)p + i), v_to_bf16(v));
}

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
      __m128i h = dt == S_F16 ? _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT) : v_to_bf16(v);
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
  __m256 a0 = _mm256_add_ps(a[0], a[2]), a1 = _mm256_add_ps(a[1], a[3]);
  a0 = _mm256_add_ps(a0, a1);
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps(a0, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_movehdup_ps(h));
  return (double)_mm_cvtss_f32(h);
}
VAI float vhmin(vf v) {
  __m128 h = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_min_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_min_ss(h, _mm_movehdup_ps(h)));
}
VAI float vhmax(vf v) {
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
}

/* n (<= VW) lanes of v as doubles into o */
VAI void vstore_sums(double *o, vf v, int n) {
  double t[8];
  _mm256_storeu_pd(t, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
  _mm256_storeu_pd(t + 4, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
  memcpy(o, t, (size_t)n * sizeof(double));
}

/* ---- integer-level pieces of the anchor and of exp ---- */

/* bn_stats_anchor_f32 (ukernels.h) lane by lane, with the same arithmetic */
VAI vf vanchor(vf sum, vf mn, vf mx, vf inv) {
  const __m256 mean = _mm256_mul_ps(sum, inv), range = _mm256_sub_ps(mx, mn);
  const __m256i e = _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(range), 23),
                                     _mm256_set1_epi32(0xff));
  const __m256 q = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(5)), 23));
  const __m256 iq = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_sub_epi32(_mm256_set1_epi32(259), e), 23));
  const __m256 t = _mm256_mul_ps(mean, iq);
  const __m256 magic = _mm256_set1_ps(0x1.8p23f);
  const __m256 r = _mm256_mul_ps(_mm256_sub_ps(_mm256_add_ps(t, magic), magic), q);
  /* usable: range > 0, 6 < e < 255, |t| < 2^22 */
  __m256 ok = _mm256_cmp_ps(range, _mm256_setzero_ps(), _CMP_GT_OQ);
  ok = _mm256_and_ps(ok, _mm256_castsi256_ps(_mm256_cmpgt_epi32(e, _mm256_set1_epi32(6))));
  ok = _mm256_and_ps(ok, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(255), e)));
  ok = _mm256_and_ps(ok, _mm256_cmp_ps(t, _mm256_set1_ps(0x1p22f), _CMP_LT_OQ));
  ok = _mm256_and_ps(ok, _mm256_cmp_ps(t, _mm256_set1_ps(-0x1p22f), _CMP_GT_OQ));
  __m256 res = _mm256_blendv_ps(mean, r, ok);
  return _mm256_blendv_ps(res, mn, _mm256_cmp_ps(range, _mm256_setzero_ps(), _CMP_EQ_OQ));
}

/* 2^n for integral n in [-126, 127] (given as floats) */
VAI vf vpow2i(vf n) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n),
                                                                _mm256_set1_epi32(127)), 23));
}
/* round to the nearest integer (even on ties) */
VAI vf vround(vf v) { return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }

#endif
