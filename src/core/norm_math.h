/* norm_math.h - the numeric rules every normalization shares, each written once: the inverse
   standard deviation, the running-statistics update, Chan's merge of moments, the x_hat offset
   the backward removes.  The reference, the CPU engine, the split API and libnorma_mpi (through
   the public calls) all use these. */
#ifndef NORMA_NORM_MATH_H
#define NORMA_NORM_MATH_H

#include <math.h>
#include <stdint.h>

#include "internal.h"

/* invstd = 1 / sqrt(var + eps), eps inside the square root; 0 when var == eps == 0 (PyTorch's
   rule for a constant channel without eps: y = beta, dx = 0).  NaN propagates. */
static inline double norm_invstd(double var, double eps) {
  return (var == 0.0 && eps == 0.0) ? 0.0 : 1.0 / sqrt(var + eps);
}

/* The biased variance m2 / count, never below 0 (rounding of a merged m2); NaN passes. */
static inline double norm_var(double m2, double count) {
  const double v = m2 / count;
  return v < 0.0 ? 0.0 : v;
}

/* The running-statistics update (norma.h, norma_bn_running_update) reduced to weights:
   r = w_old * r + w_new * batch, the batch variance made unbiased unless `biased`. */
typedef struct norm_running_rule {
  double w_old, w_new;
  int biased;
} norm_running_rule;

/* The rule for a batch of `count` values per channel.  With NORMA_BN_COUNT_WEIGHTED in flags,
   *running_count is read and *count_out receives the new running count (the caller stores it
   once the call cannot fail any more); without, running_count may be NULL. */
static inline norm_running_rule norm_running_rule_make(unsigned flags, double momentum,
                                                       double count, const double *running_count,
                                                       double *count_out) {
  norm_running_rule r = {1.0 - momentum, momentum, (flags & NORMA_BN_BIASED_RUNNING_VAR) != 0};
  if ((flags & NORMA_BN_COUNT_WEIGHTED) && running_count) {
    const double n0 = *running_count, a = (1.0 - momentum) * n0, b = momentum * count;
    const double n1 = a + b;
    if (count_out) *count_out = n1;
    if (n1 > 0.0) r.w_old = a / n1, r.w_new = b / n1;
    else r.w_old = 1.0, r.w_new = 0.0; /* nothing seen yet, nothing learned */
  }
  return r;
}

/* Updates channel ch of running_mean / running_var (parameter type of dt; each may be NULL)
   with the batch mean and biased variance of `count` values. */
static inline void norm_running_apply(const norm_running_rule *r, norma_dtype dt,
                                      void *running_mean, void *running_var, int64_t ch,
                                      double mean, double var, double count) {
  if (running_mean)
    norma__param_store(dt, running_mean, ch,
                       r->w_old * norma__param(dt, running_mean, ch, 0) + r->w_new * mean);
  if (running_var) {
    const double v = r->biased ? var : var * count / (count - 1.0);
    norma__param_store(dt, running_var, ch,
                       r->w_old * norma__param(dt, running_var, ch, 0) + r->w_new * v);
  }
}

/* Chan et al.: the moments (count, mean, m2) of set a updated by set b; count 0 is the
   identity.  Counts are doubles here (the callers check int64 overflow). */
static inline void norm_chan_merge(double *na, double *ma, double *m2a, double nb, double mb,
                                   double m2b) {
  if (nb == 0.0) return;
  if (*na == 0.0) {
    *na = nb, *ma = mb, *m2a = m2b;
    return;
  }
  const double n = *na + nb, delta = mb - *ma;
  *ma += delta * (nb / n);
  *m2a += m2b + delta * delta * (*na * nb / n);
  *na = n;
}

/* The backward removes the offset of x_hat, s = sum(x_hat) / m, that rounding the mean to its
   storage type leaves (|s| is below ~1e-2 for f32 data with mean/std up to 1e6).  A larger
   offset means the saved mean is not the batch mean (statistics supplied by the caller): then
   it is taken as given, as PyTorch does. */
#define NORM_MEAN_CORRECTION_MAX 0.0625
static inline double norm_xhat_offset(double sum_xhat, double count) {
  const double s = sum_xhat / count;
  return (s <= NORM_MEAN_CORRECTION_MAX && s >= -NORM_MEAN_CORRECTION_MAX) ? s : 0.0;
}

/* a + b as an unevaluated sum hi + lo (Knuth's TwoSum): the mean of f64 data keeps the bits
   below its last place, which matter when the mean is 1e8 times the spread */
static inline void norm_two_sum(double a, double b, double *hi, double *lo) {
  const double s = a + b, bb = s - a;
  *hi = s;
  *lo = (a - (s - bb)) + (b - bb);
}

#endif
