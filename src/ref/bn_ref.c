/* bn_ref.c - reference BatchNorm kernels: scalar loops, double arithmetic, one channel at a
   time.  They are the oracle the production kernels are tested against, so they favour being
   obviously right over being fast.  Variance by the corrected two-pass algorithm (mean, then
   sums of deviations with the rounding of the mean removed). */
#include <math.h>

#include "impl.h"

#define FOR_EACH_VALUE(p, ch, i)                          \
  for (int64_t n_ = 0; n_ < (p)->n; n_++)                 \
    for (int64_t s_ = 0, i = bn_index((p), n_, (ch), 0); s_ < (p)->s; \
         s_++, i = bn_index((p), n_, (ch), s_))

static double activate(const bn_problem *p, const void *res, int64_t i, double v) {
  if (p->act == BN_ACT_ADD_RELU) v += norma__load(p->dt, res, i);
  if (p->act != BN_ACT_NONE) v = v > 0.0 ? v : (v != v ? v : 0.0); /* NaN propagates */
  return v;
}

/* mean (as hi + lo: the mean of f64 data needs the bits below its last place when it is 1e8
   times the spread) and biased variance of channel ch */
static void channel_moments(const bn_problem *p, const void *x, int64_t ch, double *mean,
                            double *mean_lo, double *var) {
  double s = 0.0;
  FOR_EACH_VALUE(p, ch, i) s += norma__load(p->dt, x, i);
  const double m = (double)p->m, m0 = s / m;
  double d1 = 0.0, d2 = 0.0;
  FOR_EACH_VALUE(p, ch, i) {
    double v = norma__load(p->dt, x, i) - m0;
    d1 += v;
    d2 += v * v;
  }
  const double b = d1 / m, hi = m0 + b, bb = hi - m0; /* TwoSum */
  *mean = hi;
  *mean_lo = (m0 - (hi - bb)) + (b - bb);
  double v = (d2 - d1 * d1 / m) / m;
  *var = v > 0.0 ? v : (v != v ? v : 0.0);
}

static void normalize_channel(const bn_problem *p, const void *x, const void *res, int64_t ch,
                              double mean, double mean_lo, double invstd, double g, double b,
                              void *y) {
  FOR_EACH_VALUE(p, ch, i) {
    double v = ((norma__load(p->dt, x, i) - mean) - mean_lo) * invstd * g + b;
    norma__store(p->dt, y, i, activate(p, res, i, v));
  }
}

static norma_status ref_fwd_training(const bn_problem *p, const void *x, const void *res,
                                     const void *gamma, const void *beta, void *y,
                                     void *save_mean, void *save_invstd, void *running_mean,
                                     void *running_var, const norm_running_rule *run) {
  for (int64_t ch = 0; ch < p->c; ch++) {
    double mean, mlo, var;
    channel_moments(p, x, ch, &mean, &mlo, &var);
    const double is = norm_invstd(var, p->eps);
    normalize_channel(p, x, res, ch, mean, mlo, is, norma__param(p->dt, gamma, ch, 1.0),
                      norma__param(p->dt, beta, ch, 0.0), y);
    if (save_mean) norma__param_store(p->dt, save_mean, ch, mean);
    if (save_invstd) norma__param_store(p->dt, save_invstd, ch, is);
    norm_running_apply(run, p->dt, running_mean, running_var, ch, mean, var, (double)p->m);
  }
  return NORMA_OK;
}

static norma_status ref_fwd_inference(const bn_problem *p, const void *x, const void *res,
                                      const void *gamma, const void *beta, const void *mean,
                                      const void *var, void *y) {
  for (int64_t ch = 0; ch < p->c; ch++) {
    double is = 1.0 / sqrt(norma__param(p->dt, var, ch, 0) + p->eps);
    normalize_channel(p, x, res, ch, norma__param(p->dt, mean, ch, 0), 0.0, is,
                      norma__param(p->dt, gamma, ch, 1.0), norma__param(p->dt, beta, ch, 0.0), y);
  }
  return NORMA_OK;
}

static norma_status ref_moments(const bn_problem *p, const void *x, double *mean, double *m2) {
  for (int64_t ch = 0; ch < p->c; ch++) {
    double v, lo;
    channel_moments(p, x, ch, &mean[ch], &lo, &v);
    m2[ch] = v * (double)p->m;
  }
  return NORMA_OK;
}

static norma_status ref_fwd_apply(const bn_problem *p, const void *x, const void *res,
                                  const void *gamma, const void *beta, const double *mean,
                                  const double *invstd, void *y) {
  for (int64_t ch = 0; ch < p->c; ch++)
    normalize_channel(p, x, res, ch, mean[ch], 0.0, invstd[ch], norma__param(p->dt, gamma, ch, 1.0),
                      norma__param(p->dt, beta, ch, 0.0), y);
  return NORMA_OK;
}

/* ---- backward ---- */

/* The gradient reaching the normalization: dy, masked by y > 0 with an activation. */
static double masked_dy(const bn_problem *p, const void *y, const void *dy, int64_t i) {
  double g = norma__load(p->dt, dy, i);
  if (p->act != BN_ACT_NONE && !(norma__load(p->dt, y, i) > 0.0)) g = 0.0;
  return g;
}

/* x_hat of value i: from x with the given statistics, or recovered from y. */
static double xhat_of(const bn_problem *p, const void *x, const void *y, int64_t i, double mean,
                      double invstd, double g, double b) {
  if (x) return (norma__load(p->dt, x, i) - mean) * invstd;
  return (norma__load(p->dt, y, i) - b) / g;
}

static void channel_sums(const bn_problem *p, const void *x, const void *y, const void *dy,
                         int64_t ch, double mean, double invstd, double g, double b,
                         double *sg, double *sgx, double *sx) {
  double a = 0.0, ax = 0.0, xs = 0.0;
  FOR_EACH_VALUE(p, ch, i) {
    double gi = masked_dy(p, y, dy, i), xh = xhat_of(p, x, y, i, mean, invstd, g, b);
    a += gi;
    ax += gi * xh;
    xs += xh;
  }
  *sg = a, *sgx = ax, *sx = xs;
}

/* dx (and dresidual) of channel ch from the channel's sums; s is the x_hat offset removed. */
static void channel_dx(const bn_problem *p, const void *x, const void *y, const void *dy,
                       int64_t ch, double mean, double invstd, double g, double b, double sg,
                       double sgx_corrected, double s, double count, void *dx, void *dres) {
  const int global = (p->flags & NORMA_BN_GLOBAL_STATS) != 0;
  const double k = g * invstd;
  FOR_EACH_VALUE(p, ch, i) {
    double gi = masked_dy(p, y, dy, i);
    double v = k * gi;
    if (!global) {
      double xh = xhat_of(p, x, y, i, mean, invstd, g, b) - s;
      v = k * (gi - sg / count - xh * sgx_corrected / count);
    }
    if (dres) norma__store(p->dt, dres, i, gi);
    norma__store(p->dt, dx, i, v);
  }
}

static norma_status ref_backward(const bn_problem *p, const void *x, const void *y,
                                 const void *dy, const void *gamma, const void *beta,
                                 const void *save_mean, const void *save_invstd, void *dx,
                                 void *dres, void *dgamma, void *dbeta) {
  const int global = (p->flags & NORMA_BN_GLOBAL_STATS) != 0;
  for (int64_t ch = 0; ch < p->c; ch++) {
    double mean = norma__param(p->dt, save_mean, ch, 0), is = norma__param(p->dt, save_invstd, ch, 0);
    double g = norma__param(p->dt, gamma, ch, 1.0), b = norma__param(p->dt, beta, ch, 0.0);
    double sg, sgx, sx;
    channel_sums(p, x, y, dy, ch, mean, is, g, b, &sg, &sgx, &sx);
    double s = (x && !global) ? bn_xhat_offset(sx, (double)p->m) : 0.0;
    double S = sgx - s * sg;
    channel_dx(p, x, y, dy, ch, mean, is, g, b, sg, S, s, (double)p->m, dx, dres);
    if (dgamma) norma__param_store(p->dt, dgamma, ch, S);
    if (dbeta) norma__param_store(p->dt, dbeta, ch, sg);
  }
  return NORMA_OK;
}

static norma_status ref_bwd_reduce(const bn_problem *p, const void *x, const void *y,
                                   const void *dy, const void *gamma, const void *beta,
                                   const double *mean, const double *invstd, double *sum_dy,
                                   double *sum_dy_xhat, double *sum_xhat) {
  for (int64_t ch = 0; ch < p->c; ch++) {
    double sx;
    channel_sums(p, x, y, dy, ch, mean[ch], invstd[ch], norma__param(p->dt, gamma, ch, 1.0),
                 norma__param(p->dt, beta, ch, 0.0), &sum_dy[ch], &sum_dy_xhat[ch], &sx);
    if (sum_xhat) sum_xhat[ch] = sx;
  }
  return NORMA_OK;
}

static norma_status ref_bwd_apply(const bn_problem *p, const void *x, const void *y,
                                  const void *dy, const void *gamma, const void *beta,
                                  const double *mean, const double *invstd, const double *sum_dy,
                                  const double *sum_dy_xhat, const double *sum_xhat,
                                  int64_t count, void *dx, void *dres) {
  const int global = (p->flags & NORMA_BN_GLOBAL_STATS) != 0;
  for (int64_t ch = 0; ch < p->c; ch++) {
    double sg = global ? 0.0 : sum_dy[ch], sgx = global ? 0.0 : sum_dy_xhat[ch];
    double s = (!global && sum_xhat) ? sum_xhat[ch] / (double)count : 0.0;
    channel_dx(p, x, y, dy, ch, mean[ch], invstd[ch], norma__param(p->dt, gamma, ch, 1.0),
               norma__param(p->dt, beta, ch, 0.0), sg, sgx - s * sg, s,
               global ? 1.0 : (double)count, dx, dres);
  }
  return NORMA_OK;
}

static norma_status ref_moments_tile(norma_dtype dt, int64_t rows, int64_t channels,
                                     const void *x, int64_t row_stride, int64_t channel_stride,
                                     double *mean, double *m2) {
  for (int64_t j = 0; j < channels; j++) {
    const int64_t base = j * channel_stride;
    double s = 0.0;
    for (int64_t r = 0; r < rows; r++) s += norma__load(dt, x, base + r * row_stride);
    const double m0 = s / (double)rows;
    double d1 = 0.0, d2 = 0.0;
    for (int64_t r = 0; r < rows; r++) {
      double v = norma__load(dt, x, base + r * row_stride) - m0;
      d1 += v;
      d2 += v * v;
    }
    mean[j] = m0 + d1 / (double)rows;
    double v = d2 - d1 * d1 / (double)rows;
    m2[j] = v > 0.0 ? v : (v != v ? v : 0.0);
  }
  return NORMA_OK;
}

const bn_impl bn_impl_ref = {
    ref_fwd_training, ref_fwd_inference, ref_backward,     ref_moments,
    ref_fwd_apply,    ref_bwd_reduce,    ref_bwd_apply,    ref_moments_tile,
};
