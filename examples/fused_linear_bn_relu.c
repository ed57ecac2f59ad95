/*
 * fused_linear_bn_relu.c - producer-side statistics: a training block Linear -> BatchNorm1d ->
 * ReLU in which the GEMM (OpenBLAS cblas_sgemm) produces the output in row blocks and norma's
 * split API takes the BN moments of each block while it is still in cache.
 *
 *   Z = X W^T          X [N, K] input, W [C, K] weight (PyTorch's Linear layout, out-features
 *                      outermost), Z [N, C]; no Linear bias: a training BN right after the
 *                      Linear removes any per-channel constant (its gradient is 0).
 *   Y = relu(bn(Z))    BatchNorm1d over the N rows of each of the C channels (channels-last
 *                      rows of C values, leading dimension C), batch statistics, running
 *                      statistics updated.
 *
 * Fused forward (fused_forward below):
 *   for each block of `rb` rows:  Z_blk = X_blk W^T              (cblas_sgemm)
 *                                 moments(Z_blk) -> count/mean/m2 (norma_bn_moments_accumulate)
 *   norma_bn_stats_from_moments   mean, invstd, save_*, running statistics
 *   norma_bn_forward_apply        Y = relu(bn(Z)) over the whole batch, NORMA_BN_RELU
 * The statistics need the whole batch, so the normalization cannot run block by block: what
 * the fusion saves is the statistics pass of BN over Z (one read of Z from L3 / DRAM).
 *
 * Fused backward (fused_backward below):
 *   norma_bn_backward_reduce      sum g, sum g*x_hat, sum x_hat (g = dY masked by Y > 0)
 *   norma_bn_param_grads          dgamma, dbeta
 *   for each block of rb rows:    dZ_blk = BN backward of the block (norma_bn_backward_apply,
 *                                          into an L2-sized scratch: dZ is never stored whole)
 *                                 dX_blk  = dZ_blk W                 (cblas_sgemm)
 *                                 dW     += dZ_blk^T X_blk           (cblas_sgemm, beta = 1)
 *
 * Compared with the unfused sequences over the whole batch:
 *   unfused      GEMM, then norma_bn_forward_training with NORMA_BN_RELU; backward:
 *                norma_bn_backward (NORMA_BN_RELU) into dZ, then the two GEMMs
 *   unfused-sep  GEMM, then norma_bn_forward_training, then a separate ReLU pass; backward:
 *                a separate ReLU-backward pass, norma_bn_backward, then the two GEMMs
 * and it reports the GEMMs alone and the BN alone, so that the saving can be read against
 * what BN costs.
 *
 * Threads: every variant uses the same T threads in total.  The unfused steps run one library
 * at a time, each with T threads: OpenBLAS (openblas_set_num_threads), norma
 * (norma_set_num_threads), the example's OpenMP loops (the separate ReLU passes).  The fused
 * blocks have two schedules (--schedule): "serial", one block at a time with T OpenBLAS
 * threads for its GEMM and T OpenMP threads on slices of channels for its moments; "parallel",
 * T OpenMP threads each taking whole blocks with single-threaded OpenBLAS and norma calls, so
 * that a block stays in the L2 of the core that wrote it and the two thread pools do not
 * alternate once per block.  "auto" (default): parallel when every thread gets two blocks.
 *
 * Block rows (--block-rows, default auto): the block's Z rows and X rows in half of the L2
 * that holds it, but at least MIN_GEMM_ROWS rows (see auto_block_rows).
 *
 *   fused_linear_bn_relu [--shape N,K,C]... [--reps R] [--warmup W] [--threads T]
 *                        [--block-rows B] [--schedule auto|serial|parallel] [--json FILE]
 *                        [--check-only]
 *
 * OpenBLAS 0.3.21 runs its SSE3 "Prescott" kernels on CPUs it does not know (recent Xeons):
 * set OPENBLAS_CORETYPE (e.g. SkylakeX); the program warns when it sees Prescott on AVX2.
 *
 * Exits with status 1 when the fused and unfused results differ by more than 1e-4 (relative
 * to the largest magnitude of each output), 2 on a usage or library error.
 */
#define _GNU_SOURCE
#include <cblas.h>
#include <math.h>
#include <norma.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define TOL 1e-4

static void die(const char *what, norma_status st) {
  fprintf(stderr, "fused_linear_bn_relu: %s: %s: %s\n", what, norma_status_string(st),
          norma_last_error());
  exit(2);
}
#define CHECK(call)                              \
  do {                                           \
    norma_status st_ = (call);                   \
    if (st_ != NORMA_OK) die(#call, st_);        \
  } while (0)

static void *xmalloc(size_t bytes) {
  void *p = NULL;
  if (posix_memalign(&p, 64, bytes ? bytes : 64)) {
    fprintf(stderr, "fused_linear_bn_relu: out of memory (%zu bytes)\n", bytes);
    exit(2);
  }
  return p;
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---------------------------------------------------------------------------------------- */
/* The layer                                                                                */
/* ---------------------------------------------------------------------------------------- */

typedef struct layer {
  int64_t n, k, c;          /* batch, in-features, out-features (= BN channels) */
  const float *w;           /* [c][k] */
  const float *gamma, *beta;
  float *running_mean, *running_var;
  double eps, momentum;
  int threads;              /* T: OpenBLAS, norma and the example's OpenMP regions */
  int64_t block_rows;       /* rb */
  int parallel_blocks;      /* fused schedule: 0 = serial blocks, 1 = parallel blocks */
} layer;

/* What the forward keeps for the backward (as PyTorch keeps the BN input and output). */
typedef struct saved {
  float *z, *y;             /* [n][c]: the Linear output (BN input) and the block output */
  float *save_mean, *save_invstd;  /* [c], as norma_bn_forward_training writes them */
  double *mean, *invstd;    /* [c], the same in double (split API) */
} saved;

typedef struct grads {
  float *dx;                /* [n][k] */
  float *dw;                /* [c][k] */
  float *dgamma, *dbeta;    /* [c] */
} grads;

/* Scratch of the fused path, allocated once. */
typedef struct fused_ws {
  int64_t *count;           /* [c] running moments */
  double *mean, *m2;        /* [c] */
  int64_t *bcount;          /* parallel blocks: [nblocks][c] moments of each block */
  double *bmean, *bm2;
  double *sum_dy, *sum_dy_xhat, *sum_xhat; /* [c] backward sums */
  float *dz_block;          /* [T][rb][c]: dZ of one block per thread, never the whole dZ */
  float *dw_part;           /* parallel blocks: [T - 1][c][k] partial dW of threads 1.. */
} fused_ws;

static norma_bn_desc bn_desc(const layer *L, int64_t rows, unsigned flags) {
  norma_bn_desc d = {.n = rows, .c = L->c, .spatial = 1, .layout = NORMA_CHANNELS_LAST,
                     .dtype = NORMA_F32, .eps = L->eps, .flags = flags};
  return d;
}

/* Z[rows] = X[rows] W^T for the rows r0 .. r0 + m of the batch. */
static void linear_rows(const layer *L, const float *x, int64_t r0, int64_t m, float *z) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)L->c, (int)L->k, 1.0f,
              x + r0 * L->k, (int)L->k, L->w, (int)L->k, 0.0f, z + r0 * L->c, (int)L->c);
}

/* Merges the moments of the block Z[m][c] (leading dimension c) into ws->count/mean/m2.
   norma_bn_moments_accumulate is single-threaded ("the producer owns the threads"): the T
   threads take disjoint slices of channels, so each channel sees the blocks in the same order
   whatever T is, and the statistics do not depend on the thread count.  Slices are whole
   multiples of 64 channels. */
static void accumulate_block(const layer *L, const float *zb, int64_t m, fused_ws *ws) {
  const int64_t c = L->c;
  int T = L->threads;
  if ((int64_t)T * 64 > c) T = (int)(c / 64) > 0 ? (int)(c / 64) : 1;
  if (T == 1) {
    CHECK(norma_bn_moments_accumulate(NORMA_F32, m, c, zb, c, 1, ws->count, ws->mean, ws->m2));
    return;
  }
  norma_status st_all = NORMA_OK;
#pragma omp parallel num_threads(T)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t units = (c + 63) / 64;
    const int64_t u0 = units * t / nt, u1 = units * (t + 1) / nt;
    const int64_t c0 = u0 * 64, c1 = u1 * 64 < c ? u1 * 64 : c;
    if (c1 > c0) {
      norma_status st = norma_bn_moments_accumulate(NORMA_F32, m, c1 - c0, zb + c0, c, 1,
                                                    ws->count + c0, ws->mean + c0, ws->m2 + c0);
      if (st != NORMA_OK) {
#pragma omp critical
        st_all = st;
      }
    }
  }
  if (st_all != NORMA_OK) die("norma_bn_moments_accumulate", st_all);
}

/* The fused forward.  Y may be Z (in place) when no backward follows; a training step keeps
   Z, because the ReLU backward needs both Z (x_hat) and Y (the mask).

   Two schedules of the blocks over the T threads (the statistics are bitwise the same):
   - serial blocks: one block at a time, the GEMM with T OpenBLAS threads, then the moments
     with T threads on channel slices (accumulate_block).  The block is spread over the L2 of
     the T cores.
   - parallel blocks: the T threads take blocks (OpenMP, static), each runs its GEMM with
     OpenBLAS single-threaded in the calling thread and takes the moments of its block into
     the block's own slot; the slots are merged in block order afterwards, so the result is the
     same for every T.  The block stays in the L2 of the core that wrote it, and no second
     thread pool (OpenBLAS's) wakes up between the GEMM and the moments. */
static void fused_forward(const layer *L, const float *x, saved *s, fused_ws *ws) {
  const int64_t n = L->n, c = L->c, rb = L->block_rows, nb = (n + rb - 1) / rb;
  for (int64_t j = 0; j < c; j++) ws->count[j] = 0, ws->mean[j] = 0.0, ws->m2[j] = 0.0;
  if (!L->parallel_blocks) {
    for (int64_t r0 = 0; r0 < n; r0 += rb) {
      const int64_t m = n - r0 < rb ? n - r0 : rb;
      linear_rows(L, x, r0, m, s->z);                 /* the block is written ...            */
      accumulate_block(L, s->z + r0 * c, m, ws);      /* ... its moments taken while in L2   */
    }
  } else {
    norma_status st_all = NORMA_OK;
    openblas_set_num_threads(1);
#pragma omp parallel for num_threads(L->threads) schedule(static)
    for (int64_t bi = 0; bi < nb; bi++) {
      const int64_t r0 = bi * rb, m = n - r0 < rb ? n - r0 : rb;
      int64_t *cnt = ws->bcount + bi * c;
      double *mu = ws->bmean + bi * c, *m2 = ws->bm2 + bi * c;
      for (int64_t j = 0; j < c; j++) cnt[j] = 0, mu[j] = 0.0, m2[j] = 0.0;
      linear_rows(L, x, r0, m, s->z);
      norma_status st = norma_bn_moments_accumulate(NORMA_F32, m, c, s->z + r0 * c, c, 1, cnt,
                                                    mu, m2);
      if (st != NORMA_OK) {
#pragma omp critical
        st_all = st;
      }
    }
    openblas_set_num_threads(L->threads);
    if (st_all != NORMA_OK) die("norma_bn_moments_accumulate", st_all);
    for (int64_t bi = 0; bi < nb; bi++)
      CHECK(norma_bn_moments_merge(c, ws->count, ws->mean, ws->m2, ws->bcount + bi * c,
                                   ws->bmean + bi * c, ws->bm2 + bi * c));
  }
  const norma_bn_desc d = bn_desc(L, n, NORMA_BN_RELU);
  CHECK(norma_bn_stats_from_moments(&d, ws->count, ws->mean, ws->m2, s->mean, s->invstd,
                                    s->save_mean, s->save_invstd, L->running_mean,
                                    L->running_var, L->momentum));
  CHECK(norma_bn_forward_apply(&d, s->z, NULL, L->gamma, L->beta, s->mean, s->invstd, s->y));
}

/* BN backward of the rows r0 .. r0 + m into dzb, then the two GEMMs of the Linear for these
   rows while dzb is in cache: dX_blk = dZ_blk W, dW (+)= dZ_blk^T X_blk. */
static norma_status backward_block(const layer *L, const float *x, const saved *s,
                                   const float *dy, const fused_ws *ws, int64_t r0, int64_t m,
                                   float *dzb, float *dx, float *dw, int first) {
  const int64_t n = L->n, c = L->c, k = L->k;
  const norma_bn_desc db = bn_desc(L, m, NORMA_BN_RELU);
  norma_status st = norma_bn_backward_apply(&db, s->z + r0 * c, s->y + r0 * c, dy + r0 * c,
                                            L->gamma, L->beta, s->mean, s->invstd, ws->sum_dy,
                                            ws->sum_dy_xhat, ws->sum_xhat, n, dzb, NULL);
  if (st != NORMA_OK) return st;
  /* dX[m][k] = dZ_blk[m][c] W[c][k] */
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)k, (int)c, 1.0f, dzb,
              (int)c, L->w, (int)k, 0.0f, dx + r0 * k, (int)k);
  /* dW[c][k] (+)= dZ_blk^T[c][m] X_blk[m][k] */
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)c, (int)k, (int)m, 1.0f, dzb,
              (int)c, x + r0 * k, (int)k, first ? 0.0f : 1.0f, dw, (int)k);
  return NORMA_OK;
}

/* The fused backward: one reduction over the batch (the sums need every row before any dZ),
   then block by block the BN backward and the two GEMMs of the Linear while dZ of the block is
   in cache.  dZ is never stored whole: each thread has one block of scratch.
   Serial blocks: one block at a time, every call with T threads; dW accumulates block after
   block.  Parallel blocks: each thread takes blocks with single-threaded norma and OpenBLAS
   calls, accumulates its own partial dW (thread 0 in dW itself), and the partials are added
   in thread order at the end (so dW's rounding depends on T, nothing else does). */
static void fused_backward(const layer *L, const float *x, const saved *s, const float *dy,
                           grads *g, fused_ws *ws) {
  const int64_t n = L->n, c = L->c, k = L->k, rb = L->block_rows, nb = (n + rb - 1) / rb;
  const norma_bn_desc d = bn_desc(L, n, NORMA_BN_RELU);
  CHECK(norma_bn_backward_reduce(&d, s->z, s->y, dy, L->gamma, L->beta, s->mean, s->invstd,
                                 ws->sum_dy, ws->sum_dy_xhat, ws->sum_xhat));
  CHECK(norma_bn_param_grads(&d, ws->sum_dy, ws->sum_dy_xhat, ws->sum_xhat, n, g->dgamma,
                             g->dbeta));
  if (!L->parallel_blocks) {
    for (int64_t bi = 0; bi < nb; bi++) {
      const int64_t r0 = bi * rb, m = n - r0 < rb ? n - r0 : rb;
      CHECK(backward_block(L, x, s, dy, ws, r0, m, ws->dz_block, g->dx, g->dw, bi == 0));
    }
    return;
  }
  const int T = nb < L->threads ? (int)nb : L->threads;
  norma_status st_all = NORMA_OK;
  openblas_set_num_threads(1);
  norma_set_num_threads(1);
#pragma omp parallel num_threads(T)
  {
    const int t = omp_get_thread_num();
    float *dw = t == 0 ? g->dw : ws->dw_part + (size_t)(t - 1) * (size_t)(c * k);
    int first = 1;
#pragma omp for schedule(static)
    for (int64_t bi = 0; bi < nb; bi++) {
      const int64_t r0 = bi * rb, m = n - r0 < rb ? n - r0 : rb;
      norma_status st = backward_block(L, x, s, dy, ws, r0, m, ws->dz_block + (size_t)t * (size_t)(rb * c),
                                       g->dx, dw, first);
      first = 0;
      if (st != NORMA_OK) {
#pragma omp critical
        st_all = st;
      }
    }
    if (first) memset(dw, 0, sizeof(float) * (size_t)(c * k)); /* a thread without blocks */
  }
  openblas_set_num_threads(L->threads);
  norma_set_num_threads(L->threads);
  if (st_all != NORMA_OK) die("norma_bn_backward_apply", st_all);
  if (T > 1) {
    const int64_t total = c * k;
#pragma omp parallel for num_threads(L->threads) schedule(static)
    for (int64_t i = 0; i < total; i++) {
      float v = g->dw[i];
      for (int t = 1; t < T; t++) v += ws->dw_part[(size_t)(t - 1) * (size_t)total + (size_t)i];
      g->dw[i] = v;
    }
  }
}

/* ---- the unfused sequences (whole batch per step) ---------------------------------------- */

static void linear_backward_full(const layer *L, const float *x, const float *dz, grads *g) {
  const int n = (int)L->n, c = (int)L->c, k = (int)L->k;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, k, c, 1.0f, dz, c, L->w, k, 0.0f,
              g->dx, k);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, c, k, n, 1.0f, dz, c, x, k, 0.0f, g->dw,
              k);
}

static void unfused_forward(const layer *L, const float *x, saved *s) {
  linear_rows(L, x, 0, L->n, s->z);
  const norma_bn_desc d = bn_desc(L, L->n, NORMA_BN_RELU);
  CHECK(norma_bn_forward_training(&d, s->z, NULL, L->gamma, L->beta, s->y, s->save_mean,
                                  s->save_invstd, L->running_mean, L->running_var,
                                  L->momentum));
}

static void unfused_backward(const layer *L, const float *x, const saved *s, const float *dy,
                             float *dz, grads *g) {
  const norma_bn_desc d = bn_desc(L, L->n, NORMA_BN_RELU);
  CHECK(norma_bn_backward(&d, s->z, s->y, dy, L->gamma, L->beta, s->save_mean, s->save_invstd,
                          dz, NULL, g->dgamma, g->dbeta));
  linear_backward_full(L, x, dz, g);
}

/* ReLU as its own pass: y = max(0, y) in place (NaN passes through, as norma's fused ReLU). */
static void relu_pass(const layer *L, float *y) {
  const int64_t total = L->n * L->c;
#pragma omp parallel for num_threads(L->threads) schedule(static)
  for (int64_t i = 0; i < total; i++) y[i] = y[i] < 0.0f ? 0.0f : y[i];
}

/* ReLU backward as its own pass: g = dy where y > 0, else 0. */
static void relu_backward_pass(const layer *L, const float *y, const float *dy, float *g) {
  const int64_t total = L->n * L->c;
#pragma omp parallel for num_threads(L->threads) schedule(static)
  for (int64_t i = 0; i < total; i++) {
    const float v = dy[i]; /* loaded unconditionally: a select, not a branch, so it vectorizes */
    g[i] = y[i] > 0.0f ? v : 0.0f;
  }
}

static void unfused_sep_forward(const layer *L, const float *x, saved *s) {
  linear_rows(L, x, 0, L->n, s->z);
  const norma_bn_desc d = bn_desc(L, L->n, 0);
  CHECK(norma_bn_forward_training(&d, s->z, NULL, L->gamma, L->beta, s->y, s->save_mean,
                                  s->save_invstd, L->running_mean, L->running_var,
                                  L->momentum));
  relu_pass(L, s->y);
}

static void unfused_sep_backward(const layer *L, const float *x, const saved *s,
                                 const float *dy, float *dz, grads *g) {
  relu_backward_pass(L, s->y, dy, dz);
  const norma_bn_desc d = bn_desc(L, L->n, 0);
  CHECK(norma_bn_backward(&d, s->z, NULL, dz, L->gamma, L->beta, s->save_mean, s->save_invstd,
                          dz, NULL, g->dgamma, g->dbeta)); /* dx == dy: in place */
  linear_backward_full(L, x, dz, g);
}

/* ---- the parts alone ------------------------------------------------------------------- */

static void gemm_forward(const layer *L, const float *x, saved *s) {
  linear_rows(L, x, 0, L->n, s->z);
}
static void gemm_backward(const layer *L, const float *x, const float *dz, grads *g) {
  linear_backward_full(L, x, dz, g);
}
static void bn_forward(const layer *L, saved *s) {
  const norma_bn_desc d = bn_desc(L, L->n, NORMA_BN_RELU);
  CHECK(norma_bn_forward_training(&d, s->z, NULL, L->gamma, L->beta, s->y, s->save_mean,
                                  s->save_invstd, L->running_mean, L->running_var,
                                  L->momentum));
}
static void bn_backward(const layer *L, const saved *s, const float *dy, float *dz,
                        grads *g) {
  const norma_bn_desc d = bn_desc(L, L->n, NORMA_BN_RELU);
  CHECK(norma_bn_backward(&d, s->z, s->y, dy, L->gamma, L->beta, s->save_mean, s->save_invstd,
                          dz, NULL, g->dgamma, g->dbeta));
}

/* ---------------------------------------------------------------------------------------- */
/* Driver: data, verification, timing                                                       */
/* ---------------------------------------------------------------------------------------- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float frand(void) { /* uniform in [-1, 1) */
  rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
  return (float)((double)(rng_state >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

/* max |a - b| / max |b|: the error relative to the output's scale (elementwise relative error
   means nothing where a value crosses 0, as ReLU outputs and gradients do). */
static double rel_diff(const float *a, const float *b, int64_t len) {
  double dmax = 0.0, bmax = 0.0;
  for (int64_t i = 0; i < len; i++) {
    const double d = fabs((double)a[i] - (double)b[i]), m = fabs((double)b[i]);
    if (!(d <= dmax)) dmax = d; /* NaN sticks */
    if (m > bmax) bmax = m;
  }
  return bmax > 0.0 ? dmax / bmax : dmax;
}

enum { V_GEMM, V_BN, V_UNFUSED, V_UNFUSED_SEP, V_FUSED, V_COUNT };
static const char *const VNAME[V_COUNT] = {"gemm", "bn", "unfused", "unfused_sep", "fused"};

typedef struct stats3 { double min, med, max; } stats3;

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}
static stats3 summarize(const double *t, int n) {
  double *s = xmalloc(sizeof(double) * (size_t)n);
  memcpy(s, t, sizeof(double) * (size_t)n);
  qsort(s, (size_t)n, sizeof(double), cmp_double);
  stats3 r = {s[0], n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]), s[n - 1]};
  free(s);
  return r;
}

typedef struct bufs {
  float *x, *w, *gamma, *beta, *rm, *rv, *dy, *dz;
  saved s;
  grads g;
  fused_ws ws;
} bufs;

static void alloc_bufs(const layer *L, bufs *b) {
  const size_t n = (size_t)L->n, k = (size_t)L->k, c = (size_t)L->c;
  const size_t rb = (size_t)L->block_rows;
  b->x = xmalloc(4 * n * k), b->w = xmalloc(4 * c * k);
  b->gamma = xmalloc(4 * c), b->beta = xmalloc(4 * c), b->rm = xmalloc(4 * c),
  b->rv = xmalloc(4 * c);
  b->dy = xmalloc(4 * n * c), b->dz = xmalloc(4 * n * c);
  b->s.z = xmalloc(4 * n * c), b->s.y = xmalloc(4 * n * c);
  b->s.save_mean = xmalloc(4 * c), b->s.save_invstd = xmalloc(4 * c);
  b->s.mean = xmalloc(8 * c), b->s.invstd = xmalloc(8 * c);
  b->g.dx = xmalloc(4 * n * k), b->g.dw = xmalloc(4 * c * k);
  b->g.dgamma = xmalloc(4 * c), b->g.dbeta = xmalloc(4 * c);
  b->ws.count = xmalloc(8 * c), b->ws.mean = xmalloc(8 * c), b->ws.m2 = xmalloc(8 * c);
  b->ws.sum_dy = xmalloc(8 * c), b->ws.sum_dy_xhat = xmalloc(8 * c),
  b->ws.sum_xhat = xmalloc(8 * c);
  const size_t nb = (n + rb - 1) / rb, T = (size_t)L->threads;
  const size_t pb = L->parallel_blocks ? nb : 0;
  b->ws.bcount = xmalloc(8 * pb * c), b->ws.bmean = xmalloc(8 * pb * c),
  b->ws.bm2 = xmalloc(8 * pb * c);
  b->ws.dz_block = xmalloc(4 * T * rb * c);
  b->ws.dw_part = xmalloc(L->parallel_blocks && T > 1 ? 4 * (T - 1) * c * k : 0);
  const float ws = 1.0f / sqrtf((float)k);
  for (size_t i = 0; i < n * k; i++) b->x[i] = frand();
  for (size_t i = 0; i < c * k; i++) b->w[i] = ws * frand();
  for (size_t j = 0; j < c; j++) {
    b->gamma[j] = 1.0f + 0.25f * frand(), b->beta[j] = 0.1f * frand();
    b->rm[j] = 0.0f, b->rv[j] = 1.0f;
  }
  for (size_t i = 0; i < n * c; i++) b->dy[i] = frand(), b->dz[i] = 0.0f;
  /* touch every output so that no first-touch page fault lands in a timed run */
  memset(b->s.z, 0, 4 * n * c), memset(b->s.y, 0, 4 * n * c);
  memset(b->g.dx, 0, 4 * n * k), memset(b->g.dw, 0, 4 * c * k);
  memset(b->ws.dz_block, 0, 4 * T * rb * c);
  if (L->parallel_blocks && T > 1) memset(b->ws.dw_part, 0, 4 * (T - 1) * c * k);
}

static void free_bufs(bufs *b) {
  void *p[] = {b->x, b->w, b->gamma, b->beta, b->rm, b->rv, b->dy, b->dz, b->s.z, b->s.y,
               b->s.save_mean, b->s.save_invstd, b->s.mean, b->s.invstd, b->g.dx, b->g.dw,
               b->g.dgamma, b->g.dbeta, b->ws.count, b->ws.mean, b->ws.m2, b->ws.sum_dy,
               b->ws.sum_dy_xhat, b->ws.sum_xhat, b->ws.dz_block, b->ws.bcount, b->ws.bmean, b->ws.bm2,
               b->ws.dw_part};
  for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
}

static void forward_variant(int v, layer *L, bufs *b) {
  switch (v) {
    case V_GEMM: gemm_forward(L, b->x, &b->s); break;
    case V_BN: bn_forward(L, &b->s); break;
    case V_UNFUSED: unfused_forward(L, b->x, &b->s); break;
    case V_UNFUSED_SEP: unfused_sep_forward(L, b->x, &b->s); break;
    default: fused_forward(L, b->x, &b->s, &b->ws); break;
  }
}

static void backward_variant(int v, layer *L, bufs *b) {
  switch (v) {
    case V_GEMM: gemm_backward(L, b->x, b->dz, &b->g); break;
    case V_BN: bn_backward(L, &b->s, b->dy, b->dz, &b->g); break;
    case V_UNFUSED: unfused_backward(L, b->x, &b->s, b->dy, b->dz, &b->g); break;
    case V_UNFUSED_SEP: unfused_sep_backward(L, b->x, &b->s, b->dy, b->dz, &b->g); break;
    default: fused_backward(L, b->x, &b->s, b->dy, &b->g, &b->ws); break;
  }
}

/* One forward and one backward of variant v; returns their times in t[0], t[1]. */
static void run_variant(int v, layer *L, bufs *b, double t[2]) {
  const double t0 = now();
  forward_variant(v, L, b);
  const double t1 = now();
  backward_variant(v, L, b);
  t[0] = t1 - t0, t[1] = now() - t1;
}

static float *dup_floats(const float *p, int64_t len) {
  float *q = xmalloc(sizeof(float) * (size_t)len);
  memcpy(q, p, sizeof(float) * (size_t)len);
  return q;
}

static double report(FILE *log, const char *what, const char *const *names, const double *e,
                     int count) {
  double worst = 0.0;
  fprintf(log, "  check %-34s", what);
  for (int q = 0; q < count; q++) {
    fprintf(log, " %s %.1e%s", names[q], e[q], e[q] <= TOL ? "" : " (FAIL)");
    if (!(e[q] <= worst)) worst = e[q];
  }
  fprintf(log, "\n");
  return worst;
}

/* The double-precision reference of the whole block, for shapes small enough (n k c <= 2^28):
   forward from X and W, and the backward with the ReLU mask of the given float y (the mask is
   where a 1-ulp difference of the forward flips a gradient, so every backward is checked on
   the same mask).  Compares against the unfused results in the buffers of b. */
static double reference_check(const layer *L, const bufs *b, const float *y_ref,
                              const float *rm_ref, const float *rv_ref, FILE *log) {
  const int64_t n = L->n, k = L->k, c = L->c;
  double *z = malloc(sizeof(double) * (size_t)(n * c)), *dz = malloc(sizeof(double) * (size_t)(n * c));
  double *mu = calloc((size_t)c, sizeof(double)), *is = calloc((size_t)c, sizeof(double));
  double *sg = calloc((size_t)c, sizeof(double)), *sgx = calloc((size_t)c, sizeof(double));
  float *yd = xmalloc(4 * (size_t)(n * c)), *dxd = xmalloc(4 * (size_t)(n * k)),
        *dwd = xmalloc(4 * (size_t)(c * k)), *pd = xmalloc(4 * (size_t)(4 * c));
  if (!z || !dz || !mu || !is || !sg || !sgx) die("reference: out of memory", NORMA_ERR_OUT_OF_MEMORY);
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < c; j++) {
      double acc = 0.0;
      for (int64_t q = 0; q < k; q++) acc += (double)b->x[i * k + q] * (double)L->w[j * k + q];
      z[i * c + j] = acc;
    }
  for (int64_t j = 0; j < c; j++) {
    double s = 0.0, v = 0.0;
    for (int64_t i = 0; i < n; i++) s += z[i * c + j];
    mu[j] = s / (double)n;
    for (int64_t i = 0; i < n; i++) v += (z[i * c + j] - mu[j]) * (z[i * c + j] - mu[j]);
    is[j] = 1.0 / sqrt(v / (double)n + L->eps);
    pd[2 * c + j] = (float)(0.9 * 0.0 + 0.1 * mu[j]);                        /* running_mean */
    pd[3 * c + j] = (float)(0.9 * 1.0 + 0.1 * v / (double)(n - 1));           /* running_var */
    for (int64_t i = 0; i < n; i++) {
      const double t = (z[i * c + j] - mu[j]) * is[j] * L->gamma[j] + L->beta[j];
      yd[i * c + j] = (float)(t > 0.0 ? t : 0.0);
    }
  }
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < c; j++) {
      const double g = y_ref[i * c + j] > 0.0f ? (double)b->dy[i * c + j] : 0.0;
      sg[j] += g, sgx[j] += g * (z[i * c + j] - mu[j]) * is[j];
    }
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < c; j++) {
      const double g = y_ref[i * c + j] > 0.0f ? (double)b->dy[i * c + j] : 0.0;
      const double xh = (z[i * c + j] - mu[j]) * is[j];
      dz[i * c + j] = L->gamma[j] * is[j] * (g - sg[j] / (double)n - xh * sgx[j] / (double)n);
    }
  for (int64_t i = 0; i < n; i++)
    for (int64_t q = 0; q < k; q++) {
      double acc = 0.0;
      for (int64_t j = 0; j < c; j++) acc += dz[i * c + j] * (double)L->w[j * k + q];
      dxd[i * k + q] = (float)acc;
    }
  for (int64_t j = 0; j < c; j++) {
    for (int64_t q = 0; q < k; q++) {
      double acc = 0.0;
      for (int64_t i = 0; i < n; i++) acc += dz[i * c + j] * (double)b->x[i * k + q];
      dwd[j * k + q] = (float)acc;
    }
    pd[j] = (float)sgx[j], pd[c + j] = (float)sg[j];
  }
  const char *names[] = {"y", "running_mean", "running_var", "dx", "dw", "dgamma", "dbeta"};
  const double e[] = {rel_diff(y_ref, yd, n * c),       rel_diff(rm_ref, pd + 2 * c, c),
                      rel_diff(rv_ref, pd + 3 * c, c),  rel_diff(b->g.dx, dxd, n * k),
                      rel_diff(b->g.dw, dwd, c * k),    rel_diff(b->g.dgamma, pd, c),
                      rel_diff(b->g.dbeta, pd + c, c)};
  const double worst = report(log, "unfused vs double reference:", names, e, 7);
  free(z), free(dz), free(mu), free(is), free(sg), free(sgx), free(yd), free(dxd), free(dwd),
      free(pd);
  return worst;
}

/* Verification, before any timing:
   - forward: unfused, unfused-sep and fused each run from the same running statistics; y and
     the running statistics are compared with unfused's;
   - backward: each runs from the same saved state (unfused's Z, Y, save_mean, save_invstd),
     because a 1-ulp difference of the forward (the blocked GEMM, the statistics merged block by
     block) can flip the ReLU mask of a value that is ~0, and that changes its gradient by a
     whole dy: a legitimate difference that says nothing about the backward itself;
   - for small shapes, unfused against a double-precision reference.
   Returns the largest relative difference. */
static double verify(layer *L, bufs *b, FILE *log) {
  const int64_t n = L->n, k = L->k, c = L->c;
  double worst = 0.0, w;
  /* forward */
  for (int64_t j = 0; j < c; j++) b->rm[j] = 0.0f, b->rv[j] = 1.0f;
  forward_variant(V_UNFUSED, L, b);
  float *z0 = dup_floats(b->s.z, n * c), *y0 = dup_floats(b->s.y, n * c), *sm0 = dup_floats(b->s.save_mean, c),
        *si0 = dup_floats(b->s.save_invstd, c), *rm0 = dup_floats(b->rm, c), *rv0 = dup_floats(b->rv, c);
  const int others[] = {V_UNFUSED_SEP, V_FUSED};
  for (int i = 0; i < 2; i++) {
    for (int64_t j = 0; j < c; j++) b->rm[j] = 0.0f, b->rv[j] = 1.0f;
    forward_variant(others[i], L, b);
    const char *names[] = {"y", "running_mean", "running_var", "save_mean", "save_invstd"};
    const double e[] = {rel_diff(b->s.y, y0, n * c), rel_diff(b->rm, rm0, c),
                        rel_diff(b->rv, rv0, c), rel_diff(b->s.save_mean, sm0, c),
                        rel_diff(b->s.save_invstd, si0, c)};
    char what[64];
    snprintf(what, sizeof what, "forward  %s vs unfused:", VNAME[others[i]]);
    w = report(log, what, names, e, 5);
    if (!(w <= worst)) worst = w;
  }
  /* backward, every variant from unfused's forward state */
  const int vs[] = {V_UNFUSED, V_UNFUSED_SEP, V_FUSED};
  float *dx0 = NULL, *dw0 = NULL, *dg0 = NULL, *db0 = NULL;
  for (int i = 0; i < 3; i++) {
    memcpy(b->s.z, z0, 4 * (size_t)(n * c)), memcpy(b->s.y, y0, 4 * (size_t)(n * c));
    memcpy(b->s.save_mean, sm0, 4 * (size_t)c), memcpy(b->s.save_invstd, si0, 4 * (size_t)c);
    for (int64_t j = 0; j < c; j++) b->s.mean[j] = sm0[j], b->s.invstd[j] = si0[j];
    memset(b->g.dx, 0, 4 * (size_t)(n * k)), memset(b->g.dw, 0, 4 * (size_t)(c * k));
    backward_variant(vs[i], L, b);
    if (i == 0) {
      dx0 = dup_floats(b->g.dx, n * k), dw0 = dup_floats(b->g.dw, c * k), dg0 = dup_floats(b->g.dgamma, c),
      db0 = dup_floats(b->g.dbeta, c);
      continue;
    }
    const char *names[] = {"dx", "dw", "dgamma", "dbeta"};
    const double e[] = {rel_diff(b->g.dx, dx0, n * k), rel_diff(b->g.dw, dw0, c * k),
                        rel_diff(b->g.dgamma, dg0, c), rel_diff(b->g.dbeta, db0, c)};
    char what[64];
    snprintf(what, sizeof what, "backward %s vs unfused:", VNAME[vs[i]]);
    w = report(log, what, names, e, 4);
    if (!(w <= worst)) worst = w;
  }
  if ((double)n * (double)k * (double)c <= (double)(1 << 28)) {
    memcpy(b->g.dx, dx0, 4 * (size_t)(n * k)), memcpy(b->g.dw, dw0, 4 * (size_t)(c * k));
    memcpy(b->g.dgamma, dg0, 4 * (size_t)c), memcpy(b->g.dbeta, db0, 4 * (size_t)c);
    w = reference_check(L, b, y0, rm0, rv0, log);
    if (!(w <= worst)) worst = w;
  }
  free(z0), free(y0), free(sm0), free(si0), free(rm0), free(rv0), free(dx0), free(dw0),
      free(dg0), free(db0);
  return worst;
}

static long l2_bytes(void) {
  long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE); /* per core */
  return l2 > 0 ? l2 : 1L << 20;
}

/* The block's output rows and input rows take at most half of the L2 that holds the block
   (the other half: the GEMM's packed panels of W): one core's L2 with parallel blocks, the L2
   of the T cores that share the block with serial blocks.  But never fewer than MIN_GEMM_ROWS
   rows: cblas_sgemm packs all of W on every call, a cost of about (some tens of rows) / rb of
   the GEMM, which at 32 to 128 rows outweighs anything the fusion saves (docs/fusion.md). */
#define MIN_GEMM_ROWS 256
static int64_t auto_block_rows(const layer *L) {
  const int64_t bytes_per_row = (L->k + L->c) * (int64_t)sizeof(float);
  const int64_t cores = L->parallel_blocks ? 1 : L->threads;
  int64_t rb = (int64_t)l2_bytes() * cores / 2 / bytes_per_row;
  rb = rb / 8 * 8;
  if (rb < MIN_GEMM_ROWS) rb = MIN_GEMM_ROWS;
  if (rb > L->n) rb = L->n;
  return rb;
}

typedef struct options {
  int64_t shapes[32][3];
  int nshapes;
  int reps, warmup, threads;
  int64_t block_rows;
  int schedule; /* 0 serial, 1 parallel, -1 auto */
  const char *json;
  int check_only;
} options;

static void usage(void) {
  fprintf(stderr,
          "usage: fused_linear_bn_relu [--shape N,K,C]... [--reps R] [--warmup W] "
          "[--threads T] [--block-rows B] [--schedule auto|serial|parallel] [--json FILE] "
          "[--check-only]\n"
          "  default shapes: the seed_nc BatchNorm1d shapes with K = C (64,1024,1024 "
          "64,2048,2048 64,4096,4096 128,4096,4096), 4096,1024,1024 and 25088,64,256\n");
  exit(2);
}

static void parse(int argc, char **argv, options *o) {
  memset(o, 0, sizeof *o);
  o->reps = 20, o->warmup = 3, o->schedule = -1;
  o->threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
  if (o->threads < 1) o->threads = 1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--shape") && v) {
      long long n = 0, k = 0, c = 0; /* usage() exits; clang cannot tell */
      if (o->nshapes == 32 || sscanf(v, "%lld,%lld,%lld", &n, &k, &c) != 3 || n < 2 || k < 1 ||
          c < 1)
        usage();
      o->shapes[o->nshapes][0] = n, o->shapes[o->nshapes][1] = k, o->shapes[o->nshapes][2] = c;
      o->nshapes++, i++;
    } else if (!strcmp(a, "--reps") && v) {
      o->reps = atoi(v), i++;
    } else if (!strcmp(a, "--warmup") && v) {
      o->warmup = atoi(v), i++;
    } else if (!strcmp(a, "--threads") && v) {
      o->threads = atoi(v), i++;
    } else if (!strcmp(a, "--block-rows") && v) {
      o->block_rows = atoll(v), i++;
    } else if (!strcmp(a, "--schedule") && v) {
      if (!strcmp(v, "serial")) o->schedule = 0;
      else if (!strcmp(v, "parallel")) o->schedule = 1;
      else if (!strcmp(v, "auto")) o->schedule = -1;
      else usage();
      i++;
    } else if (!strcmp(a, "--json") && v) {
      o->json = v, i++;
    } else if (!strcmp(a, "--check-only")) {
      o->check_only = 1;
    } else {
      usage();
    }
  }
  if (o->reps < 1 || o->warmup < 0 || o->threads < 1 || o->block_rows < 0) usage();
  if (o->nshapes == 0) {
    static const int64_t def[][3] = {{64, 1024, 1024},   {64, 2048, 2048},
                                     {64, 4096, 4096},   {128, 4096, 4096},
                                     {4096, 1024, 1024}, {25088, 64, 256}};
    o->nshapes = 6;
    memcpy(o->shapes, def, sizeof def);
  }
}

int main(int argc, char **argv) {
  options o;
  parse(argc, argv, &o);
  openblas_set_num_threads(o.threads);
  norma_set_num_threads(o.threads);
  FILE *json = NULL;
  if (o.json && !(json = fopen(o.json, "a"))) {
    perror(o.json);
    return 2;
  }
  const char *core = openblas_get_corename();
  printf("norma %s (isa %s), %s (core %s), threads %d (OpenBLAS %d, norma %d), L2 %ld "
         "bytes per core\n",
         norma_version(), norma_isa_name(norma_get_isa()), openblas_get_config(), core,
         o.threads, openblas_get_num_threads(), norma_get_num_threads(), l2_bytes());
#if defined(__x86_64__)
  if (core && !strcmp(core, "Prescott") && __builtin_cpu_supports("avx2"))
    printf("warning: OpenBLAS runs its Prescott (SSE3) kernels on an AVX2 CPU it does not "
           "recognize; set OPENBLAS_CORETYPE=SkylakeX (AVX-512) or Haswell (AVX2)\n");
#endif
  int failed = 0;
  for (int si = 0; si < o.nshapes; si++) {
    layer L = {.n = o.shapes[si][0], .k = o.shapes[si][1], .c = o.shapes[si][2], .eps = 1e-5,
               .momentum = 0.1, .threads = o.threads};
    /* auto: parallel blocks when every thread gets at least two blocks of the L2 size of one
       core, serial blocks otherwise (few rows: the T threads share each block's GEMM) */
    L.parallel_blocks = o.schedule >= 0 ? o.schedule : 1;
    if (o.schedule < 0 && (L.n + auto_block_rows(&L) - 1) / auto_block_rows(&L) < 2 * L.threads)
      L.parallel_blocks = 0;
    if (L.threads == 1) L.parallel_blocks = 0; /* the same thing with one thread */
    L.block_rows = o.block_rows ? (o.block_rows < L.n ? o.block_rows : L.n) : auto_block_rows(&L);
    bufs b;
    alloc_bufs(&L, &b);
    L.w = b.w, L.gamma = b.gamma, L.beta = b.beta, L.running_mean = b.rm, L.running_var = b.rv;
    const int64_t nblocks = (L.n + L.block_rows - 1) / L.block_rows;
    printf("\nshape N=%lld K=%lld C=%lld  (X [N,K] -> Linear -> Z [N,C] -> BN -> ReLU), "
           "%s blocks of %lld rows x %lld, block bytes (Z rows + X rows) %.2f MiB\n",
           (long long)L.n, (long long)L.k, (long long)L.c,
           L.parallel_blocks ? "parallel" : "serial", (long long)L.block_rows,
           (long long)nblocks,
           (double)(L.block_rows * (L.k + L.c) * 4) / 1048576.0);
    const double worst = verify(&L, &b, stdout);
    if (!(worst <= TOL)) {
      printf("  MISMATCH: largest relative difference %.3e > %.0e\n", worst, TOL);
      failed = 1;
    }
    if (o.check_only) {
      free_bufs(&b);
      continue;
    }
    /* timing: warm-up, then reps rounds; each round runs every variant once, in an order that
       rotates from round to round, so that the noise of a shared machine hits all alike */
    double *t[V_COUNT][3];
    for (int v = 0; v < V_COUNT; v++)
      for (int q = 0; q < 3; q++) t[v][q] = xmalloc(sizeof(double) * (size_t)o.reps);
    for (int r = -o.warmup; r < o.reps; r++) {
      for (int i = 0; i < V_COUNT; i++) {
        const int v = (i + (r < 0 ? 0 : r)) % V_COUNT;
        double tt[2];
        run_variant(v, &L, &b, tt);
        if (r >= 0) t[v][0][r] = tt[0], t[v][1][r] = tt[1], t[v][2][r] = tt[0] + tt[1];
      }
    }
    stats3 s[V_COUNT][3];
    for (int v = 0; v < V_COUNT; v++)
      for (int q = 0; q < 3; q++) s[v][q] = summarize(t[v][q], o.reps);
    /* the saving as the median of the per-round differences (paired: same round) */
    /* the saving, paired round by round (same round, adjacent in time): the median of the
       per-round differences, and of the per-round relative savings (unfused - fused) / unfused
       per pass (fwd, bwd, fwd+bwd) */
    double *diff = xmalloc(sizeof(double) * (size_t)o.reps);
    stats3 save[2], save_rel[3];
    for (int q = 0; q < 2; q++) {
      const int qq = q == 0 ? 0 : 2;
      for (int r = 0; r < o.reps; r++) diff[r] = t[V_UNFUSED][qq][r] - t[V_FUSED][qq][r];
      save[q] = summarize(diff, o.reps);
    }
    for (int q = 0; q < 3; q++) {
      for (int r = 0; r < o.reps; r++)
        diff[r] = (t[V_UNFUSED][q][r] - t[V_FUSED][q][r]) / t[V_UNFUSED][q][r];
      save_rel[q] = summarize(diff, o.reps);
    }
    const char *qname[3] = {"fwd", "bwd", "fwd+bwd"};
    printf("  %-12s %10s %10s %10s | %10s %10s %10s | %10s %10s %10s   (ms: min / median / max "
           "of %d)\n",
           "", "fwd min", "fwd med", "fwd max", "bwd min", "bwd med", "bwd max", "f+b min",
           "f+b med", "f+b max", o.reps);
    for (int v = 0; v < V_COUNT; v++) {
      printf("  %-12s", VNAME[v]);
      for (int q = 0; q < 3; q++)
        printf(" %10.3f %10.3f %10.3f%s", s[v][q].min * 1e3, s[v][q].med * 1e3,
               s[v][q].max * 1e3, q < 2 ? " |" : "");
      printf("\n");
    }
    printf("  fused vs unfused: fwd %+.3f ms (%+.1f%% of unfused, %+.1f%% of BN fwd), "
           "fwd+bwd %+.3f ms (%+.1f%% of unfused, %+.1f%% of BN fwd+bwd)  [+ = fused faster; "
           "medians of the per-round differences]\n",
           save[0].med * 1e3, 100.0 * save_rel[0].med, 100.0 * save[0].med / s[V_BN][0].med,
           save[1].med * 1e3, 100.0 * save_rel[2].med, 100.0 * save[1].med / s[V_BN][2].med);
    if (json) {
      for (int v = 0; v < V_COUNT; v++)
        for (int q = 0; q < 3; q++)
          fprintf(json,
                  "{\"impl\": \"norma_%s\", \"n\": %lld, \"k\": %lld, \"c\": %lld, \"pass\": "
                  "\"%s\", \"threads\": %d, \"schedule\": \"%s\", \"block_rows\": %lld, "
                  "\"reps\": %d, \"min_ms\": "
                  "%.6f, \"median_ms\": %.6f, \"max_ms\": %.6f, \"openblas_core\": \"%s\", "
                  "\"max_rel_diff\": %.3e, \"run\": %ld, \"paired_saving_pct\": %.2f}\n",
                  VNAME[v], (long long)L.n, (long long)L.k, (long long)L.c, qname[q], o.threads,
                  L.parallel_blocks ? "parallel" : "serial", (long long)L.block_rows, o.reps,
                  s[v][q].min * 1e3, s[v][q].med * 1e3, s[v][q].max * 1e3, core ? core : "?",
                  worst, (long)getpid(), 100.0 * save_rel[q].med);
      fflush(json);
    }
    free(diff);
    for (int v = 0; v < V_COUNT; v++)
      for (int q = 0; q < 3; q++) free(t[v][q]);
    free_bufs(&b);
  }
  if (json) fclose(json);
  if (failed) {
    printf("\nFAILED: fused and unfused results differ by more than %.0e\n", TOL);
    return 1;
  }
  return 0;
}
