/* norm_ref.c - the reference implementation of every norm: scalar loops in double over the
 * geometry (geom.h), one group at a time.  It is the oracle the engine is tested against, so it
 * favours being obviously right over being fast.
 *
 * Statistics: mean by the corrected two-pass algorithm (mean, then the sum of deviations
 * removes its rounding, kept as hi + lo), variance from the deviations.  RMSNorm: the mean of
 * the squares.  Apply: y = act(((h - mean) - mean_lo) * invstd * gamma[c] + beta[c]).
 */
#include <math.h>
#include <stdlib.h>

#include "impl.h"

/* ---- visiting the values of a group ----------------------------------------------------- */

/* Group G's values: (sample i, channel ch, position sp) for i in [i0, i1), ch in [c0, c1),
   sp in [0, s). */
typedef struct grp {
  int64_t i0, i1, c0, c1;
} grp;

static grp group_of(const norm_geom *g, int64_t G) {
  grp r;
  if (!g->per_sample) {
    r.i0 = 0, r.i1 = g->n, r.c0 = G, r.c1 = G + 1;
  } else {
    const int64_t per = g->c / g->cpg;
    r.i0 = G / per, r.i1 = r.i0 + 1, r.c0 = (G % per) * g->cpg, r.c1 = r.c0 + g->cpg;
  }
  return r;
}

#define FOR_GROUP(g, r, i, ch, e)                                          \
  for (int64_t i = (r).i0; i < (r).i1; i++)                                \
    for (int64_t ch = (r).c0; ch < (r).c1; ch++)                           \
      for (int64_t sp_ = 0, e = norm_index((g), i, ch, 0); sp_ < (g)->s;   \
           sp_++, e = norm_index((g), i, ch, sp_))

/* The normalized input h: x, or x + residual rounded to the storage type (LN / RMS). */
static double h_at(const norm_geom *g, const norm_fwd_args *a, int64_t e) {
  const double v = norma__load(g->dt, a->x, e);
  if (!a->res || g->per_sample == 0) return v;
  double t;
  norma__store(g->dt, &t, 0, v + norma__load(g->dt, a->res, e)); /* t holds one element */
  return norma__load(g->dt, &t, 0);
}

/* mean (hi + lo) and biased variance of group G, or the mean square for RMSNorm */
static void group_stats(const norm_geom *g, const norm_fwd_args *a, int64_t G, double *mean,
                        double *mean_lo, double *var) {
  const grp r = group_of(g, G);
  const double cnt = (double)g->count;
  if (g->rms) {
    double q = 0.0;
    FOR_GROUP(g, r, i, ch, e) {
      const double v = h_at(g, a, e);
      q += v * v;
    }
    *mean = 0.0, *mean_lo = 0.0, *var = q / cnt;
    return;
  }
  double s = 0.0;
  FOR_GROUP(g, r, i, ch, e) s += h_at(g, a, e);
  const double m0 = s / cnt;
  double d1 = 0.0, d2 = 0.0;
  FOR_GROUP(g, r, i, ch, e) {
    const double v = h_at(g, a, e) - m0;
    d1 += v;
    d2 += v * v;
  }
  norm_two_sum(m0, d1 / cnt, mean, mean_lo);
  *var = norm_var(d2 - d1 * d1 / cnt, cnt);
}

static double activate(const norm_geom *g, const void *res, int64_t e, double v) {
  switch (g->act) {
    case NORM_ACT_ADD_RELU: v += norma__load(g->dt, res, e); /* fall through */
    case NORM_ACT_RELU: return v > 0.0 ? v : (v != v ? v : 0.0); /* NaN propagates */
    case NORM_ACT_SILU: return v / (1.0 + exp(-v));
    default: return v;
  }
}

/* ---- forward ---------------------------------------------------------------------------- */

static void apply_group(const norm_geom *g, const norm_fwd_args *a, int64_t G, double mean,
                        double mean_lo, double invstd) {
  const grp r = group_of(g, G);
  /* BN's ADD_RELU residual is added after the normalization; LN's before it */
  const void *act_res = g->per_sample ? NULL : a->res;
  FOR_GROUP(g, r, i, ch, e) {
    const double h = h_at(g, a, e);
    const double v = ((h - mean) - mean_lo) * invstd * norma__param(g->dt, a->gamma, ch, 1.0) +
                     norma__param(g->dt, a->beta, ch, 0.0);
    norma__store(g->dt, a->y, e, activate(g, act_res, e, v));
  }
}

static norma_status ref_forward(const norm_geom *g, norm_fwd_mode mode, const norm_fwd_args *a) {
  const double cnt = (double)g->count;
  /* InstanceNorm's running statistics average the instances: their sums over the batch */
  double *inst = NULL;
  if (mode == NORM_FWD_TRAINING && g->per_sample && (a->running_mean || a->running_var)) {
    inst = calloc((size_t)(2 * g->c), sizeof(double));
    if (!inst) return norma__fail(NORMA_ERR_OUT_OF_MEMORY, "norma: out of memory (reference)");
  }
  /* the sums h = x + residual first (LN / RMS): written before anything is normalized, so that
     sum may alias x or residual */
  if (mode == NORM_FWD_TRAINING && a->res && g->per_sample && a->sum)
    for (int64_t e = 0; e < g->total; e++) norma__store(g->dt, a->sum, e, h_at(g, a, e));
  norm_fwd_args b = *a;
  if (b.sum && b.res && g->per_sample) b.x = b.sum, b.res = NULL; /* read the stored sums */
  for (int64_t G = 0; G < (mode == NORM_FWD_INFERENCE ? 0 : g->groups); G++) {
    if (mode == NORM_FWD_APPLY) {
      apply_group(g, &b, G, b.mean_d[G], 0.0, b.invstd_d[G]);
      continue;
    }
    double mean, mlo, var;
    group_stats(g, &b, G, &mean, &mlo, &var);
    if (mode == NORM_FWD_MOMENTS) {
      b.mean_out[G] = mean;
      b.m2_out[G] = var * cnt;
      continue;
    }
    const double is = norm_invstd(var, g->eps);
    apply_group(g, &b, G, mean, mlo, is);
    if (b.save_mean) norma__param_store(g->dt, b.save_mean, G, mean);
    if (b.save_invstd) norma__param_store(g->dt, b.save_invstd, G, is);
    if (!g->per_sample) {
      norm_running_apply(b.run, g->dt, b.running_mean, b.running_var, G, mean, var, cnt);
    } else if (inst) {
      const int64_t ch = G % g->c; /* InstanceNorm: cpg == 1 */
      inst[ch] += mean;
      inst[g->c + ch] += var;
    }
  }
  if (inst) {
    /* PyTorch: the running statistics move towards the batch average of the instances' mean
       and unbiased variance */
    norm_running_rule rr = *b.run;
    const double unb = rr.biased ? 1.0 : cnt / (cnt - 1.0);
    rr.biased = 1; /* the average below is already unbiased */
    for (int64_t ch = 0; ch < g->c; ch++)
      norm_running_apply(&rr, g->dt, b.running_mean, b.running_var, ch,
                         inst[ch] / (double)g->n, inst[g->c + ch] * unb / (double)g->n, cnt);
    free(inst);
  }
  if (mode == NORM_FWD_INFERENCE) /* per-channel statistics: one "group" per channel */
    for (int64_t ch = 0; ch < g->c; ch++) {
      const double is = 1.0 / sqrt(norma__param(g->dt, a->var_in, ch, 0) + g->eps);
      const double mean = norma__param(g->dt, a->mean_in, ch, 0);
      for (int64_t i = 0; i < g->n; i++)
        for (int64_t sp = 0; sp < g->s; sp++) {
          const int64_t e = norm_index(g, i, ch, sp);
          const double v = (norma__load(g->dt, a->x, e) - mean) * is *
                               norma__param(g->dt, a->gamma, ch, 1.0) +
                           norma__param(g->dt, a->beta, ch, 0.0);
          norma__store(g->dt, a->y, e, activate(g, a->res, e, v));
        }
    }
  return NORMA_OK;
}

/* ---- backward --------------------------------------------------------------------------- */

/* the statistics of group G the backward uses */
static void bwd_stats(const norm_geom *g, const norm_bwd_args *a, int64_t G, double *mean,
                      double *invstd) {
  *mean = a->mean_d ? a->mean_d[G] : (a->save_mean ? norma__param(g->dt, a->save_mean, G, 0) : 0.0);
  *invstd = a->invstd_d ? a->invstd_d[G] : norma__param(g->dt, a->save_invstd, G, 0);
}

/* x_hat of value e of channel ch: from x, or (BN without x) recovered from y */
static double xhat_at(const norm_geom *g, const norm_bwd_args *a, int64_t e, int64_t ch,
                      double mean, double invstd) {
  if (a->x) return (norma__load(g->dt, a->x, e) - mean) * invstd;
  return (norma__load(g->dt, a->y, e) - norma__param(g->dt, a->beta, ch, 0.0)) /
         norma__param(g->dt, a->gamma, ch, 1.0);
}

/* the gradient reaching the normalization: dy through the activation's derivative */
static double g_at(const norm_geom *g, const norm_bwd_args *a, int64_t e, int64_t ch,
                   double xh) { /* xh: the x_hat of the batch mean (offset removed) */
  const double d = norma__load(g->dt, a->dy, e);
  switch (g->act) {
    case NORM_ACT_RELU:
    case NORM_ACT_ADD_RELU: return norma__load(g->dt, a->y, e) > 0.0 ? d : 0.0;
    case NORM_ACT_SILU: {
      const double z = xh * norma__param(g->dt, a->gamma, ch, 1.0) +
                       norma__param(g->dt, a->beta, ch, 0.0);
      const double sg = 1.0 / (1.0 + exp(-z));
      return d * sg * (1.0 + z * (1.0 - sg));
    }
    default: return d;
  }
}

static norma_status ref_backward(const norm_geom *g, norm_bwd_mode mode, const norm_bwd_args *a) {
  const int global = !g->per_sample && (g->flags & NORMA_BN_GLOBAL_STATS);
  /* dgamma / dbeta accumulate over groups per channel (per-sample norms: over samples) */
  double *pg = NULL;
  if (mode == NORM_BWD_FULL && (a->dgamma || a->dbeta)) {
    pg = calloc((size_t)(2 * g->c), sizeof(double));
    if (!pg) return norma__fail(NORMA_ERR_OUT_OF_MEMORY, "norma: out of memory (reference)");
  }
  for (int64_t G = 0; G < g->groups; G++) {
    const grp r = group_of(g, G);
    double mean, is;
    bwd_stats(g, a, G, &mean, &is);
    if (g->rms) mean = 0.0;
    /* SiLU's derivative needs z of the batch mean: the x_hat offset s0 of a rounded saved
       mean first (norm_xhat_offset's rule) */
    double s0 = 0.0;
    if (g->act == NORM_ACT_SILU) {
      double t = 0.0;
      FOR_GROUP(g, r, i, ch, e) t += xhat_at(g, a, e, ch, mean, is);
      s0 = norm_xhat_offset(t, (double)g->count);
    }
    /* S1 = sum gamma g, S2 = sum gamma g x_hat, S3 = sum x_hat (BN split reduce: unweighted) */
    double S1 = 0.0, S2 = 0.0, S3 = 0.0, U1 = 0.0, U2 = 0.0;
    FOR_GROUP(g, r, i, ch, e) {
      const double xh = xhat_at(g, a, e, ch, mean, is) - s0, gi = g_at(g, a, e, ch, xh);
      const double gm = norma__param(g->dt, a->gamma, ch, 1.0);
      S1 += gm * gi, S2 += gm * gi * xh, S3 += xh;
      U1 += gi, U2 += gi * xh;
    }
    if (mode == NORM_BWD_REDUCE) {
      a->o_dy[G] = U1, a->o_dy_xhat[G] = U2;
      if (a->o_xhat) a->o_xhat[G] = S3;
      continue;
    }
    double cnt = (double)g->count, s = 0.0;
    if (mode == NORM_BWD_APPLY) { /* BatchNorm's split apply: sums given, gamma outside */
      const double gm = norma__param(g->dt, a->gamma, G, 1.0);
      cnt = (double)a->count;
      s = (!global && a->sum_xhat) ? a->sum_xhat[G] / cnt : 0.0;
      S1 = global ? 0.0 : gm * a->sum_dy[G];
      S2 = global ? 0.0 : gm * a->sum_dy_xhat[G];
    } else if (a->x && !global && !g->rms) {
      s = norm_xhat_offset(S3, cnt);
    }
    const double S2c = S2 - s * S1; /* sum gamma g (x_hat - s) */
    FOR_GROUP(g, r, i, ch, e) {
      const double xh = xhat_at(g, a, e, ch, mean, is) - s0, gi = g_at(g, a, e, ch, xh);
      const double gm = norma__param(g->dt, a->gamma, ch, 1.0);
      double v = is * gm * gi;
      if (!global) v = is * (gm * gi - (g->rms ? 0.0 : S1 / cnt) - (xh - s) * S2c / cnt);
      if (a->dsum) v += norma__load(g->dt, a->dsum, e);
      if (a->dres) norma__store(g->dt, a->dres, e, gi);
      norma__store(g->dt, a->dx, e, v);
      if (pg) pg[ch] += gi * (xh - s), pg[g->c + ch] += gi;
    }
  }
  if (pg) {
    for (int64_t ch = 0; ch < g->c; ch++) {
      if (a->dgamma) norma__param_store(g->dt, a->dgamma, ch, pg[ch]);
      if (a->dbeta) norma__param_store(g->dt, a->dbeta, ch, pg[g->c + ch]);
    }
    free(pg);
  }
  return NORMA_OK;
}

/* ---- moments of a producer's tile ------------------------------------------------------- */

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
      const double v = norma__load(dt, x, base + r * row_stride) - m0;
      d1 += v;
      d2 += v * v;
    }
    mean[j] = m0 + d1 / (double)rows;
    m2[j] = norm_var(d2 - d1 * d1 / (double)rows, 1.0);
  }
  return NORMA_OK;
}

const norm_impl norm_impl_ref = {ref_forward, ref_backward, ref_moments_tile};
