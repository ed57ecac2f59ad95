/* engine.h - the CPU engine: one scheduler for every norm, generic over its geometry.
 *
 * Every operation is "reduce, finalize, apply" over *units*.  A unit is a block of channels of
 * a range of samples that holds whole statistics groups: all samples for BatchNorm (a group is
 * a channel over the batch), one sample for the per-sample norms (a group is cpg channels of
 * one sample).  The engine reduces a unit's channels over its samples with the micro-kernels
 * (ukernels.h), calls the op's finalize (statistics -> per-channel constants, saved outputs),
 * then applies the constants to the unit's values while they are still in cache.
 *
 * An op is therefore small: it says how its descriptor maps onto norm_geom, what its finalize
 * computes, and which reduction it needs (SUMS_*).  op_bn.c (BatchNorm), op_group.c (GroupNorm,
 * InstanceNorm) and op_row.c (LayerNorm, RMSNorm: rows of contiguous groups, per-element
 * affine) are the ops; engine.c is the scheduler; ukernels*.c are the kernels.
 *
 * Determinism: a reduction is cut into segments fixed by the shape alone (channels-first: runs
 * of up to NORM_CF_CHUNK values; channels-last: norm_cl_seg_len(rows) rows, in blocks of
 * block_rows() for the statistics and of BN_SUMS_BLOCK_ROWS inside the backward's sums kernel);
 * each segment is computed by a fixed sequence of kernel calls and the segments are combined
 * in index order.  Which thread computes what never changes a bit.
 */
#ifndef NORMA_ENGINE_H
#define NORMA_ENGINE_H

#include <float.h>
#include <math.h>

#include "geom.h"
#include "impl.h"
#include "ukernels.h"

#define NORM_CF_CHUNK 4096     /* values per channels-first segment */
#define NORM_CL_SEG_ROWS 1024  /* most rows per channels-last segment */
#define NORM_CL_MIN_SEG_ROWS 64 /* fewest rows per segment of a reduction in the caches */
#define NORM_ROWS_CHUNK 1024   /* channels per rows-kernel call */
/* Tensors with fewer values run without a parallel region.  On the 2-vCPU machines a fork /
   join costs 3-5 us and a barrier 1.6 us (the vCPUs exchange a cache line in ~0.8 us), and a
   call takes two or three regions: measured (Zen 5, f32, NHWC and NCHW, 1 / 2 threads) 32K
   values forward 10 / 20 us, 64K 17 / 33 us, 128K 38 / 34 us, 256K 66 / 52 us; the backward
   and inference cross over at the same size.  BatchNorm refines it by op and layout
   (bn_threads in engine.c); the per-sample norms and the row norms use it as it is. */
#define NORM_SERIAL_BELOW 131072
#define NORM_MAX_UNIT 512      /* channels per BatchNorm unit */

/* A tensor of up to NORM_CACHED_BYTES stays in the threads' caches between two passes over it;
   a larger one streams from memory.  Measured on Zen 5 with 2 threads (A/B pairs): tensors of
   12.8 MB behave as cached, tensors of 25.7 MB and more as streamed.  Only speed depends on
   it, never a result: the segments below depend on the shape alone. */
#define NORM_CACHED_BYTES ((int64_t)16 << 20)
/* Beyond NORM_SEQ_BYTES (a tensor the LLC share of two threads cannot hold either) the
   backward's channels-last sums (rows of up to 256 channels, and of 481 to 1024) and apply
   (up to 256) read rows whole, in address order (BN_ROWS_SEQ).  The sums alone, on Zen 5,
   2 threads, f32, A/B in one phase of the machine: 32x56x56x256 (103 MB) 1.08-1.9x (median
   1.45), 32x56x56x128 (51 MB) 1.19x, 32x112x112x64 1.14x; below the threshold 32x56x56x64
   (25.7 MB) 0.84x and 32x14x14x1024 0.55-0.75x, where the rows come partly from the LLC and
   the order's extra loads and stores cost more than it gains.  Since the forty-first session
   f32 rows of up to 480 channels take the order from NORM_CACHED_BYTES (norm_seq_bytes in
   engine.c, measured there). */
#define NORM_SEQ_BYTES ((int64_t)32 << 20)

/* Rows per segment of a channels-last reduction over `rows` rows of row_bytes bytes: segments
   of NORM_CL_SEG_ROWS rows (the last shorter); but a reduction over up to NORM_CACHED_BYTES
   takes the fewest segments of at most that many rows of equal length (rounded up to a
   multiple of 4), which share out evenly.  Then each thread reduces whole rows and applies the
   same rows from its own caches.  Measured on Zen 5 (2 threads, A/B pairs): 32x7x7 layers
   (1568 rows: segments of 784 instead of 1024 + 544, where the threads split channels instead)
   backward NHWC 2048 channels 1.08-1.34x, 512 channels 0.97-1.14x, forward 1.14x; on
   tensors of 25 MB and more, which the caches do not hold between the passes, equal segments
   were 3-8 % slower, so those keep segments of NORM_CL_SEG_ROWS rows where two threads'
   contiguous shares of them are within 5 % of each other (norm_cl_fixed_even).  Where they
   are not (a few segments, or a short last one), the reduction split the channels or one
   thread read up to a third more rows, and equal segments measured faster (Zen 5, 2 threads,
   f32, backward / forward NHWC, paired): 16x14x14x1344 (16.9 MB; 2048 against 1088 rows)
   1.24x / 1.05x, 64x7x7x2048 (25.7 MB) 1.09-1.14x / 1.29x, 8x19x19x2048 1.12x / 1.13x,
   16x14x14x1536 1.19x, 16x14x14x4096 1.06x / 1.04x, 16x17x17x1280 (2048 against 2576 rows)
   1.03-1.10x; 48x8x8x2048 and 24x17x17x1280 even. */
/* whether two threads' contiguous shares of the fixed segments of `rows` rows (as the split
   schedule deals them out) are within 5 % of each other; or there are at most two, and the
   threads share the channels of rows of 8 KiB or more (in 4 equal segments, [1024, 8192]
   backward 0.92x, forward 1.11x; [1536, 4096] 0.97x / 0.98x; [1280, 8192] 0.95x / 0.95x) */
static inline int norm_cl_fixed_even(int64_t rows) {
  const int64_t nseg = (rows + NORM_CL_SEG_ROWS - 1) / NORM_CL_SEG_ROWS;
  if (nseg <= 2) return 1;
  const int64_t first = nseg / 2 * NORM_CL_SEG_ROWS < rows ? nseg / 2 * NORM_CL_SEG_ROWS : rows;
  const int64_t most = first > rows - first ? first : rows - first;
  return most * 200 <= rows * 105;
}
static inline int64_t norm_cl_seg_len(int64_t rows, int64_t row_bytes) {
  int64_t nseg = (rows + NORM_CL_SEG_ROWS - 1) / NORM_CL_SEG_ROWS;
  if (rows > NORM_CACHED_BYTES / (row_bytes > 0 ? row_bytes : 1) && norm_cl_fixed_even(rows))
    return NORM_CL_SEG_ROWS;
  /* in the caches: a multiple of 4 segments (2 and 4 threads share them evenly), halved while
     they would be shorter than 2 * NORM_CL_MIN_SEG_ROWS, down to two, then while shorter than
     NORM_CL_MIN_SEG_ROWS.  A segment's first block is read twice (its anchors) and each
     segment adds a combine per channel: 392-400 rows in 2 segments instead of 4 ran the
     forward 1.14-1.18x faster (NHWC 8x1152x7x7, 16x576x5x5; [256, 4096] 1.10x), but a
     single segment, where the threads then split the channels, made 196-200 rows 0.96x. */
  nseg = (nseg + 3) / 4 * 4;
  while (nseg > 2 && rows < nseg * 2 * NORM_CL_MIN_SEG_ROWS) nseg /= 2;
  while (nseg > 1 && rows < nseg * NORM_CL_MIN_SEG_ROWS) nseg /= 2;
  if (nseg <= 1) return NORM_CL_SEG_ROWS;
  return ((rows + nseg - 1) / nseg + 3) / 4 * 4;
}

/* what a job reduces: nothing (apply only), the statistics, or the backward's sums; either
   leaves 3 doubles per channel */
enum { SUMS_NONE = 0, SUMS_STATS = 1, SUMS_BWD = 2 };

typedef struct norm_job norm_job;

/* A unit of work (see above).  Its per-channel arrays are indexed by channel - j0. */
typedef struct norm_unit {
  int64_t i0, i1;   /* samples */
  int64_t j0, nc;   /* channels */
  double *tot;      /* [3][ts] totals: statistics (t1, t2, anchor) or the backward's sums */
  int64_t ts;
  void *cst;        /* [C_COUNT][cs] constants of the kernels, in the compute type */
  int64_t cs;
  double *dcst;     /* [3][ts] forward constants in double (mhi, scale, shift), for `slow`;
                       the backward keeps x_hat's rho and c there (engine.c, lower_x) */
  int slow;         /* a channel's constants overflow the compute type: apply in double */
  void *kst;        /* [C_COUNT][cs] the backward kernels' constants (ukernels.h: C_XS ...),
                       lowered by the engine from cst */
  float *rep;       /* [C_COUNT][srk * c] the kernels' constants repeated for the apply's
                       aligned super-rows (engine.c), or NULL */
} norm_unit;

typedef void (*norm_unit_fn)(norm_job *jb, norm_unit *u);

struct norm_job {
  const norm_geom *g;
  const bn_ukernels *uk;
  size_t cbytes;   /* bytes of the compute type (4: float, 8: double) */
  int rows_form;   /* the tensor is rows of c values (channels-last, or s == 1) */
  int nt;          /* threads */
  int64_t unit;    /* channels per unit */
  int fused;       /* units end to end (else BatchNorm's split schedule) */
  int store;       /* BN_STORE_NT when outputs bypass the cache */
  int pf;          /* BN_PF_AHEAD when the rows kernels should prefetch (a tensor beyond the
                      caches), else 0 */
  int seq;         /* BN_ROWS_SEQ beyond NORM_SEQ_BYTES, else 0 */
  int one;         /* BN_ROWS_ONE where the backward's apply goes a row at a time, else 0 */
  int nsums;       /* SUMS_* */
  int act;         /* the activation the reduction kernels see (the geometry's) */
  int split;       /* the op asks for the split schedule (BatchNorm's wide rows) */
  int cf_wide;     /* the rows are the wide view of short channels-first runs (op_bn.c) */
  int apply;       /* apply after finalize */
  /* tensors */
  const void *x, *res, *y, *dy;
  void *out, *dres;
  /* op callbacks and state */
  norm_unit_fn prepare;  /* backward: the x_hat constants the reduction needs (may be NULL) */
  norm_unit_fn finalize; /* totals -> constants and outputs */
  const void *ctx;
  double *per_nc;        /* [n][2][c] doubles shared by the units (per-sample ops), or NULL */
  int want_per_nc;       /* ask run_job for per_nc */
  int quiet;             /* finalize computes the constants only: another thread writes the
                            op's outputs (save_*, running statistics, dgamma, dbeta) */
  int64_t srk, sra;      /* the split apply's aligned super-rows (engine.c): srk rows each,
                            the first at row sra; srk 0 when not used */
};

/* Plans and runs the job (the op has set g, nsums, apply, tensors, callbacks). */
norma_status norm_run_job(norm_job *jb);

/* Plans only (query_plan). */
void norm_plan_job(norm_job *jb);
/* Bytes a fused unit may hold per thread and still be applied from cache (half the L2, or
   NORMA_UNIT_BUDGET). */
int64_t norm_unit_budget(void);
/* Whether an output of `bytes` bytes is written around the cache (non-temporal stores) in a
   call whose tensors (those it reads and those it writes) total `footprint` bytes.  Within the
   range norma_set_streaming_stores set; its minimum, or NORMA_NT_MIN_BYTES (a tuning knob,
   docs/performance.md), decides alone when given; by default an output of at least a quarter
   of `floor` in a call whose footprint exceeds `floor` (NORM_NT_FOOTPRINT; lower for some
   BatchNorm calls, below).  Below that the caches hold the tensors from call to
   call, and an output written through them is found there the next time: measured (Zen 5,
   2 threads, f32, A/B pairs, streamed / through the cache) forward NCHW 8x32x112x112
   (12.8 MB: 25.6 MB read and written) 1.44x slower streamed, inference 16x64x56x56 1.7x. */
#define NORM_NT_FOOTPRINT ((int64_t)32 << 20)
/* The backward (three tensors and more), and the training forward of channels-last rows of
   at least NORM_NT_WIDE_ROW bytes, stream from a footprint of 16 MiB: on the 2-vCPU machines
   the share of the LLC the two threads keep against their neighbours is often well under
   32 MiB, and these calls then took their outputs' lines from memory before writing them.
   Measured in one sitting (Zen 5, 2 threads, pair.py --twice, 5-6 rounds, streamed against
   through the cache): backward NHWC f32 32x1024x7x7 (19.3 MB) 1.50x, 24x2048x7x7 1.57x,
   16x2048x7x7 1.22x, 32x256x14x14 1.45x (and 0.83x minutes later, in a quiet phase: 0.37
   against 0.31 ms, both faster than oneDNN's 0.54), bf16 32x2048x7x7 1.54x; below 16 MiB
   even or slower (12x2048x7x7 1.04x, add + ReLU 16x1024x7x7 0.98x, 32x512x7x7 0.72x).
   Training forward NHWC f32 32x2048x7x7 (25.7 MB) 1.22-1.70x, 64x1024x7x7 1.42x,
   16x4096x7x7 1.18x, 24x2048x7x7 1.10x, 20x2048x7x7 (16.1 MB) 0.955x; narrower rows kept
   their caches even at 25.7 MB (32x512x14x14 0.99x, 32x128x28x28 0.92x, 24x128x28x28 0.73x,
   NCHW 32x128x28x28 0.68x), and so did the inference (NHWC 32x128x28x28 0.58x,
   24x2048x7x7 0.79x).  oneDNN streams every f32 output; through the cache norma's forward of
   32x2048x7x7 ran 0.71x of its speed in that sitting, streamed 0.98x. */
#define NORM_NT_FOOTPRINT_TRAIN ((int64_t)16 << 20)
#define NORM_NT_WIDE_ROW 4096
/* The inference of channels-last rows of at least NORM_NT_WIDE_ROW bytes streams from a
   footprint of 20 MiB: through the cache, each vector's three constants from L1 slowed the
   apply of such rows (a stand-alone loop over 8x18x18x1536 f32: 0.87-1.27 ms with them,
   0.52-0.63 with the constants in registers; streamed, 0.59-0.68 either way).  Measured as
   above: 28x2048x7x7 (22.5 MB) 1.53x, 32x2048x7x7 1.47x (against oneDNN 0.83x through the
   cache, 1.08x streamed), 16x1024x14x14 1.42x, 32x1024x10x10 1.50x, bf16 64x2048x7x7 1.50x,
   8x1536x18x18 1.39x, 8x1152x14x25 1.03x; below 20 MiB, 24x2048x7x7 (19.3 MB) 0.79x, and
   8x4096x9x9 (21.2 MB) 0.84x. */
#define NORM_NT_FOOTPRINT_WIDE_INFER ((int64_t)20 << 20)
/* Channels-first runs shorter than this many bytes are applied (and a single sample's backward
   sums taken) a sample at a time, one kernel call sweeping its consecutive channels
   (BN_RUN_CHANS) in memory order (cf_sweep in engine.c): a call per (sample, channel) cost
   more than the run itself on 4x4 and 7x7 layers (measured: inference 8x960x4x4 at half
   PyTorch's speed), and a tenth of runs of up to 2 KiB in the caches.  Alternating call by
   call in one process (Zen 5, 2 threads, f32, medians of 101, a sweep below 2048 bytes
   against 512; two runs each):
   inference 32x256x14x14 1.25x / 1.28x, 128x64x12x12 1.26x / 1.25x, training forward 1.08x /
   1.08x and 1.07x / 1.08x, backward 1.11x / 1.10x and 1.05x / 1.05x; beyond the caches even
   (32x1024x14x14 0.97-1.01x, 16x1280x16x16 0.96-1.00x, 64x512x13x13 0.99-1.05x).  Longer runs
   gained nothing (a sweep below 16 KiB: 32x128x28x28 0.97-1.01x). */
#define NORM_CF_SWEEP_BELOW 2048
/* The backward of channels-first runs shorter than NORM_CF_SWEEP_BELOW (streamed a sample
   at a time as one stream: bwd_runs_stream in ukernels_vec.inc) keeps NORM_NT_FOOTPRINT: at
   NORM_NT_FOOTPRINT_TRAIN it would stream tensors from 5.3 MiB.  Measured (Zen 5, 2 threads,
   f32, pair.py --twice, 6 rounds, streamed against through the cache): backward NCHW
   32x1024x14x14 1.22x, 64x2048x7x7 1.25x, 16x1280x16x16 1.33x, 32x512x14x14 (12.8 MB) 1.22x,
   32x2048x7x7 1.34x, add + ReLU 32x1024x14x14 1.27x, but 32x256x14x14 and 64x512x7x7
   (6.4 MB) 0.87x and 0.97x; the forward (NORM_NT_FOOTPRINT already) 32x1024x14x14 1.09x,
   64x2048x7x7 1.35x, inference 1.20x and 1.39x, 16x1280x16x16 1.45x; bf16 even (inference
   64x1024x14x14 1.00x, backward 0.98x). */
int norm_nt_store(int64_t bytes, int64_t footprint, int64_t floor);
/* what a BatchNorm call (or a per-sample norm through the engine) computes, for its stores */
typedef enum { NORM_NT_INFER, NORM_NT_TRAIN_FWD, NORM_NT_BWD } norm_nt_kind;
/* the kind of a job: the backward (its sums or its apply), the training forward (with a
   reduction of x), or the inference */
static inline norm_nt_kind norm_nt_kind_of(const norm_job *jb) {
  return jb->nsums == SUMS_BWD || jb->dy ? NORM_NT_BWD
         : jb->nsums                     ? NORM_NT_TRAIN_FWD
                                         : NORM_NT_INFER;
}
/* norm_nt_store for a BatchNorm call (or a per-sample norm through the engine) on g: its
   tensors, each the size of x, are the forward's x and y (and the residual), the backward's
   x, dy and dx (and y for the activation's mask, dresidual).  The per-sample norms keep
   NORM_NT_FOOTPRINT (not measured at 16-32 MiB). */
static inline int norm_bn_nt_store(const norm_geom *g, norm_nt_kind kind) {
  const int64_t bytes = g->total * (int64_t)g->esize;
  const int backward = kind == NORM_NT_BWD;
  const int64_t tensors = backward ? 3 + (g->act != BN_ACT_NONE) + (g->act == BN_ACT_ADD_RELU)
                                   : 2 + (g->act == BN_ACT_ADD_RELU);
  const int wide =
      g->layout == NORMA_CHANNELS_LAST && g->c * (int64_t)g->esize >= NORM_NT_WIDE_ROW;
  const int short_cf =
      g->layout == NORMA_CHANNELS_FIRST && g->s * (int64_t)g->esize < NORM_CF_SWEEP_BELOW;
  int64_t floor = NORM_NT_FOOTPRINT;
  if (!g->per_sample && (backward || wide) && !short_cf)
    floor = backward || kind == NORM_NT_TRAIN_FWD ? NORM_NT_FOOTPRINT_TRAIN
                                                  : NORM_NT_FOOTPRINT_WIDE_INFER;
  return norm_nt_store(bytes, tensors * bytes, floor);
}
/* Whether the kernels' streaming stores fill whole cache lines when each writes runs of
   run_bytes contiguous bytes (a vector tail at the end of each run): runs of whole lines
   (then no run has a tail), or runs of at least 2 KiB.  A line that takes both a streaming
   store and an ordinary (masked tail) store bounces between the write-combining buffers and
   the cache: channels-last BatchNorm with 24 channels (96-byte rows) ran 16x slower with
   streaming stores, LayerNorm with D = 100 5.6x slower (docs/performance.md). */
int norm_nt_runs(int64_t run_bytes);

/* ---- helpers for the ops' finalize callbacks -------------------------------------------- */

static inline void norm_cst_set(const norm_job *jb, const norm_unit *u, int k, int64_t jrel,
                                double v) {
  if (jb->cbytes == 8) ((double *)u->cst)[k * u->cs + jrel] = v;
  else ((float *)u->cst)[k * u->cs + jrel] = (float)v;
}
/* the value a constant has after rounding to the compute type */
static inline double norm_cst_get(const norm_job *jb, const norm_unit *u, int k, int64_t jrel) {
  return jb->cbytes == 8 ? ((double *)u->cst)[k * u->cs + jrel]
                         : (double)((float *)u->cst)[k * u->cs + jrel];
}

/* Forward constants of channel jrel from a mean (hi + lo, double), invstd, gamma and beta:
   y = (x - mhi) * scale + shift, where mhi is the mean rounded to the compute type (x - mhi is
   exact on large-mean data) and the rest of the mean moves into the shift.  When scale or
   shift does not fit the compute type although it is finite (an f32 channel whose spread is
   below ~1e-38), the unit is marked slow and applied in double. */
static inline void norm_set_fwd_consts(const norm_job *jb, norm_unit *u, int64_t jrel,
                                       double mean, double mean_lo, double invstd, double gamma,
                                       double beta) {
  norm_cst_set(jb, u, C_MHI, jrel, mean);
  const double mhi = norm_cst_get(jb, u, C_MHI, jrel);
  const double mlo = (mean - mhi) + mean_lo;
  const double scale = gamma * invstd;
  const double shift = mlo == 0.0 ? beta : beta - mlo * scale; /* no 0 * Inf when var+eps == 0 */
  norm_cst_set(jb, u, C_SCALE, jrel, scale);
  norm_cst_set(jb, u, C_SHIFT, jrel, shift);
  u->dcst[jrel] = mhi, u->dcst[u->ts + jrel] = scale, u->dcst[2 * u->ts + jrel] = shift;
  if (jb->cbytes == 4 && ((fabs(scale) > FLT_MAX && isfinite(scale)) ||
                          (fabs(shift) > FLT_MAX && isfinite(shift))))
    u->slow = 1;
}

/* Backward constants of channel jrel for dx = da * (g - mg) + db * xh + dd0: written as
   da * (g - gm) + db * xh + dd with gm = mg rounded to the compute type, so that g - gm stays
   exact on data whose dy has a large mean (mg is the mean of g, or what plays its role). */
static inline void norm_set_bwd_consts(const norm_job *jb, norm_unit *u, int64_t jrel,
                                       double da, double mg, double db, double dd0) {
  norm_cst_set(jb, u, C_GM, jrel, mg);
  const double gm = norm_cst_get(jb, u, C_GM, jrel);
  norm_cst_set(jb, u, C_DA, jrel, da);
  norm_cst_set(jb, u, C_DB, jrel, db);
  norm_cst_set(jb, u, C_DD, jrel, dd0 + da * (gm - mg));
}

/* moments (mean, m2) of channel jrel of a unit's STATS totals over cnt values */
static inline void norm_moments_of(const norm_unit *u, int64_t jrel, double cnt, double *mean,
                                   double *m2) {
  const double t1 = u->tot[jrel], t2 = u->tot[u->ts + jrel];
  const double v = t2 - t1 * (t1 / cnt);
  *mean = u->tot[2 * u->ts + jrel] + t1 / cnt;
  *m2 = v < 0.0 ? 0.0 : v; /* rounding can go below 0; NaN passes */
}

/* The backward's third sum alone, sum x_hat per channel of the unit into u->tot[2 * ts + j]
   (u->tot is overwritten), with the unit's current x_hat constants: the op's prepare uses it
   to remove the offset of a rounded saved mean before the activation's derivative needs
   x_hat (SiLU). */
void norm_unit_xhat_sums(const norm_job *jb, norm_unit *u);

/* tot[.. dst] of the unit absorbs column src's totals (statistics over cnt values: re-anchored
   and added; the backward's sums: added) - the merge of columns that belong to one group */
void norm_unit_absorb(const norm_job *jb, norm_unit *u, int64_t dst, int64_t src, double cnt);

/* ---- shared by the engine and the row path -------------------------------------------- */

/* bytes rounded up to a cache line */
static inline size_t norm_up64(size_t b) { return (b + 63) & ~(size_t)63; }
/* the fewest consecutive rows of row_bytes (> 0) bytes that make whole 64-byte lines:
   64 / gcd(row_bytes, 64) */
static inline int64_t norm_line_rows(int64_t row_bytes) {
  int64_t a = row_bytes, b = 64;
  while (b) {
    const int64_t t = a % b;
    a = b, b = t;
  }
  return 64 / a;
}

/* Per-thread scratch kept between calls (grown, never shrunk): slot 0 for what a call owns,
   slot 1 for what a unit owns inside a parallel region (thread 0 is the calling thread), slot 2
   for the dynamic shares (NORM_SCRATCH_SHARES). */
void *norm_scratch(int slot, size_t bytes);
/* the same, and where fresh is given: *fresh says whether this call (re)allocated the memory,
   which it then zeroed (all of it, past `bytes` too).  Slot 2 holds the dynamic shares'
   counters (shares.c). */
void *norm_scratch_ex(int slot, size_t bytes, int *fresh);
#define NORM_SCRATCH_SHARES 2

/* Runs fn(jb, i0, i1, arg) over [0, n) in dynamic shares (shares.h): each thread's contiguous
   share in chunks, the chunks it has not started open to a thread done with its own; a single
   thread calls fn directly (no parallel region).  fn must give each item the same result
   whichever thread and range run it.  Streaming stores are fenced per thread. */
typedef void (*norm_range_fn)(norm_job *jb, int64_t i0, int64_t i1, void *arg);
void norm_parallel_for(norm_job *jb, int64_t n, norm_range_fn fn, void *arg);
/* the calling thread's index inside norm_parallel_for (0 outside a parallel region) */
int norm_thread_id(void);

/* The compute-type kernels for the job's dtype on the current ISA; sets jb->uk and cbytes. */
void norm_job_kernels(norm_job *jb);

/* op entry points (called by norm_impl_cpu in cpu_impl.c) */
norma_status norm_bn_forward(const norm_geom *g, norm_fwd_mode mode, const norm_fwd_args *a);
norma_status norm_bn_backward(const norm_geom *g, norm_bwd_mode mode, const norm_bwd_args *a);
norma_status norm_bn_moments_tile(norma_dtype dt, int64_t rows, int64_t channels, const void *x,
                                  int64_t row_stride, int64_t channel_stride, double *mean,
                                  double *m2);
norma_status norm_group_forward(const norm_geom *g, norm_fwd_mode mode, const norm_fwd_args *a);
norma_status norm_group_backward(const norm_geom *g, norm_bwd_mode mode, const norm_bwd_args *a);
norma_status norm_row_forward(const norm_geom *g, norm_fwd_mode mode, const norm_fwd_args *a);
norma_status norm_row_backward(const norm_geom *g, norm_bwd_mode mode, const norm_bwd_args *a);

#endif
