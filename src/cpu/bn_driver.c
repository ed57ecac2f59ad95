/* bn_driver.c - the production BatchNorm: thread split, blocking, per-channel constants, and
 * dispatch to the micro-kernels of the best ISA (ukernels.h).
 *
 * Every operation is "reduce, then apply" per channel:
 *   forward training: the anchored sums of each block (ukernels.h: a block is read twice in
 *                     cache, so nothing cancels), then y = (x - mean) * scale + shift;
 *   backward:         sums of g, g * x_hat, x_hat, then dx = a * (g - gm) + b * x_hat + c;
 *   inference and the split API's apply steps: apply only; moments / backward_reduce: reduce only.
 *
 * Determinism: the reduction of a channel is cut into segments fixed by the shape alone
 * (channels-first: runs of up to CF_CHUNK values of one image; channels-last: CL_SEG_ROWS rows,
 * themselves made of blocks of block_rows() rows).  A segment's result is computed by a fixed
 * sequence of micro-kernel calls and combined with the others in index order.  Which thread
 * computes a segment never changes what is computed, so results are bitwise identical for any
 * thread count, and between the two schedules.
 *
 * Two schedules, same arithmetic:
 *   fused:  threads take units of adjacent channels; each reduces its unit, finalizes it and
 *           applies it while the data is still in cache: one DRAM read when the unit fits.
 *   split:  threads take segments; partial results go to scratch, are combined in order, then
 *           every thread applies a contiguous share of the tensor.  For few channels, and for
 *           channels-last tensors whose units would not fit.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "impl.h"
#include "ukernels.h"

#ifdef _OPENMP
#include <omp.h>
#else
static inline int omp_get_thread_num(void) { return 0; }
static inline int omp_get_num_threads(void) { return 1; }
#endif

#define CF_CHUNK 4096       /* values per channels-first segment */
/* rows per micro-kernel call in channels-last reductions.  The statistics take blocks of about
   128 KiB (read twice while in L2; a larger block spreads the per-channel work of a call over
   more values), a power of two in [64, 256]: each channel adds its rows in one f32 lane, so
   more rows would cost accuracy.  The backward's sums, which have no per-block work, take 64.
   Shape alone decides it. */
static inline int64_t block_rows(int stats, int64_t c, size_t esize) {
  if (!stats) return 64;
  const int64_t target = (int64_t)(128 * 1024) / (c * (int64_t)esize);
  int64_t b = 64;
  while (b < 256 && 2 * b <= target) b *= 2;
  return b;
}
#define CL_SEG_ROWS 4096    /* rows per channels-last segment */
#define ROWS_CHUNK 1024     /* channels per rows-kernel call */
#define SERIAL_BELOW 32768  /* tensors with fewer values run without a parallel region */
#define NT_MIN_BYTES (8 << 20) /* outputs this large are written around the cache */

/* what a job reduces: nothing (apply only), the statistics, or the backward's sums; either
   reduction leaves SEG_VALUES doubles per channel and segment */
enum { SUMS_NONE = 0, SUMS_STATS = 1, SUMS_BWD = 2 };
#define SEG_VALUES 3

typedef struct job job;
typedef void (*finalize_fn)(job *jb, int64_t j0, int64_t nc);

struct job {
  const bn_problem *p;
  const bn_ukernels *uk;
  int rows_form;       /* 1: rows x channels (channels-last, or channels-first with spatial 1) */
  int64_t rows;        /* rows_form: number of rows (n * spatial) */
  size_t cbytes;       /* bytes of the compute type */
  int nt;              /* threads */
  int64_t unit;        /* fused schedule: channels per unit */
  int fused;           /* the fused schedule (else split) */
  int store;           /* BN_STORE_NT when outputs bypass the cache */
  int nsums;           /* SUMS_*: the kind of reduction */
  int apply;           /* run the apply kernels after finalize */
  /* tensors */
  const void *x, *res, *y, *dy;
  void *out, *dres;
  /* per channel: constants [C_COUNT][c] (compute type); totals (double) [3][c]: the moments
     (mean, m2, count) of the statistics, or the backward's sums */
  void *cst;
  double *tot;
  finalize_fn finalize;
  const void *ctx;
};

/* ---- scratch ---------------------------------------------------------------------------- */

/* Each calling thread keeps its scratch between calls (grown, never shrunk; freed when the
   thread exits): per-call allocation cost more than a small BatchNorm itself (measured: a
   64-value inference went from 1.0 us to 0.35 us per call). */
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
typedef struct scratch { size_t size; void *mem; } scratch;
static void scratch_free(void *s) {
  if (s) free(((scratch *)s)->mem);
  free(s);
}
static void scratch_init(void) { (void)pthread_key_create(&scratch_key, scratch_free); }

static void *scratch_get(size_t bytes) {
  (void)pthread_once(&scratch_once, scratch_init);
  scratch *s = pthread_getspecific(scratch_key);
  if (!s) {
    s = calloc(1, sizeof *s);
    if (!s || pthread_setspecific(scratch_key, s) != 0) {
      free(s);
      return NULL;
    }
  }
  if (s->size < bytes) {
    void *m = aligned_alloc(64, (bytes + 4095) & ~(size_t)4095);
    if (!m) return NULL;
    free(s->mem);
    s->mem = m;
    s->size = (bytes + 4095) & ~(size_t)4095;
  }
  return s->mem;
}

static int scratch_alloc(job *jb, size_t extra, void **extra_ptr) {
  const int64_t c = jb->p->c;
  size_t kb = 0, cb = (size_t)c * C_COUNT * jb->cbytes;
  size_t tb = (size_t)c * 3 * sizeof(double);
  kb = (kb + 63) & ~(size_t)63, cb = (cb + 63) & ~(size_t)63, tb = (tb + 63) & ~(size_t)63;
  char *mem = scratch_get(kb + cb + tb + ((extra + 63) & ~(size_t)63) + 64);
  if (!mem) return 0;
  jb->cst = mem + kb;
  jb->tot = (double *)(mem + kb + cb);
  if (extra_ptr) *extra_ptr = mem + kb + cb + tb;
  return 1;
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

/* channels-first: segment seg = (image, chunk) of channel ch -> out[SEG_VALUES] */
static void seg_sums_cf(const job *jb, int64_t ch, int64_t seg, double *out) {
  const bn_problem *p = jb->p;
  const int64_t nch = cf_chunks(jb), n = seg / nch, s0 = (seg % nch) * CF_CHUNK;
  const int64_t len = p->s - s0 < CF_CHUNK ? p->s - s0 : CF_CHUNK;
  const int64_t e = (n * p->c + ch) * p->s + s0;
  if (jb->nsums == SUMS_STATS)
    jb->uk->stats_run(tptr(jb, jb->x, e), len, NULL, out); /* t1, t2, anchor */
  else
    jb->uk->bwd_sums_run(tptr(jb, jb->x, e), tptr(jb, jb->y, e), tptr(jb, jb->dy, e), len,
                         cst_at(jb, ch), p->c, p->act, out);
}

/* values in segment seg of a channel */
static int64_t seg_count(const job *jb, int64_t seg) {
  if (jb->rows_form) {
    const int64_t r0 = seg * CL_SEG_ROWS;
    return jb->rows - r0 < CL_SEG_ROWS ? jb->rows - r0 : CL_SEG_ROWS;
  }
  const int64_t s0 = (seg % cf_chunks(jb)) * CF_CHUNK;
  return jb->p->s - s0 < CF_CHUNK ? jb->p->s - s0 : CF_CHUNK;
}

/* rows form: segment seg, channels [j0, j0 + nc) -> out[k * ostride + j]: the statistics
   (t1, t2 relative to the segment's anchor, the anchor), or the backward's three sums */
static void seg_sums_rows(const job *jb, int64_t seg, int64_t j0, int64_t nc, double *out,
                          int64_t ostride) {
  const bn_problem *p = jb->p;
  const int64_t r0 = seg * CL_SEG_ROWS;
  const int64_t r1 = r0 + CL_SEG_ROWS < jb->rows ? r0 + CL_SEG_ROWS : jb->rows;
  static _Thread_local double blk[3][ROWS_CHUNK];
  static _Thread_local union { float f[ROWS_CHUNK]; double d[ROWS_CHUNK]; } anchor;
  for (int k = 0; k < 3; k++)
    for (int64_t j = 0; j < nc; j++) out[k * ostride + j] = 0.0;
  /* row blocks outer, whole rows (up to ROWS_CHUNK channels) inner: memory is read in order;
     a channel still sees its blocks in order, whatever the loop nest */
  const int64_t br = block_rows(jb->nsums == SUMS_STATS, p->c, p->esize);
  for (int64_t r = r0; r < r1; r += br) {
    const int64_t rows = r1 - r < br ? r1 - r : br;
    for (int64_t jc = 0; jc < nc; jc += ROWS_CHUNK) {
      const int64_t ncc = nc - jc < ROWS_CHUNK ? nc - jc : ROWS_CHUNK, ja = j0 + jc;
      const int64_t e = r * p->c + ja;
      if (jb->nsums == SUMS_STATS) {
        const int first = r == r0;
        if (!first) /* the segment's anchors, in the compute type (exact: they came from it) */
          for (int64_t j = 0; j < ncc; j++) {
            if (jb->cbytes == 8) anchor.d[j] = out[2 * ostride + jc + j];
            else anchor.f[j] = (float)out[2 * ostride + jc + j];
          }
        jb->uk->stats_rows(tptr(jb, jb->x, e), rows, p->c, ncc, first ? NULL : (const void *)&anchor,
                           blk[0], blk[1], first ? &out[2 * ostride + jc] : NULL);
        for (int k = 0; k < 2; k++)
          for (int64_t j = 0; j < ncc; j++) out[k * ostride + jc + j] += blk[k][j];
      } else {
        jb->uk->bwd_sums_rows(tptr(jb, jb->x, e), tptr(jb, jb->y, e), tptr(jb, jb->dy, e), rows,
                              p->c, ncc, cst_at(jb, ja), p->c, p->act, blk[0], blk[1], blk[2]);
        for (int k = 0; k < 3; k++)
          for (int64_t j = 0; j < ncc; j++) out[k * ostride + jc + j] += blk[k][j];
      }
    }
  }
}

/* tot of channel ch absorbs segment seg's result s[k * stride] of cnt values.  Statistics:
   (t1, t2, anchor) re-anchored to the channel's anchor (its first segment's) and added;
   the backward's sums: added. */
static inline void absorb(job *jb, int64_t ch, int first, const double *s, int64_t stride,
                          double cnt) {
  const int64_t c = jb->p->c;
  if (jb->nsums == SUMS_STATS) {
    if (first) {
      jb->tot[ch] = s[0], jb->tot[c + ch] = s[stride], jb->tot[2 * c + ch] = s[2 * stride];
      return;
    }
    double t1, t2;
    bn_stats_shift(s[2 * stride], jb->tot[2 * c + ch], s[0], s[stride], cnt, &t1, &t2);
    jb->tot[ch] += t1;
    jb->tot[c + ch] += t2;
  } else {
    for (int k = 0; k < 3; k++) jb->tot[k * c + ch] += s[k * stride];
  }
}

/* ---- apply ------------------------------------------------------------------------------ */

static void apply_cf(const job *jb, int64_t ch, int64_t seg) {
  const bn_problem *p = jb->p;
  const int64_t nch = cf_chunks(jb), n = seg / nch, s0 = (seg % nch) * CF_CHUNK;
  const int64_t len = p->s - s0 < CF_CHUNK ? p->s - s0 : CF_CHUNK;
  const int64_t e = (n * p->c + ch) * p->s + s0;
  if (jb->dy)
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

/* Runs fn over [0, n) split into one contiguous range per thread (what every schedule needs).
   A single thread calls fn directly: no parallel region, no OpenMP runtime on the path. */
typedef void (*range_fn)(job *jb, int64_t i0, int64_t i1, void *arg);
static void parallel_for(job *jb, int64_t n, range_fn fn, void *arg) {
  if (jb->nt <= 1 || n <= 1) {
    fn(jb, 0, n, arg);
    store_fence(jb);
    return;
  }
#pragma omp parallel num_threads(jb->nt)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    fn(jb, n * t / nt, n * (t + 1) / nt, arg);
    store_fence(jb);
  }
}

/* fused, channels-first: a unit is a block of adjacent channels; within an image their runs
   are contiguous, so the unit streams through memory in long pieces however short a run is */
static void fused_cf(job *jb, int64_t b0, int64_t b1, void *arg) {
  (void)arg;
  const bn_problem *p = jb->p;
  const int64_t c = p->c, nch = cf_chunks(jb);
  for (int64_t b = b0; b < b1; b++) {
    const int64_t j0 = b * jb->unit, nc = c - j0 < jb->unit ? c - j0 : jb->unit;
    if (jb->nsums) {
      double s[3];
      for (int k = 0; k < 3; k++)
        for (int64_t j = 0; j < nc; j++) jb->tot[k * c + j0 + j] = 0.0;
      for (int64_t n = 0; n < p->n; n++)
        for (int64_t j = 0; j < nc; j++)
          for (int64_t q = 0; q < nch; q++) { /* channel j0 + j sees its segments in order */
            seg_sums_cf(jb, j0 + j, n * nch + q, s);
            absorb(jb, j0 + j, n == 0 && q == 0, s, 1, (double)seg_count(jb, q));
          }
    }
    jb->finalize(jb, j0, nc);
    if (jb->apply)
      for (int64_t n = 0; n < p->n; n++)
        for (int64_t j = 0; j < nc; j++)
          for (int64_t q = 0; q < nch; q++) apply_cf(jb, j0 + j, n * nch + q);
  }
}

/* fused, rows form: a unit is a block of adjacent channels over all rows */
static void fused_rows(job *jb, int64_t b0, int64_t b1, void *arg) {
  (void)arg;
  const int64_t c = jb->p->c, u = jb->unit, nseg = nsegments(jb);
  for (int64_t b = b0; b < b1; b++) {
    const int64_t j0 = b * u, nc = c - j0 < u ? c - j0 : u;
    if (jb->nsums) {
      double s[3][MAX_UNIT];
      for (int k = 0; k < 3; k++)
        for (int64_t j = 0; j < nc; j++) jb->tot[k * c + j0 + j] = 0.0;
      for (int64_t seg = 0; seg < nseg; seg++) {
        seg_sums_rows(jb, seg, j0, nc, &s[0][0], MAX_UNIT);
        for (int64_t j = 0; j < nc; j++)
          absorb(jb, j0 + j, seg == 0, &s[0][j], MAX_UNIT, (double)seg_count(jb, seg));
      }
    }
    jb->finalize(jb, j0, nc);
    if (jb->apply)
      for (int64_t r = 0; r < jb->rows; r += CL_SEG_ROWS)
        apply_rows(jb, r, r + CL_SEG_ROWS < jb->rows ? r + CL_SEG_ROWS : jb->rows, j0, nc);
  }
}

/* Fused schedule: each thread reduces, finalizes and applies whole units. */
static void run_fused(job *jb) {
  const int64_t units = (jb->p->c + jb->unit - 1) / jb->unit;
  parallel_for(jb, units, jb->rows_form ? fused_rows : fused_cf, NULL);
}

/* split, reductions: part[(ch * nseg + seg) * ns + k] (channels-first) */
static void split_sums_cf(job *jb, int64_t i0, int64_t i1, void *arg) {
  double *part = arg;
  const int64_t nseg = nsegments(jb);
  for (int64_t it = i0; it < i1; it++) seg_sums_cf(jb, it / nseg, it % nseg, &part[it * SEG_VALUES]);
}
/* split, reductions: part[seg * ns * c + k * c + j] (rows form) */
static void split_sums_rows(job *jb, int64_t i0, int64_t i1, void *arg) {
  double *part = arg;
  const int64_t c = jb->p->c;
  for (int64_t seg = i0; seg < i1; seg++) seg_sums_rows(jb, seg, 0, c, &part[seg * SEG_VALUES * c], c);
}
/* split, apply in memory order: image, channel, chunk */
static void split_apply_cf(job *jb, int64_t i0, int64_t i1, void *arg) {
  (void)arg;
  const int64_t c = jb->p->c, nch = cf_chunks(jb);
  if (i0 >= i1) return;
  int64_t q = i0 % nch, ch = (i0 / nch) % c, n = i0 / nch / c; /* then counted, not divided */
  for (int64_t it = i0; it < i1; it++) {
    apply_cf(jb, ch, n * nch + q);
    if (++q == nch) {
      q = 0;
      if (++ch == c) ch = 0, n++;
    }
  }
}
static void split_apply_rows(job *jb, int64_t r0, int64_t r1, void *arg) {
  (void)arg;
  if (r1 > r0) apply_rows(jb, r0, r1, 0, jb->p->c);
}

/* Split schedule: segments in parallel into scratch, ordered sums, then a parallel apply. */
static void run_split(job *jb, double *part) {
  const int64_t c = jb->p->c, nseg = nsegments(jb), ns = SEG_VALUES;
  if (jb->nsums) {
    for (int64_t j = 0; j < 3 * c; j++) jb->tot[j] = 0.0;
    if (!jb->rows_form) {
      const int64_t nch = cf_chunks(jb);
      parallel_for(jb, c * nseg, split_sums_cf, part);
      for (int64_t ch = 0; ch < c; ch++)
        for (int64_t seg = 0; seg < nseg; seg++)
          absorb(jb, ch, seg == 0, &part[(ch * nseg + seg) * ns], 1, (double)seg_count(jb, seg % nch));
    } else {
      parallel_for(jb, nseg, split_sums_rows, part);
      for (int64_t seg = 0; seg < nseg; seg++)
        for (int64_t j = 0; j < c; j++)
          absorb(jb, j, seg == 0, &part[seg * ns * c + j], c, (double)seg_count(jb, seg));
    }
  }
  jb->finalize(jb, 0, c);
  if (!jb->apply) return;
  if (!jb->rows_form) parallel_for(jb, c * nseg, split_apply_cf, NULL);
  else parallel_for(jb, jb->rows, split_apply_rows, NULL);
}

/* a * b for the planning decisions, saturated at INT64_MAX (sizes are positive): the
   comparisons below stay right for any size the checks let through */
static int64_t mul_sat(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
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
    const int64_t run = mul_sat(p->s, (int64_t)p->esize), slab = mul_sat(mul_sat(p->n, run), tensors);
    int64_t w = (8192 + run - 1) / run;
    if (mul_sat(w, slab) > budget) w = budget / slab;
    if (w < 1) w = 1;
    if (w > MAX_UNIT) w = MAX_UNIT;
    if (w > p->c) w = p->c;
    while (w > 1 && (p->c + w - 1) / w < 4 * (int64_t)jb->nt) w--; /* balance the threads */
    jb->unit = w;
    return use_fused(jb, (p->c + w - 1) / w);
  }
  const int64_t budget = norma__l2_bytes() / 2;
  const int64_t tensors = jb->nsums == SUMS_BWD ? (p->act != BN_ACT_NONE ? 3 : 2) : 1;
  const int64_t line = rows_line(jb),
                per_channel = mul_sat(mul_sat(jb->rows, (int64_t)p->esize), tensors);
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
  if ((w < p->c && w * (int64_t)p->esize < 2048) || mul_sat(w, per_channel) > budget) return 0;
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
/* Sets up the job's geometry and schedule (no data touched). */
static void plan(job *jb) {
  const bn_problem *p = jb->p;
  jb->rows_form = p->layout == NORMA_CHANNELS_LAST || p->s == 1;
  jb->rows = p->m;
  jb->cbytes = p->dt == NORMA_F64 ? 8 : 4;
  jb->uk = NULL;
  if (norma__isa() == NORMA_ISA_AVX2) jb->uk = bn_ukernels_avx2(p->dt);
  if (!jb->uk) jb->uk = bn_ukernels_scalar(p->dt);
  jb->nt = p->total < SERIAL_BELOW ? 1 : norma__threads();
  jb->unit = 1;
  jb->fused = jb->nsums && plan_fused(jb);
  if (jb->nsums && forced_schedule() >= 0) jb->fused = forced_schedule();
  /* Streaming stores pay off for outputs that leave the cache anyway, and only when they fill
     whole lines: long channels-first runs, or whole rows in channels-last */
  const int whole_lines = jb->rows_form ? (!jb->fused || jb->unit == p->c)
                                        : p->s * (int64_t)p->esize >= 2048;
  jb->store = whole_lines && p->total * (int64_t)p->esize >= NT_MIN_BYTES ? BN_STORE_NT : 0;
}

/* Plans, allocates scratch, runs.  Called by every operation. */
static norma_status run(job *jb, void (*prepare)(job *)) {
  const bn_problem *p = jb->p;
  plan(jb);
  size_t part_bytes = 0;
  if (!jb->fused) part_bytes = (size_t)nsegments(jb) * (size_t)p->c * SEG_VALUES * sizeof(double);
  void *part = NULL;
  if (!scratch_alloc(jb, part_bytes, &part))
    return norma__fail(NORMA_ERR_OUT_OF_MEMORY, "norma: out of memory allocating %zu bytes of "
                       "scratch", part_bytes + (size_t)p->c * 80);
  if (prepare) prepare(jb);
  if (jb->fused) run_fused(jb);
  else run_split(jb, part);
  return NORMA_OK;
}

/* norma_bn_query_plan for the production path: the decisions run() would take. */
void bn_cpu_query_plan(const bn_problem *p, int op, norma_bn_plan *out) {
  job jb = {.p = p, .nsums = op == NORMA_BN_OP_FORWARD_INFERENCE ? SUMS_NONE
                             : op == NORMA_BN_OP_BACKWARD        ? SUMS_BWD
                                                                 : SUMS_STATS,
            .apply = 1};
  plan(&jb);
  out->fused = jb.fused;
  out->unit = jb.fused ? jb.unit : 0;
  out->threads = jb.nt;
  out->isa = norma__isa() == NORMA_ISA_AVX2 && bn_ukernels_avx2(p->dt) ? NORMA_ISA_AVX2
                                                                      : NORMA_ISA_SCALAR;
  out->streaming_stores = jb.store != 0;
  out->reference = 0;
  /* reads of the inputs from memory: 1 when there is no reduction, or when a fused unit stays
     in the L2 share between its reduction and its apply */
  if (!jb.nsums) {
    out->dram_passes = 1;
  } else if (!jb.fused) {
    out->dram_passes = 2;
  } else {
    const int64_t tensors = jb.nsums == SUMS_BWD ? (p->act != BN_ACT_NONE ? 3 : 2) : 1;
    const int64_t unit_bytes =
        mul_sat(mul_sat(mul_sat(jb.unit, p->m), (int64_t)p->esize), tensors);
    out->dram_passes = unit_bytes <= norma__l2_bytes() / 2 ? 1 : 2;
  }
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

/* mean and m2 of channel ch: tot holds t1 = sum (x - K), t2 = sum (x - K)^2 and the anchor K */
static void moments_of(const job *jb, int64_t ch, double *mean, double *m2) {
  const int64_t c = jb->p->c;
  const double m = (double)jb->p->m, t1 = jb->tot[ch], t2 = jb->tot[c + ch];
  const double v = t2 - t1 * (t1 / m);
  *mean = jb->tot[2 * c + ch] + t1 / m;
  *m2 = v < 0.0 ? 0.0 : v; /* rounding can go below 0; NaN passes */
}

/* forward constants from a mean (double) and invstd: y = (x - mhi) * scale + shift, where
   mhi is the mean rounded to the compute type (x - mhi is exact on large-mean data) and the
   rounding mean - mhi moves into the shift. */
static void set_fwd_consts(job *jb, int64_t ch, double mean, double mean_lo, double invstd,
                           double g, double b) {
  cst_set(jb, C_MHI, ch, mean);
  const double mlo = (mean - cst_get(jb, C_MHI, ch)) + mean_lo;
  const double scale = g * invstd;
  cst_set(jb, C_SCALE, ch, scale);
  cst_set(jb, C_SHIFT, ch, mlo == 0.0 ? b : b - mlo * scale); /* no 0 * Inf when var + eps == 0 */
}

/* a + b as an unevaluated sum hi + lo (Knuth's TwoSum): the mean of f64 data keeps the bits
   below its last place, which matter when the mean is 1e8 times the spread */
static inline void two_sum(double a, double b, double *hi, double *lo) {
  const double s = a + b, bb = s - a;
  *hi = s;
  *lo = (a - (s - bb)) + (b - bb);
}

static void finalize_training(job *jb, int64_t j0, int64_t nc) {
  const fwd_ctx *cx = jb->ctx;
  const bn_problem *p = jb->p;
  const int64_t c = p->c;
  const int biased = (p->flags & NORMA_BN_BIASED_RUNNING_VAR) != 0;
  const double m = (double)p->m, im = 1.0 / m, mom = cx->momentum, eps = p->eps;
  const double unbias = biased ? 1.0 : m / (m - 1.0);
  enum { CH = 64 };
  double mean[CH], mlo[CH], var[CH], is[CH];
  for (int64_t a = j0; a < j0 + nc; a += CH) {
    const int64_t b = a + CH < j0 + nc ? a + CH : j0 + nc;
    /* 1/sqrt for a chunk of channels: a branch-free loop the compiler vectorizes.  As in
       PyTorch, var == 0 with eps == 0 gives invstd 0 (y = beta), not Inf. */
    for (int64_t ch = a; ch < b; ch++) {
      const double t1 = jb->tot[ch], t2 = jb->tot[c + ch], u = (t2 - t1 * (t1 * im)) * im;
      const double v = u < 0.0 ? 0.0 : u; /* rounding can go below 0; NaN passes */
      two_sum(jb->tot[2 * c + ch], t1 * im, &mean[ch - a], &mlo[ch - a]);
      var[ch - a] = v;
      is[ch - a] = (v == 0.0 && eps == 0.0) ? 0.0 : 1.0 / sqrt(v + eps);
    }
    for (int64_t ch = a; ch < b; ch++) {
      const double mu = mean[ch - a], iv = is[ch - a];
      set_fwd_consts(jb, ch, mu, mlo[ch - a], iv, norma__param(p->dt, cx->gamma, ch, 1.0),
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
  return run(&jb, NULL);
}

static void finalize_inference(job *jb, int64_t j0, int64_t nc) {
  const fwd_ctx *cx = jb->ctx;
  const bn_problem *p = jb->p;
  for (int64_t ch = j0; ch < j0 + nc; ch++)
    set_fwd_consts(jb, ch, norma__param(p->dt, cx->mean_in, ch, 0), 0.0,
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
    set_fwd_consts(jb, ch, cx->mean_d[ch], 0.0, cx->invstd_d[ch], norma__param(p->dt, cx->gamma, ch, 1.0),
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
  return run(&jb, NULL);
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
    const double s = (!global && cx->sum_xhat) ? cx->sum_xhat[ch] / (double)cx->count : 0.0;
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

/* mean and m2 of n values from sums relative to the anchor k */
static inline void tile_moments(double k, double t1, double t2, double n, double *mean, double *m2) {
  const double v = t2 - t1 * (t1 / n);
  *mean = k + t1 / n;
  *m2 = v < 0.0 ? 0.0 : v;
}

static norma_status cpu_moments_tile(norma_dtype dt, int64_t rows, int64_t channels,
                                     const void *x, int64_t row_stride, int64_t channel_stride,
                                     double *mean, double *m2) {
  const bn_ukernels *uk = NULL;
  if (norma__isa() == NORMA_ISA_AVX2) uk = bn_ukernels_avx2(dt);
  if (!uk) uk = bn_ukernels_scalar(dt);
  const size_t es = norma__dtype_size(dt);
  if (channel_stride == 1 && row_stride >= channels) {
    /* rows of adjacent channels: blocks of rows, anchored at the first block's anchors */
    static _Thread_local double t1[ROWS_CHUNK], t2[ROWS_CHUNK], b1[ROWS_CHUNK], b2[ROWS_CHUNK],
        kd[ROWS_CHUNK];
    static _Thread_local union { float f[ROWS_CHUNK]; double d[ROWS_CHUNK]; } k;
    for (int64_t j0 = 0; j0 < channels; j0 += ROWS_CHUNK) {
      const int64_t nc = channels - j0 < ROWS_CHUNK ? channels - j0 : ROWS_CHUNK;
      const int64_t br = block_rows(1, channels, es);
      for (int64_t r0 = 0; r0 < rows; r0 += br) {
        const int64_t n = rows - r0 < br ? rows - r0 : br;
        const char *blk = (const char *)x + (size_t)(r0 * row_stride + j0) * es;
        if (r0 == 0) {
          uk->stats_rows(blk, n, row_stride, nc, NULL, t1, t2, kd);
          for (int64_t j = 0; j < nc; j++) {
            if (dt == NORMA_F64) k.d[j] = kd[j];
            else k.f[j] = (float)kd[j];
          }
        } else {
          uk->stats_rows(blk, n, row_stride, nc, &k, b1, b2, NULL);
          for (int64_t j = 0; j < nc; j++) t1[j] += b1[j], t2[j] += b2[j];
        }
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
      double t1 = 0.0, t2 = 0.0, kk = 0.0, o[3];
      union { float f; double d; } k;
      for (int64_t r0 = 0; r0 < rows; r0 += CF_CHUNK) {
        const int64_t n = rows - r0 < CF_CHUNK ? rows - r0 : CF_CHUNK;
        uk->stats_run(base + (size_t)r0 * es, n, r0 == 0 ? NULL : (const void *)&k, o);
        if (r0 == 0) {
          kk = o[2];
          if (dt == NORMA_F64) k.d = kk;
          else k.f = (float)kk;
        }
        t1 += o[0], t2 += o[1];
      }
      tile_moments(kk, t1, t2, (double)rows, &mean[j], &m2[j]);
    }
    return NORMA_OK;
  }
  return bn_impl_ref.moments_tile(dt, rows, channels, x, row_stride, channel_stride, mean, m2);
}

const bn_impl bn_impl_cpu = {
    cpu_fwd_training, cpu_fwd_inference, cpu_backward,     cpu_moments,
    cpu_fwd_apply,    cpu_bwd_reduce,    cpu_bwd_apply,    cpu_moments_tile,
};
