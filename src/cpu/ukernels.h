/* ukernels.h - the single-threaded micro-kernels the CPU driver (bn_driver.c) is built on.
 *
 * One table per (ISA, dtype).  Kernels never allocate and never spawn threads; the driver owns
 * the thread split, the blocking and the per-channel constants.  Two shapes of work:
 *   *_run:  a contiguous run of `len` values of one channel (channels-first);
 *   *_rows: `rows` rows of `nc` adjacent channels, rows `ld` elements apart (channels-last).
 * Data pointers are already offset to the first value.  Per-channel constants live in the
 * compute type (float for F32/F16/BF16, double for F64) in an array laid out [k][cs]: constant
 * k of the first channel is cst[k * cs] (the pointer is offset to that channel).
 *
 * Numerics contract, shared by every ISA (it is what makes results independent of the thread
 * split): a *_run call accumulates in the compute type with value i in lane i % BN_LANES and
 * reduces the lanes in a fixed order; a *_rows call accumulates each channel sequentially over
 * its rows.  Sums are returned in double; the driver combines blocks in a fixed order.
 *
 * Statistics.  A block (a run chunk, or a block of rows) is read twice while it is in L1/L2:
 * pass 1 gives its sum, min and max, hence an anchor kb: the block mean rounded to a multiple
 * of a power of two q between range/32 and range/16; pass 2 sums d = x - kb and d^2 in the
 * compute type.  |kb - mean| <= q/2 keeps the deviations as small as the block's own spread, so
 * nothing cancels whatever the data's mean (an outlier cancels nothing either: it only widens
 * its block's range); and the few bits of kb keep x - kb and d^2 exact on dyadic data, so
 * symmetric "exact statistics" fills come out exact.  The block then contributes, relative to
 * the channel's anchor K (the first block's kb), t1 = S1 + L*delta and
 * t2 = S2 + 2*delta*S1 + L*delta^2 with delta = kb - K, in double: additive, exact on such
 * data, and cancelling only in double.  See bn_stats_anchor().  The deviations are summed
 * scaled by a power of two S set by the block's range (bn_stats_scale_f32), so that tiny or
 * huge spreads neither underflow nor overflow f32; s1 / S and s2 / S^2 are taken in double.
 */
#ifndef NORMA_UKERNELS_H
#define NORMA_UKERNELS_H

#include <stdint.h>
#include <string.h>

#include "internal.h"

#define BN_LANES 32

/* or-ed into the `act` argument of the apply kernels: outputs may bypass the cache
   (non-temporal stores); kernels without such stores ignore it */
#define BN_STORE_NT 0x100
/* or-ed into the `act` argument of fwd_run / bwd_run / bwd_sums_run: run r takes the
   constants of the r-th channel after cst (cst + r in the compute type), so that one call
   sweeps the consecutive channels of a sample (channels-first runs shorter than a call's fixed
   cost); bwd_sums_run then writes run r's sums to out[3 r .. 3 r + 2], each computed as a call
   for that run alone would */
#define BN_RUN_CHANS 0x200
/* or-ed into the `act` argument of fwd_rows / bwd_rows: the caller walks its rows backwards in
   blocks of the call's size, so the kernel prefetches the block before this one (all of it)
   instead of the rows ahead within the call */
#define BN_PF_BACK 0x400
/* or-ed into the `act` argument of the rows kernels (fwd_rows, bwd_rows, bwd_sums_rows) and
   the `flags` of stats_rows: the tensor is larger than the caches hold, so the kernel
   prefetches the rows ahead (see ukernels_vec.inc).  Without it they issue no prefetches: on
   tensors the caches hold, prefetching cost 1.2-1.4x (Zen 5, AVX-512 and AVX2 alike). */
#define BN_PF_AHEAD 0x800
/* or-ed into the `act` argument of bwd_sums_rows and bwd_rows: the tensor is far beyond the
   caches (NORM_SEQ_BYTES), so the kernels read whole rows in address order (ukernels_vec.inc,
   "rows in address order"): the apply where the rows have up to BN_SEQ_APPLY_MAX channels
   (AVX-512: up to its strips' widest rows, BSTRIP_MAX), the sums where they have up to
   BN_SEQ_SUMS_MAX.  The bits are those without it, except the sums of rows of up to
   BN_SEQ_SUMS_MAX channels, which add a row at a time in f32 within each block of
   BN_SUMS_BLOCK_ROWS rows (instead of rows by fours combined pairwise) on every vector ISA,
   whatever part of the rows a call takes (the row's width ld decides, not the call's
   channels nc) */
#define BN_ROWS_SEQ 0x1000
#define BN_SEQ_APPLY_MAX 256
#define BN_SEQ_ROW_MIN 481 /* past the widest rows of AVX-512's strips (BSTRIP_MAX) */
#define BN_SEQ_SUMS_MAX 1024
/* or-ed into the `act` argument of bwd_rows: with streaming stores, a row at a time instead of
   rows by fours, prefetching ONE_PF_BYTES ahead with BN_PF_AHEAD (the engine's choice:
   norm_bwd_one_row in engine.c); the bits are those without it */
#define BN_ROWS_ONE 0x2000
#define BN_ACT_MASK 0xff
/* rows over which bwd_sums_rows keeps a sum in the compute type before it goes to double */
#define BN_SUMS_BLOCK_ROWS 64
/* activations: the `act` argument takes BN_ACT_* (internal.h; the values of geom.h's
   NORM_ACT_*) */

/* indices of the per-channel constants */
enum {
  /* forward apply: y = act((x - C_MHI) * C_SCALE + C_SHIFT) */
  C_MHI = 0, C_SCALE = 1, C_SHIFT = 2,
  /* backward, as the ops give them (engine.h): x_hat = (v - C_A) * C_B + C_C;
     dx = C_DA * (g - C_GM) + C_DB * x_hat + C_DD; with SiLU, g = dy * silu'(z),
     z = x_hat * C_ZS + C_ZB (gamma and beta) */
  C_A = 0, C_B = 1, C_C = 2, C_GM = 3, C_DA = 4, C_DB = 5, C_DD = 6, C_ZS = 7, C_ZB = 8,
  C_COUNT = 9,
  /* the backward kernels take the engine's lowered form of them (engine.c, lower_x): their
     xh = v * C_XS + C_XO, one fma, where C_XS is a power of two (so xh = C_XS * (v - a)
     exactly, and the rest of x_hat's scale and its offset move into the other constants and
     the sums); dx = C_DA * (g - C_GM) + C_DB * xh + C_DD; z = xh * C_ZS + C_ZB */
  C_XS = 0, C_XO = 1
};
/* indices of the scalar constants of the affine (per-element gamma) kernels */
enum {
  K_A = 0, K_B = 1, K_C = 2,      /* xh = (x - K_A) * K_B + K_C */
  K_GM = 3, K_DA = 4, K_DB = 5, K_DD = 6, /* dx = K_DA * (g * dy - K_GM) + K_DB * xh + K_DD */
  K_COUNT = 7
};

typedef struct bn_ukernels {
  /* a block of nruns >= 1 runs of len >= 1 values of one channel, the runs stride elements
     apart (value i of every run in lane i % 32), channel anchor *k (compute type; NULL: the
     block's own anchor): out[0] = sum (x - k), out[1] = sum (x - k)^2, out[2] = the block's
     anchor kb */
  void (*stats_run)(const void *x, int64_t len, int64_t nruns, int64_t stride, const void *k,
                    double out[3]);
  /* the same for each channel j < nc <= 1024 over rows >= 1 rows, anchors k[j] (double,
     holding values of the compute type; or NULL): sum (x - k) and sum (x - k)^2 added to
     o1[j], o2[j] (which start at +0 for a sum); with k NULL the kernel picks the anchors (the
     vector kernels: the mean of the block's first rows) and writes them to okb[j] (when not
     NULL), for the later blocks of the segment to pass as k; flags: BN_PF_AHEAD or 0 */
  void (*stats_rows)(const void *x, int64_t rows, int64_t ld, int64_t nc, const double *k,
                     double *o1, double *o2, double *okb, int flags);
  /* y = act((x - mhi) * scale + shift [+ res]), nruns runs of len values stride apart */
  void (*fwd_run)(const void *x, const void *res, void *y, int64_t len, int64_t nruns,
                  int64_t stride, const void *cst, int64_t cs, int act);
  void (*fwd_rows)(const void *x, const void *res, void *y, int64_t rows, int64_t ld,
                   int64_t nc, const void *cst, int64_t cs, int act);
  /* g = dy masked by y > 0 (RELU, ADD_RELU) or times silu'(z) (SILU), xh = v * xs + xo (the
     lowered constants above): out = {sum g, sum g*xh, sum xh} */
  void (*bwd_sums_run)(const void *v, const void *y, const void *dy, int64_t len, int64_t nruns,
                       int64_t stride, const void *cst, int64_t cs, int act, double out[3]);
  /* the same sums per channel of a channels-last block: kept in the compute type over each
     BN_SUMS_BLOCK_ROWS rows from the first, and those blocks' sums added in double in row
     order into o1, o2, o3 (written, not added to) */
  void (*bwd_sums_rows)(const void *v, const void *y, const void *dy, int64_t rows, int64_t ld,
                        int64_t nc, const void *cst, int64_t cs, int act, double *o1,
                        double *o2, double *o3);
  /* dx = da * (g - gm) + db * xh + dd;  dres = g (when dres != NULL) */
  void (*bwd_run)(const void *v, const void *y, const void *dy, void *dx, void *dres,
                  int64_t len, int64_t nruns, int64_t stride, const void *cst, int64_t cs, int act);
  void (*bwd_rows)(const void *v, const void *y, const void *dy, void *dx, void *dres,
                   int64_t rows, int64_t ld, int64_t nc, const void *cst, int64_t cs, int act);

  /* ---- the row kernels of LayerNorm / RMSNorm (per-element gamma, beta) ---- */
  /* sum of x^2 over len >= 1 values (value i in lane i % 32), in double */
  double (*sumsq_run)(const void *x, int64_t len);
  /* h = x + r, rounded to the storage type (h may be x or r) */
  void (*add_run)(const void *x, const void *r, void *h, int64_t len);
  /* y = ((x - k[K_A]) * k[K_B] + k[K_C]) * g[j] + b[j]; g, b, k in the compute type; act
     carries BN_STORE_NT only */
  void (*affine_run)(const void *x, void *y, int64_t len, const void *k, const void *g,
                     const void *b, int act);
  /* xh = (x - k[K_A]) * k[K_B] + k[K_C]:  out = {sum g[j] dy, sum g[j] dy xh, sum xh} */
  void (*affine_bwd_sums_run)(const void *x, const void *dy, int64_t len, const void *k,
                              const void *g, double out[3]);
  /* dx = k[K_DA] * (g[j] dy - k[K_GM]) + k[K_DB] * xh + k[K_DD] (+ dsum when not NULL);
     acc_g[j] += dy * xh and acc_b[j] += dy (compute type; each may be NULL) */
  void (*affine_bwd_run)(const void *x, const void *dy, const void *dsum, void *dx,
                         int64_t len, const void *k, const void *g, void *acc_g, void *acc_b,
                         int act);
  /* stats_run(x, len, 1, 0, NULL, out) for two runs x0 and x1 at once (two rows: independent
     work to overlap), the same bits: out[0..2] for x0, out[3..5] for x1 */
  void (*stats_run2)(const void *x0, const void *x1, int64_t len, double out[6]);
  /* stats_run(run r, len, 1, 0, NULL, out + 3 r) for m >= 1 runs of len values back to back
     (run r at element r * len: a sample's consecutive channels), the same bits */
  void (*stats_runs)(const void *x, int64_t len, int64_t m, double *out);
  /* stats_run(channel j, len, nruns, stride, NULL, out + 3 j) for m >= 1 consecutive channels
     of a channels-first block (channel j's runs at element j * len), the same bits: the vector
     kernels take short runs sixteen channels at a time */
  void (*stats_chans)(const void *x, int64_t len, int64_t nruns, int64_t stride, int64_t m,
                      double *out);
  /* bwd_sums_run(channel j, len, nruns, stride, cst + j, cs, act, out + 3 j) for m >= 1
     consecutive channels of a channels-first block (channel j's runs at element j * len), the
     same bits: the AVX-512 kernels take runs of up to 8 values with the channels packed in a
     vector's lanes */
  void (*bwd_sums_chans)(const void *v, const void *y, const void *dy, int64_t len,
                         int64_t nruns, int64_t stride, int64_t m, const void *cst, int64_t cs,
                         int act, double *out);
} bn_ukernels;

/* The block anchor of the statistics (see above), in f32 and f64: the mean sum * inv_len
   rounded to a multiple of q = 2^(exponent(range) - 5); the mean itself where q would be
   finer than its precision, min for a constant block, NaN/Inf propagate. */
static inline float bn_stats_anchor_f32(float sum, float mn, float mx, float inv_len) {
  const float mean = sum * inv_len, range = mx - mn;
  if (range == 0.0f) return mn;
  uint32_t u;
  memcpy(&u, &range, 4);
  const uint32_t e = (u >> 23) & 0xffu;
  if (!(range > 0.0f) || e >= 0xffu || e <= 6u) return mean;
  float q, iq;
  const uint32_t qb = (e - 5u) << 23, iqb = (254u - e + 5u) << 23;
  memcpy(&q, &qb, 4), memcpy(&iq, &iqb, 4);
  const float t = mean * iq;
  if (!(t < 0x1p22f && t > -0x1p22f)) return mean;
  return ((t + 0x1.8p23f) - 0x1.8p23f) * q; /* round to nearest even integer, times q */
}
static inline double bn_stats_anchor_f64(double sum, double mn, double mx, double inv_len) {
  const double mean = sum * inv_len, range = mx - mn;
  if (range == 0.0) return mn;
  uint64_t u;
  memcpy(&u, &range, 8);
  const uint64_t e = (u >> 52) & 0x7ffu;
  if (!(range > 0.0) || e >= 0x7ffu || e <= 6u) return mean;
  double q, iq;
  const uint64_t qb = (e - 5u) << 52, iqb = (2046u - e + 5u) << 52;
  memcpy(&q, &qb, 8), memcpy(&iq, &iqb, 8);
  const double t = mean * iq;
  if (!(t < 0x1p51 && t > -0x1p51)) return mean;
  return ((t + 0x1.8p52) - 0x1.8p52) * q;
}

/* The scale of a block's deviations: S = 2^-E with 2^E <= range < 2^(E+1) (clamped to the
   normal floats), so that the f32 sums of (x - kb) * S and its square neither underflow (a
   channel whose spread is ~1e-42) nor overflow (~1e30).  S is a power of two: on ordinary data
   the scaled sums are the unscaled ones times S exactly, and dividing by S (S^2) in double
   restores them. */
static inline float bn_stats_scale_f32(float range) {
  if (!(range > 0.0f)) return 1.0f; /* constant block (and NaN): no deviations to scale */
  uint32_t u;
  memcpy(&u, &range, 4);
  int e = (int)((u >> 23) & 0xffu), b = 254 - e;
  b = b < 1 ? 1 : b > 254 ? 254 : b;
  const uint32_t sb = (uint32_t)b << 23;
  float sc;
  memcpy(&sc, &sb, 4);
  return sc;
}
static inline double bn_stats_scale_f64(double range) {
  if (!(range > 0.0)) return 1.0;
  uint64_t u;
  memcpy(&u, &range, 8);
  int64_t e = (int64_t)((u >> 52) & 0x7ffu), b = 2046 - e;
  b = b < 1 ? 1 : b > 2046 ? 2046 : b;
  const uint64_t sb = (uint64_t)b << 52;
  double sc;
  memcpy(&sc, &sb, 8);
  return sc;
}

/* a block's contribution relative to the channel anchor K: t1, t2 (see above) */
static inline void bn_stats_shift(double kb, double K, double s1, double s2, double len,
                                  double *t1, double *t2) {
  const double delta = kb - K, ld = len * delta;
  *t1 = s1 + ld;
  *t2 = s2 + 2.0 * delta * s1 + ld * delta;
}

/* Every slot of the table, once: the merge of the tables, the kernel tests and the kernel
   benchmark walk this list (X(name) for each member). */
#define BN_UKERNEL_SLOTS(X)                                                                  \
  X(stats_run) X(stats_rows) X(fwd_run) X(fwd_rows) X(bwd_sums_run) X(bwd_sums_rows)          \
  X(bwd_run) X(bwd_rows) X(sumsq_run) X(add_run) X(affine_run) X(affine_bwd_sums_run)         \
  X(affine_bwd_run) X(stats_run2) X(stats_runs) X(stats_chans) X(bwd_sums_chans)

/* Tables, by dtype; NULL where an ISA has no kernel for that dtype, and NULL entries where it
   lacks a kernel (the engine takes the portable one there: bn_ukernels_for). */
const bn_ukernels *bn_ukernels_scalar(norma_dtype t);
const bn_ukernels *bn_ukernels_avx2(norma_dtype t);
const bn_ukernels *bn_ukernels_avx512(norma_dtype t);
/* bf16 only, with AVX512-BF16 stores (NULL for the other dtypes) */
const bn_ukernels *bn_ukernels_avx512bf16(norma_dtype t);
const bn_ukernels *bn_ukernels_emu16(norma_dtype t); /* the AVX-512 code on AVX2 (testing) */

/* The complete table the engine uses for dtype t on ISA isa (every entry set). */
const bn_ukernels *bn_ukernels_for(norma_isa isa, norma_dtype t);
/* The ISA whose kernels bn_ukernels_for(norma__isa(), t) mostly runs (query_plan). */
norma_isa bn_ukernels_isa(norma_isa isa, norma_dtype t);

/* The forward constants of n channels with float constants (engine.h, norm_set_fwd_consts):
   the mean mean[k] + mlo[k] is split into mhi = (float)mean[k] and lo = (mean[k] - mhi) +
   mlo[k]; shift = beta[k] - lo * scale[k] (beta[k] when lo is 0: no 0 * Inf).  Writes
   cm = mhi, csc = scale, csh = shift as floats and dm, dsc, dsh as doubles; returns nonzero
   when a scale or shift is finite in double but not in float (the engine's slow path).  Each
   ISA's version does the same IEEE operations per channel, so the bits are the same. */
typedef struct norm_fwd_block {
  const double *mean, *mlo, *scale, *beta;
  float *cm, *csc, *csh;
  double *dm, *dsc, *dsh;
} norm_fwd_block;
int norm_fwd_consts(const norm_fwd_block *b, int64_t n);
int norm_fwd_consts_avx2(const norm_fwd_block *b, int64_t n);
int norm_fwd_consts_avx512(const norm_fwd_block *b, int64_t n);
int norm_fwd_consts_scalar(const norm_fwd_block *b, int64_t i, int64_t n);

/* The per-channel arithmetic between a reduction and its apply, for float constants
   (chan_vec.inc has each function's meaning), one copy per ISA: norm_chan() returns the
   widest copy the current ISA runs.  Every copy gives the bits of the scalar one. */
/* the arguments of norm_chan_ops.fwd_final (chan_vec.inc): the statistics t1, t2, k of m values
   per channel; gamma, beta (ones and zeros where the layer has none); the outputs save_mean,
   save_invstd, run_mean and run_var (updated with w_old, w_new; the variance unbiased unless
   biased): scratch where not wanted, the running statistics' zeroed; the kernels' constants
   cm, csc, csh and their doubles dm, dsc, dsh.  Every pointer valid: the loop has no branch */
typedef struct norm_fwd_final {
  const double *t1, *t2, *k;
  double m, eps, w_old, w_new;
  const float *gamma, *beta;
  float *save_mean, *save_invstd, *run_mean, *run_var;
  float *cm, *csc, *csh;
  double *dm, *dsc, *dsh;
  int biased;
} norm_fwd_final;

typedef struct norm_chan_ops {
  int (*fwd_final)(const norm_fwd_final *f, int64_t n);
  void (*xhat_consts)(const double *mean, const double *is, float *ca, float *cb, float *cc,
                      int64_t n);
  void (*bwd_consts)(const double *t1, const double *t2, const double *t3, const double *kk,
                     double m, int xg, float *cgm, float *cda, float *cdb, float *cdd,
                     float *dg, float *db_out, int64_t n);
  void (*bwd_scale)(const float *gamma, const float *si, const double *id, double *k,
                    int64_t n);
  void (*lower_x)(const float *a, const float *b, const float *c, float *xs, float *xo,
                  float *rho, float *cc, int64_t n);
  void (*lower_bwd)(const float *o, const float *rho, const float *cc, float *k, int64_t cs,
                    int64_t n);
  void (*convert_sums)(const float *rho, const float *cc, const double *t1, double *t2,
                       double *t3, double cnt, int64_t n);
  void (*absorb)(int stats, double *t1, double *t2, double *t3, const double *s1,
                 const double *s2, const double *s3, double cnt, int64_t n);
  void (*infer_prep)(const float *mean, const float *var, const float *gamma, const float *beta,
                     double eps, double *m_out, double *sc_out, double *b_out, int64_t n);
  void (*row_partials)(double *pg, double *pb, const float *ag, const float *ab, int first,
                       int64_t n);
  void (*add_d)(double *q, const double *p, int64_t n);
  void (*xhat_consts_f)(const float *sm, const float *si, float *ca, float *cb, float *cc,
                        int64_t n);
  void (*set_d)(double *q, const double *p, int64_t n);
} norm_chan_ops;
const norm_chan_ops *norm_chan(void);
extern const norm_chan_ops norm_chan_ops_base, norm_chan_ops_avx2, norm_chan_ops_avx512;

#endif
