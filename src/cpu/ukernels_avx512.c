/* ukernels_avx512.c - the vector micro-kernels (ukernels_vec.inc) on simd_avx512.h: AVX-512
   F/BW/VL/DQ, 16 lanes. */
#include <float.h>
#include "simd_avx512.h"
#define VEC_TABLE_FN bn_ukernels_avx512
#include "ukernels_vec.inc"

#include "norm_math.h"
#define CHAN_FN(f) f##_avx512
#include "chan_vec.inc"
#undef CHAN_FN

/* norm_fwd_consts (ukernels.h) in 8 lanes */
int norm_fwd_consts_avx512(const norm_fwd_block *b, int64_t n) {
  const __m512d zero = _mm512_setzero_pd(), big = _mm512_set1_pd(FLT_MAX),
                inf = _mm512_set1_pd(HUGE_VAL);
  __mmask8 flag = 0;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m512d mean = _mm512_loadu_pd(b->mean + i), sc = _mm512_loadu_pd(b->scale + i);
    const __m512d beta = _mm512_loadu_pd(b->beta + i);
    const __m256 mf = _mm512_cvtpd_ps(mean);
    const __m512d mhi = _mm512_cvtps_pd(mf);
    const __m512d lo = _mm512_add_pd(_mm512_sub_pd(mean, mhi), _mm512_loadu_pd(b->mlo + i));
    const __m512d shift = _mm512_mask_blend_pd(_mm512_cmp_pd_mask(lo, zero, _CMP_EQ_OQ),
                                               _mm512_sub_pd(beta, _mm512_mul_pd(lo, sc)), beta);
    _mm256_storeu_ps(b->cm + i, mf);
    _mm256_storeu_ps(b->csc + i, _mm512_cvtpd_ps(sc));
    _mm256_storeu_ps(b->csh + i, _mm512_cvtpd_ps(shift));
    _mm512_storeu_pd(b->dm + i, mhi), _mm512_storeu_pd(b->dsc + i, sc);
    _mm512_storeu_pd(b->dsh + i, shift);
    const __m512d as = _mm512_abs_pd(sc), ah = _mm512_abs_pd(shift);
    flag |= _mm512_cmp_pd_mask(as, big, _CMP_GT_OQ) & _mm512_cmp_pd_mask(as, inf, _CMP_LT_OQ);
    flag |= _mm512_cmp_pd_mask(ah, big, _CMP_GT_OQ) & _mm512_cmp_pd_mask(ah, inf, _CMP_LT_OQ);
  }
  return norm_fwd_consts_scalar(b, i, n) | (flag != 0);
}
