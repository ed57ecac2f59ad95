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
 * Statistics of a block are its moments (mean, m2 = sum (x - mean)^2), computed by two passes
 * over the block while it is in L1/L2: its sum gives a provisional mean k (rounded to the
 * compute type), then sums of d = x - k and d^2 give mean = k + S1/L, m2 = S2 - S1^2/L.  The
 * differences are small whatever the data's mean, so nothing cancels: one outlier, or a mean
 * 1e5 times the spread, costs no accuracy.  The driver merges blocks with Chan's formula.
 */
#ifndef NORMA_UKERNELS_H
#define NORMA_UKERNELS_H

#include <stdint.h>

#include "internal.h"

#define BN_LANES 32

/* or-ed into the `act` argument of the apply kernels: outputs may bypass the cache
   (non-temporal stores); kernels without such stores ignore it */
#define BN_STORE_NT 0x100
#define BN_ACT_MASK 0xff

/* indices of the per-channel constants */
enum {
  /* forward apply: y = act((x - C_MHI) * C_SCALE + C_SHIFT) */
  C_MHI = 0, C_SCALE = 1, C_SHIFT = 2,
  /* backward: xh = (v - C_A) * C_B + C_C;  dx = C_DA * (g - C_GM) + C_DB * xh + C_DD */
  C_A = 0, C_B = 1, C_C = 2, C_GM = 3, C_DA = 4, C_DB = 5, C_DD = 6,
  C_COUNT = 7
};

typedef struct bn_ukernels {
  /* moments of a block of len >= 1 values: out[0] = mean, out[1] = m2 */
  void (*stats_run)(const void *x, int64_t len, double out[2]);
  /* moments of each channel over rows >= 1 rows: mean[j], m2[j], overwritten; nc <= 1024 */
  void (*stats_rows)(const void *x, int64_t rows, int64_t ld, int64_t nc, double *mean,
                     double *m2);
  /* y = act((x - mhi) * scale + shift [+ res]) */
  void (*fwd_run)(const void *x, const void *res, void *y, int64_t len, const void *cst,
                  int64_t cs, int act);
  void (*fwd_rows)(const void *x, const void *res, void *y, int64_t rows, int64_t ld,
                   int64_t nc, const void *cst, int64_t cs, int act);
  /* g = dy masked by y > 0 (act), xh = (v - a) * b + c: out = {sum g, sum g*xh, sum xh} */
  void (*bwd_sums_run)(const void *v, const void *y, const void *dy, int64_t len,
                       const void *cst, int64_t cs, int act, double out[3]);
  void (*bwd_sums_rows)(const void *v, const void *y, const void *dy, int64_t rows, int64_t ld,
                        int64_t nc, const void *cst, int64_t cs, int act, double *o1,
                        double *o2, double *o3);
  /* dx = da * (g - gm) + db * xh + dd;  dres = g (when dres != NULL) */
  void (*bwd_run)(const void *v, const void *y, const void *dy, void *dx, void *dres,
                  int64_t len, const void *cst, int64_t cs, int act);
  void (*bwd_rows)(const void *v, const void *y, const void *dy, void *dx, void *dres,
                   int64_t rows, int64_t ld, int64_t nc, const void *cst, int64_t cs, int act);
} bn_ukernels;

/* Tables, by dtype; NULL where an ISA has no kernel for that dtype (the driver falls back to
   the scalar table). */
const bn_ukernels *bn_ukernels_scalar(norma_dtype t);
const bn_ukernels *bn_ukernels_avx2(norma_dtype t);

#endif
