/* simd_avx512.h - the vector layer of ukernels_vec.inc for AVX-512 (F, BW, VL, DQ): 16 f32
 * lanes, opmask tails (masked loads and stores never touch memory outside the mask).
 * f16 is widened with vcvtph2ps (AVX512F); bf16 with a 16-bit shift, and rounded to nearest
 * even on store with integer arithmetic, or, compiled for AVX512-BF16 (NORMA_SIMD_AVX512BF16),
 * with vcvtneps2bf16 where no lane is subnormal (that instruction treats subnormal inputs as
 * zero, which would change results against the portable definition, convert.h, and
 * PyTorch's).  The operations match simd_avx2.h lane for lane, so the kernels give the same
 * bits on both.
 */
#ifndef NORMA_SIMD_AVX512_H
#define NORMA_SIMD_AVX512_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define VW 16
#define VAI static inline __attribute__((always_inline))

enum { S_F32 = 0, S_F16 = 1, S_BF16 = 2 };

typedef __m512 vf;
typedef __mmask16 vm;

VAI vf vzero(void) { return _mm512_setzero_ps(); }
VAI vf vset1(float a) { return _mm512_set1_ps(a); }
VAI vf vadd(vf a, vf b) { return _mm512_add_ps(a, b); }
VAI vf vsub(vf a, vf b) { return _mm512_sub_ps(a, b); }
VAI vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
VAI vf vdiv(vf a, vf b) { return _mm512_div_ps(a, b); }
VAI vf vmin(vf a, vf b) { return _mm512_min_ps(a, b); }
VAI vf vmax(vf a, vf b) { return _mm512_max_ps(a, b); }
VAI vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
VAI vf vor_bits(vf a, vf b) { /* the bitwise OR of the lanes' patterns */
  return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(a), _mm512_castps_si512(b)));
}
VAI vf vmax0(vf v) { return _mm512_max_ps(_mm512_setzero_ps(), v); } /* NaN passes */

VAI vm vmask_first(int n) { return (vm)(n >= 16 ? 0xffffu : ((1u << n) - 1u)); }
VAI vf vand_m(vf v, vm m) { return _mm512_maskz_mov_ps(m, v); }
VAI vf vblend_m(vm m, vf a, vf b) { return _mm512_mask_blend_ps(m, a, b); } /* m ? b : a */
VAI vm vgt(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
VAI vf vkeep_pos(vf g, vf y) {
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(y, _mm512_setzero_ps(), _CMP_GT_OQ), g);
}

/* ---- loads and stores by storage type ---- */

VAI vf v_widen(__m256i h, const int dt) {
  if (dt == S_F16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

VAI vf vld(const void *p, int64_t i, const int dt) {
  if (dt == S_F32) return _mm512_loadu_ps((const float *)p + i);
  return v_widen(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i)), dt);
}

VAI vf vld_part(const void *p, int64_t i, int n, const int dt) {
  if (dt == S_F32) return _mm512_maskz_loadu_ps(vmask_first(n), (const float *)p + i);
  return v_widen(_mm256_maskz_loadu_epi16(vmask_first(n), (const uint16_t *)p + i), dt);
}

VAI __m256i v_to_bf16_int(vf v) {
  __m512i u = _mm512_castps_si512(v);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(u, _mm512_set1_epi32(0x400000)));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}

#ifdef NORMA_SIMD_AVX512BF16
/* With AVX512-BF16 (ukernels_avx512bf16.c): vcvtneps2bf16 rounds to nearest even and quiets
   NaNs exactly as the integer rounding above does, in one instruction instead of eight, but
   treats subnormal inputs as zero.  A vector holding a subnormal (vfpclassps, class 0x20:
   rare, a predicted branch) takes the integer rounding, so the bits are the same on every
   path (tests/c/test_bf16_round.c checks all 2^32 inputs). */
VAI __m256i v_to_bf16(vf v) {
  if (__builtin_expect(_mm512_fpclass_ps_mask(v, 0x20) != 0, 0)) return v_to_bf16_int(v);
  return (__m256i)_mm512_cvtneps_pbh(v);
}
#else
VAI __m256i v_to_bf16(vf v) { return v_to_bf16_int(v); }
#endif

VAI __m256i v_narrow(vf v, const int dt) {
  return dt == S_F16 ? _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT) : v_to_bf16(v);
}

VAI void vst(void *p, int64_t i, vf v, const int dt) {
  if (dt == S_F32) _mm512_storeu_ps((float *)p + i, v);
  else _mm256_storeu_si256((__m256i *)((uint16_t *)p + i), v_narrow(v, dt));
}

VAI void vst_part(void *p, int64_t i, vf v, int n, const int dt) {
  if (dt == S_F32) _mm512_mask_storeu_ps((float *)p + i, vmask_first(n), v);
  else _mm256_mask_storeu_epi16((uint16_t *)p + i, vmask_first(n), v_narrow(v, dt));
}

VAI void vst_nt(void *p, int64_t i, vf v, const int dt, int nt) {
  if (nt) {
    if (dt == S_F32) {
      float *q = (float *)p + i;
      const uintptr_t a = (uintptr_t)q;
      if ((a & 63) == 0) {
        _mm512_stream_ps(q, v);
        return;
      }
      if ((a & 31) == 0) {
        _mm256_stream_ps(q, _mm512_castps512_ps256(v));
        _mm256_stream_ps(q + 8, _mm512_extractf32x8_ps(v, 1));
        return;
      }
      if ((a & 15) == 0) { /* malloc's 16-byte alignment */
        _mm_stream_ps(q, _mm512_castps512_ps128(v));
        _mm_stream_ps(q + 4, _mm512_extractf32x4_ps(v, 1));
        _mm_stream_ps(q + 8, _mm512_extractf32x4_ps(v, 2));
        _mm_stream_ps(q + 12, _mm512_extractf32x4_ps(v, 3));
        return;
      }
    } else {
      uint16_t *q = (uint16_t *)p + i;
      const uintptr_t a = (uintptr_t)q;
      if ((a & 31) == 0) {
        _mm256_stream_si256((__m256i *)q, v_narrow(v, dt));
        return;
      }
      if ((a & 15) == 0) {
        const __m256i h = v_narrow(v, dt);
        _mm_stream_si128((__m128i *)q, _mm256_castsi256_si128(h));
        _mm_stream_si128((__m128i *)(q + 8), _mm256_extracti128_si256(h, 1));
        return;
      }
    }
  }
  vst(p, i, v, dt);
}

/* values before the next 64-byte (f32) or 32-byte (16-bit) boundary of p + i, at most n */
VAI int64_t vto_boundary(const void *p, int64_t i, int64_t n, const int dt) {
  const uintptr_t es = dt == S_F32 ? 4 : 2, al = dt == S_F32 ? 64 : 32;
  const uintptr_t a = (uintptr_t)p + (uintptr_t)i * es;
  int64_t k = (int64_t)(((al - (a & (al - 1))) & (al - 1)) / es);
  return k < n ? k : n;
}

/* Per-channel constants read along a row from whole 64-byte blocks, each vector put together
   from two of them by a permute (the row's streaming-store path in ukernels_vec.inc): where a
   row's vectors start off the blocks, plain loads of the constants straddle two lines each,
   and the streaming loop ran up to twice as long.  Lanes of a block outside the n constants
   are not read (masked loads). */
#define HAVE_VROT 1
typedef struct {
  const float *b; /* the block holding the first constant */
  __m512i idx;    /* lanes p .. p + 15 of two blocks */
  int64_t lim;    /* the constants end at b + lim */
  vf cur;
} vrot;
VAI vf vld_lanes(const float *p, int64_t lo, int64_t hi) {
  if (lo <= 0 && hi >= 16) return _mm512_load_ps(p);
  if (hi <= lo) return _mm512_setzero_ps();
  const unsigned m = (hi >= 16 ? 0xffffu : (1u << hi) - 1u) & ~((1u << lo) - 1u);
  return _mm512_maskz_load_ps((__mmask16)m, p);
}
VAI vrot vrot_start(const float *k, int64_t n) {
  const int p = (int)(((uintptr_t)k % 64) / 4);
  vrot r;
  r.b = k - p, r.lim = n + p;
  r.idx = _mm512_add_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                           _mm512_set1_epi32(p));
  r.cur = vld_lanes(r.b, p, r.lim);
  return r;
}
/* the constants of the vector o values past the first (o a multiple of 16, in order) */
VAI vf vrot_next(vrot *r, int64_t o) {
  const vf nx = vld_lanes(r->b + o + 16, 0, r->lim - o - 16);
  const vf v = _mm512_permutex2var_ps(r->cur, r->idx, nx);
  r->cur = nx;
  return v;
}
/* as vrot_next, where the next block is known to lie whole within the constants */
VAI vf vrot_next_whole(vrot *r, int64_t o) {
  const vf nx = _mm512_load_ps(r->b + o + 16);
  const vf v = _mm512_permutex2var_ps(r->cur, r->idx, nx);
  r->cur = nx;
  return v;
}
/* constants across the end of a row and the start of the next: lanes 0 .. t - 1 hold
   k[n - t .. n), lanes t .. 15 hold k[0 .. 16 - t) (0 < t < 16) */
#define HAVE_VWRAP 1
VAI vf vld_wrap(const float *k, int64_t n, int t) {
  const __mmask16 lo = vmask_first(t);
  return _mm512_mask_expandloadu_ps(_mm512_maskz_loadu_ps(lo, k + n - t), (__mmask16)~lo, k);
}
/* a store to p + i, known to be on its alignment (64 bytes for f32, 32 for 16-bit values:
   vto_boundary): streaming when nt, else vst's */
VAI void vst_al(void *p, int64_t i, vf v, const int dt, const int nt) {
  if (!nt) vst(p, i, v, dt);
  else if (dt == S_F32) _mm512_stream_ps((float *)p + i, v);
  else _mm256_stream_si256((__m256i *)((uint16_t *)p + i), v_narrow(v, dt));
}
/* whether constants at a, b, c take the blocks: one of them off a block, all on floats */
VAI int vrot_use(const float *a, const float *b, const float *c) {
  const uintptr_t x = (uintptr_t)a, y = (uintptr_t)b, z = (uintptr_t)c;
  return ((x | y | z) % 64 != 0) && (x | y | z) % 4 == 0;
}

VAI vf vldk(const float *k, int n) {
  if (n == VW) return _mm512_loadu_ps(k);
  return _mm512_maskz_loadu_ps(vmask_first(n), k);
}
VAI vf vload_a(const float *p) { return _mm512_load_ps(p); }
VAI void vstore_a(float *p, vf v) { _mm512_store_ps(p, v); }
VAI vf vloadu(const float *p) { return _mm512_loadu_ps(p); }
VAI void vstoreu(float *p, vf v) { _mm512_storeu_ps(p, v); }

/* ---- reductions: the order of simd_avx2.h (32 -> 16 -> 8 -> 4 -> 2 -> 1) ---- */

VAI double vreduce32(const vf *a) {
  const __m512 s = _mm512_add_ps(a[0], a[1]); /* lane k: x_k + x_{k+16} */
  const __m256 a0 = _mm256_add_ps(_mm512_castps512_ps256(s), _mm512_extractf32x8_ps(s, 1));
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps(a0, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_movehdup_ps(h));
  return (double)_mm_cvtss_f32(h);
}
/* min / max: the halves, then 8 -> 4 -> 2 -> 1, each step's first operand the lower lanes (as
   simd_emu16.h; spelled out because min and max return their second operand on a NaN or on
   zeros of either sign, so the tree is part of the result: k_stats_chans repeats it across
   vectors) */
VAI float vhmin(vf v) {
  const __m256 m = _mm256_min_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 h = _mm_min_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_min_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_min_ss(h, _mm_movehdup_ps(h)));
}
VAI float vhmax(vf v) {
  const __m256 m = _mm256_max_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
}

VAI void vstore_sums(double *o, vf v, int n) {
  double t[16];
  _mm512_storeu_pd(t, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
  _mm512_storeu_pd(t + 8, _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1)));
  memcpy(o, t, (size_t)n * sizeof(double));
}

/* ---- the anchor and exp's pieces, as simd_avx2.h ---- */

VAI vf vanchor(vf sum, vf mn, vf mx, vf inv) {
  const __m512 mean = _mm512_mul_ps(sum, inv), range = _mm512_sub_ps(mx, mn);
  const __m512i e = _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(range), 23),
                                     _mm512_set1_epi32(0xff));
  const __m512 q =
      _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(5)), 23));
  const __m512 iq = _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_sub_epi32(_mm512_set1_epi32(259), e), 23));
  const __m512 t = _mm512_mul_ps(mean, iq);
  const __m512 magic = _mm512_set1_ps(0x1.8p23f);
  const __m512 r = _mm512_mul_ps(_mm512_sub_ps(_mm512_add_ps(t, magic), magic), q);
  __mmask16 ok = _mm512_cmp_ps_mask(range, _mm512_setzero_ps(), _CMP_GT_OQ);
  ok &= _mm512_cmpgt_epi32_mask(e, _mm512_set1_epi32(6));
  ok &= _mm512_cmpgt_epi32_mask(_mm512_set1_epi32(255), e);
  ok &= _mm512_cmp_ps_mask(t, _mm512_set1_ps(0x1p22f), _CMP_LT_OQ);
  ok &= _mm512_cmp_ps_mask(t, _mm512_set1_ps(-0x1p22f), _CMP_GT_OQ);
  const __m512 res = _mm512_mask_blend_ps(ok, mean, r);
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(range, _mm512_setzero_ps(), _CMP_EQ_OQ), res, mn);
}

/* bn_stats_scale_f32 (ukernels.h) lane by lane */
VAI vf vscale_pow2(vf range) {
  const __m512i e = _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(range), 23),
                                     _mm512_set1_epi32(0xff));
  __m512i b = _mm512_sub_epi32(_mm512_set1_epi32(254), e);
  b = _mm512_min_epi32(_mm512_max_epi32(b, _mm512_set1_epi32(1)), _mm512_set1_epi32(254));
  const __m512 sc = _mm512_castsi512_ps(_mm512_slli_epi32(b, 23));
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(range, _mm512_setzero_ps(), _CMP_GT_OQ),
                              _mm512_set1_ps(1.0f), sc);
}

/* ---- a 16 x 16 transpose: r[c] lane k -> r[k] lane c ---- */

#define VEC_TRANSPOSE 1
/* one step: the off-diagonal d x d blocks of each 2d x 2d block swap places (rows c and c + d
   exchange the lanes whose bit d differs); four steps, d = 8, 4, 2, 1, transpose */
VAI void vtr_step(vf *r, int d, __m512i ia, __m512i ib) {
  for (int c = 0; c < 16; c++)
    if (!(c & d)) {
      const vf a = r[c], b = r[c + d];
      r[c] = _mm512_permutex2var_ps(a, ia, b), r[c + d] = _mm512_permutex2var_ps(a, ib, b);
    }
}
VAI void vtranspose16(vf *r) {
  /* lane k of row c takes lane k of a (k & d clear) or lane k - d of b (index 16 + k - d);
     lane k of row c + d takes lane k + d of a or lane k of b */
  vtr_step(r, 8, _mm512_set_epi32(23, 22, 21, 20, 19, 18, 17, 16, 7, 6, 5, 4, 3, 2, 1, 0),
           _mm512_set_epi32(31, 30, 29, 28, 27, 26, 25, 24, 15, 14, 13, 12, 11, 10, 9, 8));
  vtr_step(r, 4, _mm512_set_epi32(27, 26, 25, 24, 11, 10, 9, 8, 19, 18, 17, 16, 3, 2, 1, 0),
           _mm512_set_epi32(31, 30, 29, 28, 15, 14, 13, 12, 23, 22, 21, 20, 7, 6, 5, 4));
  vtr_step(r, 2, _mm512_set_epi32(29, 28, 13, 12, 25, 24, 9, 8, 21, 20, 5, 4, 17, 16, 1, 0),
           _mm512_set_epi32(31, 30, 15, 14, 27, 26, 11, 10, 23, 22, 7, 6, 19, 18, 3, 2));
  vtr_step(r, 1, _mm512_set_epi32(30, 14, 28, 12, 26, 10, 24, 8, 22, 6, 20, 4, 18, 2, 16, 0),
           _mm512_set_epi32(31, 15, 29, 13, 27, 11, 25, 9, 23, 7, 21, 5, 19, 3, 17, 1));
}

VAI vf vneg(vf v) { return _mm512_xor_ps(v, _mm512_set1_ps(-0.0f)); } /* -v, exactly */

/* bn_stats_shift (ukernels.h) lane by lane with K = kb and s1 = a * (1 / S), s2 = q * (1 / S)
   * (1 / S) in double, as k_stats_run ends: out[3 c] = t1, out[3 c + 1] = t2, out[3 c + 2] = kb
   for the first n lanes c */
VAI void vstats_half(__m256 kb, __m256 sc, __m256 a, __m256 q, double total, double *t1,
                     double *t2, double *tk) {
  const __m512d kbd = _mm512_cvtps_pd(kb);
  const __m512d is = _mm512_div_pd(_mm512_set1_pd(1.0), _mm512_cvtps_pd(sc));
  const __m512d s1 = _mm512_mul_pd(_mm512_cvtps_pd(a), is);
  const __m512d s2 = _mm512_mul_pd(_mm512_mul_pd(_mm512_cvtps_pd(q), is), is);
  const __m512d delta = _mm512_sub_pd(kbd, kbd), ld = _mm512_mul_pd(_mm512_set1_pd(total), delta);
  const __m512d u2 =
      _mm512_add_pd(s2, _mm512_mul_pd(_mm512_mul_pd(_mm512_set1_pd(2.0), delta), s1));
  _mm512_storeu_pd(t1, _mm512_add_pd(s1, ld));
  _mm512_storeu_pd(t2, _mm512_add_pd(u2, _mm512_mul_pd(ld, delta)));
  _mm512_storeu_pd(tk, kbd);
}
VAI void vstats_out(vf kb, vf sc, vf a, vf q, double total, int n, double *out) {
  double t[3][16];
  vstats_half(_mm512_castps512_ps256(kb), _mm512_castps512_ps256(sc), _mm512_castps512_ps256(a),
              _mm512_castps512_ps256(q), total, t[0], t[1], t[2]);
  vstats_half(_mm512_extractf32x8_ps(kb, 1), _mm512_extractf32x8_ps(sc, 1),
              _mm512_extractf32x8_ps(a, 1), _mm512_extractf32x8_ps(q, 1), total, t[0] + 8,
              t[1] + 8, t[2] + 8);
  for (int c = 0; c < n; c++)
    out[3 * c] = t[0][c], out[3 * c + 1] = t[1][c], out[3 * c + 2] = t[2][c];
}

VAI vf vpow2i(vf n) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n),
                                                                _mm512_set1_epi32(127)), 23));
}
VAI vf vround(vf v) {
  return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

#endif
