/* op_bn.c - BatchNorm on the engine: a group is a channel over the whole batch.  What is
 * BatchNorm's own: the finalize of each operation (statistics -> constants, save_*, running
 * statistics; the backward's sums -> dx constants, dgamma, dbeta), the x_hat constants of the
 * backward (from x and the saved statistics, or from y), and the split API's pieces.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "engine.h"
#include "ukernels.h"

/* ---- forward ---------------------------------------------------------------------------- */

/* a block of a float parameter (dflt where there is none) as doubles */
static void param_block(const float *p, int64_t n, double dflt, double *out) {
  if (p)
    for (int64_t k = 0; k < n; k++) out[k] = (double)p[k];
  else
    for (int64_t k = 0; k < n; k++) out[k] = dflt;
}

/* the float constants of channels b0 .. b0 + nb of u (norm_fwd_consts); nonzero: slow */
static int fwd_consts_block(norm_unit *u, int64_t b0, int64_t nb, const double *mean,
                            const double *mlo, const double *scale, const double *beta) {
  const int64_t ts = u->ts, cs = u->cs;
  float *c = (float *)u->cst;
  const norm_fwd_block fb = {mean, mlo, scale, beta, c + C_MHI * cs + b0, c + C_SCALE * cs + b0,
                             c + C_SHIFT * cs + b0, u->dcst + b0, u->dcst + ts + b0,
                             u->dcst + 2 * ts + b0};
  return norm_fwd_consts(&fb, nb);
}

/* finalize_training when the constants and parameters are float (f32 / f16 / bf16 storage):
   the same arithmetic as the general loop below, in blocks of channels, by the ISA's
   fwd_final (chan_vec.inc): one vectorized loop a block, without calls or branches.  On
   [N, C] and 7x7 layers the per-channel finalize was a third of the call.  Outputs a call
   does not want go to scratch and missing parameters read as ones and zeros, so that the one
   loop serves every call.  The constants' doubles are written for every channel: where one
   channel is slow, the whole unit is applied in double (unit_apply_slow). */
static void finalize_training_f32(norm_job *jb, norm_unit *u) {
  const norm_fwd_args *a = jb->ctx;
  const norm_geom *g = jb->g;
  const norm_chan_ops *chan = norm_chan();
  const int64_t nc = u->nc, j0 = u->j0, ts = u->ts, cs = u->cs;
  const float *gam = a->gamma ? (const float *)a->gamma + j0 : NULL;
  const float *bet = a->beta ? (const float *)a->beta + j0 : NULL;
  float *sm = a->save_mean ? (float *)a->save_mean + j0 : NULL;
  float *si = a->save_invstd ? (float *)a->save_invstd + j0 : NULL;
  float *rm = a->running_mean ? (float *)a->running_mean + j0 : NULL;
  float *rv = a->running_var ? (float *)a->running_var + j0 : NULL;
  if (!a->run) rm = rv = NULL;
  if (jb->quiet) sm = si = rm = rv = NULL; /* another thread writes them */
  float *c = (float *)u->cst;
  int slow = 0;
  enum { FB = 128 };
  float ones[FB], zeros[FB], s_mean[FB], s_is[FB], s_rm[FB], s_rv[FB];
  if (!gam)
    for (int k = 0; k < FB; k++) ones[k] = 1.0f;
  if (!bet)
    for (int k = 0; k < FB; k++) zeros[k] = 0.0f;
  norm_fwd_final f = {.m = (double)g->m, .eps = g->eps, .w_old = rm || rv ? a->run->w_old : 0.0,
                      .w_new = rm || rv ? a->run->w_new : 0.0,
                      .biased = rm || rv ? a->run->biased : 1};
  for (int64_t b0 = 0; b0 < nc; b0 += FB) {
    const int64_t nb = nc - b0 < FB ? nc - b0 : FB;
    f.t1 = u->tot + b0, f.t2 = u->tot + ts + b0, f.k = u->tot + 2 * ts + b0;
    f.gamma = gam ? gam + b0 : ones, f.beta = bet ? bet + b0 : zeros;
    f.save_mean = sm ? sm + b0 : s_mean, f.save_invstd = si ? si + b0 : s_is;
    if (!rm) memset(s_rm, 0, sizeof s_rm);
    if (!rv) memset(s_rv, 0, sizeof s_rv);
    f.run_mean = rm ? rm + b0 : s_rm, f.run_var = rv ? rv + b0 : s_rv;
    f.cm = c + C_MHI * cs + b0, f.csc = c + C_SCALE * cs + b0, f.csh = c + C_SHIFT * cs + b0;
    f.dm = u->dcst + b0, f.dsc = u->dcst + ts + b0, f.dsh = u->dcst + 2 * ts + b0;
    slow |= chan->fwd_final(&f, nb);
  }
  if (slow) u->slow = 1;
}

static void finalize_training(norm_job *jb, norm_unit *u) {
  const norm_fwd_args *a = jb->ctx;
  const norm_geom *g = jb->g;
  if (jb->cbytes == 4 && g->dt != NORMA_F64) {
    finalize_training_f32(jb, u);
    return;
  }
  const double m = (double)g->m, im = 1.0 / m;
  for (int64_t j = 0; j < u->nc; j++) {
    const int64_t ch = u->j0 + j;
    const double t1 = u->tot[j], t2 = u->tot[u->ts + j];
    const double var = norm_var(t2 - t1 * (t1 * im), m);
    double mean, mlo;
    norm_two_sum(u->tot[2 * u->ts + j], t1 * im, &mean, &mlo);
    const double is = norm_invstd(var, g->eps);
    norm_set_fwd_consts(jb, u, j, mean, mlo, is, norma__param(g->dt, a->gamma, ch, 1.0),
                        norma__param(g->dt, a->beta, ch, 0.0));
    if (jb->quiet) continue; /* another thread writes the outputs */
    if (a->save_mean) norma__param_store(g->dt, a->save_mean, ch, mean);
    if (a->save_invstd) norma__param_store(g->dt, a->save_invstd, ch, is);
    norm_running_apply(a->run, g->dt, a->running_mean, a->running_var, ch, mean, var, m);
  }
}

/* finalize_inference for float constants and parameters: norm_set_fwd_consts's arithmetic (a
   float mean has no low part), in blocks of channels: the inputs (infer_prep) and the
   constants by the ISA's double-precision helpers (ukernels.h).  One channel at a time it
   cost an [N, 4096] inference 15 us (serial, before the apply). */
static void finalize_inference_f32(norm_job *jb, norm_unit *u) {
  const norm_fwd_args *a = jb->ctx;
  const double eps = jb->g->eps;
  const int64_t nc = u->nc, j0 = u->j0;
  const float *mi = a->mean_in ? (const float *)a->mean_in + j0 : NULL;
  const float *vi = a->var_in ? (const float *)a->var_in + j0 : NULL;
  const float *gam = a->gamma ? (const float *)a->gamma + j0 : NULL;
  const float *bet = a->beta ? (const float *)a->beta + j0 : NULL;
  const norm_chan_ops *chan = norm_chan();
  int slow = 0;
  enum { FB = 128 };
  double m_b[FB], g_b[FB], b_b[FB], z_b[FB] = {0};
  for (int64_t b0 = 0; b0 < nc; b0 += FB) {
    const int64_t nb = nc - b0 < FB ? nc - b0 : FB;
    chan->infer_prep(mi ? mi + b0 : NULL, vi ? vi + b0 : NULL, gam ? gam + b0 : NULL,
                     bet ? bet + b0 : NULL, eps, m_b, g_b, b_b, nb);
    slow |= fwd_consts_block(u, b0, nb, m_b, z_b, g_b, b_b);
  }
  if (slow) u->slow = 1;
}

static void finalize_inference(norm_job *jb, norm_unit *u) {
  const norm_fwd_args *a = jb->ctx;
  const norm_geom *g = jb->g;
  if (jb->cbytes == 4 && g->dt != NORMA_F64) {
    finalize_inference_f32(jb, u);
    return;
  }
  for (int64_t j = 0; j < u->nc; j++) {
    const int64_t ch = u->j0 + j;
    norm_set_fwd_consts(jb, u, j, norma__param(g->dt, a->mean_in, ch, 0), 0.0,
                        1.0 / sqrt(norma__param(g->dt, a->var_in, ch, 0) + g->eps),
                        norma__param(g->dt, a->gamma, ch, 1.0),
                        norma__param(g->dt, a->beta, ch, 0.0));
  }
}

static void finalize_apply(norm_job *jb, norm_unit *u) {
  const norm_fwd_args *a = jb->ctx;
  const norm_geom *g = jb->g;
  for (int64_t j = 0; j < u->nc; j++) {
    const int64_t ch = u->j0 + j;
    norm_set_fwd_consts(jb, u, j, a->mean_d[ch], 0.0, a->invstd_d[ch],
                        norma__param(g->dt, a->gamma, ch, 1.0),
                        norma__param(g->dt, a->beta, ch, 0.0));
  }
}

static void finalize_moments(norm_job *jb, norm_unit *u) {
  const norm_fwd_args *a = jb->ctx;
  for (int64_t j = 0; j < u->nc; j++)
    norm_moments_of(u, j, (double)jb->g->m, &a->mean_out[u->j0 + j], &a->m2_out[u->j0 + j]);
}

/* ---- short rows and short runs: the wide view --------------------------------------------- */

/* The memory of a channels-last [m][C] tensor is also [m / k][k C]: column j of that wide view
   is channel j % C ("interleaved").  Rows shorter than a vector (C < 16 f32 values) would give
   every kernel call partial vectors; the wide view gives them rows of about 256 values.
   Likewise a channels-first [N][C][S] tensor with short runs S is [N][C S]: column j is
   channel j / S ("blocked"), and the rows kernels take whole samples where the channels-first
   kernels would take one run of S values per call.  The engine reduces and applies the wide
   view (the split schedule: one unit holds every column); the wrappers below merge the columns
   of each channel in order, run BatchNorm's own prepare / finalize on the C channels, and
   repeat the constants across the columns. */
typedef struct wide_ctx {
  const void *args;             /* the op's arguments (its callbacks' ctx) */
  norm_unit_fn prepare, finalize; /* BatchNorm's callbacks */
  const norm_geom *g;           /* the op's own geometry */
  int64_t rep;                  /* blocked: the columns per channel (S); 0: interleaved */
} wide_ctx;

/* Channels-first runs of S = 2 values always take the blocked wide view; runs of 3 to 12 values
   take it from enough samples, in rows of at most WIDE_CF_MAX_COLS columns and of a number of
   columns a sample that depends on S.  The channels-first
   kernels pay per run (about 5-7 ns, engine.c's cf_short_runs_parallel), the wide view per
   column (its sums, their merge into the channel, the constants repeated S times and read
   with every row), so it pays where the runs per channel (N) outnumber the columns per
   channel (S) several times over.  Measured (2 threads, Zen 5, f32, one median of 100-200
   calls per build, channels-first kernels / wide view, at C = 64, 256 and 1024):
     S = 4, an earlier session: 128x512x2x2 forward 0.43 / 0.09, backward 0.50 / 0.13;
     S = 3, 4 from N = 8: forward 1.6-2.6x, backward 1.1-2.0x, inference 2.2-2.7x as fast
       (more at larger N; N = 2: 0.58-1.19x, N = 4: backward 0.71-1.23x);
     S = 6 from N = 24: forward 1.7-5.7x, backward 1.45-4.8x, inference 1.3-5.6x (N = 8-12:
       f32 backward of 1024 channels 0.69-0.75x, N = 16: bf16 0.67x);
     S = 9 from N = 48: 1.12-4.1x (N = 16-24: backward 0.74-0.93x at 1024 channels);
     S = 12 from N = 128: 1.19-2.9x (N = 64: backward 0.89x, inference 0.94x at 1024);
     S = 16 stays channels-first (N = 128, 1024 channels: backward 0.75x, inference 0.63x;
       N = 24: 0.46-1.7x).
   bf16 at N = 8 (S = 3, 4), 48 (S = 9) and 128 (S = 12): 1.16-2.9x.  NCHW 64x173x2x2 (from
   a random sweep, 0.96x of oneDNN before) ran forward 0.050 / 0.010, backward 0.058 / 0.016,
   inference 0.019 / 0.005 ms.  Wide rows need more samples still: paired (pair.py), the
   backward of 8x1024x2x2 (4096 columns) 1.12x (1.16x --twice), of 8x2048x2x2 0.99x (0.85x
   --twice), of 8x4096x2x2 0.77x; the forward of 8x2048x2x2 1.33x, of 8x4096x2x2 1.26x.  So
   at most 1024 columns a sample, 512 for the backward.
   Each direction has bounds of its own since (a random sweep: NCHW 32x144x2x4 backward 0.89x
   of PyTorch).  The view's cost per value falls with the samples (about 0.3 + 4.5/N ns, the
   backward at 300 channels), the runs' with S, and wide rows leave the cache, so it pays for
   fewer samples of narrow rows.  Paired against the table before (pair.py, 4 rounds of 300):
   forward 8x300x1x6 1.70x, 16x300x1x9 1.61x, 32x300x1x12 1.88x, 16x64x1x12 1.45x, 8x1600x1x5
   1.24x, but 8x800x1x9 0.74x, 16x1000x1x12 0.78x, 12x300x1x12 0.95x, 8x64x1x16 0.55x;
   backward 16x300x1x8 1.27x, 16x600x1x6 1.24x, 32x144x2x4 2.03x, 32x64x3x3 2.70x, but
   16x600x1x8 0.89x, 16x300x1x12 0.78x, 32x300x1x12 0.93x. */
#define WIDE_CF_MAX_COLS 16384
static int wide_cf_runs(const norm_geom *g, int backward) {
  /* the view pays from n samples for runs of up to s values, in rows of at most cols_n
     columns a sample (any line that matches) */
  typedef struct { int64_t s, n, cols_n; } wide_from;
  static const wide_from fwd[] = {{6, 8, 1024}, {9, 16, 512}, {9, 48, 1024}, {12, 16, 128},
                                  {12, 128, 1024}};
  static const wide_from bwd[] = {{4, 8, 512}, {6, 24, 512}, {9, 16, 256}, {9, 48, 512},
                                  {12, 128, 512}};
  const wide_from *t = backward ? bwd : fwd;
  const size_t nt = backward ? sizeof bwd / sizeof bwd[0] : sizeof fwd / sizeof fwd[0];
  if (g->s < 2) return 0;
  if (g->s == 2) return g->n >= 1;
  const int64_t cols = g->c * g->s;
  if (cols > WIDE_CF_MAX_COLS) return 0;
  for (size_t i = 0; i < nt; i++)
    if (g->s <= t[i].s && g->n >= t[i].n && cols <= t[i].cols_n * g->n) return 1;
  return 0;
}

/* Channels-last tensors of at most WIDE_CL_MIN_ROWS rows keep their rows for the training
   forward and the backward: the view's cost per column (each column's sums, their merge into
   its channel, the constants repeated) outweighs the partial vectors it saves when the wide
   rows are few.  Measured (Zen 5, f32, best of 10 rounds of 1000-2000 calls alternating in one
   process, us, the view / the rows): training forward 16x4x4x16 3.71 / 1.44, 16x8x8x16 5.13 /
   3.96, 16x4x4x8 3.41 / 1.27, 16x8x8x8 4.39 / 3.88, 16x4x4x4 4.04 / 1.29, 16x8x8x3 3.80 /
   3.99; backward 16x4x4x8 4.94 / 1.18, 16x4x4x4 6.11 / 1.20, 16x8x8x8 6.41 / 3.34, 16x8x8x3
   5.95 / 3.46.  Past it the view gains, more so for fewer channels: training forward
   32x8x8x8 (2048 rows) 5.84 / 7.35, 64x16x16x4 11.2 / 35.2, 64x16x16x3 9.2 / 33.1, but
   64x8x8x16 11.7 / 9.1 and 64x16x8x16 (8192 rows) 19.8 / 16.8 against 32x16x16x16 15.9 /
   16.9; backward 64x16x16x3 12.0 / 42.6, 64x16x8x8 15.7 / 12.6.  The inference keeps the view
   (16x4x4x16 0.70 / 0.88, 16x8x8x8 1.44 / 2.74, but 16x4x4x4 1.51 / 0.84).  A random sweep
   had found the training forward of NHWC 16x4x4x16 at 0.67x of oneDNN (3.6 against 2.5 us,
   `pair.py --twice`). */
#define WIDE_CL_MIN_ROWS 1024
static int64_t wide_factor(const norm_geom *g, norm_nt_kind kind) {
  const int backward = kind == NORM_NT_BWD;
  if (g->layout == NORMA_CHANNELS_LAST && kind != NORM_NT_INFER && g->m <= WIDE_CL_MIN_ROWS)
    return 1;
  /* rows of exactly one line: wider only for the forward (measured on 16 f32 channels:
     inference 10.8 -> 8.9 ms, training 22-27 -> 17 ms, but the backward 27 -> 32 ms) */
  const int64_t row = g->c * (int64_t)g->esize;
  if (g->layout != NORMA_CHANNELS_LAST || (backward && row == 64)) return 1;
  if (row > 64) {
    /* rows that end inside a line, in a tensor written around the cache: streaming stores
       need whole lines (norm_nt_runs), so k rows make a wide row of whole lines */
    if (norm_nt_runs(row) || !norm_bn_nt_store(g, kind)) return 1;
    const int64_t k = norm_line_rows(row);
    return g->m % k == 0 ? k : 1;
  }
  /* first choice: wide rows of whole 64-byte lines (no partial vector at the end of a row,
     whose masked store would share a line with the next row's streaming stores: measured 2x
     slower inference for C = 3), up to 512 columns.  (For the backward, up to 480 columns,
     the widest rows its AVX-512 strips take, ran 1.05-1.24x faster with AVX-512 at C = 1, 2,
     4, 8 (2^26 values, rows of 256 instead of 512 columns), but 0.86-0.92x with AVX2 in f16;
     the columns must not depend on the ISA, which would change the bits.) */
  for (int64_t k = 512 / g->c; k > 1; k--)
    if (g->m % k == 0 && k * row % 64 == 0) return k;
  for (int64_t k = (256 + g->c - 1) / g->c; k > 1; k--)
    if (g->m % k == 0) return k;
  return 1;
}

/* the callbacks see the op's geometry and arguments, and the first C columns as channels */
static void narrow(const norm_job *jb, const norm_unit *u, norm_job *j, norm_unit *v) {
  const wide_ctx *w = jb->ctx;
  *j = *jb, j->ctx = w->args, j->g = w->g;
  *v = *u, v->nc = w->g->c;
}

/* blocked: channel ch's value (index ch) onto its columns ch * rep .. ch * rep + rep - 1, in
   place.  Blocks of channels from the last: a block is copied out before its columns (at or
   above the block's start, never below it) overwrite it, so the copy loop reads a separate
   buffer and vectorizes; a loop reading v[ch] in place must reload it after each store.
   (With all twelve rows repeated that way, the copy was 86 % of an inference of NCHW
   2x512x1x2; repeating only the rows set and this loop took NCHW 2x1131x1x2 from 14.8 to
   2.4 us.) */
#define DEFINE_EXPAND(name, T)                                                                 \
  static void name(T *v, int64_t c, int64_t rep) {                                            \
    enum { EB = 64 };                                                                         \
    T b[EB];                                                                                  \
    for (int64_t hi = c; hi > 0; hi -= EB) {                                                  \
      const int64_t lo = hi > EB ? hi - EB : 0;                                               \
      memcpy(b, v + lo, (size_t)(hi - lo) * sizeof *b);                                       \
      if (rep == 2) /* runs of two, the commonest: a loop the compiler vectorizes */          \
        for (int64_t i = 0; i < hi - lo; i++) v[2 * (lo + i)] = v[2 * (lo + i) + 1] = b[i];   \
      else                                                                                    \
        for (int64_t i = 0; i < hi - lo; i++)                                                 \
          for (int64_t q = 0; q < rep; q++) v[(lo + i) * rep + q] = b[i];                     \
    }                                                                                         \
  }
DEFINE_EXPAND(expand_f32, float)
DEFINE_EXPAND(expand_f64, double)

/* the first C columns' constants (channel order) onto every column: rows [k0, k1) of the
   kernels' constants, the ones the callback just set (the others keep their columns), and
   the forward's double constants where the apply needs them (slow) */
static void repeat_columns(const norm_job *jb, norm_unit *u, int k0, int k1) {
  const wide_ctx *w = jb->ctx;
  const int64_t c = w->g->c, rep = w->rep;
  const size_t cb = jb->cbytes;
  for (int k = k0; k < k1; k++) {
    char *row = (char *)u->cst + (size_t)k * (size_t)u->cs * cb;
    if (rep && cb == 4) expand_f32((float *)row, c, rep);
    else if (rep) expand_f64((double *)row, c, rep);
    else
      for (int64_t t = c; t < u->nc; t += c) memcpy(row + (size_t)t * cb, row, (size_t)c * cb);
  }
  if (jb->dy || !u->slow) return; /* the backward's dcst is the engine's, set for every column */
  for (int k = 0; k < 3; k++) {
    double *d = &u->dcst[k * u->ts];
    if (rep) expand_f64(d, c, rep);
    else
      for (int64_t t = c; t < u->nc; t += c) memcpy(&d[t], d, (size_t)c * sizeof(double));
  }
}

static void wide_prepare(norm_job *jb, norm_unit *u) {
  const wide_ctx *w = jb->ctx;
  norm_job j;
  norm_unit v;
  narrow(jb, u, &j, &v);
  w->prepare(&j, &v);
  /* only the backward has a prepare: x_hat's constants (and SiLU's, which BatchNorm does not
     have), which the engine lowers before the sums (lower_x) */
  repeat_columns(jb, u, C_A, C_C + 1);
  if (jb->act == BN_ACT_SILU) repeat_columns(jb, u, C_ZS, C_ZB + 1);
}

/* each channel's columns merged in column order into the channel's index */
static void merge_columns(norm_job *jb, norm_unit *u) {
  const wide_ctx *w = jb->ctx;
  const int64_t c = w->g->c, rep = w->rep;
  const double cnt = (double)jb->g->m; /* values per column */
  if (!rep) {
    for (int64_t t = c; t < u->nc; t += c)
      for (int64_t j = 0; j < c; j++) norm_unit_absorb(jb, u, j, t + j, cnt);
    return;
  }
  /* blocked: channel ch's first column ch * rep moves to index ch (every index below ch * rep
     is already merged), then takes in the others */
  for (int64_t ch = 0; ch < c; ch++) {
    const int64_t first = ch * rep;
    for (int k = 0; k < 3; k++) u->tot[k * u->ts + ch] = u->tot[k * u->ts + first];
    for (int64_t q = 1; q < rep; q++) norm_unit_absorb(jb, u, ch, first + q, cnt);
  }
}

static void wide_finalize(norm_job *jb, norm_unit *u) {
  const wide_ctx *w = jb->ctx;
  if (jb->nsums) merge_columns(jb, u);
  norm_job j;
  norm_unit v;
  narrow(jb, u, &j, &v);
  w->finalize(&j, &v);
  u->slow = v.slow;
  if (!jb->apply) return; /* the statistics or the sums alone: no constants to apply */
  if (!jb->dy) repeat_columns(jb, u, C_MHI, C_SHIFT + 1); /* the forward's apply */
  else repeat_columns(jb, u, C_GM, C_DD + 1);               /* dx's, lowered by lower_bwd */
}

/* the wide view of g into *gw: returns its rep (wide_ctx), or -1 when g stays as it is */
static int64_t wide_geom(const norm_geom *g, norm_nt_kind kind, norm_geom *gw) {
  const int backward = kind == NORM_NT_BWD;
  *gw = *g;
  if (g->layout == NORMA_CHANNELS_FIRST) {
    if (!wide_cf_runs(g, backward)) return -1;
    gw->c = g->c * g->s, gw->s = 1;
    norm_geom_finish(gw);
    return g->s;
  }
  const int64_t k = wide_factor(g, kind);
  if (k == 1) return -1;
  gw->c = g->c * k, gw->n = g->m / k, gw->s = 1;
  norm_geom_finish(gw);
  return 0;
}

/* runs jb, through the wide view when the rows are short or end inside a line, or the
   channels-first runs are short */
static norma_status run_bn(norm_job *jb, const norm_geom *g) {
  norm_geom gw;
  const int64_t rep = wide_geom(g, norm_nt_kind_of(jb), &gw);
  if (rep < 0) return norm_run_job(jb);
  wide_ctx w = {jb->ctx, jb->prepare, jb->finalize, g, rep};
  jb->g = &gw, jb->ctx = &w, jb->split = 1, jb->cf_wide = rep > 0;
  jb->prepare = jb->prepare ? wide_prepare : NULL;
  jb->finalize = wide_finalize;
  return norm_run_job(jb);
}

norma_status norm_bn_forward(const norm_geom *g, norm_fwd_mode mode, const norm_fwd_args *a) {
  static const norm_unit_fn fin[] = {finalize_training, finalize_inference, finalize_apply,
                                     finalize_moments};
  norm_job jb = {.g = g, .nsums = (mode == NORM_FWD_TRAINING || mode == NORM_FWD_MOMENTS)
                                      ? SUMS_STATS : SUMS_NONE,
                 .apply = mode != NORM_FWD_MOMENTS, .x = a->x, .res = a->res, .out = a->y,
                 .finalize = fin[mode], .ctx = a};
  return run_bn(&jb, g);
}

/* ---- backward --------------------------------------------------------------------------- */

static double bwd_mean(const norm_geom *g, const norm_bwd_args *a, int64_t ch) {
  return a->mean_d ? a->mean_d[ch] : norma__param(g->dt, a->save_mean, ch, 0);
}
static double bwd_invstd(const norm_geom *g, const norm_bwd_args *a, int64_t ch) {
  return a->invstd_d ? a->invstd_d[ch] : norma__param(g->dt, a->save_invstd, ch, 0);
}

/* prepare_xhat from x with float constants: the same arithmetic without the per-channel
   dtype and constant-type switches (straight-line, vectorizable); with prepare and finalize
   a channel at a time, [2, 4096] spent 64 % of its time in them */
static void prepare_xhat_f32(norm_job *jb, norm_unit *u) {
  const norm_bwd_args *a = jb->ctx;
  const int64_t nc = u->nc, j0 = u->j0;
  float *ca = (float *)u->cst + C_A * u->cs, *cb = (float *)u->cst + C_B * u->cs;
  float *cc = (float *)u->cst + C_C * u->cs;
  const float *sm = a->mean_d ? NULL : (const float *)a->save_mean + j0;
  const float *si = a->invstd_d ? NULL : (const float *)a->save_invstd + j0;
  const double *md = a->mean_d ? a->mean_d + j0 : NULL, *id = a->invstd_d ? a->invstd_d + j0 : NULL;
  const norm_chan_ops *chan = norm_chan();
  enum { FB = 128 };
  double m_b[FB], i_b[FB];
  for (int64_t b0 = 0; b0 < nc; b0 += FB) {
    const int64_t nb = nc - b0 < FB ? nc - b0 : FB;
    if (!md && !id) { /* the float saved statistics, converted in the ISA's loop */
      chan->xhat_consts_f(sm + b0, si + b0, ca + b0, cb + b0, cc + b0, nb);
      continue;
    }
    const double *mp = md ? md + b0 : m_b, *ip = id ? id + b0 : i_b;
    if (!md) param_block(sm + b0, nb, 0.0, m_b);
    if (!id) param_block(si + b0, nb, 0.0, i_b);
    chan->xhat_consts(mp, ip, ca + b0, cb + b0, cc + b0, nb);
  }
}

/* x_hat = (v - a) * b + c: from x with the mean split into its rounded value a and the rest;
   or from y as (y - beta) / gamma. */
static void prepare_xhat(norm_job *jb, norm_unit *u) {
  const norm_bwd_args *a = jb->ctx;
  const norm_geom *g = jb->g;
  if (a->x && jb->cbytes == 4 && g->dt != NORMA_F64 && (a->mean_d || a->save_mean) &&
      (a->invstd_d || a->save_invstd)) {
    prepare_xhat_f32(jb, u);
    return;
  }
  for (int64_t j = 0; j < u->nc; j++) {
    const int64_t ch = u->j0 + j;
    if (!a->x) {
      norm_cst_set(jb, u, C_A, j, norma__param(g->dt, a->beta, ch, 0.0));
      norm_cst_set(jb, u, C_B, j, 1.0 / norma__param(g->dt, a->gamma, ch, 1.0));
      norm_cst_set(jb, u, C_C, j, 0.0);
    } else {
      const double mean = bwd_mean(g, a, ch), is = bwd_invstd(g, a, ch);
      norm_cst_set(jb, u, C_A, j, mean);
      norm_cst_set(jb, u, C_B, j, is);
      const double lo = mean - norm_cst_get(jb, u, C_A, j);
      norm_cst_set(jb, u, C_C, j, lo == 0.0 ? 0.0 : -lo * is);
    }
  }
}

/* dx = k * (g - mg - (xh - s) * S / count);  with GLOBAL_STATS dx = k * g */
static void set_bwd(norm_job *jb, norm_unit *u, int64_t j, double k, double mg, double S_over_count,
                    double s, int global) {
  if (global) norm_set_bwd_consts(jb, u, j, k, 0.0, 0.0, 0.0);
  else norm_set_bwd_consts(jb, u, j, k, mg, -k * S_over_count, k * s * S_over_count);
}

/* finalize_backward with float constants and parameters, not GLOBAL_STATS: the arithmetic of
   the loop below (set_bwd, norm_set_bwd_consts) without its per-channel switches, in the
   ISA's loops (bwd_scale, bwd_consts): converted, multiplied and stored here in baseline code
   the parameters and dgamma, dbeta took a tenth of a one-thread backward of NHWC 1x1344x4x4
   (Zen 5).  Missing gamma reads as ones; unwanted dgamma, dbeta go to scratch. */
static void finalize_backward_f32(norm_job *jb, norm_unit *u) {
  const norm_bwd_args *a = jb->ctx;
  const int64_t nc = u->nc, j0 = u->j0, ts = u->ts, cs = u->cs;
  const double m = (double)jb->g->m;
  const double *t1 = u->tot, *t2 = u->tot + ts, *t3 = u->tot + 2 * ts;
  const float *gam = a->gamma ? (const float *)a->gamma + j0 : NULL;
  const float *si = a->invstd_d ? NULL : (const float *)a->save_invstd + j0;
  const double *id = a->invstd_d ? a->invstd_d + j0 : NULL;
  float *cgm = (float *)u->cst + C_GM * cs, *cda = (float *)u->cst + C_DA * cs;
  float *cdb = (float *)u->cst + C_DB * cs, *cdd = (float *)u->cst + C_DD * cs;
  float *dg = a->dgamma && !jb->quiet ? (float *)a->dgamma + j0 : NULL;
  float *dbt = a->dbeta && !jb->quiet ? (float *)a->dbeta + j0 : NULL;
  const norm_chan_ops *chan = norm_chan();
  enum { FB = 128 };
  double k_b[FB];
  float ones[FB], s_dg[FB], s_db[FB];
  if (!gam)
    for (int k = 0; k < FB; k++) ones[k] = 1.0f;
  for (int64_t b0 = 0; b0 < nc; b0 += FB) {
    const int64_t nb = nc - b0 < FB ? nc - b0 : FB;
    chan->bwd_scale(gam ? gam + b0 : ones, si ? si + b0 : NULL, id ? id + b0 : NULL, k_b, nb);
    chan->bwd_consts(t1 + b0, t2 + b0, t3 + b0, k_b, m, a->x != NULL, cgm + b0, cda + b0,
                     cdb + b0, cdd + b0, dg ? dg + b0 : s_dg, dbt ? dbt + b0 : s_db, nb);
  }
}

static void finalize_backward(norm_job *jb, norm_unit *u) {
  const norm_bwd_args *a = jb->ctx;
  const norm_geom *g = jb->g;
  const int global = (g->flags & NORMA_BN_GLOBAL_STATS) != 0;
  if (!global && jb->cbytes == 4 && g->dt != NORMA_F64 && (a->invstd_d || a->save_invstd)) {
    finalize_backward_f32(jb, u);
    return;
  }
  const double m = (double)g->m;
  for (int64_t j = 0; j < u->nc; j++) {
    const int64_t ch = u->j0 + j;
    const double sg = u->tot[j], sgx = u->tot[u->ts + j], sx = u->tot[2 * u->ts + j];
    const double s = (a->x && !global) ? norm_xhat_offset(sx, m) : 0.0;
    const double S = sgx - s * sg;
    set_bwd(jb, u, j, norma__param(g->dt, a->gamma, ch, 1.0) * bwd_invstd(g, a, ch), sg / m, S / m,
            s, global);
    if (jb->quiet) continue; /* another thread writes the outputs */
    if (a->dgamma) norma__param_store(g->dt, a->dgamma, ch, S);
    if (a->dbeta) norma__param_store(g->dt, a->dbeta, ch, sg);
  }
}

static void finalize_reduce(norm_job *jb, norm_unit *u) {
  const norm_bwd_args *a = jb->ctx;
  for (int64_t j = 0; j < u->nc; j++) {
    const int64_t ch = u->j0 + j;
    a->o_dy[ch] = u->tot[j];
    a->o_dy_xhat[ch] = u->tot[u->ts + j];
    if (a->o_xhat) a->o_xhat[ch] = u->tot[2 * u->ts + j];
  }
}

static void finalize_bwd_apply(norm_job *jb, norm_unit *u) {
  const norm_bwd_args *a = jb->ctx;
  const norm_geom *g = jb->g;
  const int global = (g->flags & NORMA_BN_GLOBAL_STATS) != 0;
  const double cnt = global ? 1.0 : (double)a->count;
  for (int64_t j = 0; j < u->nc; j++) {
    const int64_t ch = u->j0 + j;
    const double sg = global ? 0.0 : a->sum_dy[ch], sgx = global ? 0.0 : a->sum_dy_xhat[ch];
    const double s = (!global && a->sum_xhat) ? a->sum_xhat[ch] / cnt : 0.0;
    set_bwd(jb, u, j, norma__param(g->dt, a->gamma, ch, 1.0) * a->invstd_d[ch], sg / cnt,
            (sgx - s * sg) / cnt, s, global);
  }
}

norma_status norm_bn_backward(const norm_geom *g, norm_bwd_mode mode, const norm_bwd_args *a) {
  static const norm_unit_fn fin[] = {finalize_backward, finalize_reduce, finalize_bwd_apply};
  norm_job jb = {.g = g, .nsums = mode == NORM_BWD_APPLY ? SUMS_NONE : SUMS_BWD,
                 .apply = mode != NORM_BWD_REDUCE, .x = a->x ? a->x : a->y, .y = a->y,
                 .dy = a->dy, .out = a->dx, .dres = a->dres, .prepare = prepare_xhat,
                 .finalize = fin[mode], .ctx = a};
  return run_bn(&jb, g);
}

/* ---- moments of a producer's tile (single-threaded: the producer owns the threads) ------ */

/* mean and m2 of n values from sums relative to the anchor k */
static inline void tile_moments(double k, double t1, double t2, double n, double *mean,
                                double *m2) {
  const double v = t2 - t1 * (t1 / n);
  *mean = k + t1 / n;
  *m2 = v < 0.0 ? 0.0 : v;
}

norma_status norm_bn_moments_tile(norma_dtype dt, int64_t rows, int64_t channels, const void *x,
                                  int64_t row_stride, int64_t channel_stride, double *mean,
                                  double *m2) {
  const bn_ukernels *uk = bn_ukernels_for(norma__isa(), dt);
  const size_t es = norma__dtype_size(dt);
  if (channel_stride == 1 && row_stride >= channels) {
    /* rows of adjacent channels: blocks of rows (the engine's block_rows rule for the
       statistics), anchored at the first block's anchors */
    enum { RC = NORM_ROWS_CHUNK };
    static _Thread_local double t1[RC], t2[RC], kd[RC];
    int64_t br = 64;
    while (br < 256 && 2 * br <= (int64_t)(128 * 1024) / (channels * (int64_t)es)) br *= 2;
    for (int64_t j0 = 0; j0 < channels; j0 += RC) {
      const int64_t nc = channels - j0 < RC ? channels - j0 : RC;
      for (int64_t j = 0; j < nc; j++) t1[j] = t2[j] = 0.0;
      for (int64_t r0 = 0; r0 < rows; r0 += br) {
        const int64_t n = rows - r0 < br ? rows - r0 : br;
        const char *blk = (const char *)x + (size_t)(r0 * row_stride + j0) * es;
        uk->stats_rows(blk, n, row_stride, nc, r0 == 0 ? NULL : kd, t1, t2, r0 == 0 ? kd : NULL,
                       0);
      }
      for (int64_t j = 0; j < nc; j++)
        tile_moments(kd[j], t1[j], t2[j], (double)rows, &mean[j0 + j], &m2[j0 + j]);
    }
    return NORMA_OK;
  }
  if (row_stride == 1) {
    /* each channel a contiguous run, in chunks anchored at the first chunk's anchor */
    for (int64_t j = 0; j < channels; j++) {
      const char *base = (const char *)x + (size_t)(j * channel_stride) * es;
      double s1 = 0.0, s2 = 0.0, kk = 0.0, o[3];
      union { float f; double d; } k;
      for (int64_t r0 = 0; r0 < rows; r0 += NORM_CF_CHUNK) {
        const int64_t n = rows - r0 < NORM_CF_CHUNK ? rows - r0 : NORM_CF_CHUNK;
        uk->stats_run(base + (size_t)r0 * es, n, 1, 0, r0 == 0 ? NULL : (const void *)&k, o);
        if (r0 == 0) {
          kk = o[2];
          if (dt == NORMA_F64) k.d = kk;
          else k.f = (float)kk;
        }
        s1 += o[0], s2 += o[1];
      }
      tile_moments(kk, s1, s2, (double)rows, &mean[j], &m2[j]);
    }
    return NORMA_OK;
  }
  return norm_impl_ref.moments_tile(dt, rows, channels, x, row_stride, channel_stride, mean, m2);
}

/* ---- plan introspection ----------------------------------------------------------------- */

/* the LLC that the threads' fused units may count on holding (a conservative share of the
   two vCPUs', see NORM_NT_FOOTPRINT_TRAIN): only norma_bn_query_plan's count of reads uses it */
#define QUERY_LLC_UNITS ((int64_t)8 << 20)

void norm_cpu_query_plan(const norm_geom *g, int op, norma_bn_plan *out) {
  norm_job jb = {.g = g, .nsums = op == NORMA_BN_OP_FORWARD_INFERENCE ? SUMS_NONE
                                  : op == NORMA_BN_OP_BACKWARD        ? SUMS_BWD
                                                                      : SUMS_STATS,
                 .apply = 1};
  norm_geom gw; /* the call's plan: through the wide view where run_bn takes it */
  const int64_t rep = wide_geom(g, norm_nt_kind_of(&jb), &gw);
  if (rep >= 0) jb.g = &gw, jb.split = 1, jb.cf_wide = rep > 0;
  norm_plan_job(&jb);
  out->fused = jb.fused;
  out->unit = jb.fused ? jb.unit : 0;
  out->threads = jb.nt;
  out->isa = bn_ukernels_isa(norma__isa(), g->dt);
  out->streaming_stores = jb.store != 0;
  out->reference = 0;
  /* reads of the inputs from memory: 1 when there is no reduction, or when a fused unit stays
     in the caches between its reduction and its apply: in the L2 share, or with the units of
     all threads within QUERY_LLC_UNITS (the far channels-first backward's units of a channel,
     engine.c's cf_split_streams: 3.2 MB of x and dy for 32x64x112x112, which its apply reads
     again from the LLC) */
  if (!jb.nsums) {
    out->dram_passes = 1;
  } else if (!jb.fused) {
    out->dram_passes = 2;
  } else {
    const double tensors = jb.nsums == SUMS_BWD ? (g->act != BN_ACT_NONE ? 3 : 2) : 1;
    const double unit_bytes = (double)jb.unit * (double)g->m * (double)g->esize * tensors;
    out->dram_passes = unit_bytes <= (double)norm_unit_budget() ||
                               unit_bytes * (double)jb.nt <= (double)QUERY_LLC_UNITS
                           ? 1
                           : 2;
  }
}
