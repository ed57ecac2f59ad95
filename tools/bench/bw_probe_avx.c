/* bw_probe_avx.c - the AVX loops of the bandwidth probe; this file alone is compiled with
   -mavx and is called only when the CPU reports AVX (see bw_probe.c).  Each function handles
   one thread's chunk: pointers 32-byte aligned, n a multiple of 32 floats. */
#include <immintrin.h>
#include <stddef.h>

#include "bw_probe_kernels.h"

/* Copy with non-temporal (streaming) stores: the destination lines are not read for
   ownership, so the traffic is exactly one read of src and one write of dst. */
void bench_copy_nt_avx(float *dst, const float *src, size_t n) {
  for (size_t i = 0; i < n; i += 32) {
    __m256 a = _mm256_load_ps(src + i);
    __m256 b = _mm256_load_ps(src + i + 8);
    __m256 c = _mm256_load_ps(src + i + 16);
    __m256 d = _mm256_load_ps(src + i + 24);
    _mm256_stream_ps(dst + i, a);
    _mm256_stream_ps(dst + i + 8, b);
    _mm256_stream_ps(dst + i + 16, c);
    _mm256_stream_ps(dst + i + 24, d);
  }
  _mm_sfence();
}

/* Copy with ordinary stores (each destination line is also read for ownership). */
void bench_copy_st_avx(float *dst, const float *src, size_t n) {
  for (size_t i = 0; i < n; i += 32) {
    __m256 a = _mm256_load_ps(src + i);
    __m256 b = _mm256_load_ps(src + i + 8);
    __m256 c = _mm256_load_ps(src + i + 16);
    __m256 d = _mm256_load_ps(src + i + 24);
    _mm256_store_ps(dst + i, a);
    _mm256_store_ps(dst + i + 8, b);
    _mm256_store_ps(dst + i + 16, c);
    _mm256_store_ps(dst + i + 24, d);
  }
}

/* Read-only sum, four independent accumulators. */
double bench_read_avx(const float *src, size_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  for (size_t i = 0; i < n; i += 32) {
    s0 = _mm256_add_ps(s0, _mm256_load_ps(src + i));
    s1 = _mm256_add_ps(s1, _mm256_load_ps(src + i + 8));
    s2 = _mm256_add_ps(s2, _mm256_load_ps(src + i + 16));
    s3 = _mm256_add_ps(s3, _mm256_load_ps(src + i + 24));
  }
  __m256 s = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
  float v[8];
  _mm256_storeu_ps(v, s);
  return (double)v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
}
