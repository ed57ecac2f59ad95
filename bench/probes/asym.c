/* asym KB REPS: whether the two vCPUs run the same loop at the same speed.  Each of 2 threads
   scales its own KB-KiB f32 array into another (in L1 / L2 for small KB) REPS times; prints both
   threads' times, their ratio and the CPU each ran on.  On the 2-vCPU Zen 5 machines the ratio
   was often 1.3-1.7 (thirty-second session): one vCPU slower for the same work, which one
   depending on the minute (a neighbour on its physical core), while a compute-bound loop
   could still run at equal speed.  The engine's dynamic shares (src/cpu/shares.h) exist for
   this; compare library timings only within one phase of it. */
#define _GNU_SOURCE
#include <immintrin.h>
#include <omp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
  const size_t n = (size_t)(argc > 1 ? atol(argv[1]) : 16) * 256;
  const long reps = argc > 2 ? atol(argv[2]) : 300000;
  double tt[2] = {0, 0};
  int cpu[2] = {-1, -1};
#pragma omp parallel num_threads(2)
  {
    const int th = omp_get_thread_num();
    float *x = aligned_alloc(64, n * 4), *y = aligned_alloc(64, n * 4);
    for (size_t i = 0; i < n; i++) x[i] = (float)i, y[i] = 0;
    const __m512 a = _mm512_set1_ps(1.01f);
#pragma omp barrier
    const double t0 = omp_get_wtime();
    for (long r = 0; r < reps; r++)
      for (size_t i = 0; i < n; i += 16) _mm512_store_ps(y + i, _mm512_mul_ps(a, _mm512_load_ps(x + i)));
    tt[th] = omp_get_wtime() - t0;
    cpu[th] = sched_getcpu();
    if (y[5] == 1.2345f) printf("-");
    free(x), free(y);
  }
  printf("%zu KiB: thread 0 %.3f s (cpu %d), thread 1 %.3f s (cpu %d), ratio %.2f\n", n / 256,
         tt[0], cpu[0], tt[1], cpu[1], tt[1] / tt[0]);
  return 0;
}
