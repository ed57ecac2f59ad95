/* bn_split_api.c - the statistics / apply split of BatchNorm (see norma.h). */
#include <math.h>
#include <stdlib.h>

#include "check.h"
#include "convert.h"
#include "impl.h"

#define TRY(expr)                          \
  do {                                     \
    norma_status st_ = (expr);             \
    if (st_ != NORMA_OK) return st_;       \
  } while (0)

static size_t tbytes(const bn_problem *p) { return (size_t)p->total * p->esize; }
static size_t pbytes(const bn_problem *p) { return (size_t)p->c * norma__param_size(p->dt); }
static size_t dbytes(int64_t c) { return (size_t)c * sizeof(double); }

norma_status norma_bn_moments(const norma_bn_desc *d, const void *x, int64_t *count, double *mean,
                              double *m2) {
  static const char fn[] = "norma_bn_moments";
  bn_problem p;
  TRY(bn_check_desc(fn, d, 0, 0, &p));
  if (p.n > 0) TRY(bn_require(fn, "x", x));
  TRY(bn_require(fn, "count", count));
  TRY(bn_require(fn, "mean", mean));
  TRY(bn_require(fn, "m2", m2));
  const bn_region r[] = {
      {"x", p.n ? x : NULL, tbytes(&p), REGION_TENSOR_IN},
      {"count", count, (size_t)p.c * sizeof(int64_t), REGION_PARAM_OUT},
      {"mean", mean, dbytes(p.c), REGION_PARAM_OUT},
      {"m2", m2, dbytes(p.c), REGION_PARAM_OUT},
  };
  TRY(bn_check_overlaps(fn, r, 4));
  if (p.flags & NORMA_CHECK_FINITE && p.n > 0) TRY(bn_check_finite(fn, "x", p.dt, x, p.total));
  if (p.n == 0) {
    for (int64_t j = 0; j < p.c; j++) count[j] = 0, mean[j] = 0.0, m2[j] = 0.0;
    return NORMA_OK;
  }
  const norm_geom g = norm_geom_bn(&p);
  const norm_fwd_args a = {.x = x, .mean_out = mean, .m2_out = m2};
  TRY(norm_impl_current()->forward(&g, NORM_FWD_MOMENTS, &a));
  for (int64_t j = 0; j < p.c; j++) count[j] = p.m;
  return NORMA_OK;
}

/* Chan et al.'s pairwise update of (count, mean, m2) by another set (cb, mb, m2b). */
static void chan_merge(int64_t *ca, double *ma, double *m2a, int64_t cb, double mb, double m2b) {
  if (cb == 0) return;
  if (*ca == 0) {
    *ca = cb, *ma = mb, *m2a = m2b;
    return;
  }
  double na = (double)*ca, nb = (double)cb, n = na + nb;
  double delta = mb - *ma;
  *ma += delta * (nb / n);
  *m2a += m2b + delta * delta * (na * nb / n);
  *ca += cb;
}

static int valid_dtype(norma_dtype t) {
  return t == NORMA_F32 || t == NORMA_F64 || t == NORMA_F16 || t == NORMA_BF16;
}

norma_status norma_bn_moments_accumulate(norma_dtype dtype, int64_t rows, int64_t channels,
                                         const void *x, int64_t row_stride,
                                         int64_t channel_stride, int64_t *count, double *mean,
                                         double *m2) {
  static const char fn[] = "norma_bn_moments_accumulate";
  const norma_status bad = NORMA_ERR_INVALID_ARGUMENT;
  if (!valid_dtype(dtype))
    return norma__fail(bad, "%s: dtype is not a norma_dtype (got %d)", fn, (int)dtype);
  if (rows < 0) return norma__fail(bad, "%s: rows must be >= 0 (got %lld)", fn, (long long)rows);
  if (channels <= 0)
    return norma__fail(bad, "%s: channels must be > 0 (got %lld)", fn, (long long)channels);
  if (row_stride < 0 || channel_stride < 0)
    return norma__fail(bad, "%s: strides must be >= 0 (got row_stride %lld, channel_stride %lld)",
                       fn, (long long)row_stride, (long long)channel_stride);
  int64_t last = 0, t1, t2;
  if (rows > 0 && (__builtin_mul_overflow(rows - 1, row_stride, &t1) ||
                   __builtin_mul_overflow(channels - 1, channel_stride, &t2) ||
                   __builtin_add_overflow(t1, t2, &last) ||
                   (uint64_t)last > (uint64_t)PTRDIFF_MAX / 8))
    return norma__fail(bad, "%s: the tile extent overflows (rows = %lld, row_stride = %lld, "
                       "channels = %lld, channel_stride = %lld)", fn, (long long)rows,
                       (long long)row_stride, (long long)channels, (long long)channel_stride);
  if (rows > 0) TRY(bn_require(fn, "x", x));
  TRY(bn_require(fn, "count", count));
  TRY(bn_require(fn, "mean", mean));
  TRY(bn_require(fn, "m2", m2));
  /* channels arrays of 8 bytes: channels <= the tile extent + 1 when rows > 0; bound it for
     rows == 0 too, before the byte counts below are formed */
  if ((uint64_t)channels > (uint64_t)PTRDIFF_MAX / 8)
    return norma__fail(bad, "%s: channels is too large (%lld)", fn, (long long)channels);
  const size_t es = norma__dtype_size(dtype);
  const bn_region r[] = {
      {"x", rows > 0 ? x : NULL, rows > 0 ? (size_t)(last + 1) * es : 0, REGION_TENSOR_IN},
      {"count", count, (size_t)channels * sizeof(int64_t), REGION_PARAM_OUT},
      {"mean", mean, dbytes(channels), REGION_PARAM_OUT},
      {"m2", m2, dbytes(channels), REGION_PARAM_OUT},
  };
  TRY(bn_check_overlaps(fn, r, 4));
  for (int64_t j = 0; j < channels; j++) {
    if (count[j] < 0)
      return norma__fail(bad, "%s: count[%lld] is negative (%lld)", fn, (long long)j,
                         (long long)count[j]);
    if (count[j] > INT64_MAX - rows)
      return norma__fail(bad, "%s: count[%lld] + rows overflows int64 (%lld + %lld)", fn,
                         (long long)j, (long long)count[j], (long long)rows);
  }
  if (rows == 0) return NORMA_OK;
  /* the tile's own moments (a small scratch), then Chan's merge into the running ones */
  enum { CHUNK = 256 };
  double tm[CHUNK], tm2[CHUNK];
  for (int64_t j0 = 0; j0 < channels; j0 += CHUNK) {
    const int64_t nc = channels - j0 < CHUNK ? channels - j0 : CHUNK;
    TRY(norm_impl_current()->moments_tile(dtype, rows, nc,
                                        (const char *)x + (size_t)(j0 * channel_stride) * es,
                                        row_stride, channel_stride, tm, tm2));
    for (int64_t j = 0; j < nc; j++)
      chan_merge(&count[j0 + j], &mean[j0 + j], &m2[j0 + j], rows, tm[j], tm2[j]);
  }
  return NORMA_OK;
}

norma_status norma_bn_moments_merge(int64_t c, int64_t *count_a, double *mean_a, double *m2_a,
                                    const int64_t *count_b, const double *mean_b,
                                    const double *m2_b) {
  static const char fn[] = "norma_bn_moments_merge";
  if (c <= 0)
    return norma__fail(NORMA_ERR_INVALID_ARGUMENT, "%s: c must be > 0 (got %lld)", fn,
                       (long long)c);
  TRY(bn_require(fn, "count_a", count_a));
  TRY(bn_require(fn, "mean_a", mean_a));
  TRY(bn_require(fn, "m2_a", m2_a));
  TRY(bn_require(fn, "count_b", count_b));
  TRY(bn_require(fn, "mean_b", mean_b));
  TRY(bn_require(fn, "m2_b", m2_b));
  if ((uint64_t)c > (uint64_t)PTRDIFF_MAX / 8)
    return norma__fail(NORMA_ERR_INVALID_ARGUMENT, "%s: c is too large (%lld)", fn, (long long)c);
  const bn_region r[] = {
      {"count_a", count_a, (size_t)c * sizeof(int64_t), REGION_PARAM_OUT},
      {"mean_a", mean_a, dbytes(c), REGION_PARAM_OUT},
      {"m2_a", m2_a, dbytes(c), REGION_PARAM_OUT},
      {"count_b", count_b, (size_t)c * sizeof(int64_t), REGION_PARAM_IN},
      {"mean_b", mean_b, dbytes(c), REGION_PARAM_IN},
      {"m2_b", m2_b, dbytes(c), REGION_PARAM_IN},
  };
  TRY(bn_check_overlaps(fn, r, 6));
  for (int64_t j = 0; j < c; j++) {
    if (count_a[j] < 0 || count_b[j] < 0)
      return norma__fail(NORMA_ERR_INVALID_ARGUMENT, "%s: negative count in channel %lld", fn,
                         (long long)j);
    if (count_a[j] > INT64_MAX - count_b[j])
      return norma__fail(NORMA_ERR_INVALID_ARGUMENT,
                         "%s: count_a[%lld] + count_b[%lld] overflows int64 (%lld + %lld)", fn,
                         (long long)j, (long long)j, (long long)count_a[j],
                         (long long)count_b[j]);
  }
  for (int64_t j = 0; j < c; j++)
    chan_merge(&count_a[j], &mean_a[j], &m2_a[j], count_b[j], mean_b[j], m2_b[j]);
  return NORMA_OK;
}

norma_status norma_bn_stats_from_moments(const norma_bn_desc *d, const int64_t *count,
                                         const double *mean, const double *m2, double *mean_out,
                                         double *invstd_out, void *save_mean, void *save_invstd,
                                         void *running_mean, void *running_var,
                                         double momentum) {
  static const char fn[] = "norma_bn_stats_from_moments";
  const norma_status bad = NORMA_ERR_INVALID_ARGUMENT;
  if (!d) return norma__fail(bad, "%s: d (the descriptor) must not be NULL", fn);
  /* only c, dtype, eps and flags are read: check those */
  norma_bn_desc dd = *d;
  dd.n = 1, dd.spatial = 1, dd.layout = NORMA_CHANNELS_FIRST;
  bn_problem p;
  TRY(bn_check_desc(fn, &dd, 1, 0, &p));
  TRY(bn_require(fn, "count", count));
  TRY(bn_require(fn, "mean", mean));
  TRY(bn_require(fn, "m2", m2));
  TRY(bn_require(fn, "mean_out", mean_out));
  TRY(bn_require(fn, "invstd_out", invstd_out));
  if ((running_mean || running_var) && !(momentum >= 0.0 && momentum <= 1.0))
    return norma__fail(bad, "%s: momentum must be in [0, 1] (got %g)", fn, momentum);
  for (int64_t j = 0; j < p.c; j++)
    if (count[j] < 2)
      return norma__fail(bad, "%s: expected more than 1 value per channel when training, got "
                         "count[%lld] = %lld", fn, (long long)j, (long long)count[j]);
  const size_t pb = pbytes(&p);
  const bn_region r[] = {
      {"count", count, (size_t)p.c * sizeof(int64_t), REGION_PARAM_IN},
      {"mean", mean, dbytes(p.c), REGION_PARAM_IN},
      {"m2", m2, dbytes(p.c), REGION_PARAM_IN},
      {"mean_out", mean_out, dbytes(p.c), REGION_PARAM_OUT},
      {"invstd_out", invstd_out, dbytes(p.c), REGION_PARAM_OUT},
      {"save_mean", save_mean, pb, REGION_PARAM_OUT},
      {"save_invstd", save_invstd, pb, REGION_PARAM_OUT},
      {"running_mean", running_mean, pb, REGION_PARAM_OUT},
      {"running_var", running_var, pb, REGION_PARAM_OUT},
  };
  TRY(bn_check_overlaps(fn, r, (int)(sizeof r / sizeof r[0])));
  if ((p.flags & NORMA_BN_COUNT_WEIGHTED) && (running_mean || running_var))
    return norma__fail(NORMA_ERR_INVALID_ARGUMENT, "%s: NORMA_BN_COUNT_WEIGHTED needs the running "
                       "count: pass running_mean = running_var = NULL here and call "
                       "norma_bn_running_update", fn);
  const norm_running_rule run = norm_running_rule_make(p.flags, momentum, 0.0, NULL, NULL);
  for (int64_t j = 0; j < p.c; j++) {
    const double cnt = (double)count[j], mu = mean[j];
    const double var = m2[j] > 0.0 ? m2[j] / cnt : 0.0;
    const double is = norm_invstd(var, p.eps);
    mean_out[j] = mu;
    invstd_out[j] = is;
    if (save_mean) norma__param_store(p.dt, save_mean, j, mu);
    if (save_invstd) norma__param_store(p.dt, save_invstd, j, is);
    norm_running_apply(&run, p.dt, running_mean, running_var, j, mu, var, cnt);
  }
  return NORMA_OK;
}

norma_status norma_bn_forward_apply(const norma_bn_desc *d, const void *x, const void *residual,
                                    const void *gamma, const void *beta, const double *mean,
                                    const double *invstd, void *y) {
  static const char fn[] = "norma_bn_forward_apply";
  bn_problem p;
  TRY(bn_check_desc(fn, d, 0, 0, &p));
  TRY(bn_require(fn, "mean", mean));
  TRY(bn_require(fn, "invstd", invstd));
  if (p.n > 0) {
    TRY(bn_require(fn, "x", x));
    TRY(bn_require(fn, "y", y));
  }
  if (p.act != BN_ACT_ADD_RELU) residual = NULL;
  else if (p.n > 0) TRY(bn_require(fn, "residual (required with NORMA_BN_ADD_RELU)", residual));
  if (p.n == 0) return NORMA_OK;
  const bn_region r[] = {
      {"x", x, tbytes(&p), REGION_TENSOR_IN},
      {"residual", residual, tbytes(&p), REGION_TENSOR_IN},
      {"gamma", gamma, pbytes(&p), REGION_PARAM_IN},
      {"beta", beta, pbytes(&p), REGION_PARAM_IN},
      {"mean", mean, dbytes(p.c), REGION_PARAM_IN},
      {"invstd", invstd, dbytes(p.c), REGION_PARAM_IN},
      {"y", y, tbytes(&p), REGION_TENSOR_OUT},
  };
  TRY(bn_check_overlaps(fn, r, (int)(sizeof r / sizeof r[0])));
  if (p.flags & NORMA_CHECK_FINITE) {
    TRY(bn_check_finite(fn, "x", p.dt, x, p.total));
    TRY(bn_check_finite(fn, "residual", p.dt, residual, p.total));
    TRY(bn_check_finite_param(fn, "gamma", p.dt, gamma, p.c));
    TRY(bn_check_finite_param(fn, "beta", p.dt, beta, p.c));
  }
  const norm_geom g = norm_geom_bn(&p);
  const norm_fwd_args a = {.x = x, .res = residual, .gamma = gamma, .beta = beta, .y = y,
                           .mean_d = mean, .invstd_d = invstd};
  return norm_impl_current()->forward(&g, NORM_FWD_APPLY, &a);
}

/* Shared checks of backward_reduce / backward_apply: which of x / y are needed. */
static norma_status check_bwd_inputs(const char *fn, const bn_problem *p, const void **x,
                                     const void **y, const void *dy, const void *gamma) {
  TRY(bn_require(fn, "dy", dy));
  if (p->act != BN_ACT_NONE) {
    TRY(bn_require(fn, "x (required with NORMA_BN_RELU / NORMA_BN_ADD_RELU)", *x));
    TRY(bn_require(fn, "y (required with NORMA_BN_RELU / NORMA_BN_ADD_RELU: the mask is y > 0)",
                   *y));
  } else if (!*x) {
    TRY(bn_require(fn, "y (required when x is NULL: x_hat is recovered from y)", *y));
    if (gamma)
      for (int64_t ch = 0; ch < p->c; ch++)
        if (norma__param(p->dt, gamma, ch, 1.0) == 0.0)
          return norma__fail(NORMA_ERR_INVALID_ARGUMENT,
                             "%s: gamma[%lld] is 0: x_hat cannot be recovered from y when x is "
                             "NULL; pass x", fn, (long long)ch);
  } else {
    *y = NULL;
  }
  return NORMA_OK;
}

norma_status norma_bn_backward_reduce(const norma_bn_desc *d, const void *x, const void *y,
                                      const void *dy, const void *gamma, const void *beta,
                                      const double *mean, const double *invstd, double *sum_dy,
                                      double *sum_dy_xhat, double *sum_xhat) {
  static const char fn[] = "norma_bn_backward_reduce";
  bn_problem p;
  TRY(bn_check_desc(fn, d, 0, 0, &p));
  TRY(bn_require(fn, "mean", mean));
  TRY(bn_require(fn, "invstd", invstd));
  TRY(bn_require(fn, "sum_dy", sum_dy));
  TRY(bn_require(fn, "sum_dy_xhat", sum_dy_xhat));
  if (p.n > 0) TRY(check_bwd_inputs(fn, &p, &x, &y, dy, gamma));
  const int tensors = p.n > 0;
  const bn_region r[] = {
      {"x", tensors ? x : NULL, tbytes(&p), REGION_TENSOR_IN},
      {"y", tensors ? y : NULL, tbytes(&p), REGION_TENSOR_IN},
      {"dy", tensors ? dy : NULL, tbytes(&p), REGION_TENSOR_IN},
      {"mean", mean, dbytes(p.c), REGION_PARAM_IN},
      {"invstd", invstd, dbytes(p.c), REGION_PARAM_IN},
      {"gamma", gamma, pbytes(&p), REGION_PARAM_IN},
      {"beta", beta, pbytes(&p), REGION_PARAM_IN},
      {"sum_dy", sum_dy, dbytes(p.c), REGION_PARAM_OUT},
      {"sum_dy_xhat", sum_dy_xhat, dbytes(p.c), REGION_PARAM_OUT},
      {"sum_xhat", sum_xhat, dbytes(p.c), REGION_PARAM_OUT},
  };
  TRY(bn_check_overlaps(fn, r, (int)(sizeof r / sizeof r[0])));
  if (p.n == 0) {
    for (int64_t j = 0; j < p.c; j++) {
      sum_dy[j] = 0.0, sum_dy_xhat[j] = 0.0;
      if (sum_xhat) sum_xhat[j] = 0.0;
    }
    return NORMA_OK;
  }
  if (p.flags & NORMA_CHECK_FINITE) {
    TRY(bn_check_finite(fn, "x", p.dt, x, p.total));
    TRY(bn_check_finite(fn, "y", p.dt, y, p.total));
    TRY(bn_check_finite(fn, "dy", p.dt, dy, p.total));
  }
  const norm_geom g = norm_geom_bn(&p);
  const norm_bwd_args a = {.x = x, .y = y, .dy = dy, .gamma = gamma, .beta = beta,
                           .mean_d = mean, .invstd_d = invstd, .o_dy = sum_dy,
                           .o_dy_xhat = sum_dy_xhat, .o_xhat = sum_xhat};
  return norm_impl_current()->backward(&g, NORM_BWD_REDUCE, &a);
}

norma_status norma_bn_backward_apply(const norma_bn_desc *d, const void *x, const void *y,
                                     const void *dy, const void *gamma, const void *beta,
                                     const double *mean, const double *invstd,
                                     const double *sum_dy, const double *sum_dy_xhat,
                                     const double *sum_xhat, int64_t count, void *dx,
                                     void *dresidual) {
  static const char fn[] = "norma_bn_backward_apply";
  bn_problem p;
  TRY(bn_check_desc(fn, d, 0, 0, &p));
  TRY(bn_require(fn, "mean", mean));
  TRY(bn_require(fn, "invstd", invstd));
  const int global = (p.flags & NORMA_BN_GLOBAL_STATS) != 0;
  if (!global) {
    TRY(bn_require(fn, "sum_dy", sum_dy));
    TRY(bn_require(fn, "sum_dy_xhat", sum_dy_xhat));
    if (count < 1)
      return norma__fail(NORMA_ERR_INVALID_ARGUMENT, "%s: count must be >= 1 (got %lld)", fn,
                         (long long)count);
  }
  if (p.n == 0) return NORMA_OK;
  TRY(check_bwd_inputs(fn, &p, &x, &y, dy, gamma));
  TRY(bn_require(fn, "dx", dx));
  if (p.act != BN_ACT_ADD_RELU) dresidual = NULL;
  const bn_region r[] = {
      {"x", x, tbytes(&p), REGION_TENSOR_IN},
      {"y", y, tbytes(&p), REGION_TENSOR_IN},
      {"dy", dy, tbytes(&p), REGION_TENSOR_IN},
      {"gamma", gamma, pbytes(&p), REGION_PARAM_IN},
      {"beta", beta, pbytes(&p), REGION_PARAM_IN},
      {"mean", mean, dbytes(p.c), REGION_PARAM_IN},
      {"invstd", invstd, dbytes(p.c), REGION_PARAM_IN},
      {"sum_dy", sum_dy, dbytes(p.c), REGION_PARAM_IN},
      {"sum_dy_xhat", sum_dy_xhat, dbytes(p.c), REGION_PARAM_IN},
      {"sum_xhat", sum_xhat, dbytes(p.c), REGION_PARAM_IN},
      {"dx", dx, tbytes(&p), REGION_TENSOR_OUT},
      {"dresidual", dresidual, tbytes(&p), REGION_TENSOR_OUT},
  };
  TRY(bn_check_overlaps(fn, r, (int)(sizeof r / sizeof r[0])));
  if (p.flags & NORMA_CHECK_FINITE) {
    TRY(bn_check_finite(fn, "x", p.dt, x, p.total));
    TRY(bn_check_finite(fn, "y", p.dt, y, p.total));
    TRY(bn_check_finite(fn, "dy", p.dt, dy, p.total));
  }
  const norm_geom g = norm_geom_bn(&p);
  const norm_bwd_args a = {.x = x, .y = y, .dy = dy, .gamma = gamma, .beta = beta,
                           .mean_d = mean, .invstd_d = invstd, .sum_dy = sum_dy,
                           .sum_dy_xhat = sum_dy_xhat, .sum_xhat = global ? NULL : sum_xhat,
                           .count = count, .dx = dx, .dres = dresidual};
  return norm_impl_current()->backward(&g, NORM_BWD_APPLY, &a);
}

norma_status norma_bn_param_grads(const norma_bn_desc *d, const double *sum_dy,
                                  const double *sum_dy_xhat, const double *sum_xhat,
                                  int64_t count, void *dgamma, void *dbeta) {
  static const char fn[] = "norma_bn_param_grads";
  if (!d)
    return norma__fail(NORMA_ERR_INVALID_ARGUMENT, "%s: d (the descriptor) must not be NULL", fn);
  norma_bn_desc dd = *d;
  dd.n = 1, dd.spatial = 1, dd.layout = NORMA_CHANNELS_FIRST;
  bn_problem p;
  TRY(bn_check_desc(fn, &dd, 1, 0, &p));
  TRY(bn_require(fn, "sum_dy", sum_dy));
  TRY(bn_require(fn, "sum_dy_xhat", sum_dy_xhat));
  const int global = (p.flags & NORMA_BN_GLOBAL_STATS) != 0;
  if (sum_xhat && !global && count < 1)
    return norma__fail(NORMA_ERR_INVALID_ARGUMENT, "%s: count must be >= 1 (got %lld)", fn,
                       (long long)count);
  const bn_region r[] = {
      {"sum_dy", sum_dy, dbytes(p.c), REGION_PARAM_IN},
      {"sum_dy_xhat", sum_dy_xhat, dbytes(p.c), REGION_PARAM_IN},
      {"sum_xhat", sum_xhat, dbytes(p.c), REGION_PARAM_IN},
      {"dgamma", dgamma, pbytes(&p), REGION_PARAM_OUT},
      {"dbeta", dbeta, pbytes(&p), REGION_PARAM_OUT},
  };
  TRY(bn_check_overlaps(fn, r, 5));
  for (int64_t j = 0; j < p.c; j++) {
    double s = (sum_xhat && !global) ? sum_xhat[j] / (double)count : 0.0;
    if (dgamma) norma__param_store(p.dt, dgamma, j, sum_dy_xhat[j] - s * sum_dy[j]);
    if (dbeta) norma__param_store(p.dt, dbeta, j, sum_dy[j]);
  }
  return NORMA_OK;
}
