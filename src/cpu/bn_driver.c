/* bn_driver.c - the production BatchNorm: thread split, blocking, per-channel constants, and
 * dispatch to the micro-kernels of the best ISA (ukernels.h).
 *
 * Every operation is "reduce, then apply" per channel:
 *   forward training: sums of (x - k) and (x - k)^2 (k: the channel's first value, so that
 *                     large-mean data lose nothing), then y = (x - mean) * scale + shift;
 *   backward:         sums of g, g * x_hat, x_hat, then dx = a * g + b * x_hat + c;
 *   inference and the split API's apply steps: apply only; moments / backward_reduce: reduce only.
 *
 * Determinism: the reduction of a channel is cut into segments fixed by the shape alone
 * (channels-first: runs of up to CF_CHUNK values of one image; channels-last: CL_SEG_ROWS rows,
 * themselves summed in blocks of CL_BLOCK_ROWS rows).  A segment's sums are computed in the
 * compute type by one micro-kernel call (or a fixed sequence of them), converted to double,
 * and the segments are added in index order.  Which thread computes a segment never changes
 * what is computed, so results are bitwise identical for any thread count.
 *
 * Two schedules, same arithmetic:
 *   fused (A):  threads take whole channels (channels-first) or blocks of adjacent channels
 *               (channels-last); each reduces its channels, finalizes them, and applies them
 *               while the data is still in cache: one DRAM read when the block fits.
 *   split (B):  for few channels: threads take segments; partial sums go to scratch, are added
 *               in order, then every thread applies a share of the tensor.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "impl.h"
#include "ukernels.h"

#define CF_CHUNK 4096       /* values per channels-first segment */
#define CL_BLOCK_ROWS 64    /* rows per micro-kernel call in channels-last reductions */
#define CL_SEG_ROWS 4096    /* rows per channels-last segment */
#define ROWS_CHUNK 1024     /* channels per rows-kernel call */
#define SERIAL_BELOW 32768  /* tensors with fewer values run without a parallel region */
#define NT_MIN_BYTES (8 << 20) /* outputs this large are written around the cache */

enum { SUMS_NONE = 0, SUMS_STATS = 2, SUMS_BWD = 3 };

typedef struct job job;
typedef void (*finalize_fn)(job *jb, int64_t j0, int64_t nc);

struct job {
  const bn_problem *p;
  const bn_ukernels *uk;
  int rows_form;       /* 1: rows x channels (channels-last, or channels-first with spatial 1) */
  int64_t rows;        /* rows_form: number of rows (n * spatial) */
  size_t cbytes;       /* bytes of the compute type */
  int nt;              /* threads */
  int64_t unit;        /* rows form, fused schedule: channels per unit */
  int store;           /* BN_STORE_NT when outputs bypass the cache */
  int nsums;           /* SUMS_* */
  int apply;           /* run the apply kernels after finalize */
  /* tensors */
  const void *x, *res, *y, *dy;
  void *out, *dres;
  /* per channel (compute type): shift k [c], constants [C_COUNT][c]; totals (double) [3][c] */
  void *k, *cst;
  double *tot;
  finalize_fn finalize;
  const void *ctx;
};

/* ---- scratch ---------------------------------------------------------------------------- */

static void *scratch_alloc(job *jb, size_t extra, void **extra_ptr) {
  const int64_t c = jb->p->c;
  size_t kb = (size_t)c * jb->cbytes, cb = (size_t)c * C_COUNT * jb->cbytes;
  size_t tb = (size_t)c * 3 * sizeof(double);
  kb = (kb + 63) & ~(size_t)63, cb = (cb + 63) & ~(size_t)63, tb = (tb + 63) & ~(size_t)63;
  char *mem = aligned_alloc(64, kb + cb + tb + ((extra + 63) & ~(size_t)63) + 64);
  if (!mem) return NULL;
  jb->k = mem;
  jb->cst = mem + kb;
  jb->tot = (double *)(mem + kb + cb);
  if (extra_ptr) *extra_ptr = mem + kb + cb + tb;
  return mem;
}

static inline void cst_set(job *jb, int k, int64_t j, double v) {
  if (jb->cbytes == 8) ((double *)jb->cst)[k * jb->p->c + j] = v;
  else ((float *)jb->cst)[k * jb->p->c + j] = (float)v;
}
/* the value a constant has after rounding to the compute type */
static inline double cst_get(job *jb, int k, int64_t j) {
  return jb->cbytes == 8 ? ((double *)jb->cst)[k * jb->p->c + j]
                         : (double)((float *)jb->cst)[k * jb->p->c + j];
}
static inline const void *cst_at(const job *jb, int64_t j) {
  return (const char *)jb->cst + (size_t)j * jb->cbytes;
}

/* ---- geometry --------------------------------------------------------------------------- */

static inline const void *tptr(const job *jb, const void *base, int64_t elem) {
  return base ? (const char *)base + (size_t)elem * jb->p->esize : NULL;
}
static inline void *tptr_w(const job *jb, void *base, int64_t elem) {
  return base ? (char *)base + (size_t)elem * jb->p->esize : NULL;
}

static int64_t cf_chunks(const job *jb) { return (jb->p->s + CF_CHUNK - 1) / CF_CHUNK; }
static int64_t nsegments(const job *jb) {
  return jb->rows_form ? (jb->rows + CL_SEG_ROWS - 1) / CL_SEG_ROWS : jb->p->n * cf_chunks(jb);
}
/* the narrowest unit of the fused schedule in rows form: one 64-byte line of each row */
static int64_t rows_line(const job *jb) {
  int64_t u = 64 / (int64_t)jb->p->esize;
  return u < 8 ? 8 : u;
}
#define MAX_UNIT 512

/* ---- reduction of one segment ----------------------------------------------------------- */

/* channels-first: segment seg = (image, chunk) of channel ch -> out[nsums] */
static void seg_sums_cf(const job *jb, int64_t ch, int64_t seg, double *out) {
  const bn_problem *p = jb->p;
  const int64_t nch = cf_chunks(jb), n = seg / nch, s0 = (seg % nch) * CF_CHUNK;
  const int64_t len = p->s - s0 < CF_CHUNK ? p->s - s0 : CF_CHUNK;
  const int64_t e = (n * p->c + ch) * p->s + s0;
  if (jb->nsums == SUMS_STATS)
    jb->uk->stats_run(tptr(jb, jb->x, e), len, (const char *)jb->k + ch * jb->cbytes, out);
  else
    jb->uk->bwd_sums_run(tptr(jb, jb->x, e), tptr(jb, jb->y, e), tptr(jb, jb->dy, e), len,
                         cst_at(jb, ch), p->c, p->act, out);
}

/* rows form: segment seg, channels [j0, j0 + nc) -> out[k * ostride + j] (k < nsums) */
static void seg_sums_rows(const job *jb, int64_t seg, int64_t j0, int64_t nc, double *out,
                          int64_t ostride) {
  const bn_problem *p = jb->p;
  const int64_t r0 = seg * CL_SEG_ROWS;
  const int64_t r1 = r0 + CL_SEG_ROWS < jb->rows ? r0 + CL_SEG_ROWS : jb->rows;
  static _Thread_local double blk[3][ROWS_CHUNK];
  for (int k = 0; k < jb->nsums; k++)
    for (int64_t j = 0; j < nc; j++) out[k * ostride + j] = 0.0;
  /* row blocks outer, whole rows (up to ROWS_CHUNK channels) inner: memory is read in order;
     a channel's sums still see its blocks in order, whatever the loop nest */
  for (int64_t r = r0; r < r1; r += CL_BLOCK_ROWS) {
    const int64_t rows = r1 - r < CL_BLOCK_ROWS ? r1 - r : CL_BLOCK_ROWS;
    for (int64_t jc = 0; jc < nc; jc += ROWS_CHUNK) {
      const int64_t ncc = nc - jc < ROWS_CHUNK ? nc - jc : ROWS_CHUNK, ja = j0 + jc;
      const int64_t e = r * p->c + ja;
      if (jb->nsums == SUMS_STATS)
        jb->uk->stats_rows(tptr(jb, jb->x, e), rows, p->c, ncc, (const char *)jb->k + ja * jb->cbytes,
                           blk[0], blk[1]);
      else
        jb->uk->bwd_sums_rows(tptr(jb, jb->x, e), tptr(jb, jb->y, e), tptr(jb, jb->dy, e), rows,
                              p->c, ncc, cst_at(jb, ja), p->c, p->act, blk[0], blk[1], blk[2]);
      for (int k = 0; k < jb->nsums; k++)
        for (int64_t j = 0; j < ncc; j++) out[k * ostride + jc + j] += blk[k][j];
    }
  }
}

/* ---- apply ------------------------------------------------------------------------------ */

static void apply_cf(const job *jb, int64_t ch, int64_t seg) {
  const bn_problem *p = jb->p;
  const int64_t nch = cf_chunks(jb), n = seg / nch, s0 = (seg % nch) * CF_CHUNK;
  const int64_t len = p->s - s0 < CF_CHUNK ? p->s - s0 : CF_CHUNK;
  const int64_t e = (n * p->c + ch) * p->s + s0;
  if (jb->nsums == SUMS_BWD || jb->dy)
    jb->uk->bwd_run(tptr(jb, jb->x, e), tptr(jb, jb->y, e), tptr(jb, jb->dy, e),
                    tptr_w(jb, jb->out, e), tptr_w(jb, jb->dres, e), len, cst_at(jb, ch), p->c,
                    p->act | jb->store);
  else
    jb->uk->fwd_run(tptr(jb, jb->x, e), tptr(jb, jb->res, e), tptr_w(jb, jb->out, e), len,
                    cst_at(jb, ch), p->c, p->act | jb->store);
}

static void apply_rows(const job *jb, int64_t r0, int64_t r1, int64_t j0, int64_t nc) {
  const bn_problem *p = jb->p;
  const int64_t e = r0 * p->c + j0;
  if (jb->dy)
    jb->uk->bwd_rows(tptr(jb, jb->x, e), tptr(jb, jb->y, e), tptr(jb, jb->dy, e),
                     tptr_w(jb, jb->out, e), tptr_w(jb, jb->dres, e), r1 - r0, p->c, nc,
                     cst_at(jb, j0), p->c, p->act | jb->store);
  else
    jb->uk->fwd_rows(tptr(jb, jb->x, e), tptr(jb, jb->res, e), tptr_w(jb, jb->out, e), r1 - r0,
                     p->c, nc, cst_at(jb, j0), p->c, p->act | jb->store);
}

/* ---- the two schedules ------------------------------------------------------------------ */

/* Streaming stores are weakly ordered: each thread fences its own before the region ends. */
static inline void store_fence(const job *jb) {
#if defined(__x86_64__) || defined(__i386__)
  if (jb->store) _mm_sfence();
#else
  (void)jb;
#endif
}

static int use_fused(const job *jb, int64_t units) {
  return jb->nt == 1 || units >= 4 * (int64_t)jb->nt || units % jb->nt == 0;
}

/* Fused schedule: each thread reduces, finalizes and applies whole units. */
static void run_fused(job *jb) {
  const bn_problem *p = jb->p;
  const int64_t c = p->c, nseg = nsegments(jb);
  if (!jb->rows_form) {
#pragma omp parallel num_threads(jb->nt) if (jb->nt > 1)
    {
#pragma omp for schedule(static) nowait
    for (int64_t b = 0; b < (c + jb->unit - 1) / jb->unit; b++) {
      /* a unit is a block of adjacent channels: within an image their runs are contiguous,
         so the unit streams through memory in long pieces however short one run is */
      const int64_t j0 = b * jb->unit, nc = c - j0 < jb->unit ? c - j0 : jb->unit;
      const int64_t nch = cf_chunks(jb);
      if (jb->nsums) {
        double acc[3][MAX_UNIT], s[3];
        for (int k = 0; k < jb->nsums; k++)
          for (int64_t j = 0; j < nc; j++) acc[k][j] = 0.0;
        for (int64_t n = 0; n < p->n; n++)
          for (int64_t j = 0; j < nc; j++)
            for (int64_t q = 0; q < nch; q++) { /* channel j0 + j sees its segments in order */
              seg_sums_cf(jb, j0 + j, n * nch + q, s);
              for (int k = 0; k < jb->nsums; k++) acc[k][j] += s[k];
            }
        for (int k = 0; k < jb->nsums; k++)
          for (int64_t j = 0; j < nc; j++) jb->tot[k * c + j0 + j] = acc[k][j];
      }
      jb->finalize(jb, j0, nc);
      if (jb->apply)
        for (int64_t n = 0; n < p->n; n++)
          for (int64_t j = 0; j < nc; j++)
            for (int64_t q = 0; q < nch; q++) apply_cf(jb, j0 + j, n * nch + q);
    }
    store_fence(jb);
    }
  } else {
    const int64_t u = jb->unit, units = (c + u - 1) / u;
#pragma omp parallel num_threads(jb->nt) if (jb->nt > 1)
    {
#pragma omp for schedule(static) nowait
    for (int64_t b = 0; b < units; b++) {
      const int64_t j0 = b * u, nc = c - j0 < u ? c - j0 : u;
      if (jb->nsums) {
        double s[3][MAX_UNIT];
        for (int k = 0; k < jb->nsums; k++)
          for (int64_t j = 0; j < nc; j++) jb->tot[k * c + j0 + j] = 0.0;
        for (int64_t seg = 0; seg < nseg; seg++) {
          seg_sums_rows(jb, seg, j0, nc, &s[0][0], MAX_UNIT);
          for (int k = 0; k < jb->nsums; k++)
            for (int64_t j = 0; j < nc; j++) jb->tot[k * c + j0 + j] += s[k][j];
        }
      }
      jb->finalize(jb, j0, nc);
      if (jb->apply)
        for (int64_t r = 0; r < jb->rows; r += CL_SEG_ROWS)
          apply_rows(jb, r, r + CL_SEG_ROWS < jb->rows ? r + CL_SEG_ROWS : jb->rows, j0, nc);
    }
    store_fence(jb);
    }
  }
}

/* Split schedule: segments in parallel into scratch, ordered sums, then a parallel apply. */
static void run_split(job *jb, double *part) {
  const bn_problem *p = jb->p;
  const int64_t c = p->c, nseg = nsegments(jb), ns = jb->nsums;
  if (ns) {
    if (!jb->rows_form) {
      /* part[(ch * nseg + seg) * ns + k] */
#pragma omp parallel for num_threads(jb->nt) schedule(static) if (jb->nt > 1)
      for (int64_t it = 0; it < c * nseg; it++)
        seg_sums_cf(jb, it / nseg, it % nseg, &part[it * ns]);
      for (int64_t ch = 0; ch < c; ch++)
        for (int k = 0; k < ns; k++) {
          double acc = 0.0;
          for (int64_t seg = 0; seg < nseg; seg++) acc += part[(ch * nseg + seg) * ns + k];
          jb->tot[k * c + ch] = acc;
        }
    } else {
      /* part[seg * ns * c + k * c + j] */
#pragma omp parallel for num_threads(jb->nt) schedule(static) if (jb->nt > 1)
      for (int64_t seg = 0; seg < nseg; seg++) seg_sums_rows(jb, seg, 0, c, &part[seg * ns * c], c);
      for (int k = 0; k < ns; k++)
        for (int64_t j = 0; j < c; j++) {
          double acc = 0.0;
          for (int64_t seg = 0; seg < nseg; seg++) acc += part[seg * ns * c + k * c + j];
          jb->tot[k * c + j] = acc;
        }
    }
  }
  jb->finalize(jb, 0, c);
  if (!jb->apply) return;
  if (!jb->rows_form) {
#pragma omp parallel num_threads(jb->nt) if (jb->nt > 1)
    {
#pragma omp for schedule(static) nowait
      for (int64_t it = 0; it < c * nseg; it++) { /* in memory order: image, channel, chunk */
        const int64_t nch = cf_chunks(jb), q = it % nch, ch = (it / nch) % c, n = it / nch / c;
        apply_cf(jb, ch, n * nch + q);
      }
      store_fence(jb);
    }
  } else {
    const int64_t per = ((jb->rows + jb->nt - 1) / jb->nt + 7) / 8 * 8;
#pragma omp parallel num_threads(jb->nt) if (jb->nt > 1)
    {
#pragma omp for schedule(static) nowait
      for (int64_t r = 0; r < jb->rows; r += per)
        apply_rows(jb, r, r + per < jb->rows ? r + per : jb->rows, 0, c);
      store_fence(jb);
    }
  }
}

/* Chooses the schedule.  The fused one reads the tensor once from memory when a unit (a
   channel's slab, or a block of channels over all rows) stays in the L2 share of its thread
   between the reduction and the apply.  Channels-first has no smaller unit than a channel, so
   it stays fused (the apply then reads again from memory); channels-last with too many rows
   for even one cache line of channels takes the split schedule, whose two passes stream
   whole rows. */
static int plan_fused(job *jb) {
  const bn_problem *p = jb->p;
  if (!jb->rows_form) {
    /* channels per unit: enough for 8 KiB contiguous per image, within the L2 share */
    const int64_t budget = norma__l2_bytes() / 2;
    const int64_t tensors = jb->nsums == SUMS_BWD ? (p->act != BN_ACT_NONE ? 3 : 2) : 1;
    const int64_t run = p->s * (int64_t)p->esize, slab = p->n * run * tensors;
    int64_t w = (8192 + run - 1) / run;
    if (w * slab > budget) w = budget / slab;
    if (w < 1) w = 1;
    if (w > MAX_UNIT) w = MAX_UNIT;
    if (w > p->c) w = p->c;
    while (w > 1 && (p->c + w - 1) / w < 4 * (int64_t)jb->nt) w--; /* balance the threads */
    jb->unit = w;
    return use_fused(jb, (p->c + w - 1) / w);
  }
  const int64_t budget = norma__l2_bytes() / 2;
  const int64_t tensors = jb->nsums == SUMS_BWD ? (p->act != BN_ACT_NONE ? 3 : 2) : 1;
  const int64_t line = rows_line(jb), per_channel = jb->rows * (int64_t)p->esize * tensors;
  int64_t w;
  if (p->c <= line) {
    w = p->c;
  } else {
    w = budget / (per_channel > 0 ? per_channel : 1) / line * line;
    if (w < line) w = line;
    if (w > MAX_UNIT) w = MAX_UNIT;
    if (w >= p->c) w = p->c;
    while (w > line && (p->c + w - 1) / w < jb->nt) w -= line; /* a unit for every thread */
  }
  jb->unit = w;
  /* a unit narrower than the row reads each row in a piece, far from the last: memory serves
     short pieces poorly (measured: 64-byte pieces are slower than two streaming passes), so
     whole rows or pieces of at least 2 KiB */
  if ((w < p->c && w * (int64_t)p->esize < 2048) || w * per_channel > budget) return 0;
  return use_fused(jb, (p->c + w - 1) / w);
}

/* NORMA_SCHEDULE=fused|split forces a schedule (a debugging and testing knob: both give
   bitwise identical results).  -1: chosen per problem. */
static int forced_schedule(void) {
  static int v = -2;
  if (v == -2) {
    const char *e = getenv("NORMA_SCHEDULE");
    v = (e && strcmp(e, "fused") == 0) ? 1 : (e && strcmp(e, "split") == 0) ? 0 : -1;
  }
  return v;
}

/* Sets up the job's geometry, allocates scratch, runs.  Called by every operation. */
static norma_status run(job *jb, void (*prepare)(job *)) {
  const bn_problem *p = jb->p;
  jb->rows_form = p->layout == NORMA_CHANNELS_LAST || p->s == 1;
  jb->rows = p->m;
  jb->cbytes = p->dt == NORMA_F64 ? 8 : 4;
  jb->uk = NULL;
  if (norma__isa() == NORMA_ISA_AVX2) jb->uk = bn_ukernels_avx2(p->dt);
  if (!jb->uk) jb->uk = bn_ukernels_scalar(p->dt);
  jb->nt = p->total < SERIAL_BELOW ? 1 : norma__threads();

  int fused = jb->nsums && plan_fused(jb);
  if (jb->nsums && forced_schedule() >= 0) fused = forced_schedule();
  /* Streaming stores pay off for outputs that leave the cache anyway, and only when they fill
     whole lines: long channels-first runs, or whole rows in channels-last */
  const int whole_lines = jb->rows_form ? (!fused || jb->unit == p->c)
                                        : p->s * (int64_t)p->esize >= 2048;
  jb->store = whole_lines && p->total * (int64_t)p->esize >= NT_MIN_BYTES ? BN_STORE_NT : 0;
  size_t part_bytes = 0;
  if (!fused) {
    int64_t nseg = nsegments(jb);
    part_bytes = (size_t)nseg * (size_t)p->c * (size_t)jb->nsums * sizeof(double);
  }
  void *part = NULL;
  void *mem = scratch_alloc(jb, part_bytes, &part);
  if (!mem)
    return norma__fail(NORMA_ERR_OUT_OF_MEMORY, "norma: out of memory allocating %zu bytes of "
                       "scratch", part_bytes + (size_t)p->c * 80);
  if (prepare) prepare(jb);
  if (fused) run_fused(jb);
  else run_split(jb, part);
  free(mem);
  return NORMA_OK;
}

/* ---- forward ---------------------------------------------------------------------------- */

typedef struct fwd_ctx {
  const void *gamma, *beta;
  const void *mean_in, *var_in;              /* inference */
  const double *mean_d, *invstd_d;           /* split apply */
  void *save_mean, *save_invstd, *rmean, *rvar; /* training outputs */
  double momentum;
  double *mean_out, *m2_out;                 /* moments */
} fwd_ctx;

/* stats shift: the channel's first value */
static void prepare_shift(job *jb) {
  const bn_problem *p = jb->p;
  if (jb->rows_form && p->dt == NORMA_F32) { /* the first row, as it is */
    memcpy(jb->k, jb->x, (size_t)p->c * sizeof(float));
    return;
  }
  for (int64_t ch = 0; ch < p->c; ch++) {
    double k = norma__load(p->dt, jb->x, bn_index(p, 0, ch, 0));
    if (jb->cbytes == 8) ((double *)jb->k)[ch] = k;
    else ((float *)jb->k)[ch] = (float)k;
  }
}

static double shift_of(const job *jb, int64_t ch) {
  return jb->cbytes == 8 ? ((const double *)jb->k)[ch] : (double)((const float *)jb->k)[ch];
}

/* mean and m2 of channel ch from the shifted sums (the same arithmetic as finalize_training) */
static void moments_of(const job *jb, int64_t ch, double *mean, double *m2) {
  const int64_t c = jb->p->c;
  const double m = (double)jb->p->m, im = 1.0 / m, s1 = jb->tot[ch], s2 = jb->tot[c + ch];
  const double v = (s2 - s1 * (s1 * im)) * im;
  *mean = shift_of(jb, ch) + s1 * im;
  *m2 = (v < 0.0 ? 0.0 : v) * m;
}

/* forward constants from a mean (double) and invstd: y = (x - mhi) * scale + shift, where
   mhi is the mean rounded to the compute type (x - mhi is exact on large-mean data) and the
   rounding mean - mhi moves into the shift. */
static void set_fwd_consts(job *jb, int64_t ch, double mean, double invstd, double g, double b) {
  cst_set(jb, C_MHI, ch, mean);
  const double mlo = mean - cst_get(jb, C_MHI, ch);
  const double scale = g * invstd;
  cst_set(jb, C_SCALE, ch, scale);
  cst_set(jb, C_SHIFT, ch, b - mlo * scale);
}

static void finalize_training(job *jb, int64_t j0, int64_t nc) {
  const fwd_ctx *cx = jb->ctx;
  const bn_problem *p = jb->p;
  const int64_t c = p->c;
  const int biased = (p->flags & NORMA_BN_BIASED_RUNNING_VAR) != 0;
  const double m = (double)p->m, im = 1.0 / m, mom = cx->momentum, eps = p->eps;
  const double unbias = biased ? 1.0 : m / (m - 1.0);
  enum { CH = 64 };
  double mean[CH], var[CH], is[CH];
  for (int64_t a = j0; a < j0 + nc; a += CH) {
    const int64_t b = a + CH < j0 + nc ? a + CH : j0 + nc;
    /* moments and 1/sqrt for a chunk of channels: a branch-free loop the compiler vectorizes */
    for (int64_t ch = a; ch < b; ch++) {
      const double s1 = jb->tot[ch], s2 = jb->tot[c + ch], k = shift_of(jb, ch);
      const double v = (s2 - s1 * (s1 * im)) * im;
      mean[ch - a] = k + s1 * im;
      var[ch - a] = v < 0.0 ? 0.0 : v; /* rounding can go below 0; NaN passes */
      is[ch - a] = 1.0 / sqrt(var[ch - a] + eps);
    }
    for (int64_t ch = a; ch < b; ch++) {
      const double mu = mean[ch - a], iv = is[ch - a];
      set_fwd_consts(jb, ch, mu, iv, norma__param(p->dt, cx->gamma, ch, 1.0),
                     norma__param(p->dt, cx->beta, ch, 0.0));
      if (cx->save_mean) norma__param_store(p->dt, cx->save_mean, ch, mu);
      if (cx->save_invstd) norma__param_store(p->dt, cx->save_invstd, ch, iv);
      if (cx->rmean)
        norma__param_store(p->dt, cx->rmean, ch,
                           (1.0 - mom) * norma__param(p->dt, cx->rmean, ch, 0) + mom * mu);
      if (cx->rvar)
        norma__param_store(p->dt, cx->rvar, ch,
                           (1.0 - mom) * norma__param(p->dt, cx->rvar, ch, 0) +
                               mom * (var[ch - a] * unbias));
    }
  }
}

static norma_status cpu_fwd_training(const bn_problem *p, const void *x, const void *res,
                                     const void *gamma, const void *beta, void *y,
                                     void *save_mean, void *save_invstd, void *running_mean,
                                     void *running_var, double momentum) {
  fwd_ctx cx = {.gamma = gamma, .beta = beta, .save_mean = save_mean, .save_invstd = save_invstd,
                .rmean = running_mean, .rvar = running_var, .momentum = momentum};
  job jb = {.p = p, .nsums = SUMS_STATS, .apply = 1, .x = x, .res = res, .out = y,
            .finalize = finalize_training, .ctx = &cx};
  return run(&jb, prepare_shift);
}

static void finalize_inference(job *jb, int64_t j0, int64_t nc) {
  const fwd_ctx *cx = jb->ctx;
  const bn_problem *p = jb->p;
  for (int64_t ch = j0; ch < j0 + nc; ch++)
    set_fwd_consts(jb, ch, norma__param(p->dt, cx->mean_in, ch, 0),
                   1.0 / sqrt(norma__param(p->dt, cx->var_in, ch, 0) + p->eps),
                   norma__param(p->dt, cx->gamma, ch, 1.0), norma__param(p->dt, cx->beta, ch, 0.0));
}

static norma_status cpu_fwd_inference(const bn_problem *p, const void *x, const void *res,
                                      const void *gamma, const void *beta, const void *mean,
                                      const void *var, void *y) {
  fwd_ctx cx = {.gamma = gamma, .beta = beta, .mean_in = mean, .var_in = var};
  job jb = {.p = p, .nsums = SUMS_NONE, .apply = 1, .x = x, .res = res, .out = y,
            .finalize = finalize_inference, .ctx = &cx};
  return run(&jb, NULL);
}

static void finalize_apply(job *jb, int64_t j0, int64_t nc) {
  const fwd_ctx *cx = jb->ctx;
  const bn_problem *p = jb->p;
  for (int64_t ch = j0; ch < j0 + nc; ch++)
    set_fwd_consts(jb, ch, cx->mean_d[ch], cx->invstd_d[ch], norma__param(p->dt, cx->gamma, ch, 1.0),
                   norma__param(p->dt, cx->beta, ch, 0.0));
}

static norma_status cpu_fwd_apply(const bn_problem *p, const void *x, const void *res,
                                  const void *gamma, const void *beta, const double *mean,
                                  const double *invstd, void *y) {
  fwd_ctx cx = {.gamma = gamma, .beta = beta, .mean_d = mean, .invstd_d = invstd};
  job jb = {.p = p, .nsums = SUMS_NONE, .apply = 1, .x = x, .res = res, .out = y,
            .finalize = finalize_apply, .ctx = &cx};
  return run(&jb, NULL);
}

static void finalize_moments(job *jb, int64_t j0, int64_t nc) {
  const fwd_ctx *cx = jb->ctx;
  for (int64_t ch = j0; ch < j0 + nc; ch++) moments_of(jb, ch, &cx->mean_out[ch], &cx->m2_out[ch]);
}

static norma_status cpu_moments(const bn_problem *p, const void *x, double *mean, double *m2) {
  fwd_ctx cx = {.mean_out = mean, .m2_out = m2};
  job jb = {.p = p, .nsums = SUMS_STATS, .apply = 0, .x = x, .finalize = finalize_moments,
            .ctx = &cx};
  return run(&jb, prepare_shift);
}

/* ---- backward --------------------------------------------------------------------------- */

typedef struct bwd_ctx {
  const void *gamma, *beta;
  const void *smean, *sinvstd;               /* contract backward: parameter type */
  const double *mean_d, *invstd_d;           /* split API: double */
  const double *sum_dy, *sum_dy_xhat, *sum_xhat; /* split apply: given sums */
  int64_t count;
  int from_y;                                /* x == NULL: x_hat from y */
  void *dgamma, *dbeta;                      /* contract backward */
  double *o_dy, *o_dy_xhat, *o_xhat;         /* split reduce outputs */
} bwd_ctx;

static double ctx_mean(const bwd_ctx *cx, const bn_problem *p, int64_t ch) {
  return cx->mean_d ? cx->mean_d[ch] : norma__param(p->dt, cx->smean, ch, 0);
}
static double ctx_invstd(const bwd_ctx *cx, const bn_problem *p, int64_t ch) {
  return cx->invstd_d ? cx->invstd_d[ch] : norma__param(p->dt, cx->sinvstd, ch, 0);
}

/* x_hat = (v - a) * b + c: from x with the mean split into its rounded value a and the rest;
   or from y as (y - beta) / gamma. */
static void prepare_xhat(job *jb) {
  const bwd_ctx *cx = jb->ctx;
  const bn_problem *p = jb->p;
  for (int64_t ch = 0; ch < p->c; ch++) {
    if (cx->from_y) {
      cst_set(jb, C_A, ch, norma__param(p->dt, cx->beta, ch, 0.0));
      cst_set(jb, C_B, ch, 1.0 / norma__param(p->dt, cx->gamma, ch, 1.0));
      cst_set(jb, C_C, ch, 0.0);
    } else {
      const double mean = ctx_mean(cx, p, ch), is = ctx_invstd(cx, p, ch);
      cst_set(jb, C_A, ch, mean);
      cst_set(jb, C_B, ch, is);
      const double lo = mean - cst_get(jb, C_A, ch);
      cst_set(jb, C_C, ch, lo == 0.0 ? 0.0 : -lo * is);
    }
  }
}

/* dx constants of channel ch from its sums (sg, sgx) and the x_hat offset s. */
static void set_bwd_consts(job *jb, int64_t ch, double g, double invstd, double sg, double sgx,
                           double s, double count) {
  const double k = g * invstd;
  if (jb->p->flags & NORMA_BN_GLOBAL_STATS) {
    cst_set(jb, C_GM, ch, 0.0);
    cst_set(jb, C_DA, ch, k);
    cst_set(jb, C_DB, ch, 0.0);
    cst_set(jb, C_DD, ch, 0.0);
    return;
  }
  /* dx = k * (g - sg/count - (xh - s) * S/count), S = sgx - s*sg, written as
     da * (g - gm) + db * xh + dd with gm the mean of g rounded to the compute type, so that
     g - gm stays exact when dy has a large mean */
  const double S = sgx - s * sg, mg = sg / count;
  cst_set(jb, C_GM, ch, mg);
  const double gm = cst_get(jb, C_GM, ch);
  cst_set(jb, C_DA, ch, k);
  cst_set(jb, C_DB, ch, -k * S / count);
  cst_set(jb, C_DD, ch, k * (gm - mg) + k * s * S / count);
}

static void finalize_backward(job *jb, int64_t j0, int64_t nc) {
  const bwd_ctx *cx = jb->ctx;
  const bn_problem *p = jb->p;
  const int64_t c = p->c;
  const int global = (p->flags & NORMA_BN_GLOBAL_STATS) != 0;
  for (int64_t ch = j0; ch < j0 + nc; ch++) {
    const double sg = jb->tot[ch], sgx = jb->tot[c + ch], sx = jb->tot[2 * c + ch];
    const double s = (!cx->from_y && !global) ? bn_xhat_offset(sx, (double)p->m) : 0.0;
    set_bwd_consts(jb, ch, norma__param(p->dt, cx->gamma, ch, 1.0), ctx_invstd(cx, p, ch), sg,
                   sgx, s, (double)p->m);
    if (cx->dgamma) norma__param_store(p->dt, cx->dgamma, ch, sgx - s * sg);
    if (cx->dbeta) norma__param_store(p->dt, cx->dbeta, ch, sg);
  }
}

static norma_status cpu_backward(const bn_problem *p, const void *x, const void *y,
                                 const void *dy, const void *gamma, const void *beta,
                                 const void *save_mean, const void *save_invstd, void *dx,
                                 void *dres, void *dgamma, void *dbeta) {
  bwd_ctx cx = {.gamma = gamma, .beta = beta, .smean = save_mean, .sinvstd = save_invstd,
                .from_y = x == NULL, .dgamma = dgamma, .dbeta = dbeta};
  job jb = {.p = p, .nsums = SUMS_BWD, .apply = 1, .x = x ? x : y, .y = y, .dy = dy, .out = dx,
            .dres = dres, .finalize = finalize_backward, .ctx = &cx};
  return run(&jb, prepare_xhat);
}

static void finalize_reduce(job *jb, int64_t j0, int64_t nc) {
  const bwd_ctx *cx = jb->ctx;
  const int64_t c = jb->p->c;
  for (int64_t ch = j0; ch < j0 + nc; ch++) {
    cx->o_dy[ch] = jb->tot[ch];
    cx->o_dy_xhat[ch] = jb->tot[c + ch];
    if (cx->o_xhat) cx->o_xhat[ch] = jb->tot[2 * c + ch];
  }
}

static norma_status cpu_bwd_reduce(const bn_problem *p, const void *x, const void *y,
                                   const void *dy, const void *gamma, const void *beta,
                                   const double *mean, const double *invstd, double *sum_dy,
                                   double *sum_dy_xhat, double *sum_xhat) {
  bwd_ctx cx = {.gamma = gamma, .beta = beta, .mean_d = mean, .invstd_d = invstd,
                .from_y = x == NULL, .o_dy = sum_dy, .o_dy_xhat = sum_dy_xhat, .o_xhat = sum_xhat};
  job jb = {.p = p, .nsums = SUMS_BWD, .apply = 0, .x = x ? x : y, .y = y, .dy = dy,
            .finalize = finalize_reduce, .ctx = &cx};
  return run(&jb, prepare_xhat);
}

static void finalize_bwd_apply(job *jb, int64_t j0, int64_t nc) {
  const bwd_ctx *cx = jb->ctx;
  const bn_problem *p = jb->p;
  const int global = (p->flags & NORMA_BN_GLOBAL_STATS) != 0;
  for (int64_t ch = j0; ch < j0 + nc; ch++) {
    const double sg = global ? 0.0 : cx->sum_dy[ch], sgx = global ? 0.0 : cx->sum_dy_xhat[ch];
    const double s = (!global && cx->sum_xhat) ? bn_xhat_offset(cx->sum_xhat[ch], (double)cx->count) : 0.0;
    set_bwd_consts(jb, ch, norma__param(p->dt, cx->gamma, ch, 1.0), cx->invstd_d[ch], sg, sgx, s,
                   global ? 1.0 : (double)cx->count);
  }
}

static norma_status cpu_bwd_apply(const bn_problem *p, const void *x, const void *y,
                                  const void *dy, const void *gamma, const void *beta,
                                  const double *mean, const double *invstd, const double *sum_dy,
                                  const double *sum_dy_xhat, const double *sum_xhat,
                                  int64_t count, void *dx, void *dres) {
  bwd_ctx cx = {.gamma = gamma, .beta = beta, .mean_d = mean, .invstd_d = invstd,
                .sum_dy = sum_dy, .sum_dy_xhat = sum_dy_xhat, .sum_xhat = sum_xhat,
                .count = count, .from_y = x == NULL};
  job jb = {.p = p, .nsums = SUMS_NONE, .apply = 1, .x = x ? x : y, .y = y, .dy = dy, .out = dx,
            .dres = dres, .finalize = finalize_bwd_apply, .ctx = &cx};
  return run(&jb, prepare_xhat);
}

/* ---- moments of a producer's tile (single-threaded: the producer owns the threads) ------ */

static norma_status cpu_moments_tile(norma_dtype dt, int64_t rows, int64_t channels,
                                     const void *x, int64_t row_stride, int64_t channel_stride,
                                     double *mean, double *m2) {
  const bn_ukernels *uk = NULL;
  if (norma__isa() == NORMA_ISA_AVX2) uk = bn_ukernels_avx2(dt);
  if (!uk) uk = bn_ukernels_scalar(dt);
  const size_t es = norma__dtype_size(dt);
  const double r = (double)rows;
  if (channel_stride == 1 && row_stride >= channels) {
    /* rows of adjacent channels: shift by the first row, sums by blocks of rows */
    static _Thread_local double b1[ROWS_CHUNK], b2[ROWS_CHUNK];
    static _Thread_local union { float f[ROWS_CHUNK]; double d[ROWS_CHUNK]; } k;
    for (int64_t j0 = 0; j0 < channels; j0 += ROWS_CHUNK) {
      const int64_t nc = channels - j0 < ROWS_CHUNK ? channels - j0 : ROWS_CHUNK;
      for (int64_t j = 0; j < nc; j++) {
        double v = norma__load(dt, x, j0 + j);
        if (dt == NORMA_F64) k.d[j] = v;
        else k.f[j] = (float)v;
        mean[j0 + j] = 0.0, m2[j0 + j] = 0.0; /* s1, s2 until the end */
      }
      for (int64_t r0 = 0; r0 < rows; r0 += CL_BLOCK_ROWS) {
        const int64_t n = rows - r0 < CL_BLOCK_ROWS ? rows - r0 : CL_BLOCK_ROWS;
        uk->stats_rows((const char *)x + (size_t)(r0 * row_stride + j0) * es, n, row_stride, nc,
                       &k, b1, b2);
        for (int64_t j = 0; j < nc; j++) mean[j0 + j] += b1[j], m2[j0 + j] += b2[j];
      }
      for (int64_t j = 0; j < nc; j++) {
        const double s1 = mean[j0 + j], s2 = m2[j0 + j];
        const double kk = dt == NORMA_F64 ? k.d[j] : (double)k.f[j];
        double v = s2 - s1 * (s1 / r);
        mean[j0 + j] = kk + s1 / r;
        m2[j0 + j] = v > 0.0 ? v : (v != v ? v : 0.0);
      }
    }
    return NORMA_OK;
  }
  if (row_stride == 1) {
    /* each channel a contiguous run */
    for (int64_t j = 0; j < channels; j++) {
      const char *base = (const char *)x + (size_t)(j * channel_stride) * es;
      union { float f; double d; } k;
      double v0 = norma__load(dt, base, 0), s1 = 0.0, s2 = 0.0, o[2];
      if (dt == NORMA_F64) k.d = v0;
      else k.f = (float)v0;
      for (int64_t r0 = 0; r0 < rows; r0 += CF_CHUNK) {
        uk->stats_run(base + (size_t)r0 * es, rows - r0 < CF_CHUNK ? rows - r0 : CF_CHUNK, &k, o);
        s1 += o[0], s2 += o[1];
      }
      const double kk = dt == NORMA_F64 ? k.d : (double)k.f;
      double v = s2 - s1 * (s1 / r);
      mean[j] = kk + s1 / r;
      m2[j] = v > 0.0 ? v : (v != v ? v : 0.0);
    }
    return NORMA_OK;
  }
  return bn_impl_ref.moments_tile(dt, rows, channels, x, row_stride, channel_stride, mean, m2);
}

const bn_impl bn_impl_cpu = {
    cpu_fwd_training, cpu_fwd_inference, cpu_backward,     cpu_moments,
    cpu_fwd_apply,    cpu_bwd_reduce,    cpu_bwd_apply,    cpu_moments_tile,
};
