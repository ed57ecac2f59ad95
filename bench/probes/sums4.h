/* sums4.h - the probes' backward sums by fours (as the kernels' far sums): rows r0 .. r1 of
   rows of C f32 channels of x and dy, x_hat = x * k[j] + k[C + j]; s[0..C) += sum dy,
   s[C..2C) += sum dy * x_hat, s[2C..3C) += sum x_hat (the caller zeroes s).  pf: software
   prefetch of the next four rows. */
#include <immintrin.h>
#include <stddef.h>
static void sums4(const float *x, const float *y, const float *k, long C, size_t r0, size_t r1,
                  float *s, int pf) {
  float *s1 = s, *s2 = s + C, *s3 = s + 2 * C;
  for (size_t q = r0; q + 4 <= r1; q += 4) {
    const float *a = x + q * C, *b = y + q * C;
    if (pf)
      for (long j = 0; j < 4 * C; j += 16) {
        _mm_prefetch((const char *)(a + 4 * C + j), _MM_HINT_T0);
        _mm_prefetch((const char *)(b + 4 * C + j), _MM_HINT_T0);
      }
    for (long j = 0; j < C; j += 16) {
      const __m512 xs = _mm512_load_ps(k + j), xo = _mm512_load_ps(k + C + j);
      const __m512 h0 = _mm512_fmadd_ps(_mm512_load_ps(a + j), xs, xo);
      const __m512 h1 = _mm512_fmadd_ps(_mm512_load_ps(a + C + j), xs, xo);
      const __m512 h2 = _mm512_fmadd_ps(_mm512_load_ps(a + 2 * C + j), xs, xo);
      const __m512 h3 = _mm512_fmadd_ps(_mm512_load_ps(a + 3 * C + j), xs, xo);
      const __m512 g0 = _mm512_load_ps(b + j), g1 = _mm512_load_ps(b + C + j);
      const __m512 g2 = _mm512_load_ps(b + 2 * C + j), g3 = _mm512_load_ps(b + 3 * C + j);
      _mm512_store_ps(s1 + j, _mm512_add_ps(_mm512_load_ps(s1 + j),
                                            _mm512_add_ps(_mm512_add_ps(g0, g1), _mm512_add_ps(g2, g3))));
      _mm512_store_ps(s2 + j, _mm512_add_ps(_mm512_load_ps(s2 + j),
                                            _mm512_fmadd_ps(g0, h0, _mm512_fmadd_ps(g1, h1, _mm512_fmadd_ps(g2, h2, _mm512_mul_ps(g3, h3))))));
      _mm512_store_ps(s3 + j, _mm512_add_ps(_mm512_load_ps(s3 + j),
                                            _mm512_add_ps(_mm512_add_ps(h0, h1), _mm512_add_ps(h2, h3))));
    }
  }
}
