/* rwseq N C S PFD SEQ: NHWC f32 [N, C, S] on 2 threads, the passes of a training forward in a
   chosen sequence, repeated 15 times; prints each step's median (ms).  SEQ is a string of
   digits, each a step, in order:
     0  norma_bn_forward_training            1  norma_bn_moments
     2  norma_bn_forward_apply               3  a stand-alone apply: y = (x - m) s + b, a row at
                                                a time, streaming stores, prefetch PFD bytes ahead
     4  a plain read of x                    5  a plain read of another tensor of the same size
   Thirty-second session (Zen 5, 2 vCPUs, 32 256 3136 12288): "3" alone 2.0-2.3 ms a pass,
   "43" 3.5-4.1 (the apply after a read of x; it recovers over four or five passes: "433333"
   3.5 2.7 2.6 2.4 2.2), "53" 2.7-2.8 (after a read of another tensor), "13" as "43".  So the
   training forward's apply, which always follows the statistics' read of x, runs at about
   two thirds of the speed the same loop reaches after another apply; prefetchnta in the read,
   regular stores in the apply, a backwards walk or the threads' halves swapped did not change
   it.  Not explained (the host's cache policy, or the memory controller's). */
#include <norma.h>
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static int cmp(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}
static float read_all(const float *p, size_t n) {
  float acc = 0;
#pragma omp parallel reduction(+ : acc)
  {
    const int th = omp_get_thread_num(), nt = omp_get_num_threads();
    const size_t i0 = n * th / nt / 32 * 32, i1 = th == nt - 1 ? n / 32 * 32 : n * (th + 1) / nt / 32 * 32;
    __m512 s0 = _mm512_setzero_ps(), s1 = s0;
    for (size_t i = i0; i < i1; i += 32)
      s0 = _mm512_add_ps(s0, _mm512_load_ps(p + i)), s1 = _mm512_add_ps(s1, _mm512_load_ps(p + i + 16));
    acc += _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
  }
  return acc;
}
int main(int argc, char **argv) {
  if (argc < 6) {
    fprintf(stderr, "usage: rwseq N C S PFD SEQ\n");
    return 2;
  }
  const long N = atol(argv[1]), C = atol(argv[2]), S = atol(argv[3]), pfd = atol(argv[4]);
  const char *seq = argv[5];
  const int ns = (int)strlen(seq);
  if (C % 16 || ns < 1 || ns > 16) {
    fprintf(stderr, "C must be a multiple of 16, SEQ 1-16 steps\n");
    return 2;
  }
  const size_t n = (size_t)N * C * S, rows = n / C;
  float *x = aligned_alloc(64, n * 4), *y = aligned_alloc(64, n * 4), *z = aligned_alloc(64, n * 4);
  float *m = aligned_alloc(64, C * 4), *sc = aligned_alloc(64, C * 4), *b = aligned_alloc(64, C * 4);
  float *mean = calloc(C, 4), *inv = malloc(C * 4);
  int64_t *cnt = malloc(C * 8);
  double *mm = malloc(C * 8), *m2 = malloc(C * 8), *dm = malloc(C * 8), *di = malloc(C * 8);
#pragma omp parallel for
  for (size_t i = 0; i < n; i++) x[i] = (float)(i % 977) * 0.01f, y[i] = 0, z[i] = 1;
  for (long j = 0; j < C; j++) m[j] = 0.2f, sc[j] = 1.1f, b[j] = 0.3f, dm[j] = 0.1, di[j] = 1.3;
  norma_bn_desc d = {N, C, S, NORMA_CHANNELS_LAST, NORMA_F32, 1e-5, 0};
  double t[16][15];
  float sink = 0;
  for (int r = 0; r < 15; r++)
    for (int k = 0; k < ns; k++) {
      const double t0 = omp_get_wtime();
      switch (seq[k]) {
      case '0': norma_bn_forward_training(&d, x, NULL, NULL, NULL, y, mean, inv, NULL, NULL, 0.1); break;
      case '1': norma_bn_moments(&d, x, cnt, mm, m2); break;
      case '2': norma_bn_forward_apply(&d, x, NULL, NULL, NULL, dm, di, y); break;
      case '3':
#pragma omp parallel
      {
        const int th = omp_get_thread_num(), nt = omp_get_num_threads();
        for (size_t q = rows * th / nt; q < rows * (th + 1) / nt; q++) {
          const float *p = x + q * C;
          float *o = y + q * C;
          for (long j = 0; j < C; j += 16) {
            _mm_prefetch((const char *)(p + j) + pfd, _MM_HINT_T0);
            const __m512 v = _mm512_sub_ps(_mm512_load_ps(p + j), _mm512_load_ps(m + j));
            _mm512_stream_ps(o + j, _mm512_fmadd_ps(v, _mm512_load_ps(sc + j), _mm512_load_ps(b + j)));
          }
        }
        _mm_sfence();
      }
      break;
      case '4': sink += read_all(x, n); break;
      case '5': sink += read_all(z, n); break;
      default: fprintf(stderr, "unknown step %c\n", seq[k]); return 2;
      }
      t[k][r] = omp_get_wtime() - t0;
    }
  for (int k = 0; k < ns; k++) {
    qsort(t[k], 15, sizeof(double), cmp);
    printf(" %c:%.3f", seq[k], t[k][7] * 1e3);
  }
  printf(" ms%s\n", sink == 1.2345f ? " " : "");
  return 0;
}
