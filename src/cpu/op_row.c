/* op_row.c - the per-sample norms whose groups are contiguous pieces of a row: LayerNorm and
 * RMSNorm over [rows, d] (one group per row), and GroupNorm / InstanceNorm on [N, C] tensors
 * (s == 1: c / cpg groups per row).  The affine is per element of the row.
 *
 * One idea: a row is reduced and applied while it is in L1/L2, so the tensor crosses memory
 * once (forward: read x [and the residual], write y [and the sum]; backward: read x and dy
 * [and dsum], write dx).  The backward's dgamma / dbeta are column sums over the rows:
 * accumulated per block of rows in the compute type, added in double per block, blocks fixed by
 * the shape and combined in order, so that they do not depend on the thread count.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "engine.h"

#define ROW_PREFETCH_MAX 12288 /* most bytes of the forward's next pair of rows prefetched */
#define ROW_BLOCK 64   /* rows per compute-type accumulation of dgamma / dbeta */
/* The backward's units of rows (their partials are c doubles x 2): four where the rows allow,
   of at most ROW_BLOCK rows, more only past ROW_UNITS units.  Each unit sets, fills and hands
   over 2 c double partials, which the call then combines in order.  With a unit a row (up to
   64 units) LayerNorm's backward of [128, 768] spent 70 % of its time on them (a third in the
   serial combine): 90 us on one thread, against oneDNN's 28 us on two. */
#define ROW_UNITS 64
/* Values from which the rows' forward and backward run on the threads (BatchNorm's engine:
   NORM_SERIAL_BELOW and bn_threads).  Until the thirty-eighth session all three were
   NORM_SERIAL_BELOW (131072), which left BERT-base's [128, 768] on one thread.  Measured then
   (Zen 5, 2 threads against 1, f32, pair.py, 5 rounds, above 1 two threads faster), in phases
   where the two vCPUs ran alike: LayerNorm forward [32, 768] 1.47-1.54x, [64, 768] 1.68x,
   [128, 768] 1.85x, [8, 4096] 1.64x, but [16, 768] 1.15x in one phase and 0.56x in another;
   RMSNorm's single pass less: [64, 768] 1.22x, [96, 768] 1.45x, [16, 4096] 1.02x, [8, 4096]
   0.85x; the backward [32, 768] 1.03x, [64, 768] 1.46x, [128, 768] 1.55x (RMSNorm alike),
   [8, 4096] 0.89x.  Where the two vCPUs ran unevenly, calls of a few microseconds lost on two
   threads (as BatchNorm's do), so the thresholds sit where two threads won by 1.2x or more. */
#define ROW_PAR_FWD 32768
#define ROW_PAR_FWD_RMS 49152
#define ROW_PAR_BWD 40960
/* partials (units x 2 c doubles) from which the backward combines them on the threads, each
   a block of columns, every column still in unit order */
#define ROW_COMBINE_PAR 32768

typedef struct row_ctx {
  const norm_geom *g;
  norm_job *jb;
  const norm_fwd_args *fa;
  const norm_bwd_args *ba;
  const void *gam, *bet; /* [c] compute type: the user's (float / double) or ones / zeros */
  char *thr;             /* per-thread regions */
  size_t thr_bytes;
  double *part;          /* backward: [units][2][c] */
  int64_t rows_per_unit;
  int pf; /* forward: prefetch the next rows (the call's tensors beyond NORM_CACHED_BYTES) */
} row_ctx;

static inline const char *at(const norm_geom *g, const void *p, int64_t e) {
  return p ? (const char *)p + (size_t)e * g->esize : NULL;
}

/* the compute-type arrays gamma / beta: the parameters themselves (float for f32/f16/bf16,
   double for f64), or ones / zeros in scratch */
static void params(row_ctx *rc, const void *gamma, const void *beta, char *mem) {
  const norm_geom *g = rc->g;
  const size_t cb = rc->jb->cbytes;
  rc->gam = gamma, rc->bet = beta;
  if (!gamma || !beta) {
    for (int64_t j = 0; j < g->c; j++) {
      if (cb == 8) ((double *)mem)[j] = 1.0, ((double *)mem)[g->c + j] = 0.0;
      else ((float *)mem)[j] = 1.0f, ((float *)mem)[g->c + j] = 0.0f;
    }
    if (!gamma) rc->gam = mem;
    if (!beta) rc->bet = mem + (size_t)g->c * cb;
  }
}

static inline void kset(const row_ctx *rc, void *k, int idx, double v) {
  if (rc->jb->cbytes == 8) ((double *)k)[idx] = v;
  else ((float *)k)[idx] = (float)v;
}
static inline double kget(const row_ctx *rc, const void *k, int idx) {
  return rc->jb->cbytes == 8 ? ((const double *)k)[idx] : (double)((const float *)k)[idx];
}

/* ---- forward ---------------------------------------------------------------------------- */

/* mean (hi + lo) and biased variance of len values from t1, t2 relative to the anchor K */
static inline void stats_finish(const double o[3], int64_t len, double *mean, double *mlo,
                                double *var) {
  const double cnt = (double)len;
  *var = norm_var(o[1] - o[0] * (o[0] / cnt), cnt);
  norm_two_sum(o[2], o[0] / cnt, mean, mlo);
}

/* statistics of a contiguous group of len values: mean (hi + lo) and biased variance, or the
   mean square for RMSNorm */
static void group_stats(const row_ctx *rc, const char *h, int64_t len, double *mean,
                        double *mlo, double *var) {
  const norm_geom *g = rc->g;
  const bn_ukernels *uk = rc->jb->uk;
  if (g->rms) {
    double q = 0.0;
    for (int64_t i = 0; i < len; i += NORM_CF_CHUNK)
      q += uk->sumsq_run(h + (size_t)i * g->esize,
                         len - i < NORM_CF_CHUNK ? len - i : NORM_CF_CHUNK);
    /* squares below f32's normal range (a row of values under ~1e-19) or above it (~1e19):
       the row again in double (rare) */
    if (rc->jb->cbytes == 4 && !(q >= 0x1p-100 && q <= 0x1p100)) {
      q = 0.0;
      for (int64_t i = 0; i < len; i++) {
        const double v = norma__load(g->dt, h, i);
        q += v * v;
      }
    }
    *mean = 0.0, *mlo = 0.0, *var = norm_var(q, (double)len);
    return;
  }
  double t1 = 0.0, t2 = 0.0, K = 0.0, o[3];
  for (int64_t i = 0; i < len; i += NORM_CF_CHUNK) {
    const int64_t n = len - i < NORM_CF_CHUNK ? len - i : NORM_CF_CHUNK;
    uk->stats_run(h + (size_t)i * g->esize, n, 1, 0, NULL, o);
    if (i == 0) {
      t1 = o[0], t2 = o[1], K = o[2];
    } else {
      double a, b;
      bn_stats_shift(o[2], K, o[0], o[1], (double)n, &a, &b);
      t1 += a, t2 += b;
    }
  }
  const double o3[3] = {t1, t2, K};
  stats_finish(o3, len, mean, mlo, var);
}

/* the forward of one group in double, for constants that overflow the compute type */
static void affine_slow(const row_ctx *rc, const char *h, char *y, int64_t len, int64_t c0,
                        double mean, double mlo, double is) {
  const norm_geom *g = rc->g;
  for (int64_t j = 0; j < len; j++) {
    const double gm = rc->jb->cbytes == 8 ? ((const double *)rc->gam)[c0 + j]
                                          : (double)((const float *)rc->gam)[c0 + j];
    const double bt = rc->jb->cbytes == 8 ? ((const double *)rc->bet)[c0 + j]
                                          : (double)((const float *)rc->bet)[c0 + j];
    const double v = ((norma__load(g->dt, h, j) - mean) - mlo) * is * gm + bt;
    norma__store(g->dt, y, j, v);
  }
}

/* the outputs of group G (values hg, output y, columns c0..) from its statistics */
static inline void fwd_group(const row_ctx *rc, const char *hg, char *y, int64_t G, int64_t c0,
                             double mean, double mlo, double var) {
  const norm_geom *g = rc->g;
  const norm_fwd_args *a = rc->fa;
  const norm_job *jb = rc->jb;
  const size_t cb = jb->cbytes;
  double kk[K_COUNT];
  const double is = norm_invstd(var, g->eps);
  if (a->save_mean) norma__param_store(g->dt, a->save_mean, G, mean);
  if (a->save_invstd) norma__param_store(g->dt, a->save_invstd, G, is);
  /* xh = (h - mhi) * is + c0, mhi the mean rounded to the compute type */
  kset(rc, kk, K_A, mean);
  const double lo = (mean - kget(rc, kk, K_A)) + mlo, cc = lo == 0.0 ? 0.0 : -lo * is;
  kset(rc, kk, K_B, is);
  kset(rc, kk, K_C, cc);
  if (cb == 4 && ((fabs(is) > FLT_MAX && isfinite(is)) || (fabs(cc) > FLT_MAX && isfinite(cc))))
    affine_slow(rc, hg, y, g->cpg, c0, mean, mlo, is);
  else
    jb->uk->affine_run(hg, y, g->cpg, kk, (const char *)rc->gam + (size_t)c0 * cb,
                       (const char *)rc->bet + (size_t)c0 * cb, jb->store);
}

/* the values of row r: x, or x + residual written to the sum output or to buf */
static inline const char *row_input(const row_ctx *rc, int64_t r, char *buf) {
  const norm_geom *g = rc->g;
  const norm_fwd_args *a = rc->fa;
  const int64_t e = r * g->c;
  const char *h = at(g, a->x, e);
  if (a->res) {
    char *hw = a->sum ? (char *)a->sum + (size_t)e * g->esize : buf;
    rc->jb->uk->add_run(h, at(g, a->res, e), hw, g->c);
    h = hw;
  }
  return h;
}

/* row r of x (and of the residual) into L1 */
static inline void prefetch_row(const row_ctx *rc, int64_t r) {
  const norm_geom *g = rc->g;
  const size_t off = (size_t)(r * g->c) * g->esize, bytes = (size_t)g->c * g->esize;
  for (size_t i = 0; i < bytes; i += 64)
    __builtin_prefetch((const char *)rc->fa->x + off + i, 0, 3);
  if (rc->fa->res)
    for (size_t i = 0; i < bytes; i += 64)
      __builtin_prefetch((const char *)rc->fa->res + off + i, 0, 3);
}

static void fwd_rows(norm_job *jb, int64_t r0, int64_t r1, void *arg) {
  const row_ctx *rc = arg;
  const norm_geom *g = rc->g;
  const norm_fwd_args *a = rc->fa;
  const int64_t c = g->c, cpg = g->cpg;
  const size_t es = g->esize;
  char *buf = rc->thr + (size_t)(jb->nt > 1 ? norm_thread_id() : 0) * rc->thr_bytes;
  /* LayerNorm rows of one chunk go by pairs: their statistics in one stats_run2 call (with a
     residual only up to 4 KiB rows: measured slower at 1280 f32 values, 0.93x) */
  const int pairs = !g->rms && cpg == c && c <= NORM_CF_CHUNK &&
                    (!a->res || (size_t)c * es <= 4096);
  int64_t r = r0;
  if (pairs)
    for (; r + 1 < r1; r += 2) {
      const char *h0 = row_input(rc, r, buf), *h1 = row_input(rc, r + 1, buf + (size_t)c * es);
      double o[6], mean, mlo, var;
      jb->uk->stats_run2(h0, h1, c, o);
      /* the next pair into L1 (prefetcht0), a row before each of this pair's output rows is
         written: the first pass over a row otherwise waits on L2 / L3 (measured: 1.09 ->
         0.94 ms on 8,512,768; a pair further ahead, prefetcht1, all of the pair at once, or
         during the statistics gained less).  Up to ROW_PREFETCH_MAX bytes: more evicts what
         is being used (16 KiB: 0.89x on 1,2048,2048). */
      const int pf = rc->pf && r + 3 < r1 &&
                     (size_t)(a->res ? 4 : 2) * (size_t)c * es <= ROW_PREFETCH_MAX;
      if (pf) prefetch_row(rc, r + 2);
      stats_finish(o, c, &mean, &mlo, &var);
      fwd_group(rc, h0, (char *)a->y + (size_t)(r * c) * es, r, 0, mean, mlo, var);
      if (pf) prefetch_row(rc, r + 3);
      stats_finish(o + 3, c, &mean, &mlo, &var);
      fwd_group(rc, h1, (char *)a->y + (size_t)((r + 1) * c) * es, r + 1, 0, mean, mlo, var);
    }
  /* rows alone (RMSNorm, wider residual rows, the last of an odd range): the next row as in
     pairs */
  const int pf1 =
      rc->pf && cpg == c && (size_t)(a->res ? 2 : 1) * (size_t)c * es <= ROW_PREFETCH_MAX;
  for (; r < r1; r++) {
    const char *h = row_input(rc, r, buf);
    for (int64_t c0 = 0; c0 < c; c0 += cpg) {
      double mean, mlo, var;
      group_stats(rc, h + (size_t)c0 * es, cpg, &mean, &mlo, &var);
      if (pf1 && r + 1 < r1) prefetch_row(rc, r + 1);
      fwd_group(rc, h + (size_t)c0 * es, (char *)a->y + (size_t)(r * c + c0) * es,
                r * (c / cpg) + c0 / cpg, c0, mean, mlo, var);
    }
  }
}

norma_status norm_row_forward(const norm_geom *g, norm_fwd_mode mode, const norm_fwd_args *a) {
  if (mode != NORM_FWD_TRAINING) return norm_bn_forward(g, mode, a); /* IN / GN inference */
  norm_job jb = {.g = g};
  norm_job_kernels(&jb);
  jb.nt = g->total < (g->rms ? ROW_PAR_FWD_RMS : ROW_PAR_FWD) ? 1 : norma__threads();
  if (jb.nt > g->n) jb.nt = (int)g->n;
  const int64_t bytes = g->total * (int64_t)g->esize; /* x, y, and the residual and sum */
  const int64_t tensors = 2 + (a->res != NULL) + (a->sum != NULL);
  jb.store = norm_nt_store(bytes, tensors * bytes, NORM_NT_FOOTPRINT) &&
                     norm_nt_runs(g->c * (int64_t)g->esize) ? BN_STORE_NT : 0;
  /* the next rows are prefetched only where the caches do not hold the call: in the caches
     the prefetches cost more than they gain (pair.py, Zen 5, 2 threads, without / with: [128,
     768] 1.09x, [8, 128, 768] 1.04x; beyond, [8, 512, 768] 0.90x) */
  row_ctx rc = {.g = g, .jb = &jb, .fa = a, .pf = tensors * bytes > NORM_CACHED_BYTES};
  const size_t pb = norm_up64((size_t)g->c * 2 * jb.cbytes);
  rc.thr_bytes = a->res && !a->sum ? norm_up64((size_t)g->c * 2 * g->esize) : 0; /* 2 rows */
  char *mem = norm_scratch(0, pb + (size_t)jb.nt * rc.thr_bytes + 64);
  if (!mem)
    return norma__fail(NORMA_ERR_OUT_OF_MEMORY, "norma: out of memory allocating scratch");
  params(&rc, a->gamma, a->beta, mem);
  rc.thr = mem + pb;
  norm_parallel_for(&jb, g->n, fwd_rows, &rc);
  return NORMA_OK;
}

/* ---- backward --------------------------------------------------------------------------- */

/* one unit of rows: each row reduced then applied; dgamma / dbeta column sums in the compute
   type per ROW_BLOCK rows, added into the unit's double partials */
static void bwd_unit(const row_ctx *rc, int64_t unit, char *acc) {
  const norm_geom *g = rc->g;
  const norm_bwd_args *a = rc->ba;
  norm_job *jb = rc->jb;
  const bn_ukernels *uk = jb->uk;
  const int64_t c = g->c, cpg = g->cpg, nrows = g->n;
  const size_t es = g->esize, cb = jb->cbytes;
  const int64_t r0 = unit * rc->rows_per_unit;
  const int64_t r1 = r0 + rc->rows_per_unit < nrows ? r0 + rc->rows_per_unit : nrows;
  const int grads = a->dgamma || a->dbeta;
  double *part = rc->part ? rc->part + (size_t)unit * 2 * (size_t)c : NULL;
  char *ag = acc, *ab = acc + norm_up64((size_t)c * cb);
  double kk[K_COUNT];
  for (int64_t rb = r0; rb < r1; rb += ROW_BLOCK) {
    const int64_t re = rb + ROW_BLOCK < r1 ? rb + ROW_BLOCK : r1;
    if (grads) memset(acc, 0, 2 * norm_up64((size_t)c * cb));
    for (int64_t r = rb; r < re; r++) {
      const int64_t e = r * c;
      for (int64_t c0 = 0; c0 < c; c0 += cpg) {
        const int64_t G = r * (c / cpg) + c0 / cpg, off = e + c0;
        const double mean = g->rms ? 0.0 : norma__param(g->dt, a->save_mean, G, 0);
        const double is = norma__param(g->dt, a->save_invstd, G, 0);
        kset(rc, kk, K_A, mean);
        const double lo = mean - kget(rc, kk, K_A), cc = lo == 0.0 ? 0.0 : -lo * is;
        kset(rc, kk, K_B, is);
        kset(rc, kk, K_C, cc);
        const char *gam = (const char *)rc->gam + (size_t)c0 * cb;
        /* S1 = sum gamma dy, S2 = sum gamma dy xh, S3 = sum xh, in chunks, in order */
        double S1 = 0.0, S2 = 0.0, S3 = 0.0, o[3];
        for (int64_t i = 0; i < cpg; i += NORM_CF_CHUNK) {
          const int64_t n = cpg - i < NORM_CF_CHUNK ? cpg - i : NORM_CF_CHUNK;
          uk->affine_bwd_sums_run(at(g, a->x, off + i), at(g, a->dy, off + i), n, kk,
                                  gam + (size_t)i * cb, o);
          S1 += o[0], S2 += o[1], S3 += o[2];
        }
        const double M = (double)cpg;
        const double s = g->rms ? 0.0 : norm_xhat_offset(S3, M);
        const double A = g->rms ? 0.0 : S1, Bc = S2 - s * S1;
        /* dx = is * (gamma dy - A / M) - is * Bc / M * (xh - s): xh - s through K_C */
        kset(rc, kk, K_C, cc - s);
        kset(rc, kk, K_GM, A / M);
        const double gm = kget(rc, kk, K_GM);
        kset(rc, kk, K_DA, is);
        kset(rc, kk, K_DB, -is * Bc / M);
        kset(rc, kk, K_DD, is * (gm - A / M));
        uk->affine_bwd_run(at(g, a->x, off), at(g, a->dy, off), at(g, a->dsum, off),
                           (char *)a->dx + (size_t)off * es, cpg, kk, gam,
                           grads ? ag + (size_t)c0 * cb : NULL, grads ? ab + (size_t)c0 * cb : NULL,
                           jb->store);
      }
    }
    /* the block's sums into the unit's partials (the first block sets them) */
    if (part && cb == 8)
      for (int64_t j = 0; j < c; j++) {
        const double pg = rb > r0 ? part[j] : 0.0, pb = rb > r0 ? part[c + j] : 0.0;
        part[j] = pg + ((double *)ag)[j], part[c + j] = pb + ((double *)ab)[j];
      }
    else if (part)
      norm_chan()->row_partials(part, part + c, (const float *)ag, (const float *)ab, rb == r0, c);
  }
}

static void bwd_units(norm_job *jb, int64_t u0, int64_t u1, void *arg) {
  const row_ctx *rc = arg;
  char *acc = rc->thr + (size_t)(jb->nt > 1 ? norm_thread_id() : 0) * rc->thr_bytes;
  for (int64_t u = u0; u < u1; u++) bwd_unit(rc, u, acc);
}

/* columns [64 b0, 64 b1) of the 2 c partials: the units' in unit order, into unit 0's */
static void combine_units(norm_job *jb, int64_t b0, int64_t b1, void *arg) {
  (void)jb;
  const row_ctx *rc = arg;
  const int64_t c2 = 2 * rc->g->c, j0 = 64 * b0, j1 = 64 * b1 < c2 ? 64 * b1 : c2;
  const int64_t nunits = (rc->g->n + rc->rows_per_unit - 1) / rc->rows_per_unit;
  const norm_chan_ops *chan = norm_chan();
  for (int64_t u = 1; u < nunits; u++)
    chan->add_d(rc->part + j0, rc->part + (size_t)u * (size_t)c2 + j0, j1 - j0);
}

norma_status norm_row_backward(const norm_geom *g, norm_bwd_mode mode, const norm_bwd_args *a) {
  (void)mode;
  norm_job jb = {.g = g};
  norm_job_kernels(&jb);
  /* units of rows fixed by the shape (the partials' order): four, for the threads, of at
     most ROW_BLOCK rows, and at most ROW_UNITS units */
  int64_t rpu = (g->n + 3) / 4;
  if (rpu > ROW_BLOCK) rpu = ROW_BLOCK;
  if (rpu < (g->n + ROW_UNITS - 1) / ROW_UNITS) rpu = (g->n + ROW_UNITS - 1) / ROW_UNITS;
  if (rpu < 1) rpu = 1;
  row_ctx rc = {.g = g, .jb = &jb, .ba = a, .rows_per_unit = rpu};
  const int64_t nunits = (g->n + rpu - 1) / rpu;
  jb.nt = g->total < ROW_PAR_BWD ? 1 : norma__threads();
  if (jb.nt > nunits) jb.nt = (int)nunits;
  const int64_t bytes = g->total * (int64_t)g->esize; /* x, dy, dx */
  jb.store = norm_nt_store(bytes, 3 * bytes, NORM_NT_FOOTPRINT) &&
                     norm_nt_runs(g->c * (int64_t)g->esize) ? BN_STORE_NT : 0;
  const int grads = a->dgamma || a->dbeta;
  const size_t pb = norm_up64((size_t)g->c * 2 * jb.cbytes);
  const size_t partb = grads ? norm_up64((size_t)nunits * 2 * (size_t)g->c * sizeof(double)) : 0;
  rc.thr_bytes = 2 * norm_up64((size_t)g->c * jb.cbytes);
  char *mem = norm_scratch(0, pb + partb + (size_t)jb.nt * rc.thr_bytes + 64);
  if (!mem)
    return norma__fail(NORMA_ERR_OUT_OF_MEMORY, "norma: out of memory allocating scratch");
  params(&rc, a->gamma, NULL, mem);
  rc.part = grads ? (double *)(mem + pb) : NULL;
  rc.thr = mem + pb + partb;
  norm_parallel_for(&jb, nunits, bwd_units, &rc);
  if (grads) { /* the units' partials in unit order, into unit 0's */
    const int64_t blocks = (2 * g->c + 63) / 64;
    if (jb.nt > 1 && nunits * 2 * g->c >= ROW_COMBINE_PAR)
      norm_parallel_for(&jb, blocks, combine_units, &rc);
    else combine_units(&jb, 0, blocks, &rc);
    const double *p0 = rc.part;
    for (int64_t j = 0; j < g->c; j++) {
      if (a->dgamma) norma__param_store(g->dt, a->dgamma, j, p0[j]);
      if (a->dbeta) norma__param_store(g->dt, a->dbeta, j, p0[g->c + j]);
    }
  }
  return NORMA_OK;
}
