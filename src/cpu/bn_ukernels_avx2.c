/* bn_ukernels_avx2.c - AVX2 + FMA + F16C micro-kernels for f32, f16 and bf16 storage (f32
 * arithmetic).  One idea: the tensor is read once per kernel in 32-byte vectors and every
 * 16-bit value is widened in registers (F16C for f16, a 16-bit shift for bf16), so a kernel
 * costs what its loads and stores cost.  The accumulation structure is the portable kernels'
 * (ukernels.h): run kernels keep value i in lane i % 32 (four 8-lane accumulators) and reduce
 * by halving; rows kernels accumulate each channel down its rows.  FMA rounds differently from
 * the portable multiply-add, so results match those kernels closely, not bitwise.
 * F64 has no AVX2 table here: it is not a bandwidth-bound use, the portable kernels serve it.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "ukernels.h"

#define AI static inline __attribute__((always_inline))

enum { S_F32 = 0, S_F16 = 1, S_BF16 = 2 };

/* ---- loads and stores, by storage type (dt is a compile-time constant after inlining) ---- */

AI __m256 ld8(const void *p, int64_t i, const int dt) {
  if (dt == S_F32) return _mm256_loadu_ps((const float *)p + i);
  __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
  if (dt == S_F16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* lanes < n set, as an integer mask */
AI __m256i lane_mask_i(int n) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx);
}

/* the first n (0 < n < 8) values, zeros after; never reads past them */
AI __m256 ld_part(const void *p, int64_t i, int n, const int dt) {
  if (dt == S_F32) return _mm256_maskload_ps((const float *)p + i, lane_mask_i(n));
  uint16_t t[8] = {0};
  memcpy(t, (const uint16_t *)p + i, (size_t)n * 2);
  return ld8(t, 0, dt);
}

AI __m128i to_bf16(__m256 v) {
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

AI void st8(void *p, int64_t i, __m256 v, const int dt) {
  if (dt == S_F32) _mm256_storeu_ps((float *)p + i, v);
  else if (dt == S_F16)
    _mm_storeu_si128((__m128i *)((uint16_t *)p + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  else _mm_storeu_si128((__m128i *)((uint16_t *)p + i), to_bf16(v));
}

AI void st_part(void *p, int64_t i, __m256 v, int n, const int dt) {
  if (dt == S_F32) {
    _mm256_maskstore_ps((float *)p + i, lane_mask_i(n), v);
    return;
  }
  uint16_t t[8];
  st8(t, 0, v, dt);
  memcpy((uint16_t *)p + i, t, (size_t)n * 2);
}

/* st8 through the write-combining buffers when asked and the address allows it */
AI void st8s(void *p, int64_t i, __m256 v, const int dt, int nt) {
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
      __m128i h = dt == S_F16 ? _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT) : to_bf16(v);
      _mm_stream_si128((__m128i *)((uint16_t *)p + i), h);
      return;
    }
  }
  st8(p, i, v, dt);
}

/* values before the next 32-byte (f32) or 16-byte (16-bit) boundary of p + i, at most n */
AI int64_t to_boundary(const void *p, int64_t i, int64_t n, const int dt) {
  const uintptr_t es = dt == S_F32 ? 4 : 2, al = dt == S_F32 ? 32 : 16;
  const uintptr_t a = (uintptr_t)p + (uintptr_t)i * es;
  int64_t k = (int64_t)(((al - (a & (al - 1))) & (al - 1)) / es);
  return k < n ? k : n;
}

/* lanes < n set */
AI __m256 lane_mask(int n) { return _mm256_castsi256_ps(lane_mask_i(n)); }

/* bn_stats_anchor_f32 (ukernels.h) on 8 lanes, with the same arithmetic */
AI __m256 anchor8(__m256 sum, __m256 mn, __m256 mx, __m256 inv) {
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

AI __m256 act8(__m256 v, const void *res, int64_t i, int n, int act, const int dt) {
  if (act == BN_ACT_ADD_RELU) v = _mm256_add_ps(v, n == 8 ? ld8(res, i, dt) : ld_part(res, i, n, dt));
  /* max(v, 0) with NaN passing through: max_ps returns its second operand on NaN */
  if (act != BN_ACT_NONE) v = _mm256_max_ps(_mm256_setzero_ps(), v);
  return v;
}

AI __m256 masked_dy(const void *y, const void *dy, int64_t i, int n, int act, const int dt) {
  __m256 g = n == 8 ? ld8(dy, i, dt) : ld_part(dy, i, n, dt);
  if (act != BN_ACT_NONE) {
    __m256 yv = n == 8 ? ld8(y, i, dt) : ld_part(y, i, n, dt);
    g = _mm256_and_ps(g, _mm256_cmp_ps(yv, _mm256_setzero_ps(), _CMP_GT_OQ));
  }
  return g;
}

/* the portable kernels' lane reduction: halve 32 -> 16 -> 8 -> 4 -> 2 -> 1 */
AI double reduce32(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  a0 = _mm256_add_ps(a0, a2);
  a1 = _mm256_add_ps(a1, a3);
  a0 = _mm256_add_ps(a0, a1);
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps(a0, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_movehdup_ps(h));
  return (double)_mm_cvtss_f32(h);
}

AI void store_sums8(double *o, __m256 v, int n) {
  double t[8];
  _mm256_storeu_pd(t, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
  _mm256_storeu_pd(t + 4, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
  memcpy(o, t, (size_t)n * sizeof(double));
}

AI __m256 ldk(const float *k, int n) {
  if (n == 8) return _mm256_loadu_ps(k);
  float t[8] = {0};
  memcpy(t, k, (size_t)n * 4);
  return _mm256_loadu_ps(t);
}

/* ---- statistics ---- */

/* pass 1 of a run: sum (value i in lane i % 32), min and max */
AI void sum_min_max_run(const void *x, int64_t len, float *sum, float *mn, float *mx, const int dt) {
  __m256 a[4], lo = _mm256_set1_ps(__builtin_inff()), hi = _mm256_set1_ps(-__builtin_inff());
  for (int j = 0; j < 4; j++) a[j] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= len; i += 32)
    for (int j = 0; j < 4; j++) {
      const __m256 v = ld8(x, i + 8 * j, dt);
      a[j] = _mm256_add_ps(a[j], v);
      lo = _mm256_min_ps(lo, v), hi = _mm256_max_ps(hi, v);
    }
  for (int j = 0; j < 4 && i + 8 * j < len; j++) {
    const int64_t n = len - (i + 8 * j);
    if (n >= 8) {
      const __m256 v = ld8(x, i + 8 * j, dt);
      a[j] = _mm256_add_ps(a[j], v);
      lo = _mm256_min_ps(lo, v), hi = _mm256_max_ps(hi, v);
    } else {
      const __m256 v = ld_part(x, i + 8 * j, (int)n, dt), m = lane_mask((int)n);
      a[j] = _mm256_add_ps(a[j], v);
      lo = _mm256_min_ps(lo, _mm256_blendv_ps(_mm256_set1_ps(__builtin_inff()), v, m));
      hi = _mm256_max_ps(hi, _mm256_blendv_ps(_mm256_set1_ps(-__builtin_inff()), v, m));
    }
  }
  *sum = (float)reduce32(a[0], a[1], a[2], a[3]);
  float l[8], h[8];
  _mm256_storeu_ps(l, lo), _mm256_storeu_ps(h, hi);
  *mn = l[0], *mx = h[0];
  for (int j = 1; j < 8; j++) *mn = l[j] < *mn ? l[j] : *mn, *mx = h[j] > *mx ? h[j] : *mx;
}

AI void stats_run(const void *x, int64_t len, const void *kv, double out[3], const int dt) {
  float sum, mn, mx;
  sum_min_max_run(x, len, &sum, &mn, &mx, dt);
  const float kbf = bn_stats_anchor_f32(sum, mn, mx, 1.0f / (float)len);
  const __m256 k = _mm256_set1_ps(kbf);
  __m256 a[4], q[4];
  for (int j = 0; j < 4; j++) a[j] = q[j] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= len; i += 32)
    for (int j = 0; j < 4; j++) {
      __m256 d = _mm256_sub_ps(ld8(x, i + 8 * j, dt), k);
      a[j] = _mm256_add_ps(a[j], d);
      q[j] = _mm256_fmadd_ps(d, d, q[j]);
    }
  for (int j = 0; j < 4 && i + 8 * j < len; j++) {
    const int64_t n = len - (i + 8 * j);
    __m256 d;
    if (n >= 8) d = _mm256_sub_ps(ld8(x, i + 8 * j, dt), k);
    else d = _mm256_and_ps(_mm256_sub_ps(ld_part(x, i + 8 * j, (int)n, dt), k), lane_mask((int)n));
    a[j] = _mm256_add_ps(a[j], d);
    q[j] = _mm256_fmadd_ps(d, d, q[j]);
  }
  bn_stats_shift((double)kbf, kv ? (double)*(const float *)kv : (double)kbf,
                 reduce32(a[0], a[1], a[2], a[3]),
                 reduce32(q[0], q[1], q[2], q[3]), (double)len, &out[0], &out[1]);
  out[2] = (double)kbf;
}

/* Rows kernels walk row by row, streaming through memory, with the accumulators of up to
   ROWS_CHUNK channels in an L1/L2-resident array; each channel still sums down its rows in
   order, as the portable kernels do. */
#define ROWS_CHUNK 1024

AI void stats_rows(const void *x, int64_t rows, int64_t ld, int64_t nc, const void *kv,
                   double *o1, double *o2, double *okb, const int dt) {
  const float *K = kv;
  /* one vector of slack: the tail group is padded to a whole vector */
  float k[ROWS_CHUNK + 8] __attribute__((aligned(32))), a[ROWS_CHUNK + 8] __attribute__((aligned(32))),
      q[ROWS_CHUNK + 8] __attribute__((aligned(32))), lo[ROWS_CHUNK + 8] __attribute__((aligned(32))),
      hi[ROWS_CHUNK + 8] __attribute__((aligned(32)));
  for (int64_t j0 = 0; j0 < nc; j0 += ROWS_CHUNK) {
    const int64_t jn = nc - j0 < ROWS_CHUNK ? nc - j0 : ROWS_CHUNK, full = jn / 8 * 8;
    const int tail = (int)(jn - full);
    const size_t bytes = sizeof(float) * (size_t)(full + 8);
    memset(k, 0, bytes), memset(a, 0, bytes), memset(q, 0, bytes);
    for (int64_t j = 0; j < full + 8; j += 8) {
      _mm256_store_ps(lo + j, _mm256_set1_ps(__builtin_inff()));
      _mm256_store_ps(hi + j, _mm256_set1_ps(-__builtin_inff()));
    }
    /* pass 1: sums, minima, maxima, for the anchors.  Rows go by fours with each vector of
       accumulators held in registers meanwhile (each channel still adds its rows in order). */
    for (int64_t r0 = 0; r0 < rows; r0 += 4) {
      const int nr = rows - r0 < 4 ? (int)(rows - r0) : 4;
      for (int64_t j = 0; j < full + (tail ? 8 : 0); j += 8) {
        const int n = j < full ? 8 : tail;
        __m256 sv = _mm256_load_ps(k + j), l = _mm256_load_ps(lo + j), h = _mm256_load_ps(hi + j);
        for (int rr = 0; rr < nr; rr++) {
          const int64_t e = (r0 + rr) * ld + j0 + j;
          const __m256 v = n == 8 ? ld8(x, e, dt) : ld_part(x, e, n, dt);
          sv = _mm256_add_ps(sv, v), l = _mm256_min_ps(l, v), h = _mm256_max_ps(h, v);
        }
        _mm256_store_ps(k + j, sv), _mm256_store_ps(lo + j, l), _mm256_store_ps(hi + j, h);
      }
    }
    const __m256 inv = _mm256_set1_ps(1.0f / (float)rows);
    for (int64_t j = 0; j < full + (tail ? 8 : 0); j += 8)
      _mm256_store_ps(k + j, anchor8(_mm256_load_ps(k + j), _mm256_load_ps(lo + j),
                                     _mm256_load_ps(hi + j), inv));
    /* pass 2, over the block while it is in cache: deviations from them */
    for (int64_t r0 = 0; r0 < rows; r0 += 4) {
      const int nr = rows - r0 < 4 ? (int)(rows - r0) : 4;
      for (int64_t j = 0; j < full + (tail ? 8 : 0); j += 8) {
        const int n = j < full ? 8 : tail;
        const __m256 kk = _mm256_load_ps(k + j), m = lane_mask(n);
        __m256 av = _mm256_load_ps(a + j), qv = _mm256_load_ps(q + j);
        for (int rr = 0; rr < nr; rr++) {
          const int64_t e = (r0 + rr) * ld + j0 + j;
          __m256 d = _mm256_sub_ps(n == 8 ? ld8(x, e, dt) : ld_part(x, e, n, dt), kk);
          if (n < 8) d = _mm256_and_ps(d, m);
          av = _mm256_add_ps(av, d);
          qv = _mm256_fmadd_ps(d, d, qv);
        }
        _mm256_store_ps(a + j, av), _mm256_store_ps(q + j, qv);
      }
    }
    for (int64_t j = 0; j < jn; j++) {
      bn_stats_shift((double)k[j], K ? (double)K[j0 + j] : (double)k[j], (double)a[j],
                     (double)q[j], (double)rows,
                     &o1[j0 + j], &o2[j0 + j]);
      if (okb) okb[j0 + j] = (double)k[j];
    }
  }
}

/* ---- forward apply ---- */

AI void fwd_run(const void *x, const void *res, void *y, int64_t len, const void *cv, int64_t cs,
                int act, const int dt) {
  const float *c = cv;
  const int nt = act & BN_STORE_NT;
  act &= BN_ACT_MASK;
  const __m256 mhi = _mm256_set1_ps(c[C_MHI * cs]), sc = _mm256_set1_ps(c[C_SCALE * cs]),
               sh = _mm256_set1_ps(c[C_SHIFT * cs]);
  int64_t i = 0;
  if (nt) { /* a partial vector up to the alignment the streaming stores need */
    const int n0 = (int)to_boundary(y, 0, len, dt);
    if (n0 > 0) {
      __m256 v = _mm256_fmadd_ps(_mm256_sub_ps(ld_part(x, 0, n0, dt), mhi), sc, sh);
      st_part(y, 0, act8(v, res, 0, n0, act, dt), n0, dt);
      i = n0;
    }
  }
  for (; i + 8 <= len; i += 8)
    st8s(y, i, act8(_mm256_fmadd_ps(_mm256_sub_ps(ld8(x, i, dt), mhi), sc, sh), res, i, 8, act, dt), dt, nt);
  if (i < len) {
    const int n = (int)(len - i);
    __m256 v = _mm256_fmadd_ps(_mm256_sub_ps(ld_part(x, i, n, dt), mhi), sc, sh);
    st_part(y, i, act8(v, res, i, n, act, dt), n, dt);
  }
}

AI void fwd_rows(const void *x, const void *res, void *y, int64_t rows, int64_t ld, int64_t nc,
                 const void *cv, int64_t cs, int act, const int dt) {
  const float *mhi = (const float *)cv + C_MHI * cs, *sc = (const float *)cv + C_SCALE * cs,
              *sh = (const float *)cv + C_SHIFT * cs;
  const int nt = act & BN_STORE_NT;
  act &= BN_ACT_MASK;
  const size_t es = dt == S_F32 ? 4 : 2;
  const int64_t full = nc / 8 * 8;
  const int tail = (int)(nc - full);
  /* row by row, in memory order (streaming stores fill whole lines); the constants come from
     L1.  Each row gets its own base pointers so the loop keeps its state in registers. */
  for (int64_t r = 0; r < rows; r++) {
    const char *xr = (const char *)x + (size_t)(r * ld) * es;
    const char *rr = res ? (const char *)res + (size_t)(r * ld) * es : NULL;
    char *yr = (char *)y + (size_t)(r * ld) * es;
    for (int64_t j = 0; j < full; j += 8) {
      __m256 v = _mm256_fmadd_ps(_mm256_sub_ps(ld8(xr, j, dt), _mm256_loadu_ps(mhi + j)),
                                 _mm256_loadu_ps(sc + j), _mm256_loadu_ps(sh + j));
      st8s(yr, j, act8(v, rr, j, 8, act, dt), dt, nt);
    }
    if (tail) {
      __m256 v = _mm256_fmadd_ps(_mm256_sub_ps(ld_part(xr, full, tail, dt), ldk(mhi + full, tail)),
                                 ldk(sc + full, tail), ldk(sh + full, tail));
      st_part(yr, full, act8(v, rr, full, tail, act, dt), tail, dt);
    }
  }
}

/* ---- backward ---- */

AI void bwd_sums_run(const void *v, const void *y, const void *dy, int64_t len, const void *cv,
                     int64_t cs, int act, double out[3], const int dt) {
  const float *c = cv;
  act &= BN_ACT_MASK;
  const __m256 a = _mm256_set1_ps(c[C_A * cs]), b = _mm256_set1_ps(c[C_B * cs]),
               cc = _mm256_set1_ps(c[C_C * cs]);
  __m256 s1[4], s2[4], s3[4];
  for (int j = 0; j < 4; j++) s1[j] = s2[j] = s3[j] = _mm256_setzero_ps();
  for (int64_t i = 0; i < len; i += 32)
    for (int j = 0; j < 4 && i + 8 * j < len; j++) {
      const int64_t e = i + 8 * j, rem = len - e;
      const int n = rem >= 8 ? 8 : (int)rem;
      __m256 g = masked_dy(y, dy, e, n, act, dt);
      __m256 xv = n == 8 ? ld8(v, e, dt) : ld_part(v, e, n, dt);
      __m256 xh = _mm256_fmadd_ps(_mm256_sub_ps(xv, a), b, cc);
      if (n < 8) xh = _mm256_and_ps(xh, lane_mask(n)); /* g is 0 there already */
      s1[j] = _mm256_add_ps(s1[j], g);
      s2[j] = _mm256_fmadd_ps(g, xh, s2[j]);
      s3[j] = _mm256_add_ps(s3[j], xh);
    }
  out[0] = reduce32(s1[0], s1[1], s1[2], s1[3]);
  out[1] = reduce32(s2[0], s2[1], s2[2], s2[3]);
  out[2] = reduce32(s3[0], s3[1], s3[2], s3[3]);
}

AI void bwd_sums_rows(const void *v, const void *y, const void *dy, int64_t rows, int64_t ld,
                      int64_t nc, const void *cv, int64_t cs, int act, double *o1, double *o2,
                      double *o3, const int dt) {
  const float *c = cv;
  act &= BN_ACT_MASK;
  float s1[ROWS_CHUNK + 8] __attribute__((aligned(32))), s2[ROWS_CHUNK + 8] __attribute__((aligned(32))),
      s3[ROWS_CHUNK + 8] __attribute__((aligned(32)));
  for (int64_t j0 = 0; j0 < nc; j0 += ROWS_CHUNK) {
    const int64_t jn = nc - j0 < ROWS_CHUNK ? nc - j0 : ROWS_CHUNK;
    memset(s1, 0, sizeof(float) * (size_t)((jn + 7) / 8 * 8));
    memset(s2, 0, sizeof(float) * (size_t)((jn + 7) / 8 * 8));
    memset(s3, 0, sizeof(float) * (size_t)((jn + 7) / 8 * 8));
    for (int64_t r0 = 0; r0 < rows; r0 += 4) {
      const int nr = rows - r0 < 4 ? (int)(rows - r0) : 4;
      for (int64_t j = 0; j < jn; j += 8) {
        const int n = (int)(jn - j < 8 ? jn - j : 8);
        const int64_t ch = j0 + j;
        const __m256 a = ldk(c + C_A * cs + ch, n), b = ldk(c + C_B * cs + ch, n),
                     cc = ldk(c + C_C * cs + ch, n);
        __m256 v1 = _mm256_load_ps(s1 + j), v2 = _mm256_load_ps(s2 + j), v3 = _mm256_load_ps(s3 + j);
        for (int rr = 0; rr < nr; rr++) { /* rows by fours, sums in registers meanwhile */
          const int64_t e = (r0 + rr) * ld + ch;
          __m256 gv = masked_dy(y, dy, e, n, act, dt);
          __m256 xv = n == 8 ? ld8(v, e, dt) : ld_part(v, e, n, dt);
          __m256 xh = _mm256_fmadd_ps(_mm256_sub_ps(xv, a), b, cc);
          if (n < 8) xh = _mm256_and_ps(xh, lane_mask(n));
          v1 = _mm256_add_ps(v1, gv);
          v2 = _mm256_fmadd_ps(gv, xh, v2);
          v3 = _mm256_add_ps(v3, xh);
        }
        _mm256_store_ps(s1 + j, v1), _mm256_store_ps(s2 + j, v2), _mm256_store_ps(s3 + j, v3);
      }
    }
    for (int64_t j = 0; j < jn; j++) o1[j0 + j] = s1[j], o2[j0 + j] = s2[j], o3[j0 + j] = s3[j];
  }
}

AI __m256 dx8(__m256 g, __m256 xv, __m256 a, __m256 b, __m256 cc, __m256 gm, __m256 da,
              __m256 db, __m256 dd) {
  __m256 xh = _mm256_fmadd_ps(_mm256_sub_ps(xv, a), b, cc);
  return _mm256_fmadd_ps(da, _mm256_sub_ps(g, gm), _mm256_fmadd_ps(db, xh, dd));
}

AI void bwd_run(const void *v, const void *y, const void *dy, void *dx, void *dres, int64_t len,
                const void *cv, int64_t cs, int act, const int dt) {
  const float *c = cv;
  const int nt = act & BN_STORE_NT;
  act &= BN_ACT_MASK;
  const __m256 a = _mm256_set1_ps(c[C_A * cs]), b = _mm256_set1_ps(c[C_B * cs]),
               cc = _mm256_set1_ps(c[C_C * cs]), gm = _mm256_set1_ps(c[C_GM * cs]),
               da = _mm256_set1_ps(c[C_DA * cs]), db = _mm256_set1_ps(c[C_DB * cs]),
               dd = _mm256_set1_ps(c[C_DD * cs]);
  int64_t i = 0;
  const int64_t n0 = nt ? to_boundary(dx, 0, len, dt) : 0;
  while (i < len) {
    const int64_t left = i < n0 ? n0 - i : len - i;
    const int n = left >= 8 ? 8 : (int)left;
    __m256 g = masked_dy(y, dy, i, n, act, dt);
    __m256 xv = n == 8 ? ld8(v, i, dt) : ld_part(v, i, n, dt);
    __m256 o = dx8(g, xv, a, b, cc, gm, da, db, dd);
    if (n == 8) {
      if (dres) st8s(dres, i, g, dt, nt);
      st8s(dx, i, o, dt, nt);
    } else {
      if (dres) st_part(dres, i, g, n, dt);
      st_part(dx, i, o, n, dt);
    }
    i += n;
  }
}

AI void bwd_rows(const void *v, const void *y, const void *dy, void *dx, void *dres, int64_t rows,
                 int64_t ld, int64_t nc, const void *cv, int64_t cs, int act, const int dt) {
  const float *c = cv;
  const float *ca = c + C_A * cs, *cb = c + C_B * cs, *cc = c + C_C * cs, *cg = c + C_GM * cs,
              *cda = c + C_DA * cs, *cdb = c + C_DB * cs, *cdd = c + C_DD * cs;
  const int nt = act & BN_STORE_NT;
  act &= BN_ACT_MASK;
  const size_t es = dt == S_F32 ? 4 : 2;
  /* row by row, as fwd_rows: per-row base pointers, constants from L1 */
  for (int64_t r = 0; r < rows; r++) {
    const size_t off = (size_t)(r * ld) * es;
    const char *vr = (const char *)v + off, *dyr = (const char *)dy + off;
    const char *yr = y ? (const char *)y + off : NULL;
    char *dxr = (char *)dx + off, *drr = dres ? (char *)dres + off : NULL;
    for (int64_t j = 0; j < nc; j += 8) {
      const int n = (int)(nc - j < 8 ? nc - j : 8);
      __m256 g = masked_dy(yr, dyr, j, n, act, dt);
      __m256 xv = n == 8 ? ld8(vr, j, dt) : ld_part(vr, j, n, dt);
      __m256 o = dx8(g, xv, ldk(ca + j, n), ldk(cb + j, n), ldk(cc + j, n), ldk(cg + j, n),
                     ldk(cda + j, n), ldk(cdb + j, n), ldk(cdd + j, n));
      if (n == 8) {
        if (drr) st8s(drr, j, g, dt, nt);
        st8s(dxr, j, o, dt, nt);
      } else {
        if (drr) st_part(drr, j, g, n, dt);
        st_part(dxr, j, o, n, dt);
      }
    }
  }
}

/* ---- instances ---- */

/* The wrappers specialize each kernel for its activation (a constant after inlining), so the
   inner loops carry no activation branches. */
#define BY_ACT(call)                                                   \
  switch (act & BN_ACT_MASK) {                                         \
    case BN_ACT_RELU: { const int a_ = BN_ACT_RELU | (act & BN_STORE_NT); call; break; }   \
    case BN_ACT_ADD_RELU: { const int a_ = BN_ACT_ADD_RELU | (act & BN_STORE_NT); call; break; } \
    default: { const int a_ = BN_ACT_NONE | (act & BN_STORE_NT); call; break; }          \
  }

#define INSTANCE(sfx, DT, NT_)                                                                       \
  static void stats_run_##sfx(const void *x, int64_t len, const void *k, double out[3]) {       \
    stats_run(x, len, k, out, DT);                                                              \
  }                                                                                             \
  static void stats_rows_##sfx(const void *x, int64_t rows, int64_t ld, int64_t nc,             \
                               const void *k, double *o1, double *o2, double *okb) {            \
    stats_rows(x, rows, ld, nc, k, o1, o2, okb, DT);                                            \
  }                                                                                             \
  static void fwd_run_##sfx(const void *x, const void *res, void *y, int64_t len,               \
                            const void *cst, int64_t cs, int act) {                             \
    if ((act & BN_ACT_MASK) == BN_ACT_SILU) { /* the portable kernel */             \
      bn_ukernels_scalar(NT_)->fwd_run(x, res, y, len, cst, cs, act);                                           \
      return;                                                                    \
    }                                                                            \
    BY_ACT(fwd_run(x, res, y, len, cst, cs, a_, DT))                                            \
  }                                                                                             \
  static void fwd_rows_##sfx(const void *x, const void *res, void *y, int64_t rows, int64_t ld, \
                             int64_t nc, const void *cst, int64_t cs, int act) {                \
    if ((act & BN_ACT_MASK) == BN_ACT_SILU) { /* the portable kernel */             \
      bn_ukernels_scalar(NT_)->fwd_rows(x, res, y, rows, ld, nc, cst, cs, act);                                           \
      return;                                                                    \
    }                                                                            \
    BY_ACT(fwd_rows(x, res, y, rows, ld, nc, cst, cs, a_, DT))                                  \
  }                                                                                             \
  static void bwd_sums_run_##sfx(const void *v, const void *y, const void *dy, int64_t len,     \
                                 const void *cst, int64_t cs, int act, double out[3]) {         \
    if ((act & BN_ACT_MASK) == BN_ACT_SILU) { /* the portable kernel */             \
      bn_ukernels_scalar(NT_)->bwd_sums_run(v, y, dy, len, cst, cs, act, out);                                           \
      return;                                                                    \
    }                                                                            \
    BY_ACT(bwd_sums_run(v, y, dy, len, cst, cs, a_, out, DT))                                   \
  }                                                                                             \
  static void bwd_sums_rows_##sfx(const void *v, const void *y, const void *dy, int64_t rows,   \
                                  int64_t ld, int64_t nc, const void *cst, int64_t cs, int act, \
                                  double *o1, double *o2, double *o3) {                         \
    if ((act & BN_ACT_MASK) == BN_ACT_SILU) { /* the portable kernel */             \
      bn_ukernels_scalar(NT_)->bwd_sums_rows(v, y, dy, rows, ld, nc, cst, cs, act, o1, o2, o3);                                           \
      return;                                                                    \
    }                                                                            \
    BY_ACT(bwd_sums_rows(v, y, dy, rows, ld, nc, cst, cs, a_, o1, o2, o3, DT))                  \
  }                                                                                             \
  static void bwd_run_##sfx(const void *v, const void *y, const void *dy, void *dx, void *dres, \
                            int64_t len, const void *cst, int64_t cs, int act) {                \
    if ((act & BN_ACT_MASK) == BN_ACT_SILU) { /* the portable kernel */             \
      bn_ukernels_scalar(NT_)->bwd_run(v, y, dy, dx, dres, len, cst, cs, act);                                           \
      return;                                                                    \
    }                                                                            \
    BY_ACT(bwd_run(v, y, dy, dx, dres, len, cst, cs, a_, DT))                                   \
  }                                                                                             \
  static void bwd_rows_##sfx(const void *v, const void *y, const void *dy, void *dx,            \
                             void *dres, int64_t rows, int64_t ld, int64_t nc, const void *cst, \
                             int64_t cs, int act) {                                             \
    if ((act & BN_ACT_MASK) == BN_ACT_SILU) { /* the portable kernel */             \
      bn_ukernels_scalar(NT_)->bwd_rows(v, y, dy, dx, dres, rows, ld, nc, cst, cs, act);                                           \
      return;                                                                    \
    }                                                                            \
    BY_ACT(bwd_rows(v, y, dy, dx, dres, rows, ld, nc, cst, cs, a_, DT))                         \
  }                                                                                             \
  static const bn_ukernels table_##sfx = {stats_run_##sfx,    stats_rows_##sfx,    fwd_run_##sfx, \
                                          fwd_rows_##sfx,     bwd_sums_run_##sfx,                \
                                          bwd_sums_rows_##sfx, bwd_run_##sfx,      bwd_rows_##sfx};

INSTANCE(f32, S_F32, NORMA_F32)
INSTANCE(f16, S_F16, NORMA_F16)
INSTANCE(bf16, S_BF16, NORMA_BF16)

const bn_ukernels *bn_ukernels_avx2(norma_dtype t) {
  switch (t) {
    case NORMA_F32: return &table_f32;
    case NORMA_F16: return &table_f16;
    case NORMA_BF16: return &table_bf16;
    case NORMA_F64: return NULL;
  }
  return NULL;
}
