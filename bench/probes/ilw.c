/* ilw R C MODE [GAP]: the cost of two threads writing interleaved pieces of the same rows.
   2 threads; thread t computes z = a x + b (f32, AVX-512, ordinary stores) on channels
   [t C/2, (t+1) C/2) of each of R rows of C channels, 20000 times in a parallel region each;
   prints the median time of a region (us).
   MODE 0: one x and one z, rows of C + 2 GAP values, each half followed by GAP unused values
           (the layout of a channel-split apply; GAP 0: the halves touch)
        1: the same strided layout, but each thread its own z (nothing shared that is written)
        2: each thread its own x and z, rows of C / 2 (contiguous)
        3: one x and one z, thread t taking rows [t R/2, (t+1) R/2) whole (a row split)
   On the 2-vCPU Zen 5 machines (twenty-ninth session, R 49, C 2304), in one phase of the
   machine MODE 0 took 15-19 us against 8 us for MODE 1 and 6-7 us for 2 and 3, and a GAP of
   256 values (1 KiB) at both ends of every piece took 11 us, 1024 values 9.8 us: each
   thread's hardware prefetchers run on past the end of its piece into lines the other thread
   writes, a cross-core transfer each.  Half an hour later MODE 0 took 8.4-8.9 us against
   7.7-8.0 us for MODE 1: how much a line shared between the two vCPUs costs changes with
   where the host runs them (an empty OpenMP barrier took 1.4-1.6 us in both phases). */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}
static int cmp(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}
enum { REPS = 20000 };
int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: ilw R C MODE [GAP]\n");
    return 2;
  }
  const long R = atol(argv[1]), C = atol(argv[2]) / 32 * 32, h = C / 2;
  const int mode = atoi(argv[3]);
  const long gap = argc > 4 ? atol(argv[4]) / 16 * 16 : 0, S = C + 2 * gap;
  float *x[2], *z[2];
  for (int t = 0; t < 2; t++) {
    x[t] = aligned_alloc(4096, (size_t)(R * S * 4 + 4096));
    z[t] = aligned_alloc(4096, (size_t)(R * S * 4 + 4096));
    for (long i = 0; i < R * S; i++) x[t][i] = 1.0f, z[t][i] = 0.0f;
  }
  static double ts[REPS];
  for (int r = 0; r < REPS; r++) {
    const double t0 = now();
#pragma omp parallel num_threads(2)
    {
      const int t = omp_get_thread_num();
      const __m512 a = _mm512_set1_ps(0.5f), b = _mm512_set1_ps(0.25f);
      if (mode == 3) {
        for (long q = R * t / 2; q < R * (t + 1) / 2; q++)
          for (long j = 0; j < C; j += 16)
            _mm512_store_ps(z[0] + q * C + j, _mm512_fmadd_ps(_mm512_load_ps(x[0] + q * C + j), a, b));
      } else {
        const float *xb = mode == 2 ? x[t] : x[0];
        float *zb = mode == 0 ? z[0] : z[t];
        for (long q = 0; q < R; q++) {
          const long e = mode == 2 ? q * h : q * S + t * (h + gap);
          for (long j = 0; j < h; j += 16)
            _mm512_store_ps(zb + e + j, _mm512_fmadd_ps(_mm512_load_ps(xb + e + j), a, b));
        }
      }
    }
    ts[r] = now() - t0;
  }
  qsort(ts, REPS, sizeof ts[0], cmp);
  printf("R %ld C %ld mode %d gap %ld: median %.2f us\n", R, C, mode, gap, ts[REPS / 2]);
  return 0;
}
