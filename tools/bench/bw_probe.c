/* bw_probe.c - memory-bandwidth probe of norma-bench: the yardstick the benchmark divides by.
 *
 *  copy_nt : dst = src with non-temporal stores (AVX _mm256_stream_ps), bytes counted as
 *            read + write (2 * size) -- the best a streaming op of 1 read + 1 write can do;
 *  copy    : the same with ordinary stores (the write-allocate read is not counted);
 *  read    : sum of src (1 * size).
 * Each array is `bytes` long (>= 256 MB by default, larger than the caches), split evenly
 * over `threads` OpenMP threads in 64-byte-aligned chunks; pages are first touched by the
 * thread that uses them.  One untimed pass, then `passes` timed passes; best and median. */
#define _POSIX_C_SOURCE 200809L
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bw_probe_kernels.h"
#include "worker_common.h"

static void copy_scalar(float *dst, const float *src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = src[i];
}
static double read_scalar(const float *src, size_t n) {
  float s[8] = {0};
  for (size_t i = 0; i < n; i += 8)
    for (int j = 0; j < 8; ++j) s[j] += src[i + j];
  return (double)s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

static int have_avx(void) {
#if defined(BENCH_HAVE_AVX_PROBE) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx");
#else
  return 0;
#endif
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

enum { K_COPY_NT, K_COPY, K_READ };
static volatile double bench_probe_sink;

/* One pass of kernel k over the arrays; returns its seconds. */
static double pass(int k, float *dst, const float *src, size_t n, int threads, int avx) {
  double sum = 0.0;
  double t0 = now_s();
#pragma omp parallel num_threads(threads) reduction(+ : sum)
  {
    int t = omp_get_thread_num(), nt = omp_get_num_threads();
    size_t blocks = n / 32; /* 32 floats = 128 bytes */
    size_t b0 = blocks * (size_t)t / (size_t)nt, b1 = blocks * (size_t)(t + 1) / (size_t)nt;
    float *d = dst + b0 * 32;
    const float *s = src + b0 * 32;
    size_t m = (b1 - b0) * 32;
#ifdef BENCH_HAVE_AVX_PROBE
    if (avx) {
      if (k == K_COPY_NT) bench_copy_nt_avx(d, s, m);
      else if (k == K_COPY) bench_copy_st_avx(d, s, m);
      else sum += bench_read_avx(s, m);
    } else
#endif
    {
      (void)avx;
      if (k == K_READ) sum += read_scalar(s, m);
      else copy_scalar(d, s, m);
    }
  }
  double t1 = now_s();
  bench_probe_sink = sum;
  return t1 - t0;
}

int bench_probe(size_t bytes, int threads, int passes, bench_probe_result *r) {
  if (threads <= 0) threads = omp_get_max_threads();
  if (passes < 1) passes = 1;
  size_t n = bytes / sizeof(float) / 32 * 32;
  if (n < 32) n = 32;
  float *src = NULL, *dst = NULL;
  if (posix_memalign((void **)&src, 4096, n * sizeof(float)) ||
      posix_memalign((void **)&dst, 4096, n * sizeof(float))) {
    free(src);
    return 1;
  }
  /* first touch by the thread that will use each chunk */
#pragma omp parallel num_threads(threads)
  {
    int t = omp_get_thread_num(), nt = omp_get_num_threads();
    size_t i0 = n / 32 * (size_t)t / (size_t)nt * 32,
           i1 = n / 32 * (size_t)(t + 1) / (size_t)nt * 32;
    for (size_t i = i0; i < i1; ++i) {
      src[i] = (float)(i & 1023) * 0.001f;
      dst[i] = 0.0f;
    }
  }
  int avx = have_avx();
  double *sec = (double *)malloc(sizeof(double) * (size_t)passes);
  if (!sec) {
    free(src);
    free(dst);
    return 1;
  }
  double best[3], med[3];
  for (int k = 0; k < 3; ++k) {
    pass(k, dst, src, n, threads, avx); /* untimed */
    for (int p = 0; p < passes; ++p) sec[p] = pass(k, dst, src, n, threads, avx);
    qsort(sec, (size_t)passes, sizeof(double), cmp_double);
    double traffic = (double)(n * sizeof(float)) * (k == K_READ ? 1.0 : 2.0);
    double ms = (passes % 2) ? sec[passes / 2] : 0.5 * (sec[passes / 2 - 1] + sec[passes / 2]);
    best[k] = traffic / sec[0] * 1e-9;
    med[k] = traffic / ms * 1e-9;
  }
  free(sec);
  free(src);
  free(dst);
  memset(r, 0, sizeof *r);
  r->copy_nt_best = best[K_COPY_NT];
  r->copy_nt_median = med[K_COPY_NT];
  r->copy_best = best[K_COPY];
  r->copy_median = med[K_COPY];
  r->read_best = best[K_READ];
  r->read_median = med[K_READ];
  r->bytes = n * sizeof(float);
  r->threads = threads;
  r->passes = passes;
  r->nt_stores = avx;
  return 0;
}
