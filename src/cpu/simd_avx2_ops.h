/* simd_avx2_ops.h - the 8-lane AVX2 building blocks that simd_avx2.h (8 lanes) and
 * simd_emu16.h (16 lanes from two 8-lane halves) share: loads and stores by storage type,
 * bf16 rounding, the statistics anchor, 2^n, and the last steps of the lane reduction. */
#ifndef NORMA_SIMD_AVX2_OPS_H
#define NORMA_SIMD_AVX2_OPS_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define A8I static inline __attribute__((always_inline))

enum { S_F32 = 0, S_F16 = 1, S_BF16 = 2 };

/* lanes < n set */
A8I __m256 a8_first(int n) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx));
}

A8I __m256 a8_ld(const void *p, int64_t i, const int dt) {
  if (dt == S_F32) return _mm256_loadu_ps((const float *)p + i);
  __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
  if (dt == S_F16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* round to nearest even on the dropped 16 bits; NaN made quiet */
A8I __m128i a8_to_bf16(__m256 v) {
  __m256i u = _mm256_castps_si256(v);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
  __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  __m256i q = _mm256_or_si256(u, _mm256_set1_epi32(0x400000));
  r = _mm256_blendv_epi8(r, q, nan);
  r = _mm256_srli_epi32(r, 16);
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

A8I __m128i a8_narrow(__m256 v, const int dt) {
  return dt == S_F16 ? _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT) : a8_to_bf16(v);
}

A8I void a8_st(void *p, int64_t i, __m256 v, const int dt) {
  if (dt == S_F32) _mm256_storeu_ps((float *)p + i, v);
  else _mm_storeu_si128((__m128i *)((uint16_t *)p + i), a8_narrow(v, dt));
}

/* bn_stats_anchor_f32 (ukernels.h) lane by lane, with the same arithmetic */
A8I __m256 a8_anchor(__m256 sum, __m256 mn, __m256 mx, __m256 inv) {
  const __m256 mean = _mm256_mul_ps(sum, inv), range = _mm256_sub_ps(mx, mn);
  const __m256i e = _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(range), 23),
                                     _mm256_set1_epi32(0xff));
  const __m256 q =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(5)), 23));
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
A8I __m256 a8_pow2i(__m256 n) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n),
                                                                _mm256_set1_epi32(127)), 23));
}

/* the last steps of the lane reduction: 8 -> 4 -> 2 -> 1 */
A8I double a8_sum(__m256 a) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_movehdup_ps(h));
  return (double)_mm_cvtss_f32(h);
}
A8I float a8_min(__m256 a) {
  __m128 h = _mm_min_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  h = _mm_min_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_min_ss(h, _mm_movehdup_ps(h)));
}
A8I float a8_max(__m256 a) {
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
}

/* 8 lanes as doubles into t[0..7] */
A8I void a8_store_pd(double *t, __m256 v) {
  _mm256_storeu_pd(t, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
  _mm256_storeu_pd(t + 4, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
}

#endif
