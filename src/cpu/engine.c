/* engine.c - the scheduler of every norm (engine.h): thread split, units, segments, scratch,
 * the two schedules, and the calls into the micro-kernels.
 *
 * Two schedules, same arithmetic:
 *   fused:  threads take units (a block of channels of a range of samples, whole groups); each
 *           reduces its unit, finalizes it and applies it while the data is still in cache:
 *           one DRAM read when the unit fits.
 *   split:  (BatchNorm) threads take segments of the reduction; partial results go to scratch,
 *           are combined in order, then every thread applies a contiguous share.  For few
 *           channels, and for channels-last tensors whose units would not fit.
 */
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "engine.h"
#include "shares.h"

#ifdef _OPENMP
#include <omp.h>
#else
static inline int omp_get_thread_num(void) { return 0; }
static inline int omp_get_num_threads(void) { return 1; }
#endif

/* rows per micro-kernel call in the channels-last statistics: blocks of about 128 KiB (a
   segment's first block is read twice while in L2, to set the anchors; the later ones once,
   around them; a larger block spreads the per-channel work of a call over more values), a
   power of two in [64, 256]: each channel adds its rows in one f32 lane, so more rows would
   cost accuracy.  (The backward's sums take a segment per call, in blocks of
   BN_SUMS_BLOCK_ROWS inside the kernel.)  Shape alone decides it. */
static inline int64_t block_rows(int64_t c, size_t esize) {
  const int64_t target = (int64_t)(128 * 1024) / (c * (int64_t)esize);
  int64_t b = 64;
  while (b < 256 && 2 * b <= target) b *= 2;
  return b;
}

/* ---- scratch ---------------------------------------------------------------------------- */

/* Each thread keeps its scratch between calls: per-call allocation cost more than a small
   BatchNorm itself (measured: a 64-value inference went from 1.0 us to 0.35 us per call). */
static pthread_key_t scratch_key[3];
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
typedef struct scratch { size_t size; void *mem; } scratch;
static void scratch_free(void *s) {
  if (s) free(((scratch *)s)->mem);
  free(s);
}
static void scratch_init(void) {
  (void)pthread_key_create(&scratch_key[0], scratch_free);
  (void)pthread_key_create(&scratch_key[1], scratch_free);
  (void)pthread_key_create(&scratch_key[2], scratch_free);
}

void *norm_scratch_ex(int slot, size_t bytes, int *fresh) {
  if (fresh) *fresh = 0;
  (void)pthread_once(&scratch_once, scratch_init);
  scratch *s = pthread_getspecific(scratch_key[slot]);
  if (!s) {
    s = calloc(1, sizeof *s);
    if (!s || pthread_setspecific(scratch_key[slot], s) != 0) {
      free(s);
      return NULL;
    }
  }
  if (s->size < bytes) {
    const size_t sz = (bytes + 4095) & ~(size_t)4095;
    void *m = aligned_alloc(64, sz);
    if (!m) return NULL;
    free(s->mem);
    s->mem = m;
    s->size = sz;
    if (fresh) *fresh = 1, memset(m, 0, sz);
  }
  return s->mem;
}
void *norm_scratch(int slot, size_t bytes) { return norm_scratch_ex(slot, bytes, NULL); }

/* ---- kernels ---------------------------------------------------------------------------- */

void norm_job_kernels(norm_job *jb) {
  jb->cbytes = jb->g->dt == NORMA_F64 ? 8 : 4;
  jb->uk = bn_ukernels_for(norma__isa(), jb->g->dt);
}

/* ---- constants -------------------------------------------------------------------------- */

/* ---- geometry --------------------------------------------------------------------------- */

static inline const void *tptr(const norm_job *jb, const void *base, int64_t elem) {
  return base ? (const char *)base + (size_t)elem * jb->g->esize : NULL;
}
static inline void *tptr_w(const norm_job *jb, void *base, int64_t elem) {
  return base ? (char *)base + (size_t)elem * jb->g->esize : NULL;
}
/* the constants the kernels take: the forward's as the op set them, the backward's lowered */
static inline const void *kcst(const norm_job *jb, const norm_unit *u) {
  return jb->dy ? u->kst : u->cst;
}
static inline const void *cst_at(const norm_job *jb, const norm_unit *u, int64_t jrel) {
  return (const char *)kcst(jb, u) + (size_t)jrel * jb->cbytes;
}

/* ---- the backward's kernel constants ---------------------------------------------------- */

/* The ops give x_hat = (v - a) * b + c (c: the rest of a mean that a rounds).  The kernels
   take xh = v * S + O instead, one fma where x_hat took a subtract and an fma: S = 2^e with e
   the exponent of b and O = -a * S, both exact, so xh = S * (v - a) with the rounding of
   v - a alone, and x_hat = rho * xh + c with rho = b / S in [1, 2).  The engine lowers the
   constants before the kernels run (lower_x, lower_bwd) and turns the kernels' sums over xh
   into the op's sums over x_hat (convert_sums, in double).  Where b is 0, subnormal, Inf or
   NaN, or |a| S would leave the compute type's range (mean / std beyond 2^126 in float),
   S = 1 and rho = b.  rho and c stay in the unit's dcst, in the compute type. */

/* The float compute type's lowering is the ISA's (norm_chan: chan_vec.inc); the double one
   follows, the same steps. */

/* S for the double compute type: the bits of 2^e are b's exponent field alone */
static inline double lower_scale_f64(double a, double b) {
  uint64_t ub;
  memcpy(&ub, &b, sizeof ub);
  const uint64_t e = (ub >> 52) & 0x7ffu, us = e - 1u < 2046u ? e << 52 : 0x3ff0000000000000u;
  double S;
  memcpy(&S, &us, sizeof S);
  return fabs(a) * S <= 0x1p1022 ? S : 1.0;
}

/* xs = S, xo = -a S, rho = b / S, and with SiLU the gate's constants on xh */
static void lower_x(const norm_job *jb, norm_unit *u) {
  const int64_t cs = u->cs, ts = u->ts, nc = u->nc;
  if (jb->cbytes == 4) {
    const float *c = u->cst;
    float *k = u->kst, *rho = (float *)u->dcst, *cc = rho + ts;
    norm_chan()->lower_x(c + C_A * cs, c + C_B * cs, c + C_C * cs, k + C_XS * cs, k + C_XO * cs,
                         rho, cc, nc);
    if (jb->act == BN_ACT_SILU)
      for (int64_t j = 0; j < nc; j++)
        k[C_ZS * cs + j] = c[C_ZS * cs + j] * rho[j],
        k[C_ZB * cs + j] = c[C_ZS * cs + j] * cc[j] + c[C_ZB * cs + j];
    return;
  }
  const double *restrict a = (const double *)u->cst + C_A * cs;
  const double *restrict b = (const double *)u->cst + C_B * cs;
  const double *restrict c = (const double *)u->cst + C_C * cs;
  double *restrict xs = (double *)u->kst + C_XS * cs, *restrict xo = (double *)u->kst + C_XO * cs;
  double *restrict rho = u->dcst, *restrict cc = u->dcst + ts;
  for (int64_t j = 0; j < nc; j++) {
    const double S = lower_scale_f64(a[j], b[j]);
    xs[j] = S, xo[j] = -a[j] * S, rho[j] = b[j] / S, cc[j] = c[j];
  }
  if (jb->act == BN_ACT_SILU) {
    const double *restrict zs = (const double *)u->cst + C_ZS * cs;
    const double *restrict zb = (const double *)u->cst + C_ZB * cs;
    double *restrict kzs = (double *)u->kst + C_ZS * cs;
    double *restrict kzb = (double *)u->kst + C_ZB * cs;
    for (int64_t j = 0; j < nc; j++) kzs[j] = zs[j] * rho[j], kzb[j] = zs[j] * cc[j] + zb[j];
  }
}

/* dx = da (g - gm) + db x_hat + dd = da (g - gm) + (db rho) xh + (db c + dd) */
static void lower_bwd(const norm_job *jb, norm_unit *u) {
  const int64_t cs = u->cs, ts = u->ts, nc = u->nc;
  if (jb->cbytes == 4) {
    const float *rho = (const float *)u->dcst;
    norm_chan()->lower_bwd(u->cst, rho, rho + ts, u->kst, cs, nc);
    return;
  }
  const double *restrict o = u->cst, *restrict rho = u->dcst, *restrict cc = u->dcst + ts;
  double *restrict k = u->kst;
  for (int64_t j = 0; j < nc; j++) {
    const double db = o[C_DB * cs + j];
    k[C_GM * cs + j] = o[C_GM * cs + j], k[C_DA * cs + j] = o[C_DA * cs + j];
    k[C_DB * cs + j] = db * rho[j], k[C_DD * cs + j] = db * cc[j] + o[C_DD * cs + j];
  }
}

/* the kernels' sums {g, g xh, xh} over cnt values per channel -> {g, g x_hat, x_hat}; c == 0
   adds nothing (not 0 * Inf: an infinite sum of g keeps its sign in the sum of g x_hat) */
static void convert_sums(const norm_job *jb, norm_unit *u, double cnt) {
  const int64_t ts = u->ts, nc = u->nc;
  double *restrict t = u->tot;
  if (jb->cbytes == 4) {
    const float *rho = (const float *)u->dcst;
    norm_chan()->convert_sums(rho, rho + ts, t, t + ts, t + 2 * ts, cnt, nc);
    return;
  }
  const double *restrict rho = u->dcst, *restrict cc = u->dcst + ts;
  for (int64_t j = 0; j < nc; j++) {
    const double c = cc[j];
    t[ts + j] = rho[j] * t[ts + j] + (c != 0.0 ? c * t[j] : 0.0);
    t[2 * ts + j] = rho[j] * t[2 * ts + j] + c * cnt;
  }
}

/* Channels-first segments of a channel: a run (one sample's s values) is cut into chunks of at
   most NORM_CF_CHUNK values; short runs are taken a few samples at a time (about 512 values,
   at most 8 runs: one kernel call for them instead of eight, while the runs, a sample apart in
   memory, stay few enough for the hardware prefetchers to follow; measured on 7x7 and 14x14
   layers).  Samples per segment and chunks per run depend on s alone. */
static int64_t cf_chunks(const norm_job *jb) {
  return (jb->g->s + NORM_CF_CHUNK - 1) / NORM_CF_CHUNK;
}
static int64_t cf_spr(const norm_job *jb) {
  const int64_t v = 512 / jb->g->s;
  return v < 1 ? 1 : v > 8 ? 8 : v;
}
/* The samples per segment of the reductions (cf_spr is the apply's).  Where the split schedule
   streams runs of 512 bytes or more (128-170 f32 values: cf_spr 3 or 4), a segment takes at
   most two samples: three or four runs a sample apart per call, in x and dy, were read at
   about two thirds of the speed of two (Zen 5, 2 threads, the backward's reduce alone in
   bench/probes/bph.c, NCHW f32: 128x720x12x12 2.86 -> 1.94 ms, 64x1024x8x16 1.85 -> 0.97 ms,
   128x768x12x12 3.3 -> 2.2 ms).  Paired (pair.py --twice, against 3 or 4):
   backward 128x768x12x12 1.32x, 32x1024x12x12 1.46x, 16x512x13x13 1.19x, forward 1.18x,
   1.09x, 1.31x.  Not for 16-bit runs (288 bytes: bf16 forward 128x768x12x12 0.86x) nor for
   the fused schedule (10x2048x10x16 0.90-0.93x).  The segments set the order of the sums, so
   this depends on the shape alone: both schedules, any thread count, the same bits. */
static int cf_split_streams(const norm_job *jb);
static int64_t cf_spr_sums(const norm_job *jb) {
  const int64_t v = cf_spr(jb);
  if (v > 2 && jb->g->s * (int64_t)jb->g->esize >= 512 && cf_split_streams(jb)) return 2;
  return v;
}
/* channels-first runs applied a sample at a time (NORM_CF_SWEEP_BELOW, engine.h) */
static int cf_sweep(const norm_job *jb) {
  return cf_chunks(jb) == 1 && jb->g->s * (int64_t)jb->g->esize < NORM_CF_SWEEP_BELOW;
}

/* Channels-first statistics of short runs (a segment of several samples in one call) go
   through stats_chans, which takes blocks of few values sixteen channels at a time and the
   others a channel at a time: the same bits either way (ukernels.h). */
#define CF_CHANS_MAX_S 128
static int cf_chans(const norm_job *jb) {
  return jb->nsums == SUMS_STATS && cf_chunks(jb) == 1 && cf_spr_sums(jb) > 1 &&
         jb->g->s <= CF_CHANS_MAX_S;
}
/* the same for the backward's sums: one bwd_sums_chans call for up to NORM_CF_RUNS channels
   instead of one bwd_sums_run call each (bwd NCHW 2x1344x4x2: the calls and their absorbs
   were half the time) */
static int cf_chans_bwd(const norm_job *jb) {
  return jb->nsums == SUMS_BWD && cf_chunks(jb) == 1 && jb->g->s <= CF_CHANS_MAX_S;
}
/* the statistics (or the backward's sums: cf_chans_bwd) of channels [ch, ch + m)
   (m <= NORM_CF_RUNS) of the samples [i, i + nr) into out[3 j ..]: seg_sums_cf of each, the
   same bits; u: the unit whose constants the backward's sums take */
static void sums_cf_chans(const norm_job *jb, const norm_unit *u, int64_t ch, int64_t m,
                           int64_t i, int64_t nr, double *out) {
  const norm_geom *g = jb->g;
  const int64_t e = (i * g->c + ch) * g->s;
  if (jb->nsums == SUMS_STATS)
    jb->uk->stats_chans(tptr(jb, jb->x, e), g->s, nr, g->c * g->s, m, out);
  else
    jb->uk->bwd_sums_chans(tptr(jb, jb->x, e), tptr(jb, jb->y, e), tptr(jb, jb->dy, e), g->s, nr,
                           g->c * g->s, m, cst_at(jb, u, ch - u->j0), u->cs, jb->act, out);
}

/* rows of the samples [i0, i1) in rows form */
static inline int64_t row_of(const norm_job *jb, int64_t i) { return i * jb->g->s; }
/* rows per segment of a channels-last reduction over `rows` rows (norm_cl_seg_len) */
static inline int64_t seg_len(const norm_job *jb, int64_t rows) {
  return norm_cl_seg_len(rows, jb->g->c * (int64_t)jb->g->esize);
}

/* the narrowest unit of the fused schedule in rows form: one 64-byte line of each row */
static int64_t rows_line(const norm_job *jb) {
  int64_t u = 64 / (int64_t)jb->g->esize;
  return u < 8 ? 8 : u;
}

/* ---- reduction of one segment ----------------------------------------------------------- */

/* channels per stats_runs call (the channels-first statistics of a sample's consecutive runs) */
#define NORM_CF_RUNS 64
/* channels-first: chunk q of channel ch of the samples [i, i + nr) -> out[3] */
static void seg_sums_cf(const norm_job *jb, const norm_unit *u, int64_t ch, int64_t i, int64_t nr,
                        int64_t q, double *out) {
  const norm_geom *g = jb->g;
  const int64_t s0 = q * NORM_CF_CHUNK;
  const int64_t len = g->s - s0 < NORM_CF_CHUNK ? g->s - s0 : NORM_CF_CHUNK;
  const int64_t e = (i * g->c + ch) * g->s + s0, stride = g->c * g->s;
  if (jb->nsums == SUMS_STATS)
    jb->uk->stats_run(tptr(jb, jb->x, e), len, nr, stride, NULL, out); /* t1, t2, anchor */
  else
    jb->uk->bwd_sums_run(tptr(jb, jb->x, e), tptr(jb, jb->y, e), tptr(jb, jb->dy, e), len, nr,
                         stride, cst_at(jb, u, ch - u->j0), u->cs, jb->act, out);
}

static int64_t cf_chunk_len(const norm_job *jb, int64_t q) {
  const int64_t s0 = q * NORM_CF_CHUNK;
  return jb->g->s - s0 < NORM_CF_CHUNK ? jb->g->s - s0 : NORM_CF_CHUNK;
}

/* rows form: rows [r0, r1) (one segment), channels [j0, j0 + nc) -> out[k * ostride + j]: the
   statistics (t1, t2 relative to the segment's anchor, the anchor), or the backward's three
   sums; the backward's constants are those of unit u */
static void seg_sums_rows(const norm_job *jb, const norm_unit *u, int64_t r0, int64_t r1,
                          int64_t j0, int64_t nc, double *out, int64_t ostride) {
  const norm_geom *g = jb->g;
  static _Thread_local double blk[3][NORM_ROWS_CHUNK];
  if (jb->nsums != SUMS_STATS) {
    /* the backward's sums: one call per chunk of channels for all the rows (the kernel keeps
       them in the compute type over blocks of BN_SUMS_BLOCK_ROWS rows, in double beyond).
       Each chunk's sums are written once, as blk + 0.0: the bits of 0.0 + blk, which they were
       when out was zeroed first and added to (the zeroing, a memset a sum, and the additions
       took a fifth of a one-thread backward NHWC 2x896x2x2). */
    for (int64_t jc = 0; jc < nc; jc += NORM_ROWS_CHUNK) {
      const int64_t ncc = nc - jc < NORM_ROWS_CHUNK ? nc - jc : NORM_ROWS_CHUNK, ja = j0 + jc;
      const int64_t e = r0 * g->c + ja;
      jb->uk->bwd_sums_rows(tptr(jb, jb->x, e), tptr(jb, jb->y, e), tptr(jb, jb->dy, e), r1 - r0,
                            g->c, ncc, cst_at(jb, u, ja - u->j0), u->cs,
                            jb->act | jb->pf | jb->seq, blk[0], blk[1], blk[2]);
      for (int k = 0; k < 3; k++) norm_chan()->set_d(&out[k * ostride + jc], blk[k], ncc);
    }
    return;
  }
  for (int k = 0; k < 3; k++)
    for (int64_t j = 0; j < nc; j++) out[k * ostride + j] = 0.0;
  /* statistics: row blocks outer, whole rows (up to ROWS_CHUNK channels) inner: memory is
     read in order; a channel still sees its blocks in order, whatever the loop nest.  The
     first block writes the segment's anchors (out[2]), the later ones sum around them. */
  const int64_t br = block_rows(g->c, g->esize);
  for (int64_t r = r0; r < r1; r += br) {
    const int64_t rows = r1 - r < br ? r1 - r : br;
    for (int64_t jc = 0; jc < nc; jc += NORM_ROWS_CHUNK) {
      const int64_t ncc = nc - jc < NORM_ROWS_CHUNK ? nc - jc : NORM_ROWS_CHUNK, ja = j0 + jc;
      const int first = r == r0;
      jb->uk->stats_rows(tptr(jb, jb->x, r * g->c + ja), rows, g->c, ncc,
                         first ? NULL : &out[2 * ostride + jc], &out[jc], &out[ostride + jc],
                         first ? &out[2 * ostride + jc] : NULL, jb->pf);
    }
  }
}

/* tot[.. jrel] absorbs a partial result s[k * stride] of cnt values.  Statistics: (t1, t2,
   anchor) re-anchored to the total's anchor (its first partial's) and added; the backward's
   sums: added. */
static inline void absorb(const norm_job *jb, double *tot, int64_t ts, int64_t jrel, int first,
                          const double *s, int64_t stride, double cnt) {
  if (jb->nsums == SUMS_STATS) {
    if (first) {
      tot[jrel] = s[0], tot[ts + jrel] = s[stride], tot[2 * ts + jrel] = s[2 * stride];
      return;
    }
    double t1, t2;
    bn_stats_shift(s[2 * stride], tot[2 * ts + jrel], s[0], s[stride], cnt, &t1, &t2);
    tot[jrel] += t1;
    tot[ts + jrel] += t2;
  } else {
    for (int k = 0; k < 3; k++) tot[k * ts + jrel] += s[k * stride];
  }
}

/* absorb for channels [0, nc) at once: tot[j] absorbs s[j] (k * stride apart) of cnt values
   each; the same operations as absorb, in the ISA's loops (norm_chan) */
static void absorb_all(const norm_job *jb, double *tot, int64_t ts, int64_t nc, int first,
                       const double *s, int64_t stride, double cnt) {
  double *t1 = tot, *t2 = tot + ts, *t3 = tot + 2 * ts;
  const double *s1 = s, *s2 = s + stride, *s3 = s + 2 * stride;
  if (first) {
    memcpy(t1, s1, (size_t)nc * sizeof *t1), memcpy(t2, s2, (size_t)nc * sizeof *t2);
    memcpy(t3, s3, (size_t)nc * sizeof *t3);
  } else {
    norm_chan()->absorb(jb->nsums == SUMS_STATS, t1, t2, t3, s1, s2, s3, cnt, nc);
  }
}

/* ---- the reduction of a unit ------------------------------------------------------------ */

/* per-sample channels-first statistics: a group's values are one contiguous run of cpg * s
   values, reduced in chunks straight into the group's first channel's slot */
static void unit_stats_groups_cf(norm_job *jb, norm_unit *u) {
  const norm_geom *g = jb->g;
  const int64_t len = g->cpg * g->s, i = u->i0;
  for (int64_t j = 0; j < u->nc; j += g->cpg) {
    const int64_t e0 = (i * g->c + u->j0 + j) * g->s;
    double o[3];
    for (int64_t q = 0; q * NORM_CF_CHUNK < len; q++) {
      const int64_t n = len - q * NORM_CF_CHUNK < NORM_CF_CHUNK ? len - q * NORM_CF_CHUNK
                                                                : NORM_CF_CHUNK;
      jb->uk->stats_run(tptr(jb, jb->x, e0 + q * NORM_CF_CHUNK), n, 1, 0, NULL, o);
      absorb(jb, u->tot, u->ts, j, q == 0, o, 1, (double)n);
    }
  }
}

/* merges the per-channel statistics of each group of the unit into the group's first channel,
   in channel order (per-sample norms with cpg > 1) */
void norm_unit_absorb(const norm_job *jb, norm_unit *u, int64_t dst, int64_t src, double cnt) {
  const double t[3] = {u->tot[src], u->tot[u->ts + src], u->tot[2 * u->ts + src]};
  absorb(jb, u->tot, u->ts, dst, 0, t, 1, cnt);
}

static void unit_merge_groups(norm_job *jb, norm_unit *u, double cnt_per_channel) {
  const int64_t cpg = jb->g->cpg;
  for (int64_t j = 0; j < u->nc; j += cpg)
    for (int64_t k = 1; k < cpg; k++) {
      const double s[3] = {u->tot[j + k], u->tot[u->ts + j + k], u->tot[2 * u->ts + j + k]};
      absorb(jb, u->tot, u->ts, j, 0, s, 1, cnt_per_channel);
    }
}

static void unit_reduce(norm_job *jb, norm_unit *u) {
  const norm_geom *g = jb->g;
  /* (rows form: the first segment's absorb sets the totals, or one segment writes them) */
  if (!jb->rows_form)
    for (int k = 0; k < 3; k++)
      for (int64_t j = 0; j < u->nc; j++) u->tot[k * u->ts + j] = 0.0;
  if (g->per_sample && !jb->rows_form && jb->nsums == SUMS_STATS) {
    unit_stats_groups_cf(jb, u);
    return;
  }
  if (jb->rows_form) {
    const int64_t r0 = row_of(jb, u->i0), r1 = row_of(jb, u->i1);
    const int64_t seg = seg_len(jb, r1 - r0);
    if (r1 - r0 <= seg) {
      /* one segment (or none: zero sums): its sums are the totals, written in place (the
         first partial's absorb is a copy), without the zeroing and the copy of 3 doubles a
         channel (6 % of a one-thread NHWC 1x2304x7x7 training forward) */
      seg_sums_rows(jb, u, r0, r1, u->j0, u->nc, u->tot, u->ts);
    } else {
      /* the unit's segment buffer follows its arrays (unit_arrays) */
      double *s = (double *)((char *)u->dcst + norm_up64((size_t)u->ts * 3 * sizeof(double)));
      for (int64_t ra = r0; ra < r1; ra += seg) {
        const int64_t rb = ra + seg < r1 ? ra + seg : r1;
        seg_sums_rows(jb, u, ra, rb, u->j0, u->nc, s, u->ts);
        absorb_all(jb, u->tot, u->ts, u->nc, ra == r0, s, u->ts, (double)(rb - ra));
      }
    }
  } else if (jb->nsums == SUMS_BWD && u->i1 - u->i0 == 1 && cf_sweep(jb)) {
    /* one sample's short runs (a per-sample norm's unit): one call sweeps its channels
       (BN_RUN_CHANS), each channel's sums as its own call would give them, into the unit's
       segment buffer (3 * ts doubles after dcst) */
    double *s = (double *)((char *)u->dcst + norm_up64((size_t)u->ts * 3 * sizeof(double)));
    const int64_t e = (u->i0 * g->c + u->j0) * g->s;
    jb->uk->bwd_sums_run(tptr(jb, jb->x, e), tptr(jb, jb->y, e), tptr(jb, jb->dy, e), g->s, u->nc,
                         g->s, kcst(jb, u), u->cs, jb->act | BN_RUN_CHANS, s);
    for (int64_t j = 0; j < u->nc; j++) absorb(jb, u->tot, u->ts, j, 1, &s[3 * j], 1, (double)g->s);
  } else {
    const int64_t nch = cf_chunks(jb), spr = cf_spr_sums(jb);
    double s[3];
    for (int64_t i = u->i0; i < u->i1; i += spr) {
      const int64_t nr = u->i1 - i < spr ? u->i1 - i : spr;
      if (jb->nsums == SUMS_STATS && nch == 1 && spr == 1 && u->nc > 1) {
        /* the sample's runs of the unit's channels lie back to back: stats_runs (see
           split_sums_cf), each channel absorbing its run in sample order as below */
        double o[3 * NORM_CF_RUNS];
        for (int64_t j = 0; j < u->nc; j += NORM_CF_RUNS) {
          const int64_t m = u->nc - j < NORM_CF_RUNS ? u->nc - j : NORM_CF_RUNS;
          jb->uk->stats_runs(tptr(jb, jb->x, (i * g->c + u->j0 + j) * g->s), g->s, m, o);
          for (int64_t r = 0; r < m; r++)
            absorb(jb, u->tot, u->ts, j + r, i == u->i0, &o[3 * r], 1, (double)g->s);
        }
        continue;
      }
      if (cf_chans(jb) || cf_chans_bwd(jb)) {
        /* short runs: the statistics (or the backward's sums) of the unit's channels in
           stats_chans (bwd_sums_chans) calls (the same bits per channel as a call each), each
           channel absorbing its segments in order */
        double o[3 * NORM_CF_RUNS];
        for (int64_t j = 0; j < u->nc; j += NORM_CF_RUNS) {
          const int64_t m = u->nc - j < NORM_CF_RUNS ? u->nc - j : NORM_CF_RUNS;
          sums_cf_chans(jb, u, u->j0 + j, m, i, nr, o);
          for (int64_t r = 0; r < m; r++)
            absorb(jb, u->tot, u->ts, j + r, i == u->i0, &o[3 * r], 1, (double)(nr * g->s));
        }
        continue;
      }
      for (int64_t j = 0; j < u->nc; j++)
        for (int64_t q = 0; q < nch; q++) { /* channel j0 + j sees its segments in order */
          seg_sums_cf(jb, u, u->j0 + j, i, nr, q, s);
          absorb(jb, u->tot, u->ts, j, i == u->i0 && q == 0, s, 1,
                 (double)(nr * cf_chunk_len(jb, q)));
        }
    }
  }
  if (g->per_sample && jb->nsums == SUMS_STATS && g->cpg > 1)
    unit_merge_groups(jb, u, (double)g->s);
  if (jb->nsums == SUMS_BWD) convert_sums(jb, u, (double)((u->i1 - u->i0) * g->s));
}

void norm_unit_xhat_sums(const norm_job *jb, norm_unit *u) {
  norm_job t = *jb; /* a copy: other threads run other units of jb meanwhile */
  t.nsums = SUMS_BWD, t.act = BN_ACT_NONE, t.dy = t.x, t.y = NULL;
  lower_x(&t, u);
  unit_reduce(&t, u);
}

/* ---- apply ------------------------------------------------------------------------------ */

/* the forward in double for a unit whose constants overflow the compute type (slow, rare) */
static void unit_apply_slow(const norm_job *jb, const norm_unit *u) {
  const norm_geom *g = jb->g;
  for (int64_t i = u->i0; i < u->i1; i++)
    for (int64_t j = 0; j < u->nc; j++) {
      const double mhi = u->dcst[j], sc = u->dcst[u->ts + j], sh = u->dcst[2 * u->ts + j];
      for (int64_t sp = 0; sp < g->s; sp++) {
        const int64_t e = norm_index(g, i, u->j0 + j, sp);
        double v = (norma__load(g->dt, jb->x, e) - mhi) * sc + sh;
        if (g->act == BN_ACT_ADD_RELU) v += norma__load(g->dt, jb->res, e);
        if (g->act == BN_ACT_RELU || g->act == BN_ACT_ADD_RELU)
          v = v > 0.0 ? v : (v != v ? v : 0.0);
        if (g->act == BN_ACT_SILU) v = v / (1.0 + exp(-v));
        norma__store(g->dt, jb->out, e, v);
      }
    }
}

static void apply_cf(const norm_job *jb, const norm_unit *u, int64_t ch, int64_t i, int64_t nr,
                     int64_t q) {
  const norm_geom *g = jb->g;
  const int64_t s0 = q * NORM_CF_CHUNK, len = cf_chunk_len(jb, q);
  const int64_t e = (i * g->c + ch) * g->s + s0, stride = g->c * g->s;
  const void *k = cst_at(jb, u, ch - u->j0);
  if (jb->dy)
    jb->uk->bwd_run(tptr(jb, jb->x, e), tptr(jb, jb->y, e), tptr(jb, jb->dy, e),
                    tptr_w(jb, jb->out, e), tptr_w(jb, jb->dres, e), len, nr, stride, k, u->cs,
                    g->act | jb->store);
  else
    jb->uk->fwd_run(tptr(jb, jb->x, e), tptr(jb, jb->res, e), tptr_w(jb, jb->out, e), len, nr,
                    stride, k, u->cs, g->act | jb->store);
}

/* channels [ch, ch + nc) of sample i, whole runs, in one call */
static void apply_cf_chans(const norm_job *jb, const norm_unit *u, int64_t ch, int64_t i,
                           int64_t nc) {
  const norm_geom *g = jb->g;
  const int64_t e = (i * g->c + ch) * g->s;
  const void *k = cst_at(jb, u, ch - u->j0);
  const int flags = g->act | jb->store | BN_RUN_CHANS;
  if (jb->dy)
    jb->uk->bwd_run(tptr(jb, jb->x, e), tptr(jb, jb->y, e), tptr(jb, jb->dy, e),
                    tptr_w(jb, jb->out, e), tptr_w(jb, jb->dres, e), g->s, nc, g->s, k, u->cs,
                    flags);
  else
    jb->uk->fwd_run(tptr(jb, jb->x, e), tptr(jb, jb->res, e), tptr_w(jb, jb->out, e), g->s, nc,
                    g->s, k, u->cs, flags);
}

static void apply_rows_f(const norm_job *jb, const norm_unit *u, int64_t r0, int64_t r1,
                         int64_t j0, int64_t nc, int pf) {
  const norm_geom *g = jb->g;
  const int64_t e = r0 * g->c + j0;
  const void *k = cst_at(jb, u, j0 - u->j0);
  if (jb->dy)
    jb->uk->bwd_rows(tptr(jb, jb->x, e), tptr(jb, jb->y, e), tptr(jb, jb->dy, e),
                     tptr_w(jb, jb->out, e), tptr_w(jb, jb->dres, e), r1 - r0, g->c, nc, k, u->cs,
                     g->act | jb->store | pf | jb->seq | jb->one);
  else
    jb->uk->fwd_rows(tptr(jb, jb->x, e), tptr(jb, jb->res, e), tptr_w(jb, jb->out, e), r1 - r0,
                     g->c, nc, k, u->cs, g->act | jb->store | pf);
}
static void apply_rows(const norm_job *jb, const norm_unit *u, int64_t r0, int64_t r1,
                       int64_t j0, int64_t nc) {
  apply_rows_f(jb, u, r0, r1, j0, nc, jb->pf);
}

static void unit_apply(const norm_job *jb, const norm_unit *u) {
  if (u->slow && !jb->dy) {
    unit_apply_slow(jb, u);
    return;
  }
  if (jb->rows_form) {
    const int64_t r0 = row_of(jb, u->i0), r1 = row_of(jb, u->i1);
    for (int64_t r = r0; r < r1; r += NORM_CL_SEG_ROWS)
      apply_rows(jb, u, r, r + NORM_CL_SEG_ROWS < r1 ? r + NORM_CL_SEG_ROWS : r1, u->j0, u->nc);
    return;
  }
  if (cf_sweep(jb)) {
    for (int64_t i = u->i0; i < u->i1; i++) apply_cf_chans(jb, u, u->j0, i, u->nc);
    return;
  }
  const int64_t nch = cf_chunks(jb), spr = cf_spr(jb);
  for (int64_t i = u->i0; i < u->i1; i += spr) {
    const int64_t nr = u->i1 - i < spr ? u->i1 - i : spr;
    for (int64_t j = 0; j < u->nc; j++)
      for (int64_t q = 0; q < nch; q++) apply_cf(jb, u, u->j0 + j, i, nr, q);
  }
}

/* ---- threads ---------------------------------------------------------------------------- */

/* Streaming stores are weakly ordered: each thread fences its own before the region ends. */
static inline void store_fence(const norm_job *jb) {
#if defined(__x86_64__) || defined(__i386__)
  if (jb->store) _mm_sfence();
#else
  (void)jb;
#endif
}

int norm_thread_id(void) { return omp_get_thread_num(); }

/* the loop over [0, n) on the job's threads in dynamic shares (shares.h); back: each share's
   chunks from its end */
static void parallel_shares(norm_job *jb, int64_t n, norm_range_fn fn, void *arg, int back,
                            int64_t grain) {
  if (jb->nt <= 1 || n <= 1) {
    fn(jb, 0, n, arg);
    store_fence(jb);
    return;
  }
  norm_shares sh = {.n = n, .grain = grain, .back = back};
  (void)norm_shares_begin(&sh, jb->nt, 1);
#pragma omp parallel num_threads(jb->nt)
  {
    norm_shares me = sh;
    me.nt = omp_get_num_threads(); /* the runtime may give fewer threads than asked */
    norm_shares_run(&me, omp_get_thread_num(), fn, jb, arg);
    store_fence(jb);
  }
}
void norm_parallel_for(norm_job *jb, int64_t n, norm_range_fn fn, void *arg) {
  parallel_shares(jb, n, fn, arg, 0, 1);
}

/* ---- units ------------------------------------------------------------------------------ */

/* the arrays of a unit of up to w channels: tot, dcst, a segment buffer [3][w], the op's
   constants [C_COUNT][w] and the backward kernels' (kst) */
static size_t unit_bytes(const norm_job *jb, int64_t w) {
  return 3 * norm_up64((size_t)w * 3 * sizeof(double)) +
         2 * norm_up64((size_t)w * C_COUNT * jb->cbytes);
}
static void unit_arrays(const norm_job *jb, norm_unit *u, char *m, int64_t w) {
  const size_t db = norm_up64((size_t)w * 3 * sizeof(double));
  (void)jb;
  u->tot = (double *)m;
  u->ts = w;
  u->dcst = (double *)(m + db);
  u->cst = m + 3 * db; /* after the segment buffer, which unit_reduce finds after dcst */
  u->kst = m + 3 * db + norm_up64((size_t)w * C_COUNT * jb->cbytes);
  u->cs = w;
  u->slow = 0;
  u->rep = NULL;
}

/* units per sample (per-sample norms) and their channel ranges */
static int64_t units_per_sample(const norm_job *jb) {
  return (jb->g->c + jb->unit - 1) / jb->unit;
}
static int64_t unit_count(const norm_job *jb) {
  return jb->g->per_sample ? jb->g->n * units_per_sample(jb) : (jb->g->c + jb->unit - 1) / jb->unit;
}

static void unit_of(const norm_job *jb, int64_t b, norm_unit *u) {
  const norm_geom *g = jb->g;
  int64_t kb = b;
  if (g->per_sample) {
    const int64_t per = units_per_sample(jb);
    u->i0 = b / per, u->i1 = u->i0 + 1, kb = b % per;
  } else {
    u->i0 = 0, u->i1 = g->n;
  }
  u->j0 = kb * jb->unit;
  u->nc = g->c - u->j0 < jb->unit ? g->c - u->j0 : jb->unit;
}

/* Fused schedule: each thread reduces, finalizes and applies whole units, with the unit
   arrays of its thread (allocated by the calling thread before the region: arg). */
static void fused_units(norm_job *jb, int64_t b0, int64_t b1, void *arg) {
  norm_unit u;
  const int t = jb->nt > 1 ? omp_get_thread_num() : 0;
  unit_arrays(jb, &u, (char *)arg + (size_t)t * unit_bytes(jb, jb->unit), jb->unit);
  for (int64_t b = b0; b < b1; b++) {
    unit_of(jb, b, &u);
    u.slow = 0;
    if (jb->prepare) jb->prepare(jb, &u);
    if (jb->dy) lower_x(jb, &u);
    if (jb->nsums) unit_reduce(jb, &u);
    jb->finalize(jb, &u);
    if (!jb->apply) continue;
    if (jb->dy) lower_bwd(jb, &u);
    unit_apply(jb, &u);
  }
}

/* ---- the split schedule ----------------------------------------------------------------- */

/* rows per block of the backwards apply (split_apply_rows).  NORMA_REV_BLOCK, bytes per block
   (64 KiB), is a knob for experiments: a value above a thread's share walks it forwards. */
static int64_t env_bytes(const char *name, int64_t dflt);
static int64_t norm_rev_block_rows(const norm_job *jb) {
  static int64_t bytes = -1;
  if (bytes < 0) bytes = env_bytes("NORMA_REV_BLOCK", 65536);
  const int64_t row = jb->g->c * (int64_t)jb->g->esize;
  return bytes / row > 1 ? bytes / row : 1;
}

/* The split schedule runs one unit holding every channel of a range of samples: all of them
   for BatchNorm, one at a time for a per-sample norm with too few samples to feed the threads
   (channels-last).  Its reduction's segments (channels-first: channel, sample block, chunk;
   rows form: row segments, in channel blocks when they are too few) go to the threads, their
   partials are combined in order, then every thread applies a contiguous share. */

/* the rows of the unit in rows form */
static inline int64_t urow0(const norm_job *jb, const norm_unit *u) { return row_of(jb, u->i0); }
static inline int64_t urows(const norm_job *jb, const norm_unit *u) {
  return row_of(jb, u->i1) - row_of(jb, u->i0);
}

static int64_t nsegments(const norm_job *jb, const norm_unit *u) {
  if (jb->rows_form) {
    const int64_t rows = urows(jb, u), len = seg_len(jb, rows);
    return (rows + len - 1) / len;
  }
  const int64_t spr = cf_spr_sums(jb);
  return (u->i1 - u->i0 + spr - 1) / spr * cf_chunks(jb);
}
/* Channels per rows-form work item of the split reduction: whole rows (memory in order, each
   thread streaming a contiguous range) when the row segments alone share out evenly (the
   threads' contiguous ranges of segments within 15% of an equal share of the rows), else the
   channels in one block per thread (at least 128 channels, a multiple of 16), each thread
   taking its block of every segment: balanced whatever the segments' lengths, and each thread
   still reads long pieces of the rows.  A column's sums do not depend on the block that holds
   it. */
static int64_t split_cblock(const norm_job *jb, const norm_unit *u) {
  const int64_t c = jb->g->c, nseg = nsegments(jb, u), nt = jb->nt, rows = urows(jb, u);
  const int64_t len = seg_len(jb, rows);
  if (nt <= 1) return c;
  if (nseg >= nt) {
    int64_t most = 0;
    for (int64_t t = 0; t < nt; t++) {
      const int64_t a = nseg * t / nt * len;
      const int64_t b = nseg * (t + 1) / nt * len;
      const int64_t r = (b < rows ? b : rows) - a;
      if (r > most) most = r;
    }
    if ((double)most * (double)nt <= 1.15 * (double)rows) return c;
  }
  int64_t nb = nt, maxb = (c + 127) / 128;
  if (nb > maxb) nb = maxb;
  if (nb < 1) nb = 1;
  const int64_t w = ((c + nb - 1) / nb + 15) / 16 * 16;
  return w < c ? w : c;
}

/* rows form: the unit's totals (its channels: all of them, or a view's) from the partials of
   its nseg row segments, in segment order */
static void combine_row_segments(const norm_job *jb, norm_unit *u, const double *part,
                                 int64_t nseg) {
  const int64_t c = jb->g->c, rows = urows(jb, u), len = seg_len(jb, rows);
  for (int64_t seg = 0; seg < nseg; seg++) {
    const int64_t n = rows - seg * len < len ? rows - seg * len : len;
    absorb_all(jb, u->tot, u->ts, u->nc, seg == 0, &part[seg * 3 * c + u->j0], c, (double)n);
  }
}

typedef struct split_arg {
  double *part;
  norm_unit *u; /* the unit: every channel of its samples */
  int64_t nseg, cb;
  int walk;     /* the rows apply's walk (rows_walk) */
} split_arg;

/* channels-first: part[(ch * nseg + seg) * 3 + k]; work items in memory order (sample block,
   channel, chunk), so that each thread streams a contiguous range of the tensor */
static void split_sums_cf(norm_job *jb, int64_t w0, int64_t w1, void *arg) {
  const split_arg *sa = arg;
  const int64_t nseg = sa->nseg, nch = cf_chunks(jb), spr = cf_spr_sums(jb), i1 = sa->u->i1;
  const int64_t c = jb->g->c;
  /* whole runs of one sample at a time (spr 1, one chunk): the statistics of its consecutive
     channels in one stats_runs call, whose passes overlap (the same bits per channel) */
  const int runs = jb->nsums == SUMS_STATS && nch == 1 && spr == 1;
  const int chans = cf_chans(jb) || cf_chans_bwd(jb);
  for (int64_t it = w0; it < w1;) {
    const int64_t q = it % nch, ch = (it / nch) % c, seg = it / nch / c * nch + q;
    const int64_t i = sa->u->i0 + seg / nch * spr;
    int64_t m = c - ch < w1 - it ? c - ch : w1 - it;
    if (chans && m > 1) {
      /* short runs: consecutive channels of the segment in one stats_chans (bwd_sums_chans)
         call */
      double o[3 * NORM_CF_RUNS];
      if (m > NORM_CF_RUNS) m = NORM_CF_RUNS;
      sums_cf_chans(jb, sa->u, ch, m, i, i1 - i < spr ? i1 - i : spr, o);
      for (int64_t r = 0; r < m; r++)
        for (int k = 0; k < 3; k++) sa->part[((ch + r) * nseg + seg) * 3 + k] = o[3 * r + k];
      it += m;
      continue;
    }
    if (runs && m > 1) {
      double o[3 * NORM_CF_RUNS];
      if (m > NORM_CF_RUNS) m = NORM_CF_RUNS;
      jb->uk->stats_runs(tptr(jb, jb->x, (i * c + ch) * jb->g->s), jb->g->s, m, o);
      for (int64_t r = 0; r < m; r++)
        for (int k = 0; k < 3; k++) sa->part[((ch + r) * nseg + seg) * 3 + k] = o[3 * r + k];
      it += m;
      continue;
    }
    seg_sums_cf(jb, sa->u, ch, i, i1 - i < spr ? i1 - i : spr, q, &sa->part[(ch * nseg + seg) * 3]);
    it++;
  }
}
/* rows form: part[seg * 3 * c + k * c + j]; work items are (channel block, segment), block
   major: with one block per thread each thread takes one block of every segment */
static void split_sums_rows(norm_job *jb, int64_t w0, int64_t w1, void *arg) {
  const split_arg *sa = arg;
  const int64_t c = jb->g->c, cb = sa->cb, nseg = sa->nseg;
  const int64_t base = urow0(jb, sa->u), end = base + urows(jb, sa->u);
  const int64_t len = seg_len(jb, end - base);
  for (int64_t it = w0; it < w1; it++) {
    const int64_t seg = it % nseg, j0 = (it / nseg) * cb;
    const int64_t nc = c - j0 < cb ? c - j0 : cb;
    const int64_t r0 = base + seg * len;
    const int64_t r1 = r0 + len < end ? r0 + len : end;
    seg_sums_rows(jb, sa->u, r0, r1, j0, nc, &sa->part[seg * 3 * c + j0], c);
  }
}
/* apply in memory order: sample, channel, chunk */
static void split_apply_cf(norm_job *jb, int64_t i0, int64_t i1, void *arg) {
  const split_arg *sa = arg;
  const int64_t c = jb->g->c, nch = cf_chunks(jb);
  if (i0 >= i1) return;
  if (cf_sweep(jb)) { /* items are (sample, channel): the channels of a sample in one call */
    int64_t ch = i0 % c, n = sa->u->i0 + i0 / c;
    for (int64_t it = i0; it < i1; n++, ch = 0) {
      const int64_t m = c - ch < i1 - it ? c - ch : i1 - it;
      apply_cf_chans(jb, sa->u, ch, n, m);
      it += m;
    }
    return;
  }
  int64_t q = i0 % nch, ch = (i0 / nch) % c, n = sa->u->i0 + i0 / nch / c; /* then counted */
  for (int64_t it = i0; it < i1; it++) {
    apply_cf(jb, sa->u, ch, n, 1, q);
    if (++q == nch) {
      q = 0;
      if (++ch == c) ch = 0, n++;
    }
  }
}
/* Aligned super-rows.  AVX-512 loads and stores a line's worth of f32 at a time: where a row
   does not end on a line (728 channels: 2912 bytes), every other row's vectors straddle two
   lines, and the apply of such rows ran 1.4-1.7x slower than of rows of 720 or 736 channels.
   srk consecutive rows (srk * c * esize a multiple of 64 bytes) are one row of srk * c values
   whose vectors all start on a line once the first does; the apply takes them as such, with
   the constants repeated srk times (u->rep).  Each value's arithmetic is what it was, so the
   results are bitwise the same; only the apply uses them (the reductions keep their order).
   Used where the kernels' vectors would straddle lines (the row not a multiple of the vector's
   bytes), the tensors share one alignment, a super-row has at most NORM_SR_MAX_C values (half
   that for 16-bit data, whose constants are twice their bytes: bf16 20x728x19x19, 2912 values
   a super-row, ran its inference 0.78x as fast), and the threads get at least 4 super-rows
   each.
   Inference took wider super-rows until the thirty-third session (up to 65536 values on
   AVX-512, 24576 on AVX2, 16 rows a super-row for 643-1439 channels; they had run 1.05-1.6x
   faster than rows whose vectors straddled lines).  Their repeated constants (3 * 16 * c
   floats) were copied on one thread before the apply and read from L2.  The forward's row
   kernel now aligns each row's stores itself (ukernels_vec.inc, fwd_rows_range: the values up
   to the line, then whole aligned vectors, AVX-512's constants put together from whole
   blocks), and against the wide super-rows it ran (Zen 5, 2 threads, f32, pair.py, 4 rounds)
   inference NHWC 1x643x26x26 2.02x (as fast as 640 channels), 1x1259x26x26 1.96x,
   16x999x14x14 1.52x, 4x1221x26x26 1.51x, 8x1221x7x7 1.35x, bf16 16x999x14x14 1.19x, and
   AVX2 1.3-1.7x in the caches.  The super-rows of up to NORM_SR_MAX_C values stay: without
   them the training forward of 728 channels (two rows a super-row) ran 0.91-0.96x
   (32x728x28x28, 20x728x19x19), and the backward's apply, which had no aligned row kernel
   then, ran 32x728x28x28 in 7.4 against 8.8 ms (not measured against bwd_rows_phased). */
#define NORM_SR_MAX_C 3072
static void plan_super_rows(norm_job *jb) {
  const norm_geom *g = jb->g;
  jb->srk = 0, jb->sra = 0;
  if (!jb->rows_form || jb->fused || !jb->apply || jb->cbytes != 4 || g->c < 1) return;
  const norma_isa isa = bn_ukernels_isa(norma__isa(), g->dt);
  if (isa == NORMA_ISA_SCALAR) return;
  const int64_t row = g->c * (int64_t)g->esize;
  const int64_t vbytes = (isa == NORMA_ISA_AVX512 ? 16 : 8) * (int64_t)g->esize;
  /* AVX-512 applies rows of up to 128 values in strips, their constants in registers: super-rows
     would leave them (32x40x56x56 inference ran 0.87x as fast) */
  if (row % vbytes == 0 || (isa == NORMA_ISA_AVX512 && g->c <= 128)) return;
  const int64_t k = norm_line_rows(row), vals = k * g->c, per = 4 / (int64_t)g->esize;
  if (vals > NORM_SR_MAX_C / per || g->m < 4 * k * (int64_t)jb->nt) return;
  const uintptr_t ph = (uintptr_t)jb->out % 64;
  const void *in[] = {jb->x, jb->res, jb->y, jb->dy, jb->dres};
  for (int i = 0; i < 5; i++)
    if (in[i] && (uintptr_t)in[i] % 64 != ph) return;
  for (int64_t r = 0; r < k; r++)
    if ((ph + (uintptr_t)(r * row)) % 64 == 0) {
      jb->srk = k, jb->sra = r;
      return;
    }
}
static size_t super_rows_bytes(const norm_job *jb) {
  const size_t arrays = jb->dy ? C_COUNT : C_SHIFT + 1; /* super_rows_consts' */
  return jb->srk ? norm_up64(arrays * (size_t)(jb->srk * jb->g->c) * sizeof(float)) : 0;
}
/* the unit's kernel constants (every channel) repeated srk times into rep: the forward's
   three (C_MHI, C_SCALE, C_SHIFT), or all of them for the backward */
static void super_rows_consts(const norm_job *jb, norm_unit *u, float *rep) {
  const int64_t c = jb->g->c, w = jb->srk * c;
  const float *k = kcst(jb, u);
  for (int q = 0; q < (jb->dy ? C_COUNT : C_SHIFT + 1); q++)
    for (int64_t r = 0; r < jb->srk; r++)
      memcpy(&rep[q * w + r * c], &k[q * u->cs], (size_t)c * sizeof(float));
  u->rep = rep;
}
/* rows r0 .. r1 (whole rows of the unit): the rows before the first super-row and after the
   last one as they are, the super-rows between as rows of srk * c values */
static void apply_whole_rows(const norm_job *jb, const norm_unit *u, int64_t r0, int64_t r1,
                             int pf) {
  const int64_t k = jb->srk, c = jb->g->c;
  if (!u->rep || r1 - r0 < 2 * k) {
    apply_rows_f(jb, u, r0, r1, 0, c, pf);
    return;
  }
  const int64_t a = r0 + ((jb->sra - r0) % k + k) % k, n = (r1 - a) / k, b = a + n * k;
  if (a > r0) apply_rows_f(jb, u, r0, a, 0, c, pf);
  const int64_t e = a * c, w = k * c;
  if (jb->dy)
    jb->uk->bwd_rows(tptr(jb, jb->x, e), tptr(jb, jb->y, e), tptr(jb, jb->dy, e),
                     tptr_w(jb, jb->out, e), tptr_w(jb, jb->dres, e), n, w, w, u->rep, w,
                     jb->g->act | jb->store | pf);
  else
    jb->uk->fwd_rows(tptr(jb, jb->x, e), tptr(jb, jb->res, e), tptr_w(jb, jb->out, e), n, w, w,
                     u->rep, w, jb->g->act | jb->store | pf);
  if (b < r1) apply_rows_f(jb, u, b, r1, 0, c, pf);
}

/* After a reduction the apply walks each thread's rows backwards, in blocks of about 64 KiB
   read forwards: the rows the statistics read last are the ones still in the caches (L2 and
   the LLC), so a tensor somewhat larger than the caches is partly read from them instead of
   from memory.  Without one (inference) it walks forwards, and so it does on tensors beyond
   the caches (jb->pf) with rows of at most NORM_FWD_WALK_MAX_C channels: there the backwards
   walk cost more than the caches gave back (backward NHWC, Zen 5, 2 threads, paired:
   forwards 32x112x112x64 1.16x, 32x56x56x128 1.10x, 32x56x56x64 1.04x faster; 32x56x56x256
   and 32x28x28x512 0.82x and 0.86x; in-cache 32x28x28x128 0.91x).  The backward's apply of
   wider rows walks forwards too, without software prefetch, on tensors of 16-64 MiB (x):
   paired against the backwards walk (Zen 5, 2 threads, f32) 64x2048x7x7 1.08x, 32x1024x14x14
   1.06x, 32x512x28x28 1.15x, bf16 1.06x; with the prefetch of the narrow rows' walk these were
   1.06-1.10x slower.  AVX-512 only (AVX2 0.94-0.96x on 32x1024x14x14 and 64x2048x7x7).
   Not in the caches (32x2048x7x7 0.94x) or for the forward (32x1024x14x14 0.91x,
   32x512x28x28 0.96x).  Beyond 64 MiB for f32 rows of up to 4 KiB only (seventeenth
   session, paired against the backwards walk, 7-9 rounds): 64x960x19x19 1.07-1.17x,
   64x896x20x20 1.14-1.22x, 64x720x22x22 1.08x, 64x576x24x24 1.07-1.22x, 128x576x17x17
   1.09-1.19x, 32x256x56x56 1.04-1.26x, 32x192x56x56 1.09-1.21x, 64x1024x18x18 1.05-1.23x,
   ReLU 0.83-1.49x (1.08x paired on 128x576x17x17 and 64x576x24x24), add + ReLU 0.995x.
   A stand-alone loop (bench/probes/seqp.c) shows why: after the backwards walk in 64 KiB
   blocks both the apply and the next call's reduction ran slower (3.6 and 2.6 ms against 3.1
   and 2.2 ms, 89 MB of 960-channel rows).  Wider rows keep the backwards walk (forwards:
   64x1152x17x17 0.97x, 64x1280x16x16 0.95x, 16x1280x34x34 0.95x, 64x1344x16x16 0.95x,
   64x1536x15x15 0.995x, 64x2048x13x13 0.99x).  The backward's 16-bit rows walked forwards
   without prefetch lost (bf16 64x960x28x28 0.86-0.90x, 64x576x34x34 0.75x); forwards with
   the prefetch ahead they gain on tensors of 16-64 MiB (eighteenth session, Zen 5, 2 threads,
   pair.py --twice against the walk without prefetch): bf16 32x512x28x28 1.23-1.26x, ReLU
   1.21x, add + ReLU 1.24x, f16 1.23x, 64x1024x14x14 1.12x, 128x2048x7x7 1.05x,
   32x256x56x56 and 32x192x56x56 even.  Beyond 64 MiB (against the backwards walk) the runs
   disagreed, so those keep it: bf16 64x960x28x28 1.155x then 1.13x (rounds 0.76-1.44),
   64x576x34x34 1.16x then 0.98x, ReLU 0.975x, f16 64x960x28x28 1.006x.  AVX-512 only (AVX2
   bf16 0.99x / 1.02x); the training forward's apply keeps its walk (bf16 32x512x28x28 0.965x,
   64x576x34x34 1.10x). */
#define NORM_FWD_WALK_MAX_C 128
#define NORM_BWD_FWD_WALK_MAX_BYTES ((int64_t)64 << 20) /* beyond: f32 rows of up to 4 KiB */
#define NORM_BWD_FWD_WALK_FAR_ROW 4096
/* how split_apply_rows walks: forwards, prefetching ahead (no reduction, narrow rows, the
   backward's 16-bit rows of 16-64 MiB on AVX-512, or its rows a row at a time: jb->one);
   forwards without prefetch (the backward's wider f32 rows of 16-64 MiB on AVX-512, and beyond
   for rows of up to 4 KiB): 2, 1; backwards: 0 */
static int rows_walk(const norm_job *jb) {
  const int64_t c = jb->g->c;
  const int bwd512 =
      jb->dy && jb->pf && bn_ukernels_isa(norma__isa(), jb->g->dt) == NORMA_ISA_AVX512;
  const int mid = jb->g->total * (int64_t)jb->g->esize <= NORM_BWD_FWD_WALK_MAX_BYTES;
  const int ahead =
      !jb->nsums || (jb->pf && c <= NORM_FWD_WALK_MAX_C) || (bwd512 && jb->g->esize == 2 && mid);
  const int far_ok = jb->g->esize == 4 && c * 4 <= NORM_BWD_FWD_WALK_FAR_ROW;
  return ahead ? 2 : bwd512 && (far_ok || mid) ? 1 : 0;
}
/* the fewest rows a chunk of the apply's dynamic shares (shares.h): 64 KiB of x, so that a
   chunk's rows pay for reading the constants of the row again */
static int64_t apply_grain(const norm_job *jb) {
  const int64_t row = jb->g->c * (int64_t)jb->g->esize;
  return row >= 65536 ? 1 : 65536 / row;
}
static void split_apply_rows(norm_job *jb, int64_t r0, int64_t r1, void *arg) {
  const split_arg *sa = arg;
  const int64_t base = urow0(jb, sa->u);
  const int walk = sa->walk, ahead = walk == 2;
  if (walk) {
    for (int64_t lo = r0; lo < r1; lo += NORM_CL_SEG_ROWS) {
      const int64_t hi = r1 - lo < NORM_CL_SEG_ROWS ? r1 : lo + NORM_CL_SEG_ROWS;
      apply_whole_rows(jb, sa->u, base + lo, base + hi, ahead || jb->one ? jb->pf : 0);
    }
    return;
  }
  int64_t blk = norm_rev_block_rows(jb);
  if (jb->srk) blk = (blk + jb->srk - 1) / jb->srk * jb->srk;
  /* the backward's rows that end inside a line go by fours of rows that start on one offset
     in a line, 4 P rows a group (ukernels_vec.inc, bwd_rows_phased): whole groups a block
     (P divides the rows that make whole lines) */
  if (jb->dy && !jb->srk && jb->g->c % 16 != 0 &&
      bn_ukernels_isa(norma__isa(), jb->g->dt) == NORMA_ISA_AVX512) {
    const int64_t q = 4 * norm_line_rows(jb->g->c * (int64_t)jb->g->esize);
    blk = (blk + q - 1) / q * q;
  }
  for (int64_t hi = r1; hi > r0;) {
    const int64_t lo = hi - blk > r0 ? hi - blk : r0;
    /* the kernel prefetches the next block down (a whole block of the same size) */
    const int pf = jb->pf && lo - blk >= r0 ? BN_PF_BACK : 0;
    apply_whole_rows(jb, sa->u, base + lo, base + hi, pf);
    hi = lo;
  }
}
static void split_apply_slow(norm_job *jb, int64_t i0, int64_t i1, void *arg) {
  (void)i0, (void)i1;
  unit_apply_slow(jb, ((const split_arg *)arg)->u);
}

/* channels-first: the totals of channels [ch0, ch1) from their segments' partials, in segment
   order (each channel alone: the threads may share the channels out as they like).  Combined
   on the threads from this many partials on (32x512x28x28 has 16384). */
#define NORM_CF_COMBINE_PAR 8192
static void combine_cf(norm_job *jb, int64_t ch0, int64_t ch1, void *arg) {
  const split_arg *sa = arg;
  const norm_unit *u = sa->u;
  const int64_t c = jb->g->c, nseg = sa->nseg, nch = cf_chunks(jb), spr = cf_spr_sums(jb);
  for (int64_t ch = ch0; ch < ch1; ch++)
    for (int64_t seg = 0; seg < nseg; seg++) {
      const int64_t i = u->i0 + seg / nch * spr, nr = u->i1 - i < spr ? u->i1 - i : spr;
      absorb(jb, u->tot, c, ch, seg == 0, &sa->part[(ch * nseg + seg) * 3], 1,
             (double)(nr * cf_chunk_len(jb, seg % nch)));
    }
}

static void run_split(norm_job *jb, norm_unit *u, double *part, float *rep) {
  const norm_geom *g = jb->g;
  const int64_t c = g->c, nseg = nsegments(jb, u);
  split_arg sa = {part, u, nseg, jb->rows_form ? split_cblock(jb, u) : c,
                  jb->rows_form ? rows_walk(jb) : 0};
  u->slow = 0;
  if (jb->prepare) jb->prepare(jb, u);
  if (jb->dy) lower_x(jb, u);
  if (jb->nsums) {
    for (int64_t j = 0; j < 3 * c; j++) u->tot[j] = 0.0;
    if (!jb->rows_form) {
      norm_parallel_for(jb, c * nseg, split_sums_cf, &sa);
      if (c * nseg >= NORM_CF_COMBINE_PAR) norm_parallel_for(jb, c, combine_cf, &sa);
      else combine_cf(jb, 0, c, &sa);
    } else {
      norm_parallel_for(jb, nseg * ((c + sa.cb - 1) / sa.cb), split_sums_rows, &sa);
      combine_row_segments(jb, u, part, nseg);
    }
    if (g->per_sample && jb->nsums == SUMS_STATS && g->cpg > 1)
      unit_merge_groups(jb, u, (double)g->s);
    if (jb->nsums == SUMS_BWD) convert_sums(jb, u, (double)((u->i1 - u->i0) * g->s));
  }
  jb->finalize(jb, u);
  if (!jb->apply) return;
  if (jb->dy) lower_bwd(jb, u);
  if (jb->srk && (!u->slow || jb->dy)) super_rows_consts(jb, u, rep);
  if (u->slow && !jb->dy) norm_parallel_for(jb, 1, split_apply_slow, &sa);
  else if (!jb->rows_form)
    norm_parallel_for(jb, (u->i1 - u->i0) * c * cf_chunks(jb), split_apply_cf, &sa);
  else parallel_shares(jb, urows(jb, u), split_apply_rows, &sa, !sa.walk, apply_grain(jb));
}

/* The split schedule of BatchNorm in rows form in one parallel region, for tensors in the
   caches.  Between the reduction and the apply, run_split combines the segments and finalizes
   on one thread between two regions: the other thread waits, and the per-channel arrays it
   read in the last call (constants, partials) cross between the cores' caches.  Here, after a
   barrier, each thread combines the partials and finalizes its own share of the channels into
   one set of unit arrays (thread 0's), writing those channels' outputs; after a second
   barrier every thread applies its rows with those arrays.  The same operations per channel
   in the same order, so the same bits.  Measured (Zen 5, 2 threads, f32): the serial part of
   a 16x576x5x5 backward took 13 us at 2 threads against 6 us at 1, in a 58 us call; until
   the forty-third session every thread finalized all channels after one barrier, which with
   few rows of many channels cost what the rest of the call did (NHWC 1x768x4x4 forward: a
   division, a square root and another division in double per channel, 2 ns a channel). */
static int split_one_region(const norm_job *jb) {
  const norm_geom *g = jb->g;
  return jb->nt > 1 && jb->rows_form && !g->per_sample && jb->nsums && jb->apply &&
         !jb->want_per_nc && g->total * (int64_t)g->esize <= NORM_CACHED_BYTES;
}

/* the view of channels [c0, c1) of unit w's arrays: the same planes and strides, from c0 (the
   forward's dcst holds doubles, the backward's its rho and c in the compute type) */
static void unit_view(const norm_job *jb, const norm_unit *w, int64_t c0, int64_t c1,
                      norm_unit *v) {
  const size_t cb = jb->cbytes, db = jb->nsums == SUMS_BWD ? cb : sizeof(double);
  *v = *w;
  v->j0 = w->j0 + c0, v->nc = c1 - c0;
  v->tot = w->tot + c0;
  v->cst = (char *)w->cst + (size_t)c0 * cb;
  v->kst = (char *)w->kst + (size_t)c0 * cb;
  v->dcst = (double *)(void *)((char *)w->dcst + (size_t)c0 * db);
}

/* Whether an output begins just past the end of an input (within NORM_ADJACENT_BYTES).  The
   thread that streams up to the end of that input has the hardware prefetchers run on into
   the output's first lines, which another thread then writes and must take back from that
   thread's cache.  Measured (Zen 5, 2 threads, f32, NHWC 1x24x24x256 training forward, y
   placed after x; bench/probes/adj.c), in a phase where the two vCPUs exchanged lines slowly:
   0.030-0.032 ms with y 128 bytes to 30 KiB past x's end, 0.021 ms with y before x or 110 KiB
   or more past it; in a phase where they exchanged lines fast, 0.016 ms either way.  The
   bench workers allocate a case's tensors one after the other, so from their second case on
   every output follows an input so; so may a framework's allocator. */
#define NORM_ADJACENT_BYTES ((int64_t)128 << 10)
static int out_follows_input(const norm_job *jb) {
  const uintptr_t bytes = (uintptr_t)(jb->g->total * (int64_t)jb->g->esize);
  const void *in[] = {jb->x, jb->res, jb->y, jb->dy};
  const void *out[] = {jb->out, jb->dres};
  for (int o = 0; o < 2; o++)
    for (int i = 0; i < 4; i++) {
      if (!out[o] || !in[i]) continue;
      const uintptr_t end = (uintptr_t)in[i] + bytes, b = (uintptr_t)out[o];
      if (b >= end && b - end < (uintptr_t)NORM_ADJACENT_BYTES) return 1;
    }
  return 0;
}

static void run_split_region(norm_job *jb, const norm_unit *whole, double *part, char *umem,
                             char *rmem) {
  const norm_geom *g = jb->g;
  const int64_t c = g->c, nseg = nsegments(jb, whole), cb = split_cblock(jb, whole);
  const int64_t items = nseg * ((c + cb - 1) / cb), rows = urows(jb, whole);
  const size_t ub = unit_bytes(jb, c);
  /* Where an output follows an input, thread t takes the t-th and the (2 nt - 1 - t)-th of
     2 nt shares of the whole-row segments and of the rows to apply, so that thread 0 both
     reads the end of the input and writes the start of the output: measured as above with y
     128 bytes past x, 0.023-0.024 ms against 0.030-0.031 ms (contiguous shares); the shares
     of a thread stay the same in both phases, and each segment's partials and each row's
     values are computed as before, so the bits do not change. */
  const int mirror = cb == c && jb->nt > 1 && out_follows_input(jb), walk = rows_walk(jb);
  /* both loops in dynamic shares (shares.h), thread t owning the t-th share, or with mirror the
     t-th and the (2 nt - 1 - t)-th of 2 nt */
  norm_shares sums = {.n = items, .mirror = mirror};
  norm_shares app = {.n = rows, .grain = apply_grain(jb), .mirror = mirror, .own_rev = 1,
                     .back = !walk};
  if (norm_shares_begin(&sums, jb->nt, 2)) app.ctr = sums.ctr, app.gen = sums.gen + 1;
  /* each thread finalizes its share of the channels; not in the wide view (op_bn.c), whose
     finalize merges each channel's columns from across the rows: there every thread
     finalizes them all into its own arrays, and thread 0 writes the outputs */
  const int share = !jb->split;
  int any_slow = 0; /* a channel's constants overflow the compute type */
#pragma omp parallel num_threads(jb->nt)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    norm_job jt = *jb;
    /* the arrays the apply reads (thread 0's when shared), and the backward's x_hat constants
       for the sums (each thread's own) */
    norm_unit u = *whole, own;
    unit_arrays(&jt, &u, umem + (share ? 0 : (size_t)t * ub), c);
    own = u;
    if (share && jt.dy && t > 0) unit_arrays(&jt, &own, umem + (size_t)t * ub, c);
    if (jt.prepare) jt.prepare(&jt, &own);
    if (jt.dy) lower_x(&jt, &own);
    split_arg sa = {part, &own, nseg, cb, walk};
    norm_shares ms = sums, ma = app;
    ms.nt = ma.nt = (int)nt;
    norm_shares_run(&ms, (int)t, split_sums_rows, &jt, &sa);
#pragma omp barrier
    /* this thread's channels [c0, c1) (whole vectors of them), or all of them */
    int64_t c0 = share ? (c * t / nt + 15) / 16 * 16 : 0;
    int64_t c1 = share ? (c * (t + 1) / nt + 15) / 16 * 16 : c;
    c0 = c0 < c ? c0 : c, c1 = c1 < c ? c1 : c;
    jt.quiet = !share && t > 0;
    norm_unit v;
    unit_view(&jt, &u, c0, c1, &v);
    if (v.nc > 0) {
      combine_row_segments(&jt, &v, part, nseg);
      if (jt.nsums == SUMS_BWD) convert_sums(&jt, &v, (double)((v.i1 - v.i0) * g->s));
      jt.finalize(&jt, &v);
      if (jt.dy) lower_bwd(&jt, &v);
    }
    if (share) {
      if (v.slow) {
#pragma omp atomic write
        any_slow = 1;
      }
#pragma omp barrier
#pragma omp atomic read
      u.slow = any_slow;
    } else {
      u.slow = v.slow;
    }
    sa.u = &u;
    if (jt.srk && (!u.slow || jt.dy))
      super_rows_consts(&jt, &u, (float *)(rmem + (size_t)t * super_rows_bytes(&jt)));
    if (u.slow && !jt.dy) {
      if (t == 0) unit_apply_slow(&jt, &u);
    } else {
      norm_shares_run(&ma, (int)t, split_apply_rows, &jt, &sa);
    }
    store_fence(&jt);
  }
}

/* ---- planning --------------------------------------------------------------------------- */

static int use_fused(const norm_job *jb, int64_t units) {
  return jb->nt == 1 || units >= 4 * (int64_t)jb->nt || units % jb->nt == 0;
}

/* BatchNorm.  The fused schedule reads the tensor once from memory when a unit (a channel's
   slab, or a block of channels over all rows) stays in the L2 share of its thread between the
   reduction and the apply.  Channels-first has no smaller unit than a channel, so it stays
   fused (the apply then reads again from memory); channels-last with too many rows for even
   one cache line of channels takes the split schedule, whose two passes stream whole rows. */
/* Tuning knobs for experiments (docs/performance.md): NORMA_UNIT_BUDGET, bytes a fused unit
   may hold per thread (default half the L2), and NORMA_MIN_PIECE, the shortest contiguous
   piece of a channels-last row a fused unit may read (default 2048 bytes). */
static int64_t env_bytes(const char *name, int64_t dflt) {
  const char *e = getenv(name);
  if (!e || !*e) return dflt;
  const long long v = atoll(e);
  return v > 0 ? (int64_t)v : dflt;
}
int norm_nt_store(int64_t bytes, int64_t footprint, int64_t floor) {
  static int64_t env = 0; /* NORMA_NT_MIN_BYTES, or -1 */
  if (!env) env = env_bytes("NORMA_NT_MIN_BYTES", -1);
  int64_t lo, hi;
  norma__streaming_range(&lo, &hi);
  if (lo < 0 && env < 0) /* the default */
    return bytes >= floor / 4 && bytes <= hi && footprint > floor;
  return bytes >= (lo < 0 ? env : lo) && bytes <= hi;
}

int norm_nt_runs(int64_t run_bytes) { return run_bytes % 64 == 0 || run_bytes >= 2048; }

int64_t norm_unit_budget(void) {
  static int64_t v = 0;
  if (!v) v = env_bytes("NORMA_UNIT_BUDGET", norma__l2_bytes() / 2);
  return v;
}
static int64_t min_piece(void) {
  static int64_t v = 0;
  if (!v) v = env_bytes("NORMA_MIN_PIECE", 2048);
  return v;
}

/* Channels-first with many samples: the split schedule, whose reduction and apply each stream
   the tensor in memory order (split_sums_cf, split_apply_cf), beats the fused one although it
   reads x twice.  A fused unit reads its slab in one piece per sample, a sample apart; with
   32 samples or more those pieces are many and short, and were read at about a third of the
   streaming bandwidth (32x512x28x28: 57 % of the forward in stats_run, x at about 32 GB/s;
   prefetching the next piece, or the next unit into L2, did not help).
   Measured (Zen 5, 2 threads, f32 unless said, paired, split against fused): forward
   32x512x28x28 1.25-1.32x, 32x256x56x56 1.20x, 32x64x112x112 1.20x, 32x1024x14x14 1.60x,
   32x128x28x28 1.26x, 32x256x14x14 1.10x, 32x64x56x56 0.99-1.09x, bf16 32x512x28x28 1.9x;
   backward 32x512x28x28 1.23x, 32x1024x14x14 1.36x, 32x64x56x56 1.33x, 32x256x14x14 1.11x,
   bf16 32x512x28x28 1.73x, bf16 32x1024x14x14 1.04-1.25x.  Not for fewer samples (fused
   pieces long: 8x256x56x56 0.93x, 16x96x56x56 0.80x), runs under 128 values (7x7:
   32x2048x7x7 0.89x, 32x512x7x7 0.97x) or tensors of a few MiB.  Both schedules give the
   same bits. */
#define NORM_CF_SPLIT_MIN_N 32
#define NORM_CF_SPLIT_MIN_S 128
#define NORM_CF_SPLIT_MIN_BYTES ((int64_t)4 << 20)
/* From 12 samples, runs of up to 512 values stream too (ninth session, paired, split against
   fused: forward 20x728x19x19 1.8x (AVX2 1.8x), 24x512x20x20 1.6x, 16x600x20x20 1.25x,
   12x728x19x19 1.3x, 20x728x14x14 1.18x, 16x256x22x22 1.28x; backward 1.15-1.63x; bf16
   20x728x19x19 1.13x / 1.36x); longer runs keep the fused schedule (16x256x28x28 backward
   0.91x, 16x256x38x38 forward 0.95x split). */
#define NORM_CF_SPLIT_SHORT_MIN_N 12
#define NORM_CF_SPLIT_SHORT_MAX_S 512
/* But the f32 backward of tensors far beyond the LLC (x of NORM_CF_FUSED_BWD_BYTES or more)
   with runs of NORM_CF_FUSED_BWD_RUN bytes or more stays fused: a unit's x and dy (a channel:
   3.2 MB for 32x64x112x112) come back to its apply from the LLC, where the split schedule's
   apply reads the whole tensor from memory again.  Measured (thirty-seventh session, Zen 5, 2
   threads, pair.py --twice, 4 rounds, split against fused): 32x64x112x112 1.27x,
   32x256x56x56 1.42x, 64x128x56x56 1.37x, 32x128x64x64 1.23x, 48x96x80x80 1.34x,
   128x64x56x56 1.21x; not for tensors the LLC holds in part (32x64x56x56 1.04x, 64x64x56x56
   1.02x), shorter runs (32x512x28x28 0.79x) or bf16 (32x256x56x56 0.86x, 64x256x56x56 0.98x,
   32x64x112x112 1.07x); the forward gained little (32x256x56x56 1.04x). */
#define NORM_CF_FUSED_BWD_BYTES ((int64_t)64 << 20)
#define NORM_CF_FUSED_BWD_RUN ((int64_t)12288)
static int cf_split_streams(const norm_job *jb) {
  const norm_geom *g = jb->g;
  if (g->s < NORM_CF_SPLIT_MIN_S || g->total * (int64_t)g->esize < NORM_CF_SPLIT_MIN_BYTES)
    return 0;
  if (jb->nsums == SUMS_BWD && g->esize == 4 && g->s * g->esize >= NORM_CF_FUSED_BWD_RUN &&
      g->total * g->esize >= NORM_CF_FUSED_BWD_BYTES)
    return 0;
  return g->n >= NORM_CF_SPLIT_MIN_N ||
         (g->n >= NORM_CF_SPLIT_SHORT_MIN_N && g->s <= NORM_CF_SPLIT_SHORT_MAX_S);
}

/* The backward in rows form whose units would not share out evenly (3 units of 512 channels
   for 2 threads: rows of 1025 to 1536 channels, or 5 of 2049 to 2560) took the split
   schedule, whose threads split the channels for the sums and then the rows for the apply,
   half of which the other thread's cache holds.  Where one unit per thread fits the unit
   budget with pieces of at least NORMA_MIN_PIECE, each thread takes a unit of C / nt channels
   (beyond NORM_MAX_UNIT) and reads it again from its own cache, as oneDNN's channels-last
   backward does.  Measured (Zen 5, 2 threads, f32 unless said, median of 5 alternating rounds,
   ms, split / a unit per thread): NHWC 1x1344x10x9 0.0337 / 0.0311 (0.039 / 0.031 in a slow
   phase), 1x1152x10x10 0.0322 / 0.0303, 1x1408x9x8 0.0338 / 0.0245, 1x1536x8x8 0.0298 /
   0.0239, 1x2304x7x7 0.0411 / 0.0324, 3x1152x6x6 0.0339 / 0.0327, 2x1280x7x7 0.0336 / 0.0333.
   Paired against the split schedule (pair.py, 6-8 rounds): 1x1344x10x9 1.25-1.29x, 1x1408x9x8
   1.36x, 2x1408x6x6 1.29x, 2x1152x7x7 1.18x, 3x1152x6x6 1.14x; against oneDNN 1.03-1.58x
   on these and 1x1536x8x8, 1x2304x7x7 (1x1344x10x9 was 0.70-0.80x).  Rows of 1280 channels
   gained in the machine's fast phase (2x1280x7x7 1.25x, 1x1280x10x10 1.21x) and lost in its
   slow one (0.85x, 0.84x; not explained).  Not two units per thread (4x1280x6x6, units of
   320: 0.0514 / 0.0562), nor beyond the budget (1x768x10x18, units of 384: 0.0334 / 0.0556).
   Both schedules give the same bits.
   The training forward of at most NORM_FEW_ROWS rows takes a unit per thread too (and the
   backward's units are not refused for their short pieces, plan_bn): the split schedule had
   every thread combine and finalize all channels after its barrier (a division and a square
   root in double per channel; since the forty-third session each thread finalizes its share,
   run_split_region), which with few rows outweighs the rows' own work (1x1536x5x5, one
   thread: fwd_stats, fwd_tail and norm_fwd_consts, now fwd_final, 30 % of the call).
   Measured (Zen 5, 2 threads, f32, pair.py, 6-8 rounds, a unit per thread against the split
   schedule of then): NHWC 1x1536x5x5 1.58x,
   1x2048x5x5 1.94x, 1x1536x7x7 1.46x, 1x2048x7x7 1.29x, 1x1152x7x7 1.22x, 1x1088x7x7 1.12x,
   2x1536x7x7 1.10x, 1x1536x10x10 1.12x, [32, 2048] 1.64x, [64, 2048] 1.47x, [64, 1536] 1.29x,
   [128, 1536] 1.14x; at 196 rows it lost (4x1152x7x7 0.84x).  Not for f32 rows a multiple of
   4 KiB apart read in pieces narrower than 4 KiB (1x1024x7x7 0.44-0.83x, 2x1024x5x5
   0.42-0.81x, [64, 1024] 0.68-0.78x): perf put the time on the apply's stores, every row's
   piece on the same 4 KiB offsets (see ALIAS_ROWS in ukernels_vec.inc; the mechanism is not
   proven).  16-bit rows of 4 KiB gained all the same (bf16 1x2048x5x5 1.50x): twice the
   channels a byte, twice the finalize saved. */
#define NORM_FEW_ROWS 128
/* the channels of a unit per thread, or 0 where such units do not fit */
static int64_t unit_per_thread(const norm_job *jb, int64_t line, double per_channel,
                               int64_t budget) {
  const norm_geom *g = jb->g;
  const int64_t nt = jb->nt, w = ((g->c + nt - 1) / nt + line - 1) / line * line;
  if (w >= g->c || (g->c + w - 1) / w != nt || w * (int64_t)g->esize < min_piece() ||
      (double)w * per_channel > (double)budget)
    return 0;
  return w;
}

static int plan_bn(norm_job *jb) {
  const norm_geom *g = jb->g;
  const int64_t budget = norm_unit_budget();
  const int64_t tensors = jb->nsums == SUMS_BWD ? (g->act != BN_ACT_NONE ? 3 : 2) : 1;
  if (!jb->rows_form) {
    /* channels per unit: enough for 8 KiB contiguous per image, within the L2 share */
    const double run = (double)g->s * (double)g->esize, slab = (double)g->n * run * tensors;
    double wd = ceil(8192.0 / run);
    if (wd * slab > (double)budget) wd = floor((double)budget / slab);
    int64_t w = wd < 1.0 ? 1 : wd > NORM_MAX_UNIT ? NORM_MAX_UNIT : (int64_t)wd;
    if (w > g->c) w = g->c;
    /* Enough units to balance the threads; one thread takes the widest.  The statistics of
       short runs go sixteen channels a call (stats_chans, its lanes a channel each), so units
       of whole sixteens.  Both cut the calls and their unused lanes: a single-thread call had
       been cut into 4 units (NCHW 64x24x2x2: 4 of 6 channels).  Paired against the library
       before (Zen 5, f32, 5 rounds): forward 64x24x2x2 1.76x, 4x60x5x5 1.49x, 32x48x4x4
       1.25x (bf16 1.30x), and on 2 threads 64x64x2x2 (units of 16, not 8) 1.44x, 16x192x2x2
       1.16x, 8x512x3x3 1.12x; backward 64x24x2x2 1.14x, 16x24x7x7 1.21x. */
    if (jb->nt > 1)
      while (w > 1 && (g->c + w - 1) / w < 4 * (int64_t)jb->nt) w--;
    if (cf_chans(jb)) {
      if (w > 16) w = w / 16 * 16;
      else if (g->c >= 32 * (int64_t)jb->nt && 16 * slab <= (double)budget) w = 16;
    }
    jb->unit = w; /* also the fused schedule's unit when NORMA_SCHEDULE forces it */
    return !cf_split_streams(jb) && use_fused(jb, (g->c + w - 1) / w);
  }
  const int64_t line = rows_line(jb);
  const double per_channel = (double)g->m * (double)g->esize * tensors;
  int64_t w;
  if (g->c <= line) {
    w = g->c;
  } else {
    const double wd = floor((double)budget / per_channel / (double)line) * (double)line;
    w = wd < (double)line ? line : wd > NORM_MAX_UNIT ? NORM_MAX_UNIT : (int64_t)wd;
    if (w >= g->c) w = g->c;
    while (w > line && (g->c + w - 1) / w < jb->nt) w -= line; /* a unit for every thread */
  }
  jb->unit = w;
  if (jb->nsums == SUMS_STATS && jb->nt > 1 && g->m <= NORM_FEW_ROWS) {
    const int64_t wt = unit_per_thread(jb, line, per_channel, budget);
    const int64_t row = g->c * (int64_t)g->esize, piece = wt * (int64_t)g->esize;
    if (wt && (g->esize < 4 || row % 4096 != 0 || piece >= 4096)) {
      jb->unit = wt;
      return 1;
    }
  }
  /* a unit narrower than the row reads each row in a piece, far from the last: memory serves
     short pieces poorly (measured: 64-byte pieces are slower than two streaming passes), so
     whole rows or pieces of at least 2 KiB */
  if ((w < g->c && w * (int64_t)g->esize < min_piece()) || (double)w * per_channel > (double)budget)
    return 0;
  /* one unit per thread, read in pieces under 4 KiB: the split schedule, whose threads take
     whole rows, was faster (Zen 5, 2 threads, f32, forward NHWC 1x1024x14x14 and 4x1024x7x7:
     units of 656 and 368 channels, 1.38x; [64, 4096], units of 8 KiB pieces, 0.68x).  Not the
     backward of at most NORM_FEW_ROWS rows, whose split schedule finalizes every channel on
     every thread (see unit_per_thread): paired, fused against split (Zen 5, 2 threads, f32),
     NHWC 1x1024x7x7 1.23-1.42x, 2x1024x7x7 1.34x, 1x1024x10x10 1.05x, [32, 1024] 1.51x,
     [64, 1024] 1.22x, [128, 1024] 1.12x. */
  if ((g->c + w - 1) / w <= jb->nt && w * (int64_t)g->esize < 2 * min_piece() &&
      !(jb->nsums == SUMS_BWD && g->m <= NORM_FEW_ROWS))
    return 0;
  /* The forward with two units per thread: split.  Measured (Zen 5, 2 threads, f32, ms, best
     of 3 medians, fused / split): 4 units, NHWC 4x1792x7x7 0.064 / 0.047, 4x2048x7x7 0.062 /
     0.054, 3x2048x7x7 0.052 / 0.047, [256, 2048] 0.078 / 0.063, [128, 2048] 0.042 / 0.037,
     [32, 2048] 0.0148 / 0.0139; 6 units, [64, 3072] 0.0326 / 0.0336; 8 units, [64, 4096]
     0.039 / 0.044, NHWC 4x4096x7x7 0.102 / 0.111.  The backward with 4 units stays fused
     (1x2048x7x7 0.023 / 0.031, 3x2048x7x7 0.067 / 0.073). */
  if (jb->nsums == SUMS_STATS && jb->nt > 1 && (g->c + w - 1) / w < 3 * (int64_t)jb->nt) return 0;
  if (use_fused(jb, (g->c + w - 1) / w)) return 1;
  const int64_t wt = jb->nsums == SUMS_BWD ? unit_per_thread(jb, line, per_channel, budget) : 0;
  if (wt) jb->unit = wt;
  return wt != 0;
}

/* BatchNorm inference in rows form with few rows and many channels, in the caches: units of
   channels.  The split schedule derives the per-channel constants (a square root and a
   division each) on one thread, then applies by rows; with few rows for the channels that
   serial part costs as much as the apply.  Units of channels, one per thread, each derive
   their own constants and apply them to every row: nothing serial, no barrier.  Each row is
   then read in pieces (at least NORMA_MIN_PIECE), slower per byte, so only for up to 256 rows
   of at least 16 KiB.  Measured (2 threads, Zen 5, f32, ms, units / split): [16, 30000]
   0.10 / 0.20, [8, 100000] 0.24 / 0.74, [16, 4096] 0.017 / 0.032, [200, 4096] 0.10 / 0.12; and
   where it does not pay, [64, 1024] 0.019 / 0.013, [2048, 1000] 0.36 / 0.21, NHWC 8x1280x7x7
   0.10 / 0.04.  The result does not depend on the schedule. */
static int plan_infer_units(norm_job *jb) {
  const norm_geom *g = jb->g;
  const int64_t line = rows_line(jb), nt = jb->nt;
  if (!jb->rows_form || nt <= 1 || g->m > 256 || g->total * (int64_t)g->esize > NORM_CACHED_BYTES)
    return 0;
  const int64_t w = ((g->c + nt - 1) / nt + line - 1) / line * line;
  if (g->c * (int64_t)g->esize < 16384 || w * (int64_t)g->esize < min_piece() ||
      (g->c + w - 1) / w != nt)
    return 0;
  jb->unit = w;
  return 1;
}

/* Per-sample norms: a unit is whole groups of one sample.  Channels-first: groups are
   contiguous, so a unit of about 64 KiB per tensor or more (whole groups) stays in L2;
   channels-last: whole rows when the samples keep every thread busy, else group blocks of at
   least 2 KiB pieces. */
static void plan_per_sample(norm_job *jb) {
  const norm_geom *g = jb->g;
  const int64_t cpg = g->cpg, ngr = g->c / cpg;
  const double gbytes = (double)cpg * (double)g->s * (double)g->esize; /* one group, one tensor */
  int64_t k = 1;                                                       /* groups per unit */
  if (!jb->rows_form) {
    const double want = 64.0 * 1024;
    k = gbytes >= want ? 1 : (int64_t)(want / gbytes);
  } else {
    k = ngr; /* whole rows: both passes stream (few samples: the split schedule, below) */
  }
  if (k > ngr) k = ngr;
  if (k < 1) k = 1;
  /* enough units for the threads (whole rows already balance them) */
  if (k < ngr || !jb->rows_form)
    while (k > 1 && g->n * ((ngr + k - 1) / k) < 4 * (int64_t)jb->nt) k = (k + 1) / 2;
  jb->unit = k * cpg;
}

/* NORMA_SCHEDULE=fused|split forces BatchNorm's schedule (a debugging and testing knob: both
   give bitwise identical results).  -1: chosen per problem. */
static int forced_schedule(void) {
  static int v = -2;
  if (v == -2) {
    const char *e = getenv("NORMA_SCHEDULE");
    v = (e && strcmp(e, "fused") == 0) ? 1 : (e && strcmp(e, "split") == 0) ? 0 : -1;
  }
  return v;
}

/* Threads for a BatchNorm call: all of them from the size at which sharing the work gains
   more than the parallel region costs (a fork / join of 3-5 us, a barrier), which depends on
   the work per value.  Measured on Zen 5 (2 threads, f32, A/B pairs of 1 and 2 threads on 58
   shapes of 32K-262K values, both layouts and [N, C]; docs/performance.md, fifteenth session):
   - inference (a pass over x): from NORM_PAR_INFER values (below) plus 32 a channel (the
     constants each thread makes and reads).  The fifteenth session measured (its rule
     was 131072 plus 32): with 1, 2 threads ran 1x2048x8x8 (131K values) 0.72-0.88x as
     fast, 8x256x8x8 and 16x512x4x4 0.76-0.80x, [64, 2048] 0.67x, [128, 1024] 0.72x,
     [150, 1000] 0.79x, 4x128x16x16 1.04x, and 3x256x14x14 (150K) 1.16x, 12x128x10x10 (154K)
     1.50x, 4x1024x7x7 1.00-1.16x, [64, 4096] 1.22x, 64x64x7x7 1.42-1.53x, 8x512x8x8 1.21x;
   - channels-first training (forward and backward): the per-channel work (a channel's runs
     reduced, its constants made) counts as 48 values.  NCHW 1x1024x7x7 (50K values) ran its
     forward 1.41x, its backward 1.09x faster on 2 threads; 1x1024x8x8 1.38x / 1.20x; 16x64x8x8
     and 4x192x8x8 0.83-0.90x; at 98K values 0.93-1.64x.  Not for 16-bit data under 256
     channels: bf16 32x64x7x7 ran 0.94x / 0.82x (f16 4x512x7x7 backward 1.20x, bf16 1x1024x7x7
     forward 1.51x);
   - the wide view of short channels-first runs (op_bn.c, wide_cf_runs): the backward of f32
     from 98304 values where its rows are whole lines, else from NORM_SERIAL_BELOW (against
     the rule below, backward NCHW 32x256x2x2 ran 0.72x, 8x512x3x3 0.99x);
   - channels-last and [N, C] training: the backward from NORM_PAR_ROWS_BWD values, the
     forward from NORM_PAR_ROWS_FWD, any dtype.  The fifteenth session had found 2 threads
     slower below 98304 (backward f32, whole lines) and 131072 values (the rest); re-measured,
     they gain far below that (not traced to one change: the schedules and their parallel
     regions have changed much since).  Measured (thirty-seventh session, Zen 5, f32 unless
     said, pair.py against one thread, 4 rounds, one process a measurement):
     backward 1x1280x8x8 1.80x, 16x512x3x3 1.53x (bf16 1.47x), bf16 8x256x7x7 1.65x,
     2x1000x7x7 1.28x, [64, 1000] 1.17x, 8x256x4x4 (32K) 1.21x, 4x512x3x3 (18K) 1.13x,
     2x768x4x4 1.06x; but [24, 1000] 0.88x, [16, 1024] 0.91x, 8x256x2x4 0.97x; forward
     16x512x3x3 1.45x (bf16 1.31x), [64, 1000] 1.16x, 4x384x5x5 (38K) 1.14x, 2x2048x4x4 (32K)
     1.12x; but 2x768x4x4 (24K) 0.87x, [24, 1000] 0.92x, 8x256x2x4 0.79x, 8x64x6x6 0.91x.  In
     a loop of calls (one thread against two): 32K values 0.90-1.13x forward, 0.97-1.33x
     backward; 48K-82K 0.98-1.65x forward, 1.0-1.74x backward. */
#define NORM_PAR_TRAIN ((int64_t)98304)
/* Inference shares its work from NORM_PAR_INFER values plus 32 a channel (131072 plus 32
   until the thirty-seventh session).  Measured then (Zen 5, f32 unless said, pair.py against
   one thread, 4 rounds): gains at 50K-131K values, NHWC 16x512x3x3 1.28x (bf16 1.24x),
   32x256x3x3 1.34x, 16x64x8x8 1.31x, 4x640x5x5 1.10x, [128, 1024] 1.30x, [64, 2048] 1.05x,
   NCHW 1x2048x8x8 1.24x, 8x128x7x7 1.26x; losses where the channels are many for the values,
   which the 32 a channel keeps on one thread: [48, 1024] 0.85x, NHWC 4x1024x3x4 0.88x, NCHW
   16x256x3x3 0.70x.  The wide view of short channels-first runs keeps 131072 plus 32: against
   it, NCHW 16x512x3x3 ran 0.97x, 32x256x3x3 0.98x (6 rounds). */
#define NORM_PAR_INFER ((int64_t)49152)
#define NORM_PAR_ROWS_BWD ((int64_t)32768)
#define NORM_PAR_ROWS_FWD ((int64_t)36864)
/* A channel of those counts as NORM_PAR_ROWS_*_CHANNEL values (not in the wide view of short
   rows): its finalize (a division, a square root and more in double; the backward's x_hat
   constants too) costs 2-5 ns on one thread, against 0.1-0.2 ns a value, and where rows are
   few and channels many it is most of the call.  Until the forty-third session values alone
   counted.  Measured then (Zen 5, f32, pair.py --twice, two threads against one, 6 rounds):
   forward NHWC 1x1344x4x4 1.39x, 1x2048x3x3 1.69x, 1x1536x3x3 1.34x, 1x1152x4x4 1.13x,
   [16, 2048] 1.55x, but 1x1024x4x4 0.99x, 1x896x5x5 0.96x, [24, 1000] 0.95x, 1x768x4x4
   0.82x, 2x640x4x4 0.82x, 1x512x5x5 0.71x; backward 1x1344x4x4 1.44x, 1x2048x3x3 1.72x,
   1x1152x4x4 1.45x, 2x1024x3x3 1.36x, 1x896x4x4 1.27x, [24, 1000] 1.22x, [16, 1024] 1.15x,
   1x768x4x4 1.15x (0.88-1.56), but 1x512x5x5 0.62x.  In slower phases of the machine two
   threads lost up to 2.5x on 14-25K values (2x768x4x4, 4x384x3x3), so the thresholds stay
   where the gain is large. */
#define NORM_PAR_ROWS_FWD_CHANNEL 16
#define NORM_PAR_ROWS_BWD_CHANNEL 24
/* Channels-first training with short runs costs per run and per channel more than its values
   say: a one-thread fit over 20 shapes of 8K-66K values with runs of 4-49 (Zen 5, f32, in
   the caches) gave 0.087 ns a value, 7.5 ns a channel and 5.1 ns a run for the backward, and
   0.064, 8.2 and 5.6 for the forward.  So with many channels of short runs two threads pay
   below NORM_PAR_TRAIN: work in values, a channel counted as 87 (forward 128) and a run as 58
   (87), from 131072 (forward 262144), about 12 (17) us of one thread.  Measured, 1 / 2 threads
   (median of 5-7 alternating rounds, f32): backward 8x1024x2x2 1.81x, 4x1024x4x4 1.73x,
   32x256x2x2 1.67x, 16x256x4x4 1.47x, 2x1024x5x5 1.42x, 32x128x3x3 1.38x, 2x1344x4x2 1.36x,
   64x64x2x2 1.33x, 4x704x3x3 1.30x, 16x192x2x2 1.26x, 2x512x7x7 1.19x, 4x512x2x2 1.19x,
   8x512x3x3 1.17x, bf16 2x1344x4x2 1.41x, 8x512x3x3 1.34x; forward 1x1024x7x7 1.46x,
   8x512x3x3 1.15-1.47x, 8x320x5x5 1.32-1.35x, 16x256x3x3 1.13-1.30x, 16x192x2x2 1.08-1.25x,
   64x64x2x2 1.10-1.12x.  Where one thread stays: backward 16x64x7x7 0.86x, 4x192x7x7 0.94x,
   8x128x4x4 0.89x, 4x160x5x5 0.65x; forward 2x512x7x7 0.94-1.50x, 2x512x4x4 0.94x,
   16x64x7x7 0.77-1.13x, 8x128x4x4 0.62-0.84x.  Not under 64 channels, whose units get too small
   to share (backward 64x32x2x2 0.87x, 128x16x3x3 0.73x; forward 0.84x, 0.80x).  (Runs of 2
   values, and of 3-12 with enough samples, take the rows form, op_bn.c's wide view
   (wide_cf_runs), and never come here.) */
#define CF_PAR_MIN_C 64
/* Channels-first training with CF_PAR_MIN_C channels or more, any dtype, shares its work from
   NORM_PAR_CF values (a channel counted as 48); fewer channels keep NORM_PAR_TRAIN (f32) and
   NORM_SERIAL_BELOW (16-bit).  Until the thirty-seventh session all of them did (16-bit
   data under 256 channels from NORM_SERIAL_BELOW).  Measured then (Zen 5, pair.py against one
   thread, 4 rounds, forward / backward): f32 1x64x16x16 (16K values) 1.37x / 1.05x,
   2x64x16x16 1.46x / 1.46x, 1x128x14x14 1.54x / 1.47x, 1x512x7x7 1.67x / 1.56x, 4x64x16x16
   1.51x / 1.77x, 1x256x14x14 1.69x / 1.63x, 16x64x5x5 1.44x / 1.04x, bf16 2x64x16x16 1.39x
   (forward), 1x128x14x14 1.37x (backward).  Fewer channels lost: 64x32x4x4 0.53x / 1.15x,
   8x32x8x8 1.07x / 0.95x. */
#define NORM_PAR_CF ((int64_t)24576)
static int cf_short_runs_parallel(const norm_geom *g, int backward) {
  if (g->c < CF_PAR_MIN_C) return 0;
  const int64_t runs = g->n * g->c;
  return backward ? g->total + 87 * g->c + 58 * runs >= NORM_SERIAL_BELOW
                  : g->total + 128 * g->c + 87 * runs >= 2 * NORM_SERIAL_BELOW;
}
static int bn_threads(const norm_job *jb) {
  const norm_geom *g = jb->g;
  const int backward = jb->dy != NULL || jb->nsums == SUMS_BWD;
  const int whole_lines = g->c * (int64_t)g->esize % 64 == 0;
  int64_t work = g->total, need = NORM_SERIAL_BELOW;
  if (!jb->nsums) {
    need = (jb->cf_wide ? NORM_SERIAL_BELOW : NORM_PAR_INFER) + 32 * g->c;
  } else if (!jb->rows_form) {
    if (g->c >= CF_PAR_MIN_C) work += 48 * g->c, need = NORM_PAR_CF;
    else if (g->esize == 4) work += 48 * g->c, need = NORM_PAR_TRAIN;
    if (cf_short_runs_parallel(g, backward)) return norma__threads();
  } else if (jb->cf_wide) {
    if (backward && g->esize == 4 && whole_lines) need = NORM_PAR_TRAIN;
  } else {
    need = backward ? NORM_PAR_ROWS_BWD : NORM_PAR_ROWS_FWD;
    if (!jb->split)
      work += (backward ? NORM_PAR_ROWS_BWD_CHANNEL : NORM_PAR_ROWS_FWD_CHANNEL) * g->c;
  }
  return work < need ? 1 : norma__threads();
}

/* The backward's apply of f32 channels-last rows with streaming stores goes by fours on
   AVX-512 (see bwd_rows_block).  Far beyond the caches a row at a time is faster for rows of
   481 to 896 channels (672 until the twenty-ninth session, below), with every activation
   since the prefetch below: it streams x and dy and writes dx in address order where the
   fours keep eight reads and four writes in flight.
   Measured without an activation and before the prefetch (nineteenth
   session, Zen 5, 2 threads, the whole backward): in one process alternating both ways over
   20-30 rounds (median ratio; the same path both ways gave 1.010x, quartiles 0.99-1.035)
   32x512x28x28 1.064x, 16x672x30x30 1.039x, 32x576x28x28 1.024x; pair.py --twice against the
   library before, 9 rounds, 32x512x28x28 1.06x, 64x512x28x28 1.086x.  Rows of 768 channels
   were even (48x768x27x27 1.035x in one process, 0.957x and 1.015x paired; 64x768x20x20
   1.03-1.10x; 16x768x28x28 0.95-1.015x).  Not below 32 MiB (16x512x28x28 1.031x, but
   8x672x30x30 0.965x, 16x768x20x20 0.965x), for rows of 4 KiB and wider (16x1024x20x20
   0.95x, 32x1024x24x24 0.99x, 32x2048x14x14 0.96x), with ReLU, which reads y too
   (32x512x28x28 0.967x, 64x768x20x20 0.919x), or for bf16 (pair.py: 32x512x28x28 0.81x).
   The twentieth session added the prefetch 4 KiB ahead (ONE_PF_BYTES in bwd_rows_block,
   AVX-512's forwards walk, split_apply_rows); with it ReLU and add + ReLU gain too.  pair.py
   --twice against the walk without it (Zen 5, 2 threads, 5 rounds): 29x576x28x28 1.18x and
   1.23x (7 rounds), 16x672x30x30 1.10x, 64x512x28x28 1.12x and 1.10x, ReLU 29x576x28x28
   1.02x, 32x512x28x28 1.11x, 16x672x30x30 1.25x, add + ReLU 29x576x28x28 1.14x.  Not wider
   rows (`bph`, the apply alone: 16x30x30x768 1.04x, 64x19x19x960 0.79-0.85x, 16x30x30x1344
   0.83-0.98x) nor bf16 (58x576x28x28 0.98x, 64x512x28x28 0.98x), nor the rows of AVX-512's
   strips (up to 480 channels), which the flag's prefetch slowed (`bph`, the apply alone, ms):
   63x21x21x384 2.55-2.62 against 1.57-1.71, 32x32x32x288 2.32-2.38 against 1.48.
   The twenty-ninth session widened it from 672 to 896 channels: pair.py against rows by fours
   (Zen 5, 2 threads, 6-8 rounds) 32x704x30x30 1.14x (0.96x in a noisy run), 16x768x28x28
   1.16x and 1.04x, 32x768x34x34 1.07x, 48x768x27x27 1.05x, 64x768x24x24 1.05x,
   64x768x34x34 1.06x, 24x832x28x28 1.03x, 64x896x28x28 1.05x, 32x896x20x20 1.00x, add +
   ReLU 32x768x28x28 1.10x, ReLU 1.04x; wider rows were even or lost (64x960x19x19 1.00x,
   32x1024x24x24 0.98x). */
#define NORM_BWD_ONE_ROW_MAX 3584 /* bytes of a row: 896 f32 */
static int norm_bwd_one_row(const norm_geom *g, int64_t bytes) {
  return g->dt == NORMA_F32 && !g->per_sample && g->layout == NORMA_CHANNELS_LAST &&
         bytes > NORM_SEQ_BYTES && g->c >= BN_SEQ_ROW_MIN &&
         g->c * (int64_t)g->esize <= NORM_BWD_ONE_ROW_MAX;
}

/* Values from which the per-sample norms (GroupNorm, InstanceNorm) run on the threads.  Until
   the thirty-eighth session they took NORM_SERIAL_BELOW (131072).  Measured then (Zen 5, two
   threads against one, f32, pair.py, 5 rounds, above 1 two threads faster): GroupNorm forward
   NCHW [1, 64, 16, 16] 1.35x, [2, 64, 16, 16] 1.61x, [1, 128, 24, 24] 1.70x, backward
   1.56x / 1.82x, NHWC forward [2, 64, 16, 16] 1.42x, [1, 128, 24, 24] 1.33x, backward 1.42x;
   InstanceNorm forward NCHW [2, 64, 16, 16] 1.65x, [4, 64, 16, 16] 1.76x, backward 1.79x,
   NHWC 1.70x / 1.79x.  At 8192-16384 values they were even or lost (GroupNorm NHWC
   [1, 64, 16, 16] forward 0.78x, backward 0.91x; InstanceNorm NCHW [1, 32, 16, 16] 0.85x). */
#define NORM_PAR_PER_SAMPLE 24576

/* The tensors beyond which the backward reads its rows in address order (BN_ROWS_SEQ):
   NORM_SEQ_BYTES, but from NORM_CACHED_BYTES for f32 rows of up to NORM_SEQ_NARROW_MAX_C
   channels, whose x and dy together overflow the LLC share there already.  Measured (forty-
   first session, Zen 5, 2 threads, f32, 25.7 MB tensors unless said, the whole backward
   alternating in one process, medians of 15, ms, the rows in order / as before): 64 channels
   2.13 / 2.22, 2.62 / 2.64 (24x56x56x64, 19.3 MB: 1.56 / 1.67, 2.15 / 2.34); 128 3.92 /
   4.48, 3.89 / 4.37; 256 3.57 / 4.51, 3.21 / 5.01, AVX2 2.72 / 3.45, 2.94 / 3.67; 320 3.32 /
   4.22, 3.27 / 4.09; 448 5.13 / 7.47, 3.68 / 4.14, 4.02 / 4.51; but 512 3.68 / 3.52, 4.39 /
   4.47, 768 3.59 / 3.16, 4.39 / 4.01, 1024 3.75 / 2.99, 3.62 / 3.10.  A random sweep had
   found the backward of NHWC 16x30x30x448 at 0.81x of PyTorch (pair.py --twice, 8 rounds). */
#define NORM_SEQ_NARROW_MAX_C 480
static int64_t norm_seq_bytes(const norm_geom *g) {
  return g->dt == NORMA_F32 && g->c <= NORM_SEQ_NARROW_MAX_C ? NORM_CACHED_BYTES
                                                             : NORM_SEQ_BYTES;
}

/* Where BatchNorm's channels-last kernels go without software prefetch although the tensor
   is beyond the caches: the hardware's prefetchers serve their one ascending stream, and the
   kernels' prefetch of every line stalled it (`perf`: a fifth of the inference of
   2x111x111x896's samples on the prefetch).  Measured (thirty-eighth session, Zen 5, 2
   threads, pair.py --twice, 5-7 rounds, above 1 without faster):
   - an apply alone (inference) of f32 rows of 1-5 KiB (256-1280 channels: the kernel's
     whole rows, FWD_ROW_L1), any ISA: 2x111x111x896 1.27x, 8x50x50x640 1.13x, 32x56x56x256 1.16x,
     32x28x28x512 1.21x, 16x64x64x384 1.12x, 8x40x40x1280 1.10x, 8x50x50x1024 1.05x, AVX2
     1.08-1.16x; not narrower rows (32x112x112x64 1.00x, 16x100x100x128 0.98x), wider ones,
     which go in blocks (8x40x40x1536 0.96x), or bf16 (16x56x56x512 0.92x, 8x80x80x896 0.92x);
   - the AVX-512 training forward of the same rows beyond NORM_SEQ_BYTES (statistics and
     apply): 32x56x56x256 1.09x, 64x56x56x256 1.07x, 8x50x50x640 1.11x, 16x64x64x384 1.03x,
     2x111x111x896 1.03x, ReLU 32x56x56x256 1.09x, 32x28x28x512 1.00x; within it
     (32x28x28x256 0.99x, 32x14x14x1024 0.97x) and for bf16 (32x28x28x512 0.81x) not;
   - the AVX-512 backward of rows of up to 128 channels beyond NORM_SEQ_BYTES (its sums take
     no prefetch there already; its apply walks forwards): 32x112x112x64 1.08x, 64x56x56x64
     1.18x, 32x56x56x128 1.03x, 16x100x100x96 1.04x, 64x80x80x32 1.04x, bf16 32x112x112x64
     1.05x, ReLU 1.04x; within NORM_SEQ_BYTES the LLC holds part of the tensor and it lost
     (32x56x56x64, 25.7 MB: 0.95x).  AVX2's rows by fours need the prefetch (k_bwd_sums_rows);
     wider rows' backward too (all prefetch off: 32x56x56x256 0.94x, 8x93x93x576 0.875x). */
static int rows_no_prefetch(const norm_job *jb, int64_t bytes) {
  const norm_geom *g = jb->g;
  if (!jb->rows_form || g->per_sample) return 0;
  const int64_t row = g->c * (int64_t)g->esize;
  const int f32_rows = g->dt == NORMA_F32 && row >= 1024 && row <= 5120;
  const int far512 =
      bytes > NORM_SEQ_BYTES && bn_ukernels_isa(norma__isa(), g->dt) == NORMA_ISA_AVX512;
  return (!jb->nsums && f32_rows) ||                               /* an apply alone */
         (jb->nsums == SUMS_STATS && !jb->dy && f32_rows && far512) || /* training forward */
         (jb->dy && g->c <= 128 && far512);                           /* backward */
}

/* Whether short channels-first runs may stream their output, as one stream a sample
   (fwd_runs_stream, bwd_runs_stream; norm_bn_nt_store decides whether they do): runs of at
   least a vector that a call sweeps (cf_sweep) */
static int cf_stream(const norm_job *jb) { return cf_sweep(jb) && jb->g->s >= 16; }

void norm_plan_job(norm_job *jb) {
  const norm_geom *g = jb->g;
  jb->rows_form = g->layout == NORMA_CHANNELS_LAST;
  jb->act = g->act;
  norm_job_kernels(jb);
  jb->nt = g->per_sample ? (g->total < NORM_PAR_PER_SAMPLE ? 1 : norma__threads())
                         : bn_threads(jb);
  jb->unit = g->c;
  if (g->per_sample) {
    plan_per_sample(jb);
    /* channels-last with fewer samples than keep the threads busy: sample by sample, the
       split schedule spreads each one's rows over the threads */
    jb->fused = !(jb->rows_form && jb->nt > 1 && g->n % jb->nt != 0 && g->n < 4 * (int64_t)jb->nt);
    if (!jb->fused) jb->unit = g->c;
  } else {
    jb->fused = jb->nsums ? plan_bn(jb) : !jb->split && jb->apply && plan_infer_units(jb);
    if (jb->nsums && forced_schedule() >= 0) jb->fused = forced_schedule();
    if (jb->split) jb->fused = 0;
    if (!jb->fused) jb->unit = g->c;
  }
  /* Streaming stores pay off for outputs that leave the cache anyway, and only when they fill
     whole lines: long channels-first runs, short channels-first runs of at least a vector
     that a kernel call sweeps as one stream (cf_sweep; fwd_runs_stream, bwd_runs_stream in
     ukernels_vec.inc), or whole rows (of whole lines, or long) in channels-last */
  const int whole_lines =
      jb->rows_form ? (!jb->fused || jb->unit == g->c) && norm_nt_runs(g->c * (int64_t)g->esize)
                    : g->s * (int64_t)g->esize >= 2048 || cf_stream(jb);
  jb->store =
      whole_lines && norm_bn_nt_store(g, norm_nt_kind_of(jb)) ? BN_STORE_NT : 0;
  /* the rows kernels prefetch only where the tensor is beyond the caches (BN_PF_AHEAD) */
  const int64_t bytes = g->total * (int64_t)g->esize;
  jb->pf = bytes > NORM_CACHED_BYTES && !rows_no_prefetch(jb, bytes) ? BN_PF_AHEAD : 0;
  jb->seq = bytes > norm_seq_bytes(g) ? BN_ROWS_SEQ : 0;
  jb->one = norm_bwd_one_row(g, bytes) ? BN_ROWS_ONE : 0;
}

/* ---- running a job ---------------------------------------------------------------------- */

norma_status norm_run_job(norm_job *jb) {
  const norm_geom *g = jb->g;
  norm_plan_job(jb);
  /* everything the call needs, allocated here before anything is written: the units' arrays
     (one set per thread, or the global unit of the split schedule), the split partials, and
     per_nc */
  norm_unit whole = {.i1 = g->per_sample ? 1 : g->n, .nc = g->c};
  const int region = !jb->fused && split_one_region(jb);
  const size_t units = jb->fused || region
                           ? (size_t)jb->nt * unit_bytes(jb, jb->fused ? jb->unit : g->c)
                           : unit_bytes(jb, g->c);
  const size_t part = (!jb->fused && jb->nsums)
                          ? (size_t)nsegments(jb, &whole) * (size_t)g->c * 3 * sizeof(double) : 0;
  const size_t pnc = jb->want_per_nc ? (size_t)g->n * (size_t)g->c * 2 * sizeof(double) : 0;
  plan_super_rows(jb);
  const size_t rep = (region ? (size_t)jb->nt : 1) * super_rows_bytes(jb);
  char *mem = norm_scratch(0, norm_up64(units) + norm_up64(part) + norm_up64(pnc) + rep);
  if (!mem)
    return norma__fail(NORMA_ERR_OUT_OF_MEMORY, "norma: out of memory allocating %zu bytes of "
                       "scratch", units + part + pnc + rep);
  jb->per_nc = jb->want_per_nc ? (double *)(mem + norm_up64(units) + norm_up64(part)) : NULL;
  char *rmem = mem + norm_up64(units) + norm_up64(part) + norm_up64(pnc);
  if (jb->fused) {
    norm_parallel_for(jb, unit_count(jb), fused_units, mem);
  } else if (region) {
    run_split_region(jb, &whole, (double *)(mem + norm_up64(units)), mem, rmem);
  } else { /* BatchNorm: one unit of all samples; a per-sample norm: one per sample */
    norm_unit u = whole;
    unit_arrays(jb, &u, mem, g->c);
    const int64_t step = whole.i1;
    for (int64_t i = 0; i < g->n; i += step) {
      u.i0 = i, u.i1 = i + step, u.j0 = 0, u.nc = g->c;
      run_split(jb, &u, (double *)(mem + norm_up64(units)), (float *)rmem);
    }
  }
  return NORMA_OK;
}
