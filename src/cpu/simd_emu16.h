/* simd_emu16.h - a 16-lane vector layer made of two AVX2 halves: the AVX-512 kernels' control
 * flow (16-lane loops, two accumulators per 32 lanes, 16-lane tails) run on a CPU without
 * AVX-512.  It exists for testing: NORMA_EMULATE_AVX512=1 serves the avx512 level with it where
 * the CPU lacks AVX-512, so that every line of ukernels_vec.inc that the AVX-512 instance runs
 * also runs, and is tested, on AVX2 machines.  Only the intrinsics of simd_avx512.h are left
 * untested there.
 */
#ifndef NORMA_SIMD_EMU16_H
#define NORMA_SIMD_EMU16_H

#include "simd_avx2_ops.h"

#define VW 16
#define VAI static inline __attribute__((always_inline))

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
EMU2(vor_bits, _mm256_or_ps) /* the lanes' bit patterns ORed */
#undef EMU2
VAI vf vzero(void) { return vmk(_mm256_setzero_ps(), _mm256_setzero_ps()); }
VAI vf vset1(float a) { return vmk(_mm256_set1_ps(a), _mm256_set1_ps(a)); }
VAI vf vfma(vf a, vf b, vf c) {
  return vmk(_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi));
}
VAI vf vmax0(vf v) {
  return vmk(_mm256_max_ps(_mm256_setzero_ps(), v.lo), _mm256_max_ps(_mm256_setzero_ps(), v.hi));
}

VAI vm vmask_first(int n) {
  vm m = {a8_first(n < 8 ? n : 8), a8_first(n > 8 ? n - 8 : 0)};
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

VAI vf vld(const void *p, int64_t i, const int dt) {
  return vmk(a8_ld(p, i, dt), a8_ld(p, i + 8, dt));
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

VAI void vst(void *p, int64_t i, vf v, const int dt) {
  a8_st(p, i, v.lo, dt);
  a8_st(p, i + 8, v.hi, dt);
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
  return a8_sum(_mm256_add_ps(_mm256_add_ps(a[0].lo, a[1].lo), _mm256_add_ps(a[0].hi, a[1].hi)));
}
VAI float vhmin(vf v) { return a8_min(_mm256_min_ps(v.lo, v.hi)); }
VAI float vhmax(vf v) { return a8_max(_mm256_max_ps(v.lo, v.hi)); }
VAI void vstore_sums(double *o, vf v, int n) {
  double t[16];
  a8_store_pd(t, v.lo), a8_store_pd(t + 8, v.hi);
  memcpy(o, t, (size_t)n * sizeof(double));
}

/* ---- the anchor and exp's pieces ---- */

VAI vf vanchor(vf sum, vf mn, vf mx, vf inv) {
  return vmk(a8_anchor(sum.lo, mn.lo, mx.lo, inv.lo), a8_anchor(sum.hi, mn.hi, mx.hi, inv.hi));
}
VAI vf vpow2i(vf n) { return vmk(a8_pow2i(n.lo), a8_pow2i(n.hi)); }
VAI vf vround(vf v) {
  return vmk(_mm256_round_ps(v.lo, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
             _mm256_round_ps(v.hi, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

#endif
