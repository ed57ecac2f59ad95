/* impl.h - the interface between the checked public API and an implementation.  Two exist:
   norm_impl_ref (src/ref: scalar, double arithmetic, the oracle) and norm_impl_cpu (src/cpu: the
   engine with its thread split and ISA dispatch).  Arguments arrive checked (sizes, NULLs,
   overlaps, finiteness); an implementation may still fail with OUT_OF_MEMORY, before writing
   anything.  Every op of every norm goes through the same two calls, described by its
   geometry (geom.h) and the arguments below. */
#ifndef NORMA_IMPL_H
#define NORMA_IMPL_H

#include "geom.h"
#include "internal.h"
#include "norm_math.h"

/* What a forward call computes. */
typedef enum norm_fwd_mode {
  NORM_FWD_TRAINING = 0,  /* statistics of the batch, apply, save_*, running statistics */
  NORM_FWD_INFERENCE = 1, /* apply with given per-channel mean_in / var_in (BN, IN eval) */
  NORM_FWD_APPLY = 2,     /* apply with given per-group mean_d / invstd_d (split API) */
  NORM_FWD_MOMENTS = 3    /* per-group moments mean_out / m2_out only (split API) */
} norm_fwd_mode;

typedef struct norm_fwd_args {
  const void *x, *res;          /* res: BN's ADD_RELU residual, or LN/RMS's residual input */
  const void *gamma, *beta;     /* [c], parameter type; NULL: 1 and 0 */
  void *y, *sum;                /* sum: LN/RMS's x + residual output (may be NULL) */
  void *save_mean, *save_invstd;/* [groups], parameter type, may be NULL (RMS: save_invstd) */
  void *running_mean, *running_var; /* [c], BN / IN training; may be NULL */
  const norm_running_rule *run;
  const void *mean_in, *var_in; /* [c], parameter type: inference */
  const double *mean_d, *invstd_d; /* [groups]: split apply */
  double *mean_out, *m2_out;    /* [groups]: moments */
} norm_fwd_args;

/* What a backward call computes. */
typedef enum norm_bwd_mode {
  NORM_BWD_FULL = 0,   /* dx (dres), dgamma, dbeta from save_mean / save_invstd */
  NORM_BWD_REDUCE = 1, /* per-group sums only (split API, BatchNorm) */
  NORM_BWD_APPLY = 2   /* dx (dres) from given sums (split API, BatchNorm) */
} norm_bwd_mode;

typedef struct norm_bwd_args {
  const void *x, *y, *dy, *dsum; /* x NULL (BN): x_hat from y; dsum: LN/RMS, added to dx */
  const void *gamma, *beta;
  const void *save_mean, *save_invstd; /* [groups], parameter type (RMS: save_invstd only) */
  const double *mean_d, *invstd_d;     /* split API: [groups] double */
  const double *sum_dy, *sum_dy_xhat, *sum_xhat; /* split apply: given sums */
  int64_t count;                       /* split apply: values per group of the sums */
  void *dx, *dres, *dgamma, *dbeta;
  double *o_dy, *o_dy_xhat, *o_xhat;   /* split reduce outputs */
} norm_bwd_args;

typedef struct norm_impl {
  norma_status (*forward)(const norm_geom *g, norm_fwd_mode mode, const norm_fwd_args *a);
  norma_status (*backward)(const norm_geom *g, norm_bwd_mode mode, const norm_bwd_args *a);
  /* moments of one tile (count = rows > 0 per channel): value (r, j) at
     x[r * row_stride + j * channel_stride]; tile mean and m2 per channel, overwritten */
  norma_status (*moments_tile)(norma_dtype dt, int64_t rows, int64_t channels, const void *x,
                               int64_t row_stride, int64_t channel_stride, double *mean,
                               double *m2);
} norm_impl;

extern const norm_impl norm_impl_ref;
extern const norm_impl norm_impl_cpu;

static inline const norm_impl *norm_impl_current(void) {
  return norma__use_reference() ? &norm_impl_ref : &norm_impl_cpu;
}

/* norma_bn_query_plan for the engine: the decisions a BatchNorm call would take.  op is a
   norma_bn_op. */
void norm_cpu_query_plan(const norm_geom *g, int op, norma_bn_plan *out);

/* the x_hat offset rule (norm_math.h), under the name libnorma_mpi uses */
static inline double bn_xhat_offset(double sum_xhat, double count) {
  return norm_xhat_offset(sum_xhat, count);
}

#endif
