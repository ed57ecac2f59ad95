/* ukernels_avx2.c - the vector micro-kernels (ukernels_vec.inc) on simd_avx2.h: AVX2 + FMA +
   F16C, 8 lanes. */
#include <float.h>
#include "simd_avx2.h"
#define VEC_TABLE_FN bn_ukernels_avx2
#include "ukernels_vec.inc"

#include "norm_math.h"
#define CHAN_FN(f) f##_avx2
#include "chan_vec.inc"
#undef CHAN_FN

/* norm_fwd_consts (ukernels.h) in 4 lanes */
int norm_fwd_consts_avx2(const norm_fwd_block *b, int64_t n) {
  const __m256d zero = _mm256_setzero_pd(), big = _mm256_set1_pd(FLT_MAX),
                inf = _mm256_set1_pd(HUGE_VAL), sign = _mm256_set1_pd(-0.0);
  __m256d flag = zero;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m256d mean = _mm256_loadu_pd(b->mean + i), sc = _mm256_loadu_pd(b->scale + i);
    const __m256d beta = _mm256_loadu_pd(b->beta + i);
    const __m128 mf = _mm256_cvtpd_ps(mean);
    const __m256d mhi = _mm256_cvtps_pd(mf);
    const __m256d lo = _mm256_add_pd(_mm256_sub_pd(mean, mhi), _mm256_loadu_pd(b->mlo + i));
    const __m256d shift = _mm256_blendv_pd(_mm256_sub_pd(beta, _mm256_mul_pd(lo, sc)), beta,
                                           _mm256_cmp_pd(lo, zero, _CMP_EQ_OQ));
    _mm_storeu_ps(b->cm + i, mf);
    _mm_storeu_ps(b->csc + i, _mm256_cvtpd_ps(sc));
    _mm_storeu_ps(b->csh + i, _mm256_cvtpd_ps(shift));
    _mm256_storeu_pd(b->dm + i, mhi), _mm256_storeu_pd(b->dsc + i, sc);
    _mm256_storeu_pd(b->dsh + i, shift);
    const __m256d as = _mm256_andnot_pd(sign, sc), ah = _mm256_andnot_pd(sign, shift);
    flag = _mm256_or_pd(flag, _mm256_and_pd(_mm256_cmp_pd(as, big, _CMP_GT_OQ),
                                            _mm256_cmp_pd(as, inf, _CMP_LT_OQ)));
    flag = _mm256_or_pd(flag, _mm256_and_pd(_mm256_cmp_pd(ah, big, _CMP_GT_OQ),
                                            _mm256_cmp_pd(ah, inf, _CMP_LT_OQ)));
  }
  return norm_fwd_consts_scalar(b, i, n) | (_mm256_movemask_pd(flag) != 0);
}
