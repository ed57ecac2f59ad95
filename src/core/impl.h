/* impl.h - the interface between the checked public API and an implementation.  Two exist:
   bn_impl_ref (src/ref: scalar, double accumulation, the oracle) and bn_impl_cpu (src/cpu: the
   production kernels with their thread split and ISA dispatch).  Arguments arrive checked
   (sizes, NULLs, overlaps, finiteness); an implementation may still fail with OUT_OF_MEMORY,
   before writing anything. */
#ifndef NORMA_IMPL_H
#define NORMA_IMPL_H

#include "internal.h"
#include "norm_math.h"

typedef struct bn_impl {
  norma_status (*fwd_training)(const bn_problem *p, const void *x, const void *res,
                               const void *gamma, const void *beta, void *y, void *save_mean,
                               void *save_invstd, void *running_mean, void *running_var,
                               const norm_running_rule *run);
  norma_status (*fwd_inference)(const bn_problem *p, const void *x, const void *res,
                                const void *gamma, const void *beta, const void *mean,
                                const void *var, void *y);
  norma_status (*backward)(const bn_problem *p, const void *x, const void *y, const void *dy,
                           const void *gamma, const void *beta, const void *save_mean,
                           const void *save_invstd, void *dx, void *dres, void *dgamma,
                           void *dbeta);
  /* split API pieces; count/mean/m2 and the sums are double arrays of c */
  norma_status (*moments)(const bn_problem *p, const void *x, double *mean, double *m2);
  norma_status (*fwd_apply)(const bn_problem *p, const void *x, const void *res,
                            const void *gamma, const void *beta, const double *mean,
                            const double *invstd, void *y);
  norma_status (*bwd_reduce)(const bn_problem *p, const void *x, const void *y, const void *dy,
                             const void *gamma, const void *beta, const double *mean,
                             const double *invstd, double *sum_dy, double *sum_dy_xhat,
                             double *sum_xhat);
  norma_status (*bwd_apply)(const bn_problem *p, const void *x, const void *y, const void *dy,
                            const void *gamma, const void *beta, const double *mean,
                            const double *invstd, const double *sum_dy,
                            const double *sum_dy_xhat, const double *sum_xhat, int64_t count,
                            void *dx, void *dres);
  /* moments of one tile (count = rows > 0 per channel): value (r, j) at
     x[r * row_stride + j * channel_stride]; tile mean and m2 per channel, overwritten */
  norma_status (*moments_tile)(norma_dtype dt, int64_t rows, int64_t channels, const void *x,
                               int64_t row_stride, int64_t channel_stride, double *mean,
                               double *m2);
} bn_impl;

extern const bn_impl bn_impl_ref;
extern const bn_impl bn_impl_cpu;

void bn_cpu_query_plan(const bn_problem *p, int op, norma_bn_plan *out);

static inline const bn_impl *bn_impl_current(void) {
  return norma__use_reference() ? &bn_impl_ref : &bn_impl_cpu;
}

/* the x_hat offset rule (norm_math.h), under the name libnorma_mpi uses */
static inline double bn_xhat_offset(double sum_xhat, double count) {
  return norm_xhat_offset(sum_xhat, count);
}

#endif
