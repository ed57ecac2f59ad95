/* bn_api.c - the public BatchNorm entry points: check every argument, scan for non-finite
   values when asked, then hand over to the implementation (reference or production). */
#include <math.h>

#include "check.h"
#include "impl.h"
#include "trace.h"

#define TRY(expr)                          \
  do {                                     \
    norma_status st_ = (expr);             \
    if (st_ != NORMA_OK) return st_;       \
  } while (0)

static size_t tbytes(const bn_problem *p) { return (size_t)p->total * p->esize; }
static size_t pbytes(const bn_problem *p) { return (size_t)p->c * norma__param_size(p->dt); }

static norma_status forward_training(const char *fn, const norma_bn_desc *d, const void *x,
                                     const void *residual, const void *gamma, const void *beta,
                                     void *y, void *save_mean, void *save_invstd,
                                     void *running_mean, void *running_var,
                                     double *running_count, double momentum, int counted);

norma_status norma_bn_forward_training(const norma_bn_desc *d, const void *x,
                                       const void *residual, const void *gamma,
                                       const void *beta, void *y, void *save_mean,
                                       void *save_invstd, void *running_mean, void *running_var,
                                       double momentum) {
  return forward_training("norma_bn_forward_training", d, x, residual, gamma, beta, y, save_mean,
                          save_invstd, running_mean, running_var, NULL, momentum, 0);
}

norma_status norma_bn_forward_training_counted(const norma_bn_desc *d, const void *x,
                                               const void *residual, const void *gamma,
                                               const void *beta, void *y, void *save_mean,
                                               void *save_invstd, void *running_mean,
                                               void *running_var, double *running_count,
                                               double momentum) {
  return forward_training("norma_bn_forward_training_counted", d, x, residual, gamma, beta, y,
                          save_mean, save_invstd, running_mean, running_var, running_count,
                          momentum, 1);
}

/* Checks of the running-statistics arguments shared by the training calls and
   norma_bn_running_update. */
static norma_status check_running(const char *fn, const bn_problem *p, const void *running_mean,
                                  const void *running_var, const double *running_count,
                                  double momentum, int counted) {
  if (!running_mean && !running_var) return NORMA_OK;
  if (!(momentum >= 0.0 && momentum <= 1.0))
    return norma__fail(NORMA_ERR_INVALID_ARGUMENT, "%s: momentum must be in [0, 1] (got %g)", fn,
                       momentum);
  if (!(p->flags & NORMA_BN_COUNT_WEIGHTED)) return NORMA_OK;
  if (!counted)
    return norma__fail(NORMA_ERR_INVALID_ARGUMENT, "%s: NORMA_BN_COUNT_WEIGHTED needs the running "
                       "count: call norma_bn_forward_training_counted", fn);
  TRY(bn_require(fn, "running_count (required with NORMA_BN_COUNT_WEIGHTED)", running_count));
  if (!(*running_count >= 0.0) || !isfinite(*running_count))
    return norma__fail(NORMA_ERR_INVALID_ARGUMENT, "%s: *running_count must be finite and >= 0 "
                       "(got %g)", fn, *running_count);
  return NORMA_OK;
}

norma_status norma_bn_running_update(const norma_bn_desc *d, int64_t count, const double *mean,
                                     const double *var, void *running_mean, void *running_var,
                                     double *running_count, double momentum) {
  static const char fn[] = "norma_bn_running_update";
  if (!d)
    return norma__fail(NORMA_ERR_INVALID_ARGUMENT, "%s: d (the descriptor) must not be NULL", fn);
  /* only d->c, d->dtype and d->flags are read (norma.h): n, spatial, layout and eps may be
     anything (a descriptor made for the update alone, an empty rank's) */
  const norma_bn_desc dc = {.n = 1, .c = d->c, .spatial = 1, .layout = NORMA_CHANNELS_FIRST,
                            .dtype = d->dtype, .eps = 0.0, .flags = d->flags};
  bn_problem p;
  TRY(bn_check_desc(fn, &dc, 0, 0, &p));
  if (count < 2)
    return norma__fail(NORMA_ERR_INVALID_ARGUMENT, "%s: count must be >= 2 (got %lld)", fn,
                       (long long)count);
  TRY(bn_require(fn, "mean", mean));
  TRY(bn_require(fn, "var", var));
  TRY(check_running(fn, &p, running_mean, running_var, running_count, momentum, 1));
  const size_t db = (size_t)p.c * sizeof(double);
  const bn_region r[] = {
      {"mean", mean, db, REGION_PARAM_IN},
      {"var", var, db, REGION_PARAM_IN},
      {"running_mean", running_mean, pbytes(&p), REGION_PARAM_OUT},
      {"running_var", running_var, pbytes(&p), REGION_PARAM_OUT},
      {"running_count", (p.flags & NORMA_BN_COUNT_WEIGHTED) ? running_count : NULL,
       sizeof(double), REGION_PARAM_OUT},
  };
  TRY(bn_check_overlaps(fn, r, (int)(sizeof r / sizeof r[0])));
  if (p.flags & NORMA_CHECK_FINITE) {
    TRY(bn_check_finite(fn, "mean", NORMA_F64, mean, p.c));
    TRY(bn_check_finite(fn, "var", NORMA_F64, var, p.c));
    TRY(bn_check_finite_param(fn, "running_mean", p.dt, running_mean, p.c));
    TRY(bn_check_finite_param(fn, "running_var", p.dt, running_var, p.c));
  }
  if (!running_mean && !running_var) return NORMA_OK;
  double n1 = 0.0;
  const norm_running_rule run =
      norm_running_rule_make(p.flags, momentum, (double)count, running_count, &n1);
  for (int64_t j = 0; j < p.c; j++)
    norm_running_apply(&run, p.dt, running_mean, running_var, j, mean[j], var[j], (double)count);
  if (p.flags & NORMA_BN_COUNT_WEIGHTED) *running_count = n1;
  return NORMA_OK;
}

static norma_status forward_training(const char *fn, const norma_bn_desc *d, const void *x,
                                     const void *residual, const void *gamma, const void *beta,
                                     void *y, void *save_mean, void *save_invstd,
                                     void *running_mean, void *running_var,
                                     double *running_count, double momentum, int counted) {
  bn_problem p;
  TRY(bn_check_desc(fn, d, 1, 1, &p));
  TRY(bn_require(fn, "x", x));
  TRY(bn_require(fn, "y", y));
  if (p.act != BN_ACT_ADD_RELU) residual = NULL;
  else TRY(bn_require(fn, "residual (required with NORMA_BN_ADD_RELU)", residual));
  TRY(check_running(fn, &p, running_mean, running_var, running_count, momentum, counted));
  const int counting = (p.flags & NORMA_BN_COUNT_WEIGHTED) && (running_mean || running_var);
  const bn_region r[] = {
      {"x", x, tbytes(&p), REGION_TENSOR_IN},
      {"residual", residual, tbytes(&p), REGION_TENSOR_IN},
      {"gamma", gamma, pbytes(&p), REGION_PARAM_IN},
      {"beta", beta, pbytes(&p), REGION_PARAM_IN},
      {"y", y, tbytes(&p), REGION_TENSOR_OUT},
      {"save_mean", save_mean, pbytes(&p), REGION_PARAM_OUT},
      {"save_invstd", save_invstd, pbytes(&p), REGION_PARAM_OUT},
      {"running_mean", running_mean, pbytes(&p), REGION_PARAM_OUT},
      {"running_var", running_var, pbytes(&p), REGION_PARAM_OUT},
      {"running_count", counting ? running_count : NULL, sizeof(double), REGION_PARAM_OUT},
  };
  TRY(bn_check_overlaps(fn, r, (int)(sizeof r / sizeof r[0])));
  if (p.flags & NORMA_CHECK_FINITE) {
    TRY(bn_check_finite(fn, "x", p.dt, x, p.total));
    TRY(bn_check_finite(fn, "residual", p.dt, residual, p.total));
    TRY(bn_check_finite_param(fn, "gamma", p.dt, gamma, p.c));
    TRY(bn_check_finite_param(fn, "beta", p.dt, beta, p.c));
    TRY(bn_check_finite_param(fn, "running_mean", p.dt, running_mean, p.c));
    TRY(bn_check_finite_param(fn, "running_var", p.dt, running_var, p.c));
  }
  double n1 = 0.0;
  const norm_running_rule run = norm_running_rule_make(p.flags, momentum, (double)p.m,
                                                       counting ? running_count : NULL, &n1);
  const double t0 = bn_trace_begin();
  const norm_geom g = norm_geom_bn(&p);
  const norm_fwd_args a = {.x = x, .res = residual, .gamma = gamma, .beta = beta, .y = y,
                           .save_mean = save_mean, .save_invstd = save_invstd,
                           .running_mean = running_mean, .running_var = running_var, .run = &run};
  norma_status st = norm_impl_current()->forward(&g, NORM_FWD_TRAINING, &a);
  if (st == NORMA_OK && counting) *running_count = n1;
  bn_trace_end("bn_forward_training", &p, t0, residual ? 3 : 2, st);
  return st;
}

norma_status norma_bn_forward_inference(const norma_bn_desc *d, const void *x,
                                        const void *residual, const void *gamma,
                                        const void *beta, const void *mean, const void *var,
                                        void *y) {
  static const char fn[] = "norma_bn_forward_inference";
  bn_problem p;
  TRY(bn_check_desc(fn, d, 1, 0, &p));
  TRY(bn_require(fn, "x", x));
  TRY(bn_require(fn, "mean", mean));
  TRY(bn_require(fn, "var", var));
  TRY(bn_require(fn, "y", y));
  if (p.act != BN_ACT_ADD_RELU) residual = NULL;
  else TRY(bn_require(fn, "residual (required with NORMA_BN_ADD_RELU)", residual));
  const bn_region r[] = {
      {"x", x, tbytes(&p), REGION_TENSOR_IN},
      {"residual", residual, tbytes(&p), REGION_TENSOR_IN},
      {"gamma", gamma, pbytes(&p), REGION_PARAM_IN},
      {"beta", beta, pbytes(&p), REGION_PARAM_IN},
      {"mean", mean, pbytes(&p), REGION_PARAM_IN},
      {"var", var, pbytes(&p), REGION_PARAM_IN},
      {"y", y, tbytes(&p), REGION_TENSOR_OUT},
  };
  TRY(bn_check_overlaps(fn, r, (int)(sizeof r / sizeof r[0])));
  if (p.flags & NORMA_CHECK_FINITE) {
    TRY(bn_check_finite(fn, "x", p.dt, x, p.total));
    TRY(bn_check_finite(fn, "residual", p.dt, residual, p.total));
    TRY(bn_check_finite_param(fn, "gamma", p.dt, gamma, p.c));
    TRY(bn_check_finite_param(fn, "beta", p.dt, beta, p.c));
    TRY(bn_check_finite_param(fn, "mean", p.dt, mean, p.c));
    TRY(bn_check_finite_param(fn, "var", p.dt, var, p.c));
  }
  const double t0 = bn_trace_begin();
  const norm_geom g = norm_geom_bn(&p);
  const norm_fwd_args a = {.x = x, .res = residual, .gamma = gamma, .beta = beta, .y = y,
                           .mean_in = mean, .var_in = var};
  norma_status st = norm_impl_current()->forward(&g, NORM_FWD_INFERENCE, &a);
  bn_trace_end("bn_forward_inference", &p, t0, residual ? 3 : 2, st);
  return st;
}

norma_status norma_bn_backward(const norma_bn_desc *d, const void *x, const void *y,
                               const void *dy, const void *gamma, const void *beta,
                               const void *save_mean, const void *save_invstd, void *dx,
                               void *dresidual, void *dgamma, void *dbeta) {
  static const char fn[] = "norma_bn_backward";
  bn_problem p;
  TRY(bn_check_desc(fn, d, 1, !(d && (d->flags & NORMA_BN_GLOBAL_STATS)), &p));
  TRY(bn_require(fn, "dy", dy));
  TRY(bn_require(fn, "save_mean", save_mean));
  TRY(bn_require(fn, "save_invstd", save_invstd));
  TRY(bn_require(fn, "dx", dx));
  if (p.act != BN_ACT_NONE) {
    TRY(bn_require(fn, "x (required with NORMA_BN_RELU / NORMA_BN_ADD_RELU)", x));
    TRY(bn_require(fn, "y (required with NORMA_BN_RELU / NORMA_BN_ADD_RELU: the mask is y > 0)",
                   y));
  } else if (!x) {
    TRY(bn_require(fn, "y (required when x is NULL: x_hat is recovered from y)", y));
  } else {
    y = NULL; /* not used */
  }
  if (p.act != BN_ACT_ADD_RELU) dresidual = NULL;
  const bn_region r[] = {
      {"x", x, tbytes(&p), REGION_TENSOR_IN},
      {"y", y, tbytes(&p), REGION_TENSOR_IN},
      {"dy", dy, tbytes(&p), REGION_TENSOR_IN},
      {"gamma", gamma, pbytes(&p), REGION_PARAM_IN},
      {"beta", beta, pbytes(&p), REGION_PARAM_IN},
      {"save_mean", save_mean, pbytes(&p), REGION_PARAM_IN},
      {"save_invstd", save_invstd, pbytes(&p), REGION_PARAM_IN},
      {"dx", dx, tbytes(&p), REGION_TENSOR_OUT},
      {"dresidual", dresidual, tbytes(&p), REGION_TENSOR_OUT},
      {"dgamma", dgamma, pbytes(&p), REGION_PARAM_OUT},
      {"dbeta", dbeta, pbytes(&p), REGION_PARAM_OUT},
  };
  TRY(bn_check_overlaps(fn, r, (int)(sizeof r / sizeof r[0])));
  if (!x && gamma) {
    for (int64_t ch = 0; ch < p.c; ch++)
      if (norma__param(p.dt, gamma, ch, 1.0) == 0.0)
        return norma__fail(NORMA_ERR_INVALID_ARGUMENT,
                           "%s: gamma[%lld] is 0: x_hat cannot be recovered from y when x is "
                           "NULL; pass x", fn, (long long)ch);
  }
  if (p.flags & NORMA_CHECK_FINITE) {
    TRY(bn_check_finite(fn, "x", p.dt, x, p.total));
    TRY(bn_check_finite(fn, "y", p.dt, y, p.total));
    TRY(bn_check_finite(fn, "dy", p.dt, dy, p.total));
    TRY(bn_check_finite_param(fn, "gamma", p.dt, gamma, p.c));
    TRY(bn_check_finite_param(fn, "beta", p.dt, beta, p.c));
    TRY(bn_check_finite_param(fn, "save_mean", p.dt, save_mean, p.c));
    TRY(bn_check_finite_param(fn, "save_invstd", p.dt, save_invstd, p.c));
  }
  const double t0 = bn_trace_begin();
  const norm_geom g = norm_geom_bn(&p);
  const norm_bwd_args a = {.x = x, .y = y, .dy = dy, .gamma = gamma, .beta = beta,
                           .save_mean = save_mean, .save_invstd = save_invstd, .dx = dx,
                           .dres = dresidual, .dgamma = dgamma, .dbeta = dbeta};
  norma_status st = norm_impl_current()->backward(&g, NORM_BWD_FULL, &a);
  bn_trace_end("bn_backward", &p, t0, 3 + (x && y ? 1 : 0) + (dresidual ? 1 : 0), st);
  return st;
}

norma_status norma_bn_query_plan(const norma_bn_desc *d, norma_bn_op op, norma_bn_plan *plan) {
  static const char fn[] = "norma_bn_query_plan";
  bn_problem p;
  if (op != NORMA_BN_OP_FORWARD_TRAINING && op != NORMA_BN_OP_FORWARD_INFERENCE &&
      op != NORMA_BN_OP_BACKWARD)
    return norma__fail(NORMA_ERR_INVALID_ARGUMENT, "%s: op is not a norma_bn_op (got %d)", fn,
                       (int)op);
  const int training = op == NORMA_BN_OP_FORWARD_TRAINING ||
                       (op == NORMA_BN_OP_BACKWARD && !(d && (d->flags & NORMA_BN_GLOBAL_STATS)));
  TRY(bn_check_desc(fn, d, 1, training, &p));
  TRY(bn_require(fn, "plan", plan));
  if (norma__use_reference()) {
    /* the reference reads per channel: sums, deviations, normalize (backward: sums, dx) */
    *plan = (norma_bn_plan){.dram_passes = op == NORMA_BN_OP_FORWARD_INFERENCE ? 1
                                           : op == NORMA_BN_OP_BACKWARD        ? 2
                                                                               : 3,
                            .fused = 0, .unit = 0, .threads = 1, .isa = NORMA_ISA_SCALAR,
                            .streaming_stores = 0, .reference = 1};
    return NORMA_OK;
  }
  const norm_geom g = norm_geom_bn(&p);
  norm_cpu_query_plan(&g, (int)op, plan);
  return NORMA_OK;
}
