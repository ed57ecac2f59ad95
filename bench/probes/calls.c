/* calls N C S OP [REPS]: the median time (us) of one NHWC f32 BatchNorm call in a loop of
   calls through the public API, over 50 blocks of REPS / 50 calls (default 20000 calls): OP 0
   the training forward, 1 the backward, 2 inference; CF=1 for NCHW.  The cost of small calls,
   where a process's first call or a cold cache would drown it; `perf record` on it shows
   where such a call spends its time.  Threads: OMP_NUM_THREADS (or the library default). */
#include <norma.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}
static int cmpd(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}
int main(int argc, char **argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: calls N C S OP [REPS]\n");
    return 2;
  }
  const long n = atol(argv[1]), c = atol(argv[2]), s = atol(argv[3]);
  const int op = atoi(argv[4]);
  const long reps = argc > 5 ? atol(argv[5]) : 20000, block = reps / 50 > 0 ? reps / 50 : 1;
  const norma_layout lay = getenv("CF") ? NORMA_CHANNELS_FIRST : NORMA_CHANNELS_LAST;
  const norma_bn_desc d = {n, c, s, lay, NORMA_F32, 1e-5, 0};
  const size_t m = (size_t)(n * c * s), bytes = (m * 4 + 63) / 64 * 64;
  float *x = aligned_alloc(64, bytes), *y = aligned_alloc(64, bytes);
  float *dy = aligned_alloc(64, bytes), *dx = aligned_alloc(64, bytes);
  float *p = malloc(sizeof(float) * (size_t)c * 8);
  if (!x || !y || !dy || !dx || !p) return 1;
  float *g = p, *b = p + c, *sm = p + 2 * c, *si = p + 3 * c, *rm = p + 4 * c, *rv = p + 5 * c;
  float *dg = p + 6 * c, *db = p + 7 * c;
  for (size_t i = 0; i < m; i++) {
    x[i] = (float)((i * 7919) % 1000) / 500.f;
    dy[i] = (float)((i * 104729) % 777) / 400.f - 1.f;
  }
  for (long j = 0; j < c; j++) g[j] = 1.f + (float)j * 0.001f, b[j] = 0.1f, rm[j] = 0, rv[j] = 1;
  if (norma_bn_forward_training(&d, x, NULL, g, b, y, sm, si, rm, rv, 0.1) != NORMA_OK) {
    fprintf(stderr, "%s\n", norma_last_error());
    return 1;
  }
  double t[50];
  for (int k = 0; k < 50; k++) {
    const double t0 = now();
    for (long r = 0; r < block; r++) {
      if (op == 0) norma_bn_forward_training(&d, x, NULL, g, b, y, sm, si, rm, rv, 0.1);
      else if (op == 1) norma_bn_backward(&d, x, NULL, dy, g, b, sm, si, dx, NULL, dg, db);
      else norma_bn_forward_inference(&d, x, NULL, g, b, rm, rv, y);
    }
    t[k] = (now() - t0) / (double)block * 1e6;
  }
  qsort(t, 50, sizeof t[0], cmpd);
  printf("%ldx%ldx%ld op %d: median %.2f us min %.2f\n", n, c, s, op, t[25], t[0]);
  free(x), free(y), free(dy), free(dx), free(p);
  return 0;
}
