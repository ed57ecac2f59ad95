/* simd_emu16.h - a 16-lane vector layer made of two AVX2 halves: the AVX-512 kernels' control
 * flow (16-lane loops, two accumulators per 32 lanes, 16-lane tails) run on a CPU without
 * AVX-512.  It exists for testing: NORMA_EMULATE_AVX512=1 serves the avx512 level with it where
 * the CPU lacks AVX-512, so that every line of ukernels_vec.inc that the AVX-512 instance runs
 * also runs, and is tested, on AVX2 machines.  Only the intrinsics of simd_avx512.h are left
 * untested there.
 */
#ifndef NORMA_SIMD_EMU16_H
#define NORMA_SIMD_EMU16_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define VW 16
#define VAI static inline __attribute__((always_inline))

enum { S_F32 = 0, S_F16 = 1, S_BF16 = 2 };

typedef struct { __m256 lo, hi; } vf;
typedef struct { __m256 lo, hi; } vm;

VAI vf vmk(__m256 lo, __m256 hi) { vf r = {lo, hi}; return r; }
#define EMU2(name, op) VAI vf name(vf a, vf b) { return vmk(op(a.lo, b.lo), op(a.hi, b.hi)); }
EMU2(vadd, _mm256_add_ps)
EMU2(vsub, _mm256_sub_ps)
EMU2(vmul, _mm256_mul_ps)
EMU2(vdiv, _mm256_div_ps)
EMU2(vmin, _mm256_min_ps)
EMU2(vmax, _mm256_max_ps)
#undef EMU2
VAI vf vzero(void) { return vmk(_mm256_setzero_ps(), _mm256_setzero_ps()); }
VAI vf vset1(float a) { return vmk(_mm256_set1_ps(a), _mm256_set1_ps(a)); }
VAI vf vfma(vf a, vf b, vf c) {
  return vmk(_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi));
}
VAI vf vmax0(vf v) {
  return vmk(_mm256_max_ps(_mm256_setzero_ps(), v.lo), _mm256_max_ps(_mm256_setzero_ps(), v.hi));
}

VAI __m256 e_first8(int n) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx));
}
VAI vm vmask_first(int n) {
  vm m = {e_first8(n < 8 ? n : 8), e_first8(n > 8 ? n - 8 : 0)};
  return m;
}
VAI vf vand_m(vf v, vm m) { return vmk(_mm256_and_ps(v.lo, m.lo), _mm256_and_ps(v.hi, m.hi)); }
VAI vf vblend_m(vm m, vf a, vf b) {
  return vmk(_mm256_blendv_ps(a.lo, b.lo, m.lo), _mm256_blendv_ps(a.hi, b.hi, m.hi));
}
VAI vm vgt(vf a, vf b) {
  vm m = {_mm256_cmp_ps(a.lo, b.lo, _CMP_GT_OQ), _mm256_cmp_ps(a.hi, b.hi, _CMP_GT_OQ)};
  return m;
}
VAI vf vkeep_pos(vf g, vf y) {
  const __m256 z = _mm256_setzero_ps();
  return vmk(_mm256_and_ps(g.lo, _mm256_cmp_ps(y.lo, z, _CMP_GT_OQ)),
             _mm256_and_ps(g.hi, _mm256_cmp_ps(y.hi, z, _CMP_GT_OQ)));
}

/* ---- loads and stores ---- */

VAI __m256 e_ld8(const void *p, int64_t i, const int dt) {
  if (dt == S_F32) return _mm256_loadu_ps((const float *)p + i);
  __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
  if (dt == S_F16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
VAI vf vld(const void *p, int64_t i, const int dt) {
  return vmk(e_ld8(p, i, dt), e_ld8(p, i + 8, dt));
}
VAI vf vld_part(const void *p, int64_t i, int n, const int dt) {
  if (dt == S_F32) { /* masked halves: nothing past the n values is touched */
    const vm m = vmask_first(n);
    const float *q = (const float *)p + i;
    return vmk(_mm256_maskload_ps(q, _mm256_castps_si256(m.lo)),
               _mm256_maskload_ps(q + 8, _mm256_castps_si256(m.hi)));
  }
  uint16_t t[16] = {0};
  memcpy(t, (const uint16_t *)p + i, (size_t)n * 2);
  return vld(t, 0, dt);
}

VAI __m128i e_to_bf16(__m256 v) {
  __m256i u = _mm256_castps_si256(v);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
  __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  __m256i q = _mm256_or_si256(u, _mm256_set1_epi32(0x400000));
  r = _mm256_blendv_epi8(r, q, nan);
  r = _mm256_srli_epi32(r, 16);
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}
VAI void e_st8(void *p, int64_t i, __m256 v, const int dt) {
  if (dt == S_F32) _mm256_storeu_ps((float *)p + i, v);
  else if (dt == S_F16)
    _mm_storeu_si128((__m128i *)((uint16_t *)p + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  else _mm_storeu_si128((__m128i *)((uint16_t *)p + i), e_to_bf16(v));
}
VAI void vst(void *p, int64_t i, vf v, const int dt) {
  e_st8(p, i, v.lo, dt);
  e_st8(p, i + 8, v.hi, dt);
}
VAI void vst_part(void *p, int64_t i, vf v, int n, const int dt) {
  if (dt == S_F32) {
    const vm m = vmask_first(n);
    float *q = (float *)p + i;
    _mm256_maskstore_ps(q, _mm256_castps_si256(m.lo), v.lo);
    _mm256_maskstore_ps(q + 8, _mm256_castps_si256(m.hi), v.hi);
    return;
  }
  uint16_t t[16];
  vst(t, 0, v, dt);
  memcpy((uint16_t *)p + i, t, (size_t)n * 2);
}
VAI void vst_nt(void *p, int64_t i, vf v, const int dt, int nt) {
  if (nt && dt == S_F32 && (((uintptr_t)((float *)p + i)) & 31) == 0) {
    _mm256_stream_ps((float *)p + i, v.lo);
    _mm256_stream_ps((float *)p + i + 8, v.hi);
    return;
  }
  vst(p, i, v, dt);
}
/* the AVX-512 instance's boundaries: 64 bytes (f32), 32 bytes (16-bit) */
VAI int64_t vto_boundary(const void *p, int64_t i, int64_t n, const int dt) {
  const uintptr_t es = dt == S_F32 ? 4 : 2, al = dt == S_F32 ? 64 : 32;
  const uintptr_t a = (uintptr_t)p + (uintptr_t)i * es;
  int64_t k = (int64_t)(((al - (a & (al - 1))) & (al - 1)) / es);
  return k < n ? k : n;
}

VAI vf vldk(const float *k, int n) {
  if (n == VW) return vmk(_mm256_loadu_ps(k), _mm256_loadu_ps(k + 8));
  return vld_part(k, 0, n, S_F32);
}
VAI vf vload_a(const float *p) { return vmk(_mm256_load_ps(p), _mm256_load_ps(p + 8)); }
VAI void vstore_a(float *p, vf v) { _mm256_store_ps(p, v.lo), _mm256_store_ps(p + 8, v.hi); }
VAI vf vloadu(const float *p) { return vmk(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)); }
VAI void vstoreu(float *p, vf v) { _mm256_storeu_ps(p, v.lo), _mm256_storeu_ps(p + 8, v.hi); }

/* ---- reductions: simd_avx512.h's order ---- */

VAI double vreduce32(const vf *a) {
  const __m256 slo = _mm256_add_ps(a[0].lo, a[1].lo), shi = _mm256_add_ps(a[0].hi, a[1].hi);
  const __m256 a0 = _mm256_add_ps(slo, shi);
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps(a0, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_movehdup_ps(h));
  return (double)_mm_cvtss_f32(h);
}
VAI float vhmin(vf v) {
  const __m256 a = _mm256_min_ps(v.lo, v.hi);
  __m128 h = _mm_min_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  h = _mm_min_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_min_ss(h, _mm_movehdup_ps(h)));
}
VAI float vhmax(vf v) {
  const __m256 a = _mm256_max_ps(v.lo, v.hi);
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
}
VAI void vstore_sums(double *o, vf v, int n) {
  double t[16];
  _mm256_storeu_pd(t, _mm256_cvtps_pd(_mm256_castps256_ps128(v.lo)));
  _mm256_storeu_pd(t + 4, _mm256_cvtps_pd(_mm256_extractf128_ps(v.lo, 1)));
  _mm256_storeu_pd(t + 8, _mm256_cvtps_pd(_mm256_castps256_ps128(v.hi)));
  _mm256_storeu_pd(t + 12, _mm256_cvtps_pd(_mm256_extractf128_ps(v.hi, 1)));
  memcpy(o, t, (size_t)n * sizeof(double));
}

/* ---- the anchor and exp's pieces ---- */

VAI __m256 e_anchor8(__m256 sum, __m256 mn, __m256 mx, __m256 inv) {
  const __m256 mean = _mm256_mul_ps(sum, inv), range = _mm256_sub_ps(mx, mn);
  const __m256i e = _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(range), 23),
                                     _mm256_set1_epi32(0xff));
  const __m256 q = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(5)), 23));
  const __m256 iq = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_sub_epi32(_mm256_set1_epi32(259), e), 23));
  const __m256 t = _mm256_mul_ps(mean, iq);
  const __m256 magic = _mm256_set1_ps(0x1.8p23f);
  const __m256 r = _mm256_mul_ps(_mm256_sub_ps(_mm256_add_ps(t, magic), magic), q);
  __m256 ok = _mm256_cmp_ps(range, _mm256_setzero_ps(), _CMP_GT_OQ);
  ok = _mm256_and_ps(ok, _mm256_castsi256_ps(_mm256_cmpgt_epi32(e, _mm256_set1_epi32(6))));
  ok = _mm256_and_ps(ok, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(255), e)));
  ok = _mm256_and_ps(ok, _mm256_cmp_ps(t, _mm256_set1_ps(0x1p22f), _CMP_LT_OQ));
  ok = _mm256_and_ps(ok, _mm256_cmp_ps(t, _mm256_set1_ps(-0x1p22f), _CMP_GT_OQ));
  __m256 res = _mm256_blendv_ps(mean, r, ok);
  return _mm256_blendv_ps(res, mn, _mm256_cmp_ps(range, _mm256_setzero_ps(), _CMP_EQ_OQ));
}
VAI vf vanchor(vf sum, vf mn, vf mx, vf inv) {
  return vmk(e_anchor8(sum.lo, mn.lo, mx.lo, inv.lo), e_anchor8(sum.hi, mn.hi, mx.hi, inv.hi));
}
VAI __m256 e_pow2i(__m256 n) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n),
                                                                _mm256_set1_epi32(127)), 23));
}
VAI vf vpow2i(vf n) { return vmk(e_pow2i(n.lo), e_pow2i(n.hi)); }
VAI vf vround(vf v) {
  return vmk(_mm256_round_ps(v.lo, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
             _mm256_round_ps(v.hi, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

#endif
