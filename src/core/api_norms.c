/* api_norms.c - the public entry points of the norm family (LayerNorm, RMSNorm, GroupNorm,
   InstanceNorm): each checks its descriptor into a geometry (geom.h) and its arguments with the
   shared rules of check.c, then calls the implementation (reference or engine). */
#include <math.h>

#include "check.h"
#include "impl.h"
#include "trace.h"

#define TRY(expr)                          \
  do {                                     \
    norma_status st_ = (expr);             \
    if (st_ != NORMA_OK) return st_;       \
  } while (0)

static const norma_status BAD = NORMA_ERR_INVALID_ARGUMENT;

/* ---- descriptors -> geometry ------------------------------------------------------------ */

static norma_status check_common(const char *fn, norma_dtype dt, double eps, unsigned flags,
                                 unsigned allowed) {
  if (dt != NORMA_F32 && dt != NORMA_F64 && dt != NORMA_F16 && dt != NORMA_BF16)
    return norma__fail(BAD, "%s: d->dtype must be NORMA_F32, NORMA_F64, NORMA_F16 or NORMA_BF16 "
                       "(got %d)", fn, (int)dt);
  if (!(eps >= 0.0) || !isfinite(eps))
    return norma__fail(BAD, "%s: d->eps must be finite and >= 0 (got %g)", fn, eps);
  if (flags & ~allowed)
    return norma__fail(BAD, "%s: d->flags has bits this op does not take: 0x%x", fn,
                       flags & ~allowed);
  if ((flags & NORMA_RELU) && (flags & NORMA_SILU))
    return norma__fail(BAD, "%s: d->flags sets both NORMA_RELU and NORMA_SILU", fn);
  return NORMA_OK;
}

/* n, c, s >= 1 and the tensor's byte size representable */
static norma_status check_sizes(const char *fn, int64_t n, int64_t c, int64_t s, norma_dtype dt,
                                const char *nn, const char *cn, const char *sn) {
  if (n < 1) return norma__fail(BAD, "%s: d->%s must be >= 1 (got %lld)", fn, nn, (long long)n);
  if (c < 1) return norma__fail(BAD, "%s: d->%s must be >= 1 (got %lld)", fn, cn, (long long)c);
  if (s < 1) return norma__fail(BAD, "%s: d->%s must be >= 1 (got %lld)", fn, sn, (long long)s);
  int64_t t1, t2, bytes;
  if (__builtin_mul_overflow(n, c, &t1) || __builtin_mul_overflow(t1, s, &t2) ||
      __builtin_mul_overflow(t2, (int64_t)norma__dtype_size(dt), &bytes) ||
      bytes > NORMA_MAX_TENSOR_BYTES || (uint64_t)bytes > (uint64_t)SIZE_MAX)
    return norma__fail(BAD, "%s: the tensor's size overflows or exceeds NORMA_MAX_TENSOR_BYTES "
                       "(2^48) (%s = %lld, %s = %lld, %s = %lld)", fn, nn, (long long)n, cn,
                       (long long)c, sn, (long long)s);
  return NORMA_OK;
}

static norma_status check_layout(const char *fn, norma_layout l) {
  if (l != NORMA_CHANNELS_FIRST && l != NORMA_CHANNELS_LAST)
    return norma__fail(BAD, "%s: d->layout must be NORMA_CHANNELS_FIRST or NORMA_CHANNELS_LAST "
                       "(got %d)", fn, (int)l);
  return NORMA_OK;
}

static int act_of(unsigned flags) {
  return (flags & NORMA_SILU)   ? NORM_ACT_SILU
         : (flags & NORMA_RELU) ? NORM_ACT_RELU
                                : NORM_ACT_NONE;
}

static norma_status ln_geom(const char *fn, const norma_ln_desc *d, int rms, norm_geom *g) {
  if (!d) return norma__fail(BAD, "%s: d (the descriptor) must not be NULL", fn);
  TRY(check_sizes(fn, d->rows, d->d, 1, d->dtype, "rows", "d", "rows"));
  TRY(check_common(fn, d->dtype, d->eps, d->flags, NORMA_CHECK_FINITE));
  *g = (norm_geom){0};
  g->n = d->rows, g->c = d->d, g->s = 1, g->layout = NORMA_CHANNELS_LAST, g->dt = d->dtype;
  g->per_sample = 1, g->cpg = d->d, g->rms = rms, g->eps = d->eps, g->flags = d->flags;
  g->act = NORM_ACT_NONE;
  norm_geom_finish(g);
  return NORMA_OK;
}

static norma_status gn_geom(const char *fn, const norma_gn_desc *d, norm_geom *g) {
  if (!d) return norma__fail(BAD, "%s: d (the descriptor) must not be NULL", fn);
  TRY(check_sizes(fn, d->n, d->c, d->spatial, d->dtype, "n", "c", "spatial"));
  if (d->groups < 1 || d->c % d->groups != 0)
    return norma__fail(BAD, "%s: d->groups must be >= 1 and divide d->c (got groups = %lld, "
                       "c = %lld)", fn, (long long)d->groups, (long long)d->c);
  TRY(check_layout(fn, d->layout));
  TRY(check_common(fn, d->dtype, d->eps, d->flags, NORMA_RELU | NORMA_SILU | NORMA_CHECK_FINITE));
  *g = (norm_geom){0};
  g->n = d->n, g->c = d->c, g->s = d->spatial, g->layout = d->layout, g->dt = d->dtype;
  g->per_sample = 1, g->cpg = d->c / d->groups, g->eps = d->eps, g->flags = d->flags;
  g->act = act_of(d->flags);
  norm_geom_finish(g);
  return NORMA_OK;
}

static norma_status in_geom(const char *fn, const norma_in_desc *d, int training, norm_geom *g) {
  if (!d) return norma__fail(BAD, "%s: d (the descriptor) must not be NULL", fn);
  TRY(check_sizes(fn, d->n, d->c, d->spatial, d->dtype, "n", "c", "spatial"));
  if (training && d->spatial < 2)
    return norma__fail(BAD, "%s: expected more than 1 spatial element when training, got "
                       "d->spatial = %lld", fn, (long long)d->spatial);
  TRY(check_layout(fn, d->layout));
  TRY(check_common(fn, d->dtype, d->eps, d->flags,
                   NORMA_RELU | NORMA_SILU | NORMA_BN_BIASED_RUNNING_VAR | NORMA_CHECK_FINITE));
  *g = (norm_geom){0};
  g->n = d->n, g->c = d->c, g->s = d->spatial, g->layout = d->layout, g->dt = d->dtype;
  g->per_sample = 1, g->cpg = 1, g->eps = d->eps, g->flags = d->flags;
  g->act = act_of(d->flags);
  norm_geom_finish(g);
  return NORMA_OK;
}

static size_t tbytes(const norm_geom *g) { return (size_t)g->total * g->esize; }
static size_t cbytes(const norm_geom *g) { return (size_t)g->c * norma__param_size(g->dt); }
static size_t gbytes(const norm_geom *g) { return (size_t)g->groups * norma__param_size(g->dt); }

#define NREG(r) ((int)(sizeof(r) / sizeof((r)[0])))

/* NORMA_CHECK_FINITE over the given regions (tensors in the storage type, parameters in the
   parameter type) */
static norma_status finite(const char *fn, const norm_geom *g, const bn_region *r, int n) {
  if (!(g->flags & NORMA_CHECK_FINITE)) return NORMA_OK;
  for (int i = 0; i < n; i++) {
    if (!r[i].ptr || r[i].kind == REGION_TENSOR_OUT || r[i].kind == REGION_PARAM_OUT) continue;
    if (r[i].kind == REGION_TENSOR_IN)
      TRY(bn_check_finite(fn, r[i].name, g->dt, r[i].ptr, g->total));
    else
      TRY(bn_check_finite_param(fn, r[i].name, g->dt, r[i].ptr,
                                (int64_t)(r[i].bytes / norma__param_size(g->dt))));
  }
  return NORMA_OK;
}

/* ---- LayerNorm and RMSNorm -------------------------------------------------------------- */

static norma_status row_forward(const char *fn, const norma_ln_desc *d, int rms, const void *x,
                                const void *residual, const void *gamma, const void *beta,
                                void *y, void *sum, void *save_mean, void *save_invstd) {
  norm_geom g;
  TRY(ln_geom(fn, d, rms, &g));
  TRY(bn_require(fn, "x", x));
  TRY(bn_require(fn, "y", y));
  if (!residual) sum = NULL;
  const bn_region r[] = {
      {"x", x, tbytes(&g), REGION_TENSOR_IN},
      {"residual", residual, tbytes(&g), REGION_TENSOR_IN},
      {"gamma", gamma, cbytes(&g), REGION_PARAM_IN},
      {"beta", beta, cbytes(&g), REGION_PARAM_IN},
      {"y", y, tbytes(&g), REGION_TENSOR_OUT},
      {"sum", sum, tbytes(&g), REGION_TENSOR_OUT},
      {rms ? "save_invrms" : "save_mean", rms ? save_invstd : save_mean, gbytes(&g),
       REGION_PARAM_OUT},
      {"save_invstd", rms ? NULL : save_invstd, gbytes(&g), REGION_PARAM_OUT},
  };
  TRY(bn_check_overlaps(fn, r, NREG(r)));
  TRY(finite(fn, &g, r, NREG(r)));
  const norm_fwd_args a = {.x = x, .res = residual, .gamma = gamma, .beta = beta, .y = y,
                           .sum = sum, .save_mean = rms ? NULL : save_mean,
                           .save_invstd = save_invstd};
  return norm_impl_current()->forward(&g, NORM_FWD_TRAINING, &a);
}

norma_status norma_ln_forward(const norma_ln_desc *d, const void *x, const void *residual,
                              const void *gamma, const void *beta, void *y, void *sum,
                              void *save_mean, void *save_invstd) {
  return row_forward("norma_ln_forward", d, 0, x, residual, gamma, beta, y, sum, save_mean,
                     save_invstd);
}

norma_status norma_rms_forward(const norma_ln_desc *d, const void *x, const void *residual,
                               const void *gamma, void *y, void *sum, void *save_invrms) {
  return row_forward("norma_rms_forward", d, 1, x, residual, gamma, NULL, y, sum, NULL,
                     save_invrms);
}

static norma_status row_backward(const char *fn, const norma_ln_desc *d, int rms, const void *x,
                                 const void *dy, const void *dsum, const void *gamma,
                                 const void *save_mean, const void *save_invstd, void *dx,
                                 void *dgamma, void *dbeta) {
  norm_geom g;
  TRY(ln_geom(fn, d, rms, &g));
  TRY(bn_require(fn, "x", x));
  TRY(bn_require(fn, "dy", dy));
  if (!rms) TRY(bn_require(fn, "save_mean", save_mean));
  TRY(bn_require(fn, rms ? "save_invrms" : "save_invstd", save_invstd));
  TRY(bn_require(fn, "dx", dx));
  const bn_region r[] = {
      {"x", x, tbytes(&g), REGION_TENSOR_IN},
      {"dy", dy, tbytes(&g), REGION_TENSOR_IN},
      {"dsum", dsum, tbytes(&g), REGION_TENSOR_IN},
      {"gamma", gamma, cbytes(&g), REGION_PARAM_IN},
      {"save_mean", rms ? NULL : save_mean, gbytes(&g), REGION_PARAM_IN},
      {rms ? "save_invrms" : "save_invstd", save_invstd, gbytes(&g), REGION_PARAM_IN},
      {"dx", dx, tbytes(&g), REGION_TENSOR_OUT},
      {"dgamma", dgamma, cbytes(&g), REGION_PARAM_OUT},
      {"dbeta", rms ? NULL : dbeta, cbytes(&g), REGION_PARAM_OUT},
  };
  TRY(bn_check_overlaps(fn, r, NREG(r)));
  TRY(finite(fn, &g, r, NREG(r)));
  const norm_bwd_args a = {.x = x, .dy = dy, .dsum = dsum, .gamma = gamma,
                           .save_mean = rms ? NULL : save_mean, .save_invstd = save_invstd,
                           .dx = dx, .dgamma = dgamma, .dbeta = rms ? NULL : dbeta};
  return norm_impl_current()->backward(&g, NORM_BWD_FULL, &a);
}

norma_status norma_ln_backward(const norma_ln_desc *d, const void *x, const void *dy,
                               const void *dsum, const void *gamma, const void *save_mean,
                               const void *save_invstd, void *dx, void *dgamma, void *dbeta) {
  return row_backward("norma_ln_backward", d, 0, x, dy, dsum, gamma, save_mean, save_invstd, dx,
                      dgamma, dbeta);
}

norma_status norma_rms_backward(const norma_ln_desc *d, const void *x, const void *dy,
                                const void *dsum, const void *gamma, const void *save_invrms,
                                void *dx, void *dgamma) {
  return row_backward("norma_rms_backward", d, 1, x, dy, dsum, gamma, NULL, save_invrms, dx,
                      dgamma, NULL);
}

/* ---- GroupNorm and InstanceNorm --------------------------------------------------------- */

/* the forward with the instance / group statistics; running_* only for InstanceNorm */
static norma_status group_forward(const char *fn, const norm_geom *g, const void *x,
                                  const void *gamma, const void *beta, void *y, void *save_mean,
                                  void *save_invstd, void *running_mean, void *running_var,
                                  double momentum) {
  TRY(bn_require(fn, "x", x));
  TRY(bn_require(fn, "y", y));
  if ((running_mean || running_var) && !(momentum >= 0.0 && momentum <= 1.0))
    return norma__fail(BAD, "%s: momentum must be in [0, 1] (got %g)", fn, momentum);
  const bn_region r[] = {
      {"x", x, tbytes(g), REGION_TENSOR_IN},
      {"gamma", gamma, cbytes(g), REGION_PARAM_IN},
      {"beta", beta, cbytes(g), REGION_PARAM_IN},
      {"y", y, tbytes(g), REGION_TENSOR_OUT},
      {"save_mean", save_mean, gbytes(g), REGION_PARAM_OUT},
      {"save_invstd", save_invstd, gbytes(g), REGION_PARAM_OUT},
      {"running_mean", running_mean, cbytes(g), REGION_PARAM_OUT},
      {"running_var", running_var, cbytes(g), REGION_PARAM_OUT},
  };
  TRY(bn_check_overlaps(fn, r, NREG(r)));
  TRY(finite(fn, g, r, 3));
  if (g->flags & NORMA_CHECK_FINITE) {
    TRY(bn_check_finite_param(fn, "running_mean", g->dt, running_mean, g->c));
    TRY(bn_check_finite_param(fn, "running_var", g->dt, running_var, g->c));
  }
  const norm_running_rule run = norm_running_rule_make(g->flags, momentum, 0.0, NULL, NULL);
  const norm_fwd_args a = {.x = x, .gamma = gamma, .beta = beta, .y = y, .save_mean = save_mean,
                           .save_invstd = save_invstd, .running_mean = running_mean,
                           .running_var = running_var, .run = &run};
  return norm_impl_current()->forward(g, NORM_FWD_TRAINING, &a);
}

static norma_status group_backward(const char *fn, const norm_geom *g, const void *x,
                                   const void *y, const void *dy, const void *gamma,
                                   const void *beta, const void *save_mean,
                                   const void *save_invstd, void *dx, void *dgamma, void *dbeta) {
  TRY(bn_require(fn, "x", x));
  TRY(bn_require(fn, "dy", dy));
  TRY(bn_require(fn, "save_mean", save_mean));
  TRY(bn_require(fn, "save_invstd", save_invstd));
  TRY(bn_require(fn, "dx", dx));
  if (g->act == NORM_ACT_RELU)
    TRY(bn_require(fn, "y (required with NORMA_RELU: the mask is y > 0)", y));
  else
    y = NULL; /* not used */
  const bn_region r[] = {
      {"x", x, tbytes(g), REGION_TENSOR_IN},
      {"y", y, tbytes(g), REGION_TENSOR_IN},
      {"dy", dy, tbytes(g), REGION_TENSOR_IN},
      {"gamma", gamma, cbytes(g), REGION_PARAM_IN},
      {"beta", beta, cbytes(g), REGION_PARAM_IN},
      {"save_mean", save_mean, gbytes(g), REGION_PARAM_IN},
      {"save_invstd", save_invstd, gbytes(g), REGION_PARAM_IN},
      {"dx", dx, tbytes(g), REGION_TENSOR_OUT},
      {"dgamma", dgamma, cbytes(g), REGION_PARAM_OUT},
      {"dbeta", dbeta, cbytes(g), REGION_PARAM_OUT},
  };
  TRY(bn_check_overlaps(fn, r, NREG(r)));
  TRY(finite(fn, g, r, NREG(r)));
  const norm_bwd_args a = {.x = x, .y = y, .dy = dy, .gamma = gamma, .beta = beta,
                           .save_mean = save_mean, .save_invstd = save_invstd, .dx = dx,
                           .dgamma = dgamma, .dbeta = dbeta};
  return norm_impl_current()->backward(g, NORM_BWD_FULL, &a);
}

norma_status norma_gn_forward(const norma_gn_desc *d, const void *x, const void *gamma,
                              const void *beta, void *y, void *save_mean, void *save_invstd) {
  static const char fn[] = "norma_gn_forward";
  norm_geom g;
  TRY(gn_geom(fn, d, &g));
  return group_forward(fn, &g, x, gamma, beta, y, save_mean, save_invstd, NULL, NULL, 0.0);
}

norma_status norma_gn_backward(const norma_gn_desc *d, const void *x, const void *y,
                               const void *dy, const void *gamma, const void *beta,
                               const void *save_mean, const void *save_invstd, void *dx,
                               void *dgamma, void *dbeta) {
  static const char fn[] = "norma_gn_backward";
  norm_geom g;
  TRY(gn_geom(fn, d, &g));
  return group_backward(fn, &g, x, y, dy, gamma, beta, save_mean, save_invstd, dx, dgamma, dbeta);
}

norma_status norma_in_forward_training(const norma_in_desc *d, const void *x, const void *gamma,
                                       const void *beta, void *y, void *save_mean,
                                       void *save_invstd, void *running_mean, void *running_var,
                                       double momentum) {
  static const char fn[] = "norma_in_forward_training";
  norm_geom g;
  TRY(in_geom(fn, d, 1, &g));
  return group_forward(fn, &g, x, gamma, beta, y, save_mean, save_invstd, running_mean,
                       running_var, momentum);
}

norma_status norma_in_forward_inference(const norma_in_desc *d, const void *x, const void *gamma,
                                        const void *beta, const void *mean, const void *var,
                                        void *y) {
  static const char fn[] = "norma_in_forward_inference";
  norm_geom g;
  TRY(in_geom(fn, d, 0, &g));
  TRY(bn_require(fn, "x", x));
  TRY(bn_require(fn, "mean", mean));
  TRY(bn_require(fn, "var", var));
  TRY(bn_require(fn, "y", y));
  const bn_region r[] = {
      {"x", x, tbytes(&g), REGION_TENSOR_IN},
      {"gamma", gamma, cbytes(&g), REGION_PARAM_IN},
      {"beta", beta, cbytes(&g), REGION_PARAM_IN},
      {"mean", mean, cbytes(&g), REGION_PARAM_IN},
      {"var", var, cbytes(&g), REGION_PARAM_IN},
      {"y", y, tbytes(&g), REGION_TENSOR_OUT},
  };
  TRY(bn_check_overlaps(fn, r, NREG(r)));
  TRY(finite(fn, &g, r, NREG(r)));
  const norm_fwd_args a = {.x = x, .gamma = gamma, .beta = beta, .y = y, .mean_in = mean,
                           .var_in = var};
  return norm_impl_current()->forward(&g, NORM_FWD_INFERENCE, &a);
}

norma_status norma_in_backward(const norma_in_desc *d, const void *x, const void *y,
                               const void *dy, const void *gamma, const void *beta,
                               const void *save_mean, const void *save_invstd, void *dx,
                               void *dgamma, void *dbeta) {
  static const char fn[] = "norma_in_backward";
  norm_geom g;
  TRY(in_geom(fn, d, 0, &g));
  return group_backward(fn, &g, x, y, dy, gamma, beta, save_mean, save_invstd, dx, dgamma, dbeta);
}
