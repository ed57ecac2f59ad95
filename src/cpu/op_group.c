/* op_group.c - GroupNorm and InstanceNorm (InstanceNorm is GroupNorm with one channel per
 * group) on the engine: a group is cpg adjacent channels of one sample, so a unit is a block
 * of whole groups of one sample.  Tensors with s == 1 go to op_row.c (their groups are
 * contiguous pieces of a row).
 *
 * Forward: the engine reduces each group (channels-first: the group's contiguous run;
 * channels-last: per channel down the rows, merged), finalize turns a group's statistics into
 * per-channel constants y = (x - mean) * invstd * gamma[c] + beta[c], then the engine applies
 * them with the activation (ReLU, SiLU).
 * Backward: per-channel sums of g, g * x_hat, x_hat; the group combines them weighted by gamma:
 *   dx = invstd * (gamma[c] g - A / M - (x_hat - s) * B / M),  A = sum gamma g,
 *   B = sum gamma g (x_hat - s),  M = cpg * s,  s the x_hat offset of the rounded mean;
 * dgamma and dbeta are per-(sample, channel) partials summed over the samples in order.
 */
#include <math.h>

#include "engine.h"

static int64_t group_index(const norm_geom *g, int64_t i, int64_t ch) {
  return norm_group(g, i, ch);
}

/* ---- forward ---------------------------------------------------------------------------- */

static void finalize_forward(norm_job *jb, norm_unit *u) {
  const norm_fwd_args *a = jb->ctx;
  const norm_geom *g = jb->g;
  const double cnt = (double)g->count;
  const int64_t i = u->i0;
  for (int64_t j = 0; j < u->nc; j += g->cpg) {
    const double t1 = u->tot[j], t2 = u->tot[u->ts + j];
    const double var = norm_var(t2 - t1 * (t1 / cnt), cnt);
    double mean, mlo;
    norm_two_sum(u->tot[2 * u->ts + j], t1 / cnt, &mean, &mlo);
    const double is = norm_invstd(var, g->eps);
    const int64_t G = group_index(g, i, u->j0 + j);
    if (a->save_mean) norma__param_store(g->dt, a->save_mean, G, mean);
    if (a->save_invstd) norma__param_store(g->dt, a->save_invstd, G, is);
    for (int64_t k = 0; k < g->cpg; k++) {
      const int64_t ch = u->j0 + j + k;
      norm_set_fwd_consts(jb, u, j + k, mean, mlo, is, norma__param(g->dt, a->gamma, ch, 1.0),
                          norma__param(g->dt, a->beta, ch, 0.0));
    }
    if (jb->per_nc) { /* InstanceNorm's running statistics: the instance's mean and variance */
      jb->per_nc[(i * 2) * g->c + u->j0 + j] = mean;
      jb->per_nc[(i * 2 + 1) * g->c + u->j0 + j] = var;
    }
  }
}

norma_status norm_group_forward(const norm_geom *g, norm_fwd_mode mode, const norm_fwd_args *a) {
  if (mode != NORM_FWD_TRAINING) /* given per-channel statistics: BatchNorm's inference */
    return norm_bn_forward(g, mode, a);
  const int running = a->running_mean || a->running_var;
  norm_job jb = {.g = g, .nsums = SUMS_STATS, .apply = 1, .x = a->x, .out = a->y,
                 .finalize = finalize_forward, .ctx = a, .want_per_nc = running};
  const norma_status st = norm_run_job(&jb);
  if (st != NORMA_OK || !running) return st;
  /* PyTorch's InstanceNorm: the running statistics move towards the batch average of the
     instances' mean and unbiased variance (summed over the samples in order) */
  norm_running_rule rr = *a->run;
  const double cnt = (double)g->count, unb = rr.biased ? 1.0 : cnt / (cnt - 1.0);
  rr.biased = 1; /* the average below is already unbiased */
  for (int64_t ch = 0; ch < g->c; ch++) {
    double sm = 0.0, sv = 0.0;
    for (int64_t i = 0; i < g->n; i++)
      sm += jb.per_nc[(i * 2) * g->c + ch], sv += jb.per_nc[(i * 2 + 1) * g->c + ch];
    norm_running_apply(&rr, g->dt, a->running_mean, a->running_var, ch, sm / (double)g->n,
                       sv * unb / (double)g->n, cnt);
  }
  return NORMA_OK;
}

/* ---- backward --------------------------------------------------------------------------- */

/* x_hat = (x - a) * b + c per channel from its group's saved statistics; SiLU's z = x_hat *
   gamma + beta */
static void prepare_xhat(norm_job *jb, norm_unit *u) {
  const norm_bwd_args *a = jb->ctx;
  const norm_geom *g = jb->g;
  for (int64_t j = 0; j < u->nc; j++) {
    const int64_t ch = u->j0 + j, G = group_index(g, u->i0, ch);
    const double mean = norma__param(g->dt, a->save_mean, G, 0);
    const double is = norma__param(g->dt, a->save_invstd, G, 0);
    norm_cst_set(jb, u, C_A, j, mean);
    norm_cst_set(jb, u, C_B, j, is);
    const double lo = mean - norm_cst_get(jb, u, C_A, j);
    norm_cst_set(jb, u, C_C, j, lo == 0.0 ? 0.0 : -lo * is);
    norm_cst_set(jb, u, C_ZS, j, norma__param(g->dt, a->gamma, ch, 1.0));
    norm_cst_set(jb, u, C_ZB, j, norma__param(g->dt, a->beta, ch, 0.0));
  }
  if (g->act != NORM_ACT_SILU) return;
  /* silu'(z) needs z = x_hat * gamma + beta with the x_hat of the batch mean: remove the offset
     s = mean(x_hat) that the rounded save_mean leaves (the rule of norm_xhat_offset) before
     the reduction, through the x_hat constant c */
  norm_unit_xhat_sums(jb, u);
  const double M = (double)g->count;
  for (int64_t j = 0; j < u->nc; j += g->cpg) {
    double S3 = 0.0;
    for (int64_t k = 0; k < g->cpg; k++) S3 += u->tot[2 * u->ts + j + k];
    const double s = norm_xhat_offset(S3, M);
    if (s == 0.0) continue;
    for (int64_t k = 0; k < g->cpg; k++)
      norm_cst_set(jb, u, C_C, j + k, norm_cst_get(jb, u, C_C, j + k) - s);
  }
}

static void finalize_backward(norm_job *jb, norm_unit *u) {
  const norm_bwd_args *a = jb->ctx;
  const norm_geom *g = jb->g;
  const double M = (double)g->count;
  const int64_t i = u->i0;
  for (int64_t j = 0; j < u->nc; j += g->cpg) {
    const int64_t G = group_index(g, i, u->j0 + j);
    const double is = norma__param(g->dt, a->save_invstd, G, 0);
    double A = 0.0, B = 0.0, S3 = 0.0; /* in channel order */
    for (int64_t k = 0; k < g->cpg; k++) {
      const double gam = norma__param(g->dt, a->gamma, u->j0 + j + k, 1.0);
      A += gam * u->tot[j + k];
      B += gam * u->tot[u->ts + j + k];
      S3 += u->tot[2 * u->ts + j + k];
    }
    const double s = norm_xhat_offset(S3, M), Bc = B - s * A;
    for (int64_t k = 0; k < g->cpg; k++) {
      const int64_t ch = u->j0 + j + k;
      const double gam = norma__param(g->dt, a->gamma, ch, 1.0), da = is * gam;
      /* dx = da * (g - A / (M gamma)) - is * B / M * (x_hat - s); with gamma == 0 the group's
         term stays in dd */
      const double mg = gam != 0.0 ? A / (M * gam) : 0.0;
      const double dd0 = (gam != 0.0 ? 0.0 : -is * A / M) + is * s * Bc / M;
      norm_set_bwd_consts(jb, u, j + k, da, mg, -is * Bc / M, dd0);
      if (jb->per_nc) { /* dgamma, dbeta partials of this sample */
        const double s1 = u->tot[j + k], s2 = u->tot[u->ts + j + k];
        jb->per_nc[(i * 2) * g->c + ch] = s2 - s * s1;
        jb->per_nc[(i * 2 + 1) * g->c + ch] = s1;
      }
    }
  }
}

norma_status norm_group_backward(const norm_geom *g, norm_bwd_mode mode, const norm_bwd_args *a) {
  (void)mode; /* the split API is BatchNorm's */
  const int grads = a->dgamma || a->dbeta;
  norm_job jb = {.g = g, .nsums = SUMS_BWD, .apply = 1, .x = a->x, .y = a->y, .dy = a->dy,
                 .out = a->dx, .prepare = prepare_xhat, .finalize = finalize_backward, .ctx = a,
                 .want_per_nc = grads};
  const norma_status st = norm_run_job(&jb);
  if (st != NORMA_OK || !grads) return st;
  for (int64_t ch = 0; ch < g->c; ch++) {
    double dg = 0.0, db = 0.0;
    for (int64_t i = 0; i < g->n; i++)
      dg += jb.per_nc[(i * 2) * g->c + ch], db += jb.per_nc[(i * 2 + 1) * g->c + ch];
    if (a->dgamma) norma__param_store(g->dt, a->dgamma, ch, dg);
    if (a->dbeta) norma__param_store(g->dt, a->dbeta, ch, db);
  }
  return NORMA_OK;
}
