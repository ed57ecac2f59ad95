/*
 * bn_act_fusion_bench.c - what norma's fused flags save against the same work done as separate
 * passes, measured on one shape at a time (docs/fusion.md):
 *
 *   forward   bn                    norma_bn_forward_training, no activation
 *             bn+relu fused         ... with NORMA_BN_RELU
 *             bn, relu pass         ... without, then y = max(0, y) as its own pass
 *             bn+add+relu fused     ... with NORMA_BN_ADD_RELU
 *             bn, add+relu pass     ... without, then y = max(0, y + residual) as its own pass
 *   backward  bwd                   norma_bn_backward, no activation, from x
 *             bwd relu fused        ... NORMA_BN_RELU (mask y > 0 read inside)
 *             relu pass, bwd        g = (y > 0 ? dy : 0) as its own pass, then bwd on g
 *             bwd add+relu fused    ... NORMA_BN_ADD_RELU, dresidual written
 *             add+relu pass, bwd    g = (y > 0 ? dy : 0) as its own pass (g is dresidual), then
 *                                   bwd on g
 *             bwd from y            x = NULL: x_hat recovered from y (x need not be kept)
 *   inference infer                 norma_bn_forward_inference: the pass that folding the BN
 *                                   into the producer's weights (norma_bn_fold_into_weights)
 *                                   removes
 *
 *   bn_act_fusion_bench [--shape N,C[,H,W]]... [--layout nchw|nhwc] [--threads T] [--reps R]
 *                       [--warmup W] [--json FILE]
 *
 * The separate passes are plain OpenMP loops over the tensor with T threads, as a framework's
 * elementwise kernel would be.  Rounds run every operation once, in a rotating order; each
 * operation reports the median (min, max) of its rounds.
 */
#define _GNU_SOURCE
#include <norma.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void check(norma_status st, const char *what) {
  if (st != NORMA_OK) {
    fprintf(stderr, "bn_act_fusion_bench: %s: %s: %s\n", what, norma_status_string(st),
            norma_last_error());
    exit(2);
  }
}

static float *falloc(int64_t len) {
  void *p = NULL;
  if (posix_memalign(&p, 64, (size_t)len * sizeof(float))) {
    fprintf(stderr, "bn_act_fusion_bench: out of memory\n");
    exit(2);
  }
  memset(p, 0, (size_t)len * sizeof(float));
  return p;
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

enum {
  OP_BN, OP_BN_RELU, OP_BN_RELU_SEP, OP_BN_ADD_RELU, OP_BN_ADD_RELU_SEP,
  OP_BWD, OP_BWD_RELU, OP_BWD_RELU_SEP, OP_BWD_ADD_RELU, OP_BWD_ADD_RELU_SEP, OP_BWD_FROM_Y,
  OP_INFER, OP_COUNT
};
static const char *const OPNAME[OP_COUNT] = {
    "bn", "bn+relu fused", "bn, relu pass", "bn+add+relu fused", "bn, add+relu pass",
    "bwd", "bwd relu fused", "relu pass, bwd", "bwd add+relu fused", "add+relu pass, bwd",
    "bwd from y (x=NULL)", "infer (folding removes)"};
static const char *const OPKEY[OP_COUNT] = {
    "bn_fwd", "bn_relu_fused", "bn_then_relu", "bn_add_relu_fused", "bn_then_add_relu",
    "bwd", "bwd_relu_fused", "relu_bwd_then_bwd", "bwd_add_relu_fused", "add_relu_bwd_then_bwd",
    "bwd_from_y", "infer"};
/* minimum DRAM traffic in tensors (T = one tensor's bytes): reads + writes; the ReLU mask of a
   fused backward is read as a whole tensor (y), as the kernels do */
static const int TRAFFIC[OP_COUNT] = {2, 2, 4, 3, 5, 3, 4, 6, 5, 6, 3, 2};

typedef struct bufs {
  int64_t total, c;
  float *x, *res, *y, *y_bn, *y_r, *y_ar, *dy, *dx, *g;
  float *gamma, *beta, *rm, *rv, *sm, *si, *dgamma, *dbeta, *mean, *var;
  int threads;
} bufs;

static void relu_pass(const bufs *b, float *y) {
  const int64_t n = b->total;
#pragma omp parallel for num_threads(b->threads) schedule(static)
  for (int64_t i = 0; i < n; i++) y[i] = y[i] < 0.0f ? 0.0f : y[i];
}
static void add_relu_pass(const bufs *b, float *y, const float *r) {
  const int64_t n = b->total;
#pragma omp parallel for num_threads(b->threads) schedule(static)
  for (int64_t i = 0; i < n; i++) {
    const float v = y[i] + r[i];
    y[i] = v < 0.0f ? 0.0f : v;
  }
}
static void mask_pass(const bufs *b, const float *y, const float *dy, float *g) {
  const int64_t n = b->total;
#pragma omp parallel for num_threads(b->threads) schedule(static)
  for (int64_t i = 0; i < n; i++) {
    const float v = dy[i]; /* loaded unconditionally: a select, not a branch, so it vectorizes */
    g[i] = y[i] > 0.0f ? v : 0.0f;
  }
}

static void run_op(int op, const norma_bn_desc *d0, bufs *b) {
  norma_bn_desc d = *d0;
  switch (op) {
    case OP_BN:
      check(norma_bn_forward_training(&d, b->x, NULL, b->gamma, b->beta, b->y, b->sm, b->si,
                                      b->rm, b->rv, 0.1), "fwd");
      break;
    case OP_BN_RELU:
      d.flags = NORMA_BN_RELU;
      check(norma_bn_forward_training(&d, b->x, NULL, b->gamma, b->beta, b->y, b->sm, b->si,
                                      b->rm, b->rv, 0.1), "fwd relu");
      break;
    case OP_BN_RELU_SEP:
      check(norma_bn_forward_training(&d, b->x, NULL, b->gamma, b->beta, b->y, b->sm, b->si,
                                      b->rm, b->rv, 0.1), "fwd");
      relu_pass(b, b->y);
      break;
    case OP_BN_ADD_RELU:
      d.flags = NORMA_BN_ADD_RELU;
      check(norma_bn_forward_training(&d, b->x, b->res, b->gamma, b->beta, b->y, b->sm, b->si,
                                      b->rm, b->rv, 0.1), "fwd add relu");
      break;
    case OP_BN_ADD_RELU_SEP:
      check(norma_bn_forward_training(&d, b->x, NULL, b->gamma, b->beta, b->y, b->sm, b->si,
                                      b->rm, b->rv, 0.1), "fwd");
      add_relu_pass(b, b->y, b->res);
      break;
    case OP_BWD:
      check(norma_bn_backward(&d, b->x, NULL, b->dy, b->gamma, b->beta, b->sm, b->si, b->dx,
                              NULL, b->dgamma, b->dbeta), "bwd");
      break;
    case OP_BWD_RELU:
      d.flags = NORMA_BN_RELU;
      check(norma_bn_backward(&d, b->x, b->y_r, b->dy, b->gamma, b->beta, b->sm, b->si, b->dx,
                              NULL, b->dgamma, b->dbeta), "bwd relu");
      break;
    case OP_BWD_RELU_SEP:
      mask_pass(b, b->y_r, b->dy, b->g);
      check(norma_bn_backward(&d, b->x, NULL, b->g, b->gamma, b->beta, b->sm, b->si, b->dx,
                              NULL, b->dgamma, b->dbeta), "bwd");
      break;
    case OP_BWD_ADD_RELU:
      d.flags = NORMA_BN_ADD_RELU;
      check(norma_bn_backward(&d, b->x, b->y_ar, b->dy, b->gamma, b->beta, b->sm, b->si, b->dx,
                              b->g, b->dgamma, b->dbeta), "bwd add relu");
      break;
    case OP_BWD_ADD_RELU_SEP:
      mask_pass(b, b->y_ar, b->dy, b->g); /* g is dresidual and the BN's gradient */
      check(norma_bn_backward(&d, b->x, NULL, b->g, b->gamma, b->beta, b->sm, b->si, b->dx,
                              NULL, b->dgamma, b->dbeta), "bwd");
      break;
    case OP_BWD_FROM_Y:
      check(norma_bn_backward(&d, NULL, b->y_bn, b->dy, b->gamma, b->beta, b->sm, b->si, b->dx,
                              NULL, b->dgamma, b->dbeta), "bwd from y");
      break;
    default:
      check(norma_bn_forward_inference(&d, b->x, NULL, b->gamma, b->beta, b->mean, b->var,
                                       b->y), "infer");
      break;
  }
}

int main(int argc, char **argv) {
  int64_t shapes[32][4];
  int nshapes = 0, reps = 15, warmup = 2, nhwc = 0;
  int threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
  const char *json_path = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--shape") && v && nshapes < 32) {
      long long s[4] = {0, 0, 1, 1};
      if (sscanf(v, "%lld,%lld,%lld,%lld", &s[0], &s[1], &s[2], &s[3]) < 2) goto usage;
      for (int q = 0; q < 4; q++) shapes[nshapes][q] = s[q];
      nshapes++, i++;
    } else if (!strcmp(a, "--layout") && v) {
      nhwc = !strcmp(v, "nhwc"), i++;
    } else if (!strcmp(a, "--threads") && v) {
      threads = atoi(v), i++;
    } else if (!strcmp(a, "--reps") && v) {
      reps = atoi(v), i++;
    } else if (!strcmp(a, "--warmup") && v) {
      warmup = atoi(v), i++;
    } else if (!strcmp(a, "--json") && v) {
      json_path = v, i++;
    } else {
    usage:
      fprintf(stderr, "usage: bn_act_fusion_bench [--shape N,C[,H,W]]... [--layout nchw|nhwc] "
                      "[--threads T] [--reps R] [--warmup W] [--json FILE]\n");
      return 2;
    }
  }
  if (threads < 1) threads = 1;
  if (reps < 1) reps = 1;
  if (nshapes == 0) {
    static const int64_t def[][4] = {{32, 64, 56, 56}, {32, 256, 56, 56}, {32, 1024, 14, 14},
                                     {64, 4096, 1, 1}};
    nshapes = 4;
    memcpy(shapes, def, sizeof def);
  }
  norma_set_num_threads(threads);
  FILE *json = json_path ? fopen(json_path, "a") : NULL;
  if (json_path && !json) {
    perror(json_path);
    return 2;
  }
  printf("norma %s (isa %s), %d threads, %s, median of %d rounds (ms)\n", norma_version(),
         norma_isa_name(norma_get_isa()), threads, nhwc ? "NHWC" : "NCHW", reps);
  for (int si = 0; si < nshapes; si++) {
    const int64_t n = shapes[si][0], c = shapes[si][1], sp = shapes[si][2] * shapes[si][3];
    bufs b = {.total = n * c * sp, .c = c, .threads = threads};
    float **t[] = {&b.x, &b.res, &b.y, &b.y_bn, &b.y_r, &b.y_ar, &b.dy, &b.dx, &b.g};
    for (size_t q = 0; q < sizeof t / sizeof t[0]; q++) *t[q] = falloc(b.total);
    float **p[] = {&b.gamma, &b.beta, &b.rm, &b.rv, &b.sm, &b.si, &b.dgamma, &b.dbeta, &b.mean,
                   &b.var};
    for (size_t q = 0; q < sizeof p / sizeof p[0]; q++) *p[q] = falloc(c);
    uint64_t s = 88172645463325252ull;
    for (int64_t i = 0; i < b.total; i++) {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      b.x[i] = (float)((double)(s >> 40) / 16777216.0) * 4.0f - 1.0f;
      b.res[i] = (float)((double)(s & 0xffffff) / 16777216.0) - 0.5f;
      b.dy[i] = (float)((double)((s >> 20) & 0xfffff) / 1048576.0) - 0.5f;
    }
    for (int64_t j = 0; j < c; j++)
      b.gamma[j] = 1.0f + 0.01f * (float)(j % 7), b.beta[j] = 0.01f * (float)(j % 5),
      b.rv[j] = 1.0f, b.mean[j] = 1.0f, b.var[j] = 1.5f;
    const norma_bn_desc d = {.n = n, .c = c, .spatial = sp,
                             .layout = nhwc ? NORMA_CHANNELS_LAST : NORMA_CHANNELS_FIRST,
                             .dtype = NORMA_F32, .eps = 1e-5, .flags = 0};
    /* the saved outputs the backwards read: y of bn, of bn+relu, of bn+add+relu */
    run_op(OP_BN, &d, &b), memcpy(b.y_bn, b.y, sizeof(float) * (size_t)b.total);
    run_op(OP_BN_RELU, &d, &b), memcpy(b.y_r, b.y, sizeof(float) * (size_t)b.total);
    run_op(OP_BN_ADD_RELU, &d, &b), memcpy(b.y_ar, b.y, sizeof(float) * (size_t)b.total);
    double *tm = calloc((size_t)(OP_COUNT * reps), sizeof(double));
    for (int r = -warmup; r < reps; r++)
      for (int i = 0; i < OP_COUNT; i++) {
        const int op = (i + (r < 0 ? 0 : r)) % OP_COUNT;
        const double t0 = now();
        run_op(op, &d, &b);
        if (r >= 0) tm[op * reps + r] = now() - t0;
      }
    const double tbytes = (double)b.total * 4.0;
    printf("\nshape %lld,%lld,%lld,%lld  (one tensor %.1f MiB)\n", (long long)shapes[si][0],
           (long long)c, (long long)shapes[si][2], (long long)shapes[si][3], tbytes / 1048576.0);
    printf("  %-24s %9s %9s %9s  %7s %8s\n", "op", "min", "median", "max", "traffic", "GB/s");
    double med[OP_COUNT];
    for (int op = 0; op < OP_COUNT; op++) {
      double *v = tm + op * reps;
      qsort(v, (size_t)reps, sizeof(double), cmp_double);
      med[op] = reps % 2 ? v[reps / 2] : 0.5 * (v[reps / 2 - 1] + v[reps / 2]);
      printf("  %-24s %9.3f %9.3f %9.3f  %5d T %8.1f\n", OPNAME[op], v[0] * 1e3, med[op] * 1e3,
             v[reps - 1] * 1e3, TRAFFIC[op], TRAFFIC[op] * tbytes / med[op] * 1e-9);
      if (json)
        fprintf(json,
                "{\"op\": \"%s\", \"n\": %lld, \"c\": %lld, \"h\": %lld, \"w\": %lld, "
                "\"layout\": \"%s\", \"threads\": %d, \"reps\": %d, \"min_ms\": %.6f, "
                "\"median_ms\": %.6f, \"max_ms\": %.6f, \"traffic_tensors\": %d}\n",
                OPKEY[op], (long long)n, (long long)c, (long long)shapes[si][2],
                (long long)shapes[si][3], nhwc ? "nhwc" : "nchw", threads, reps, v[0] * 1e3,
                med[op] * 1e3, v[reps - 1] * 1e3, TRAFFIC[op]);
    }
    printf("  saving of the fusion (separate - fused): fwd relu %.3f ms (%.0f%%), fwd add+relu "
           "%.3f ms (%.0f%%), bwd relu %.3f ms (%.0f%%), bwd add+relu %.3f ms (%.0f%%)\n",
           (med[OP_BN_RELU_SEP] - med[OP_BN_RELU]) * 1e3,
           100.0 * (med[OP_BN_RELU_SEP] - med[OP_BN_RELU]) / med[OP_BN_RELU_SEP],
           (med[OP_BN_ADD_RELU_SEP] - med[OP_BN_ADD_RELU]) * 1e3,
           100.0 * (med[OP_BN_ADD_RELU_SEP] - med[OP_BN_ADD_RELU]) / med[OP_BN_ADD_RELU_SEP],
           (med[OP_BWD_RELU_SEP] - med[OP_BWD_RELU]) * 1e3,
           100.0 * (med[OP_BWD_RELU_SEP] - med[OP_BWD_RELU]) / med[OP_BWD_RELU_SEP],
           (med[OP_BWD_ADD_RELU_SEP] - med[OP_BWD_ADD_RELU]) * 1e3,
           100.0 * (med[OP_BWD_ADD_RELU_SEP] - med[OP_BWD_ADD_RELU]) / med[OP_BWD_ADD_RELU_SEP]);
    free(tm);
    for (size_t q = 0; q < sizeof t / sizeof t[0]; q++) free(*t[q]);
    for (size_t q = 0; q < sizeof p / sizeof p[0]; q++) free(*p[q]);
  }
  if (json) fclose(json);
  return 0;
}
