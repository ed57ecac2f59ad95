/* test_norm_reference.c - the norm family (LayerNorm, RMSNorm, GroupNorm, InstanceNorm)
 * against a float64 reference written here from the formulas of norma.h, independent of the
 * library's own reference (which test_norms uses as the oracle).  Each check runs with the
 * reference kernels (norma_set_use_reference(1)) and the production kernels; ctest runs the
 * program once per ISA path.
 *
 *  1. a handful of cases per op: forward (y, sum, save_mean, save_invstd, running statistics),
 *     InstanceNorm inference, backward (dx, dgamma, dbeta) given the statistics the forward
 *     saved;
 *  2. large-mean accuracy: f32 data with mean 1e4 and std 0.1 (and f64 with mean 1e8, std 1):
 *     LayerNorm, GroupNorm and InstanceNorm in both layouts, y / dx / dgamma / dbeta within
 *     1e-4 (f64: 1e-8) normwise relative error of float64, the backward given the save_mean /
 *     save_invstd the forward wrote; RMSNorm with mean 0 / std 1 and mean 1e4 / std 0.1;
 *     GroupNorm / InstanceNorm with the fused SiLU too;
 *     extreme scales: f32 / bf16 data scaled by 2^k, k in [-100, 100], eps 0: y, save_invstd
 *     and dx agree with float64 (the norms are scale invariant);
 *  3. exact-statistics fills: values in pairs symmetric about a dyadic mean (RMSNorm: about 0),
 *     so that the mean and the variance are exact in any summation order: save_mean exact (or
 *     1 ulp), save_invstd (eps 0) within 1 ulp of 1 / sqrt(the exact variance) (f64: 2), and
 *     bitwise 1 / 2^k when the variance is 4^k; InstanceNorm's running statistics likewise;
 *  4. the residual fusion of LayerNorm / RMSNorm: sum == x + residual rounded to the dtype,
 *     bitwise; y bitwise the op applied to that sum; sum aliasing x or residual gives bitwise
 *     the same results; dsum is added to dx.
 */
#include "test_norm_util.h"

enum { K_LN = 0, K_RMS = 1, K_GN = 2, K_IN = 3 };
static const char *KNAME[4] = {"LN", "RMS", "GN", "IN"};

typedef struct nprob {
  int kind;
  tn_geo g;
  norma_dtype dt;
  double eps;
  unsigned flags; /* NORMA_RELU / NORMA_SILU (GN, IN), BIASED_RUNNING_VAR (IN), CHECK_FINITE */
} nprob;

static int64_t ptotal(const nprob *p) { return tn_total(&p->g); }
static double par(norma_dtype dt, const void *p, int64_t j, double dflt) {
  return p ? tu_pload(dt, p, j) : dflt;
}

/* ---- the independent reference: long double sums over each group's values ---- */

/* h = x, or x + residual rounded to the storage type (LN / RMS); group statistics: mean
   (0 for RMS), biased variance (RMS: the mean square), invstd = 1 / sqrt(var + eps) or 0 when
   var == eps == 0; y = act((h - mean) * invstd * gamma[ch] + beta[ch]) (when y != NULL) */
static void ind_forward(const nprob *p, const void *x, const void *res, const void *gamma,
                        const void *beta, double *h, long double *mean, double *var,
                        double *invstd, double *y) {
  const tn_geo *g = &p->g;
  const int64_t total = ptotal(p), ng = tn_ngroups(g), cnt = tn_count(g);
  const int rms = p->kind == K_RMS;
  for (int64_t e = 0; e < total; e++)
    h[e] = res ? tu_round(p->dt, tu_load(p->dt, x, e) + tu_load(p->dt, res, e))
               : tu_load(p->dt, x, e);
  for (int64_t G = 0; G < ng; G++) {
    long double s = 0, q = 0;
    TN_FOR_GROUP(g, G, e) s += h[e], q += (long double)h[e] * h[e];
    const long double mu = rms ? 0.0L : s / cnt;
    long double ss = 0;
    TN_FOR_GROUP(g, G, e) ss += (h[e] - mu) * (h[e] - mu);
    mean[G] = mu;
    var[G] = (double)(rms ? q / cnt : ss / cnt);
    invstd[G] = (var[G] == 0.0 && p->eps == 0.0)
                    ? 0.0
                    : (double)(1.0L / sqrtl(var[G] + (long double)p->eps));
  }
  if (!y) return;
  for (int64_t e = 0; e < total; e++) {
    const int64_t G = tn_group_of(g, e), ch = tn_channel_of(g, e);
    long double z = (h[e] - mean[G]) * invstd[G] * par(p->dt, gamma, ch, 1.0) +
                    (rms ? 0.0 : par(p->dt, beta, ch, 0.0)); /* RMSNorm has no beta */
    if (p->flags & NORMA_RELU) z = z > 0 ? z : 0;
    if (p->flags & NORMA_SILU) z = z / (1.0L + expl(-z));
    y[e] = (double)z;
  }
}

/* silu'(z) * d */
static long double silu_grad(long double d, long double z) {
  const long double sg = 1.0L / (1.0L + expl(-z));
  return d * sg * (1.0L + z * (1.0L - sg));
}

/* Backward, from the formulas of norma.h: x_hat = (h - mean) * invstd with the exact mean of
   the group's h (what the removal of save_mean's rounding promises; RMS: mean 0) and the given
   invstd (the saved one); g = dy times the activation's derivative (RELU: y > 0 with the stored
   y; SILU: silu'(z), z = x_hat * gamma + beta); k = gamma * g;
     dx = invstd * (k - mean_G(k) - x_hat * mean_G(k * x_hat)) (+ dsum)   (RMS: no mean_G(k))
     dgamma[ch] = sum g * x_hat,  dbeta[ch] = sum g.
   fg / fb (may be NULL): the sums of |g| (|x_hat| + 1) and |g| per channel, the floors of the
   parameter gradients' tolerances. */
static void ind_backward(const nprob *p, const double *h, const void *y, const void *dy,
                         const void *dsum, const void *gamma, const void *beta,
                         const double *invstd, double *dx, double *dgamma, double *dbeta,
                         double *fg, double *fb) {
  const tn_geo *g = &p->g;
  const int64_t ng = tn_ngroups(g), cnt = tn_count(g), c = g->c;
  const int rms = p->kind == K_RMS;
  const norma_dtype dt = p->dt;
  long double *pg = calloc((size_t)(4 * c), sizeof(long double));
  for (int64_t G = 0; G < ng; G++) {
    long double s = 0;
    TN_FOR_GROUP(g, G, e) s += h[e];
    const long double mu = rms ? 0.0L : s / cnt, is = invstd[G];
    long double sx = 0;
    TN_FOR_GROUP(g, G, e) sx += (h[e] - mu) * is;
    const long double off = rms ? 0.0L : sx / cnt; /* 0 up to rounding */
#define XH(e) ((h[e] - mu) * is - off)
#define GR(e, ch)                                                                          \
  ((p->flags & NORMA_RELU)   ? (tu_load(dt, y, e) > 0 ? (long double)tu_load(dt, dy, e) : 0.0L) \
   : (p->flags & NORMA_SILU) ? silu_grad(tu_load(dt, dy, e),                               \
                                         XH(e) * par(dt, gamma, ch, 1.0) + par(dt, beta, ch, 0.0)) \
                             : (long double)tu_load(dt, dy, e))
    long double A = 0, B = 0;
    TN_FOR_GROUP(g, G, e) {
      const int64_t ch = tn_channel_of(g, e);
      const long double gr = GR(e, ch), k = par(dt, gamma, ch, 1.0) * gr, xh = XH(e);
      A += k, B += k * xh;
      pg[ch] += gr * xh, pg[c + ch] += gr;
      pg[2 * c + ch] += fabsl(gr) * (fabsl(xh) + 1), pg[3 * c + ch] += fabsl(gr);
    }
    TN_FOR_GROUP(g, G, e) {
      const int64_t ch = tn_channel_of(g, e);
      const long double gr = GR(e, ch), k = par(dt, gamma, ch, 1.0) * gr, xh = XH(e);
      long double v = is * (k - (rms ? 0.0L : A / cnt) - xh * B / cnt);
      if (dsum) v += tu_load(dt, dsum, e);
      dx[e] = (double)v;
    }
#undef XH
#undef GR
  }
  for (int64_t j = 0; j < c; j++) {
    dgamma[j] = (double)pg[j], dbeta[j] = (double)pg[c + j];
    if (fg) fg[j] = fmax(1.0, (double)pg[2 * c + j]);
    if (fb) fb[j] = fmax(1.0, (double)pg[3 * c + j]);
  }
  free(pg);
}

/* ---- calling the library on a problem ---- */

static norma_status call_forward(const nprob *p, const void *x, const void *res,
                                 const void *gamma, const void *beta, void *y, void *sum,
                                 void *sm, void *si, void *rm, void *rv, double momentum) {
  const tn_geo *g = &p->g;
  switch (p->kind) {
    case K_LN:
    case K_RMS: {
      norma_ln_desc d = {g->n, g->c, p->dt, p->eps, p->flags};
      return p->kind == K_LN ? norma_ln_forward(&d, x, res, gamma, beta, y, sum, sm, si)
                             : norma_rms_forward(&d, x, res, gamma, y, sum, si);
    }
    case K_GN: {
      norma_gn_desc d = {g->n, g->c, g->s, g->c / g->cpg, g->lay, p->dt, p->eps, p->flags};
      return norma_gn_forward(&d, x, gamma, beta, y, sm, si);
    }
    default: {
      norma_in_desc d = {g->n, g->c, g->s, g->lay, p->dt, p->eps, p->flags};
      return norma_in_forward_training(&d, x, gamma, beta, y, sm, si, rm, rv, momentum);
    }
  }
}

static norma_status call_backward(const nprob *p, const void *x, const void *y, const void *dy,
                                  const void *dsum, const void *gamma, const void *beta,
                                  const void *sm, const void *si, void *dx, void *dg, void *db) {
  const tn_geo *g = &p->g;
  switch (p->kind) {
    case K_LN:
    case K_RMS: {
      norma_ln_desc d = {g->n, g->c, p->dt, p->eps, p->flags};
      return p->kind == K_LN ? norma_ln_backward(&d, x, dy, dsum, gamma, sm, si, dx, dg, db)
                             : norma_rms_backward(&d, x, dy, dsum, gamma, si, dx, dg);
    }
    case K_GN: {
      norma_gn_desc d = {g->n, g->c, g->s, g->c / g->cpg, g->lay, p->dt, p->eps, p->flags};
      return norma_gn_backward(&d, x, y, dy, gamma, beta, sm, si, dx, dg, db);
    }
    default: {
      norma_in_desc d = {g->n, g->c, g->s, g->lay, p->dt, p->eps, p->flags};
      return norma_in_backward(&d, x, y, dy, gamma, beta, sm, si, dx, dg, db);
    }
  }
}

static void set_prob_ctx(const char *what, const nprob *p, int use_ref) {
  tu_set_ctx("%s %s %s n=%lld c=%lld s=%lld G=%lld %s %s eps=%g flags=0x%x", what,
             use_ref ? "ref" : "prod", KNAME[p->kind], (long long)p->g.n, (long long)p->g.c,
             (long long)p->g.s, (long long)(p->g.c / p->g.cpg), tu_dt_name(p->dt),
             tu_layout_name(p->g.lay), p->eps, p->flags);
}

/* ================================ 1. independent cases ================================== */

static void independent_case(const nprob *p, int residual, int use_dsum, int gamma_null,
                             int beta_null, uint64_t seed) {
  const tn_geo *g = &p->g;
  const int64_t total = ptotal(p), ng = tn_ngroups(g), c = g->c;
  const norma_dtype dt = p->dt, pt = tu_ptype(dt);
  const size_t tb = total * tu_esize(dt), pb = c * tu_psize(dt), gb = ng * tu_psize(dt);
  const double tt = tu_tol_tensor(dt), tp = tu_tol_param(dt), momentum = 0.3;
  tu_rng r = tu_rng_make(seed);
  double *mu = tu_alloc(ng * 8), *sd = tu_alloc(ng * 8), *off = tu_alloc(c * 8);
  for (int64_t G = 0; G < ng; G++)
    mu[G] = p->kind == K_RMS ? tu_uniform(&r, -1, 1) : tu_uniform(&r, -3, 3),
    sd[G] = tu_uniform(&r, 0.3, 3);
  for (int64_t j = 0; j < c; j++) off[j] = p->kind >= K_GN ? tu_uniform(&r, -0.5, 0.5) : 0.0;
  void *x = tu_alloc(tb), *res = tu_alloc(tb), *dy = tu_alloc(tb), *dsum = tu_alloc(tb);
  tn_fill_groups(dt, g, x, mu, sd, off, &r);
  tu_fill_uniform(dt, res, total, &r, -1.5, 1.5);
  tu_fill_uniform(dt, dy, total, &r, -1, 1.5);
  tu_fill_uniform(dt, dsum, total, &r, -1, 1);
  void *gamma = gamma_null ? NULL : tu_alloc(pb), *beta = beta_null ? NULL : tu_alloc(pb);
  if (gamma) tu_fill_param(dt, gamma, c, &r, -1.5, 1.5);
  if (gamma)
    for (int64_t j = 0; j < c; j++)
      if (fabs(tu_pload(dt, gamma, j)) < 0.2) tu_pstore(dt, gamma, j, 0.7);
  if (beta) tu_fill_param(dt, beta, c, &r, -1, 1);
  void *rm0 = tu_alloc(pb), *rv0 = tu_alloc(pb);
  tu_fill_param(dt, rm0, c, &r, -1, 1);
  tu_fill_param(dt, rv0, c, &r, 0.2, 3);
  const void *resp = residual ? res : NULL, *dsp = use_dsum ? dsum : NULL;

  /* the expectations of the forward */
  double *h = tu_alloc(total * 8), *ey = tu_alloc(total * 8), *var = tu_alloc(ng * 8),
         *inv = tu_alloc(ng * 8), *emean = tu_alloc(ng * 8);
  long double *meanl = tu_alloc(ng * sizeof(long double));
  ind_forward(p, x, resp, gamma, beta, h, meanl, var, inv, ey);
  for (int64_t G = 0; G < ng; G++) emean[G] = (double)meanl[G];
  /* InstanceNorm: running statistics move towards the batch average of the instances' mean
     and unbiased (or, with the flag, biased) variance */
  double *erm = tu_alloc(c * 8), *erv = tu_alloc(c * 8), *eyi = tu_alloc(total * 8);
  if (p->kind == K_IN) {
    const double s = (double)g->s,
                 unb = (p->flags & NORMA_BN_BIASED_RUNNING_VAR) ? 1.0 : s / (s - 1);
    for (int64_t j = 0; j < c; j++) {
      long double am = 0, av = 0;
      for (int64_t i = 0; i < g->n; i++) am += meanl[i * c + j], av += var[i * c + j] * unb;
      erm[j] = (1 - momentum) * tu_pload(dt, rm0, j) + momentum * (double)(am / g->n);
      erv[j] = (1 - momentum) * tu_pload(dt, rv0, j) + momentum * (double)(av / g->n);
    }
    /* inference: y = act((x - rm0) / sqrt(rv0 + eps) * gamma + beta) */
    for (int64_t e = 0; e < total; e++) {
      const int64_t ch = tn_channel_of(g, e);
      long double z = ((long double)tu_load(dt, x, e) - tu_pload(dt, rm0, ch)) /
                          sqrtl((long double)tu_pload(dt, rv0, ch) + p->eps) *
                          par(dt, gamma, ch, 1.0) +
                      par(dt, beta, ch, 0.0);
      if (p->flags & NORMA_RELU) z = z > 0 ? z : 0;
      if (p->flags & NORMA_SILU) z = z / (1.0L + expl(-z));
      eyi[e] = (double)z;
    }
  }

  for (int use_ref = 1; use_ref >= 0; use_ref--) {
    norma_set_use_reference(use_ref);
    set_prob_ctx("independent", p, use_ref);
    void *y = tu_poisoned(tb), *sum = tu_poisoned(tb), *sm = tu_poisoned(gb), *si = tu_poisoned(gb);
    void *rm = tu_dup(rm0, pb), *rv = tu_dup(rv0, pb);
    norma_status st = call_forward(p, x, resp, gamma, beta, y, sum, sm, si, rm, rv, momentum);
    EXPECT_OK(st, "forward");
    tu_cmp_d("y", dt, y, ey, total, tt, 1.0);
    if (residual) tu_cmp_d("sum", dt, sum, h, total, 0.0, 0.0);
    if (p->kind != K_RMS) tu_cmp_d("save_mean", pt, sm, emean, ng, tp, 1.0);
    tu_cmp_d(p->kind == K_RMS ? "save_invrms" : "save_invstd", pt, si, inv, ng, tp, 0.0);
    if (p->kind == K_IN) {
      tu_cmp_d("running_mean", pt, rm, erm, c, tp, 1.0);
      tu_cmp_d("running_var", pt, rv, erv, c, tp, 1.0);
      void *yi = tu_poisoned(tb);
      norma_in_desc d = {g->n, c, g->s, g->lay, dt, p->eps, p->flags};
      st = norma_in_forward_inference(&d, x, gamma, beta, rm0, rv0, yi);
      EXPECT_OK(st, "inference");
      tu_cmp_d("inference y", dt, yi, eyi, total, tt, 1.0);
      free(yi);
    }
    /* the backward, given the statistics this forward saved and its y */
    double *sid = tu_alloc(ng * 8), *edx = tu_alloc(total * 8), *edg = tu_alloc(c * 8),
           *edb = tu_alloc(c * 8), *fg = tu_alloc(c * 8), *fb = tu_alloc(c * 8),
           *fdx = tu_alloc(ng * 8);
    for (int64_t G = 0; G < ng; G++) sid[G] = tu_pload(dt, si, G);
    const void *xb = residual ? sum : x;
    ind_backward(p, h, y, dy, dsp, gamma, beta, sid, edx, edg, edb, fg, fb);
    for (int64_t G = 0; G < ng; G++) {
      double gm = 0;
      for (int64_t k = 0; k < g->cpg; k++)
        gm = fmax(gm, fabs(par(dt, gamma, (G % (c / g->cpg)) * g->cpg + k, 1.0)));
      fdx[G] = fmax(1.0, sid[G] * gm * 1.5);
    }
    void *dx = tu_poisoned(tb), *dg = tu_poisoned(pb), *dbt = tu_poisoned(pb);
    st = call_backward(p, xb, y, dy, dsp, gamma, beta, sm, si, dx, dg, dbt);
    EXPECT_OK(st, "backward");
    tn_cmp("dx", dt, dx, -1, edx, total, tt, 0.0, fdx, g);
    tn_cmp("dgamma", pt, dg, -1, edg, c, tp, 0.0, fg, NULL);
    if (p->kind != K_RMS) tn_cmp("dbeta", pt, dbt, -1, edb, c, tp, 0.0, fb, NULL);
    else tu_check_poison("dbeta (RMSNorm has none)", dbt, pb);
    free(sid), free(edx), free(edg), free(edb), free(fg), free(fb), free(fdx);
    free(dx), free(dg), free(dbt), free(y), free(sum), free(sm), free(si), free(rm), free(rv);
  }
  norma_set_use_reference(0);
  free(mu), free(sd), free(off), free(x), free(res), free(dy), free(dsum), free(gamma), free(beta);
  free(rm0), free(rv0), free(h), free(ey), free(var), free(inv), free(emean), free(meanl);
  free(erm), free(erv), free(eyi);
}

static void test_independent(void) {
  const norma_layout CF = NORMA_CHANNELS_FIRST, CL = NORMA_CHANNELS_LAST;
  typedef struct {
    nprob p;
    int residual, dsum, gamma_null, beta_null;
  } icase;
  static icase cases[32];
  int n = 0;
  /* LayerNorm / RMSNorm: tails, a chunk boundary, residual / dsum, gamma / beta NULL */
  cases[n++] = (icase){{K_LN, tn_geo_ln(5, 33), NORMA_F32, 1e-5, 0}, 1, 1, 0, 0};
  cases[n++] = (icase){{K_LN, tn_geo_ln(3, 1000), NORMA_F64, 1e-3, 0}, 0, 0, 0, 1};
  cases[n++] = (icase){{K_LN, tn_geo_ln(70, 7), NORMA_F16, 1e-5, NORMA_CHECK_FINITE}, 1, 0, 1, 0};
  cases[n++] = (icase){{K_LN, tn_geo_ln(2, 4097), NORMA_BF16, 0.0, 0}, 1, 1, 0, 0};
  cases[n++] = (icase){{K_RMS, tn_geo_ln(5, 33), NORMA_F32, 1e-6, 0}, 1, 1, 0, 0};
  cases[n++] = (icase){{K_RMS, tn_geo_ln(66, 17), NORMA_F64, 1e-5, 0}, 0, 1, 1, 0};
  cases[n++] = (icase){{K_RMS, tn_geo_ln(3, 4100), NORMA_F16, 1e-5, 0}, 1, 0, 0, 0};
  cases[n++] = (icase){{K_RMS, tn_geo_ln(7, 31), NORMA_BF16, 0.0, 0}, 0, 0, 0, 0};
  /* GroupNorm: both layouts, activations, the row path (spatial 1) */
  cases[n++] = (icase){{K_GN, tn_geo_gn(2, 17, 49, 1, CF), NORMA_F32, 1e-5, 0}, 0, 0, 0, 0};
  cases[n++] = (icase){{K_GN, tn_geo_gn(3, 64, 7, 4, CL), NORMA_F64, 1e-5, NORMA_RELU}, 0, 0, 0, 0};
  cases[n++] = (icase){{K_GN, tn_geo_gn(2, 6, 33, 3, CF), NORMA_F16, 1e-3, NORMA_SILU}, 0, 0, 0, 0};
  cases[n++] = (icase){{K_GN, tn_geo_gn(2, 6, 33, 3, CL), NORMA_F32, 0.0, NORMA_SILU}, 0, 0, 1, 0};
  cases[n++] = (icase){{K_GN, tn_geo_gn(3, 1000, 1, 8, CL), NORMA_BF16, 1e-5, 0}, 0, 0, 0, 1};
  cases[n++] = (icase){{K_GN, tn_geo_gn(5, 8, 1, 2, CF), NORMA_F32, 1e-5, NORMA_RELU}, 0, 0, 0, 0};
  cases[n++] = (icase){{K_GN, tn_geo_gn(2, 3, 4500, 1, CF), NORMA_F32, 1e-5, 0}, 0, 0, 0, 0};
  /* InstanceNorm: running statistics (unbiased, biased), activations, inference */
  cases[n++] = (icase){{K_IN, tn_geo_gn(2, 3, 49, 3, CF), NORMA_F32, 1e-5, 0}, 0, 0, 0, 0};
  cases[n++] = (icase){{K_IN, tn_geo_gn(3, 17, 7, 17, CL), NORMA_F64, 1e-5,
                        NORMA_SILU | NORMA_BN_BIASED_RUNNING_VAR}, 0, 0, 0, 0};
  cases[n++] =
      (icase){{K_IN, tn_geo_gn(1, 5, 1021, 5, CF), NORMA_BF16, 1e-5, NORMA_RELU}, 0, 0, 0, 0};
  cases[n++] = (icase){{K_IN, tn_geo_gn(4, 9, 2, 9, CL), NORMA_F16, 1e-3, 0}, 0, 0, 1, 1};
  for (int i = 0; i < n; i++)
    independent_case(&cases[i].p, cases[i].residual, cases[i].dsum, cases[i].gamma_null,
                     cases[i].beta_null, 3000 + i);
}

/* ================================ 2. large mean ========================================= */

static void large_mean_case(const nprob *p, double center, double spread, double tol,
                            uint64_t seed) {
  const tn_geo *g = &p->g;
  const int64_t total = ptotal(p), ng = tn_ngroups(g), c = g->c;
  const norma_dtype dt = p->dt, pt = tu_ptype(dt);
  const size_t tb = total * tu_esize(dt), pb = c * tu_psize(dt), gb = ng * tu_psize(dt);
  tu_rng r = tu_rng_make(seed);
  void *x = tu_alloc(tb), *dy = tu_alloc(tb), *gamma = tu_alloc(pb), *beta = tu_alloc(pb);
  for (int64_t e = 0; e < total; e++) tu_store(dt, x, e, center + spread * tu_normal(&r));
  for (int64_t e = 0; e < total; e++) tu_store(dt, dy, e, 0.5 * tu_normal(&r) + 0.1);
  tu_fill_param(dt, gamma, c, &r, 0.5, 1.5);
  tu_fill_param(dt, beta, c, &r, -0.5, 0.5);
  double *h = tu_alloc(total * 8), *ey = tu_alloc(total * 8), *var = tu_alloc(ng * 8),
         *inv = tu_alloc(ng * 8);
  long double *meanl = tu_alloc(ng * sizeof(long double));
  ind_forward(p, x, NULL, gamma, beta, h, meanl, var, inv, ey);
  for (int use_ref = 1; use_ref >= 0; use_ref--) {
    norma_set_use_reference(use_ref);
    set_prob_ctx("large mean", p, use_ref);
    void *y = tu_poisoned(tb), *sm = tu_poisoned(gb), *si = tu_poisoned(gb), *dx = tu_poisoned(tb),
         *dg = tu_poisoned(pb), *dbt = tu_poisoned(pb);
    norma_status st = call_forward(p, x, NULL, gamma, beta, y, NULL, sm, si, NULL, NULL, 0.1);
    EXPECT_OK(st, "forward");
    double e = tu_normwise(dt, y, ey, total);
    TU_CHECK(e <= tol, "[%s] y normwise error %.3g > %.3g (mean %g, std %g)", tu_ctx, e, tol,
             center, spread);
    e = tu_normwise(pt, si, inv, ng);
    TU_CHECK(e <= tol, "[%s] save_invstd normwise error %.3g > %.3g", tu_ctx, e, tol);
    if (p->kind != K_RMS) {
      double worst = 0; /* the saved mean, in units of the spread */
      for (int64_t G = 0; G < ng; G++)
        worst = fmax(worst, fabs((double)((long double)tu_pload(dt, sm, G) - meanl[G])) / spread);
      const double mtol = dt == NORMA_F64 ? 1e-7 : 0.01; /* the parameter type's rounding */
      TU_CHECK(worst <= mtol, "[%s] save_mean off by %.3g std", tu_ctx, worst);
    }
    /* the backward given what this forward saved */
    double *sid = tu_alloc(ng * 8), *edx = tu_alloc(total * 8), *edg = tu_alloc(c * 8),
           *edb = tu_alloc(c * 8);
    for (int64_t G = 0; G < ng; G++) sid[G] = tu_pload(dt, si, G);
    ind_backward(p, h, y, dy, NULL, gamma, beta, sid, edx, edg, edb, NULL, NULL);
    st = call_backward(p, x, y, dy, NULL, gamma, beta, sm, si, dx, dg, dbt);
    EXPECT_OK(st, "backward");
    e = tu_normwise(dt, dx, edx, total);
    TU_CHECK(e <= tol, "[%s] dx normwise error %.3g > %.3g", tu_ctx, e, tol);
    e = tu_normwise(pt, dg, edg, c);
    TU_CHECK(e <= tol, "[%s] dgamma normwise error %.3g > %.3g", tu_ctx, e, tol);
    if (p->kind != K_RMS) {
      e = tu_normwise(pt, dbt, edb, c);
      TU_CHECK(e <= tol, "[%s] dbeta normwise error %.3g > %.3g", tu_ctx, e, tol);
    }
    free(sid), free(edx), free(edg), free(edb);
    free(y), free(sm), free(si), free(dx), free(dg), free(dbt);
  }
  norma_set_use_reference(0);
  free(x), free(dy), free(gamma), free(beta), free(h), free(ey), free(var), free(inv), free(meanl);
}

static void test_large_mean(void) {
  const norma_dtype F32 = NORMA_F32, F64 = NORMA_F64;
  large_mean_case(&(nprob){K_LN, tn_geo_ln(64, 1000), F32, 1e-5, 0}, 1e4, 0.1, 1e-4, 600);
  large_mean_case(&(nprob){K_LN, tn_geo_ln(8, 4097), F32, 1e-5, 0}, -1e4, 0.1, 1e-4, 601);
  large_mean_case(&(nprob){K_LN, tn_geo_ln(300, 33), F32, 1e-5, 0}, 1e4, 0.1, 1e-4, 602);
  large_mean_case(&(nprob){K_LN, tn_geo_ln(16, 777), F64, 1e-5, 0}, 1e8, 1.0, 1e-8, 603);
  large_mean_case(&(nprob){K_RMS, tn_geo_ln(64, 1000), F32, 1e-6, 0}, 0.0, 1.0, 1e-4, 610);
  large_mean_case(&(nprob){K_RMS, tn_geo_ln(64, 1000), F32, 1e-6, 0}, 1e4, 0.1, 1e-4, 611);
  large_mean_case(&(nprob){K_RMS, tn_geo_ln(8, 4097), F32, 1e-6, 0}, -1e4, 0.1, 1e-4, 612);
  for (int l = 0; l < 2; l++) {
    const norma_layout lay = (norma_layout)l;
    large_mean_case(&(nprob){K_GN, tn_geo_gn(2, 32, 49, 4, lay), F32, 1e-5, 0}, 1e4, 0.1, 1e-4,
                    620 + l);
    large_mean_case(&(nprob){K_GN, tn_geo_gn(2, 6, 1500, 2, lay), F32, 1e-5, 0}, -1e4, 0.1, 1e-4,
                    622 + l);
    large_mean_case(&(nprob){K_GN, tn_geo_gn(3, 64, 1, 8, lay), F32, 1e-5, 0}, 1e4, 0.1, 1e-4,
                    624 + l);
    large_mean_case(&(nprob){K_GN, tn_geo_gn(2, 8, 300, 2, lay), F64, 1e-5, 0}, 1e8, 1.0, 1e-8,
                    628 + l);
    large_mean_case(&(nprob){K_IN, tn_geo_gn(2, 8, 1021, 8, lay), F32, 1e-5, 0}, 1e4, 0.1, 1e-4,
                    630 + l);
  }
}

/* The same promise with the fused SiLU: its derivative silu'(z) needs z = x_hat * gamma + beta,
   and x_hat must be that of the batch mean, not of save_mean rounded to f32 (at mean / std =
   1e5 the rounding moves x_hat by up to 5e-3, and silu'(z) with it). */
static void test_large_mean_silu(void) {
  for (int l = 0; l < 2; l++) {
    const norma_layout lay = (norma_layout)l;
    large_mean_case(&(nprob){K_GN, tn_geo_gn(2, 16, 100, 4, lay), NORMA_F32, 1e-5, NORMA_SILU},
                    1e4, 0.1, 1e-4, 640 + l);
    large_mean_case(&(nprob){K_IN, tn_geo_gn(2, 4, 500, 4, lay), NORMA_F32, 1e-5, NORMA_SILU},
                    -1e4, 0.1, 1e-4, 642 + l);
  }
}

/* ================================ 2b. extreme scales ==================================== */

/* f32 / bf16 data scaled by 2^k (k from -100 to 100: every value a normal number, the saved
   invstd still finite), eps 0: the norms are scale invariant, and the float64 reference shows
   it; the production path must agree with it in y, save_invstd and dx.  The statistics of a
   block are sums of squared deviations: in f32 they underflow for spreads below ~2^-64 and
   overflow above ~2^62 unless they are scaled. */
static void scale_case(const nprob *p, int k, uint64_t seed) {
  const tn_geo *g = &p->g;
  const int64_t total = ptotal(p), ng = tn_ngroups(g), c = g->c;
  const norma_dtype dt = p->dt, pt = tu_ptype(dt);
  const size_t tb = total * tu_esize(dt), pb = c * tu_psize(dt), gb = ng * tu_psize(dt);
  const double tol = dt == NORMA_F32 ? 1e-5 : 1e-2;
  tu_rng r = tu_rng_make(seed);
  void *x = tu_alloc(tb), *dy = tu_alloc(tb), *gamma = tu_alloc(pb), *beta = tu_alloc(pb);
  for (int64_t e = 0; e < total; e++) tu_store(dt, x, e, ldexp(0.5 + tu_uniform(&r, -1.5, 1.5), k));
  for (int64_t e = 0; e < total; e++) tu_store(dt, dy, e, tu_uniform(&r, -1, 1.2));
  tu_fill_param(dt, gamma, c, &r, 0.5, 1.5);
  tu_fill_param(dt, beta, c, &r, -0.5, 0.5);
  double *h = tu_alloc(total * 8), *ey = tu_alloc(total * 8), *var = tu_alloc(ng * 8),
         *inv = tu_alloc(ng * 8);
  long double *meanl = tu_alloc(ng * sizeof(long double));
  ind_forward(p, x, NULL, gamma, beta, h, meanl, var, inv, ey);
  for (int use_ref = 1; use_ref >= 0; use_ref--) {
    norma_set_use_reference(use_ref);
    char what[64];
    snprintf(what, sizeof what, "scale 2^%d", k);
    set_prob_ctx(what, p, use_ref);
    void *y = tu_poisoned(tb), *sm = tu_poisoned(gb), *si = tu_poisoned(gb), *dx = tu_poisoned(tb);
    norma_status st = call_forward(p, x, NULL, gamma, beta, y, NULL, sm, si, NULL, NULL, 0.1);
    EXPECT_OK(st, "forward");
    double e = tu_normwise(dt, y, ey, total);
    TU_CHECK(e <= tol, "[%s] y normwise error %.3g > %.3g", tu_ctx, e, tol);
    e = tu_normwise(pt, si, inv, ng);
    TU_CHECK(e <= 1e-5, "[%s] save_invstd normwise error %.3g > 1e-5 (e.g. %g, want %g)", tu_ctx, e,
             tu_pload(dt, si, 0), inv[0]);
    double *sid = tu_alloc(ng * 8), *edx = tu_alloc(total * 8), *edg = tu_alloc(c * 8),
           *edb = tu_alloc(c * 8);
    for (int64_t G = 0; G < ng; G++) sid[G] = tu_pload(dt, si, G);
    ind_backward(p, h, y, dy, NULL, gamma, beta, sid, edx, edg, edb, NULL, NULL);
    st = call_backward(p, x, y, dy, NULL, gamma, beta, sm, si, dx, NULL, NULL);
    EXPECT_OK(st, "backward");
    e = tu_normwise(dt, dx, edx, total);
    TU_CHECK(e <= tol, "[%s] dx normwise error %.3g > %.3g", tu_ctx, e, tol);
    free(sid), free(edx), free(edg), free(edb), free(y), free(sm), free(si), free(dx);
  }
  norma_set_use_reference(0);
  free(x), free(dy), free(gamma), free(beta), free(h), free(ey), free(var), free(inv), free(meanl);
}

static void test_extreme_scales(void) {
  static const int ks[] = {-100, -80, -70, -40, 40, 60, 62, 70, 100};
  uint64_t seed = 660;
  for (int t = 0; t < 2; t++) {
    const norma_dtype dt = t ? NORMA_BF16 : NORMA_F32;
    for (int ki = 0; ki < 9; ki++) {
      const int k = ks[ki];
      scale_case(&(nprob){K_LN, tn_geo_ln(6, 200), dt, 0.0, 0}, k, seed++);
      scale_case(&(nprob){K_RMS, tn_geo_ln(6, 200), dt, 0.0, 0}, k, seed++);
      for (int l = 0; l < 2; l++) {
        scale_case(&(nprob){K_GN, tn_geo_gn(2, 8, 50, 2, (norma_layout)l), dt, 0.0, 0}, k, seed++);
        scale_case(&(nprob){K_IN, tn_geo_gn(2, 3, 70, 3, (norma_layout)l), dt, 0.0, 0}, k, seed++);
      }
    }
  }
}

/* ================================ 3. exact statistics =================================== */

/* Fills every group of p with values in pairs center[G] +- k / 8 (k in 0..8, at least one
   k != 0; an odd count gets one value center[G]), placed at random positions of the group; or,
   with `fixed`, every pair +- 2 (variance exactly 4).  Returns per group the exact mean and
   the exact sum of squared deviations (about center; RMS: about 0, center = 0). */
static void exact_fill(const nprob *p, void *x, double *emean, double *em2, int fixed, tu_rng *r) {
  const tn_geo *g = &p->g;
  const int64_t ng = tn_ngroups(g), cnt = tn_count(g), per = g->c / g->cpg;
  int64_t *pos = tu_alloc(cnt * sizeof(int64_t));
  for (int64_t G = 0; G < ng; G++) {
    const double center =
        p->kind == K_RMS ? 0.0 : 0.5 + 0.25 * (double)(G % 5) - (G % 2 ? 1.0 : 0.0);
    const int64_t i = G / per, c0 = (G % per) * g->cpg;
    for (int64_t q = 0; q < cnt; q++) pos[q] = q;
    for (int64_t q = cnt - 1; q > 0; q--) {
      const int64_t o = tu_below(r, q + 1), t = pos[q];
      pos[q] = pos[o], pos[o] = t;
    }
    long long sumk2 = 0;
    for (int64_t q = 0; q + 1 < cnt; q += 2) {
      const int64_t k = fixed ? 16 : q == 0 ? 1 + tu_below(r, 8) : tu_below(r, 9);
      sumk2 += 2 * k * k;
      for (int hh = 0; hh < 2; hh++) {
        const int64_t k2 = pos[q + hh];
        tu_store(p->dt, x, tn_index(g, i, c0 + k2 / g->s, k2 % g->s),
                 center + (hh ? -1.0 : 1.0) * (double)k / 8.0);
      }
    }
    if (cnt % 2) {
      const int64_t k2 = pos[cnt - 1];
      tu_store(p->dt, x, tn_index(g, i, c0 + k2 / g->s, k2 % g->s), center);
    }
    emean[G] = center;
    em2[G] = (double)sumk2 / 64.0;
  }
  free(pos);
}

static void exact_case(const nprob *p, int fixed, uint64_t seed) {
  const tn_geo *g = &p->g;
  const int64_t total = ptotal(p), ng = tn_ngroups(g), cnt = tn_count(g), c = g->c;
  const norma_dtype dt = p->dt, pt = tu_ptype(dt);
  const size_t tb = total * tu_esize(dt), pb = c * tu_psize(dt), gb = ng * tu_psize(dt);
  tu_rng r = tu_rng_make(seed);
  void *x = tu_alloc(tb);
  double *emean = tu_alloc(ng * 8), *em2 = tu_alloc(ng * 8);
  exact_fill(p, x, emean, em2, fixed, &r);
  for (int use_ref = 1; use_ref >= 0; use_ref--) {
    norma_set_use_reference(use_ref);
    set_prob_ctx(fixed ? "exact stats (variance 4)" : "exact stats", p, use_ref);
    void *y = tu_poisoned(tb), *sm = tu_poisoned(gb), *si = tu_poisoned(gb);
    void *rm = tu_alloc(pb), *rv = tu_alloc(pb);
    tu_fill_param(dt, rm, c, &r, -5, 5);
    tu_fill_param(dt, rv, c, &r, 1, 5);
    /* InstanceNorm: momentum 1 and biased: the running statistics are the batch averages */
    norma_status st = call_forward(p, x, NULL, NULL, NULL, y, NULL, sm, si, rm, rv, 1.0);
    EXPECT_OK(st, "forward");
    int64_t bad_mean = 0, bad_inv = 0, worst_mean = 0, worst_inv = 0, wg = 0;
    for (int64_t G = 0; G < ng; G++) {
      const double var = em2[G] / (double)cnt, einv = 1.0 / sqrt(var);
      int64_t um = 0, ui;
      if (pt == NORMA_F64) {
        if (p->kind != K_RMS) um = tu_ulps_f64(((double *)sm)[G], emean[G]);
        ui = tu_ulps_f64(((double *)si)[G], einv);
      } else {
        if (p->kind != K_RMS) um = tu_ulps_f32(((float *)sm)[G], (float)emean[G]);
        ui = tu_ulps_f32(((float *)si)[G], (float)einv);
      }
      if (fixed) { /* variance 4 (RMS: mean square 4): invstd exactly 1/2 */
        if (tu_pload(dt, si, G) != 0.5) ui = 1000;
      }
      bad_mean += um > 1;
      bad_inv += ui > (fixed ? 0 : pt == NORMA_F64 ? 2 : 1);
      if (um > worst_mean) worst_mean = um;
      if (ui > worst_inv) worst_inv = ui, wg = G;
    }
    if (p->kind != K_RMS)
      TU_CHECK(bad_mean == 0,
               "[%s] save_mean off by > 1 ulp in %lld of %lld groups (worst %lld ulp)", tu_ctx,
               (long long)bad_mean, (long long)ng, (long long)worst_mean);
    TU_CHECK(bad_inv == 0, "[%s] save_invstd (eps 0) off in %lld of %lld groups (worst %lld ulp, "
             "group %lld: %.9g, variance %.17g)", tu_ctx, (long long)bad_inv, (long long)ng,
             (long long)worst_inv, (long long)wg, tu_pload(dt, si, wg), em2[wg] / (double)cnt);
    if (p->kind == K_IN && (p->flags & NORMA_BN_BIASED_RUNNING_VAR)) {
      int64_t bad = 0;
      for (int64_t j = 0; j < c; j++) {
        double am = 0, av = 0; /* exact: few dyadic values */
        for (int64_t i = 0; i < g->n; i++)
          am += emean[i * c + j], av += em2[i * c + j] / (double)cnt;
        am /= (double)g->n, av /= (double)g->n;
        const int64_t um = pt == NORMA_F64 ? tu_ulps_f64(((double *)rm)[j], am)
                                           : tu_ulps_f32(((float *)rm)[j], (float)am);
        const int64_t uv = pt == NORMA_F64 ? tu_ulps_f64(((double *)rv)[j], av)
                                           : tu_ulps_f32(((float *)rv)[j], (float)av);
        bad += um > 1 || uv > 1;
      }
      TU_CHECK(bad == 0, "[%s] running statistics (momentum 1, biased) off by > 1 ulp in %lld "
               "channels", tu_ctx, (long long)bad);
    }
    free(y), free(sm), free(si), free(rm), free(rv);
  }
  norma_set_use_reference(0);
  free(x), free(emean), free(em2);
}

static void test_exact(void) {
  int i = 0;
  for (int t = 0; t < 4; t++) {
    const norma_dtype dt = TN_DTS[t];
    exact_case(&(nprob){K_LN, tn_geo_ln(9, 64), dt, 0.0, 0}, 0, 700 + i++);
    exact_case(&(nprob){K_LN, tn_geo_ln(5, 1021), dt, 0.0, 0}, 0, 700 + i++);
    exact_case(&(nprob){K_LN, tn_geo_ln(3, 4097), dt, 0.0, 0}, 0, 700 + i++);
    exact_case(&(nprob){K_LN, tn_geo_ln(7, 7), dt, 0.0, 0}, 0, 700 + i++);
    exact_case(&(nprob){K_LN, tn_geo_ln(4, 30), dt, 0.0, 0}, 1, 700 + i++);
    exact_case(&(nprob){K_RMS, tn_geo_ln(9, 64), dt, 0.0, 0}, 0, 700 + i++);
    exact_case(&(nprob){K_RMS, tn_geo_ln(3, 4097), dt, 0.0, 0}, 0, 700 + i++);
    exact_case(&(nprob){K_RMS, tn_geo_ln(4, 30), dt, 0.0, 0}, 1, 700 + i++);
    for (int l = 0; l < 2; l++) {
      const norma_layout lay = (norma_layout)l;
      exact_case(&(nprob){K_GN, tn_geo_gn(2, 12, 16, 3, lay), dt, 0.0, 0}, 0, 700 + i++);
      exact_case(&(nprob){K_GN, tn_geo_gn(3, 6, 49, 2, lay), dt, 0.0, NORMA_RELU}, 0, 700 + i++);
      exact_case(&(nprob){K_GN, tn_geo_gn(1, 4, 1500, 1, lay), dt, 0.0, 0}, 0, 700 + i++);
      exact_case(&(nprob){K_GN, tn_geo_gn(8, 64, 1, 8, lay), dt, 0.0, 0}, 0, 700 + i++);
      exact_case(&(nprob){K_GN, tn_geo_gn(2, 8, 10, 4, lay), dt, 0.0, NORMA_SILU}, 1, 700 + i++);
      exact_case(&(nprob){K_IN, tn_geo_gn(4, 5, 16, 5, lay), dt, 0.0, NORMA_BN_BIASED_RUNNING_VAR},
                 0, 700 + i++);
      exact_case(&(nprob){K_IN, tn_geo_gn(3, 17, 7, 17, lay), dt, 0.0, NORMA_BN_BIASED_RUNNING_VAR},
                 0, 700 + i++);
      exact_case(&(nprob){K_IN, tn_geo_gn(2, 3, 1021, 3, lay), dt, 0.0, 0}, 0, 700 + i++);
      exact_case(
          &(nprob){K_IN, tn_geo_gn(2, 3, 4098, 3, lay), dt, 0.0, NORMA_BN_BIASED_RUNNING_VAR}, 1,
          700 + i++);
    }
  }
}

/* ================================ 4. residual fusion ==================================== */

static void residual_case(int rms, int64_t rows, int64_t d, norma_dtype dt, uint64_t seed) {
  const tn_geo g = tn_geo_ln(rows, d);
  const int64_t total = rows * d;
  const size_t tb = total * tu_esize(dt), pb = d * tu_psize(dt), gb = rows * tu_psize(dt);
  const norma_dtype pt = tu_ptype(dt);
  const norma_ln_desc D = {rows, d, dt, 1e-5, 0};
  tu_rng r = tu_rng_make(seed);
  void *x = tu_alloc(tb), *res = tu_alloc(tb), *dy = tu_alloc(tb), *dsum = tu_alloc(tb);
  double *mu = tu_alloc(rows * 8), *sd = tu_alloc(rows * 8);
  for (int64_t i = 0; i < rows; i++) mu[i] = tu_uniform(&r, -2, 2), sd[i] = tu_uniform(&r, 0.5, 2);
  tn_fill_groups(dt, &g, x, mu, sd, NULL, &r);
  tu_fill_uniform(dt, res, total, &r, -3, 3);
  tu_fill_uniform(dt, dy, total, &r, -1, 1);
  tu_fill_uniform(dt, dsum, total, &r, -1, 1);
  void *gamma = tu_alloc(pb), *beta = tu_alloc(pb);
  tu_fill_param(dt, gamma, d, &r, 0.5, 1.5);
  tu_fill_param(dt, beta, d, &r, -0.5, 0.5);
  void *esum = tu_alloc(tb); /* x + residual rounded to dt */
  for (int64_t e = 0; e < total; e++)
    tu_store(dt, esum, e, tu_load(dt, x, e) + tu_load(dt, res, e));
#define FWD(xx, rr, yy, ss, sm, si)                                             \
  (rms ? norma_rms_forward(&D, xx, rr, gamma, yy, ss, si)                        \
       : norma_ln_forward(&D, xx, rr, gamma, beta, yy, ss, sm, si))
  for (int use_ref = 1; use_ref >= 0; use_ref--) {
    norma_set_use_reference(use_ref);
    tu_set_ctx("residual %s %s rows=%lld d=%lld %s", use_ref ? "ref" : "prod", rms ? "RMS" : "LN",
               (long long)rows, (long long)d, tu_dt_name(dt));
    /* fused, sum separate */
    void *y1 = tu_poisoned(tb), *s1 = tu_poisoned(tb), *sm1 = tu_poisoned(gb),
         *si1 = tu_poisoned(gb);
    EXPECT_OK(FWD(x, res, y1, s1, sm1, si1), "forward (residual, sum)");
    tn_same("sum == x + residual rounded", dt, s1, esum, total);
    /* the op on the sum itself */
    void *y0 = tu_poisoned(tb), *sm0 = tu_poisoned(gb), *si0 = tu_poisoned(gb);
    EXPECT_OK(FWD(esum, NULL, y0, NULL, sm0, si0), "forward (on the sum)");
    tn_same("y (fused) == y (op on the sum)", dt, y1, y0, total);
    if (!rms) tu_same_bits("save_mean (fused) == (op on the sum)", sm1, sm0, gb);
    tu_same_bits("save_invstd (fused) == (op on the sum)", si1, si0, gb);
    /* sum NULL */
    void *y2 = tu_poisoned(tb), *sm2 = tu_poisoned(gb), *si2 = tu_poisoned(gb);
    EXPECT_OK(FWD(x, res, y2, NULL, sm2, si2), "forward (residual, sum NULL)");
    tn_same("y (sum NULL)", dt, y2, y1, total);
    tu_same_bits("save_invstd (sum NULL)", si2, si1, gb);
    /* sum aliasing x (the residual stream updated in place), then residual */
    for (int which = 0; which < 2; which++) {
      void *xa = tu_dup(x, tb), *ra = tu_dup(res, tb), *y3 = tu_poisoned(tb),
           *sm3 = tu_poisoned(gb), *si3 = tu_poisoned(gb);
      void *sum = which ? ra : xa;
      EXPECT_OK(FWD(xa, ra, y3, sum, sm3, si3),
                which ? "forward (sum == residual)" : "forward (sum == x)");
      tn_same(which ? "sum (== residual)" : "sum (== x)", dt, sum, esum, total);
      tn_same(which ? "y (sum == residual)" : "y (sum == x)", dt, y3, y1, total);
      if (!rms) tu_same_bits("save_mean (aliased sum)", sm3, sm1, gb);
      tu_same_bits("save_invstd (aliased sum)", si3, si1, gb);
      tn_same(which ? "x untouched (sum == residual)" : "residual untouched (sum == x)", dt,
              which ? xa : ra, which ? x : res, total);
      free(xa), free(ra), free(y3), free(sm3), free(si3);
    }
    /* y aliasing x with the sum into residual: the residual stream and the output in place */
    {
      void *xa = tu_dup(x, tb), *ra = tu_dup(res, tb), *sm4 = tu_poisoned(gb),
           *si4 = tu_poisoned(gb);
      EXPECT_OK(FWD(xa, ra, xa, ra, sm4, si4), "forward (y == x, sum == residual)");
      tn_same("y (== x, sum == residual)", dt, xa, y1, total);
      tn_same("sum (== residual, y == x)", dt, ra, esum, total);
      free(xa), free(ra), free(sm4), free(si4);
    }
    /* the backward: dsum is added to dx */
    const nprob p = {rms ? K_RMS : K_LN, g, dt, 1e-5, 0};
    double *h = tu_alloc(total * 8), *sid = tu_alloc(rows * 8), *edx = tu_alloc(total * 8),
           *edx0 = tu_alloc(total * 8), *edg = tu_alloc(d * 8), *edb = tu_alloc(d * 8),
           *fdx = tu_alloc(rows * 8);
    for (int64_t e = 0; e < total; e++) h[e] = tu_load(dt, esum, e);
    for (int64_t i = 0; i < rows; i++)
      sid[i] = tu_pload(dt, si1, i), fdx[i] = fmax(1.0, 2.0 * sid[i]);
    ind_backward(&p, h, NULL, dy, dsum, gamma, beta, sid, edx, edg, edb, NULL, NULL);
    ind_backward(&p, h, NULL, dy, NULL, gamma, beta, sid, edx0, edg, edb, NULL, NULL);
    void *dx = tu_poisoned(tb), *dx0 = tu_poisoned(tb);
    norma_status st = rms ? norma_rms_backward(&D, s1, dy, dsum, gamma, si1, dx, NULL)
                          : norma_ln_backward(&D, s1, dy, dsum, gamma, sm1, si1, dx, NULL, NULL);
    EXPECT_OK(st, "backward (dsum)");
    st = rms ? norma_rms_backward(&D, s1, dy, NULL, gamma, si1, dx0, NULL)
             : norma_ln_backward(&D, s1, dy, NULL, gamma, sm1, si1, dx0, NULL, NULL);
    EXPECT_OK(st, "backward (no dsum)");
    tn_cmp("dx (with dsum)", dt, dx, -1, edx, total, tu_tol_tensor(dt), 0.0, fdx, &g);
    tn_cmp("dx (without dsum)", dt, dx0, -1, edx0, total, tu_tol_tensor(dt), 0.0, fdx, &g);
    /* dx(dsum) - dx(no dsum) == dsum, up to the rounding of the stored dx */
    double *diff = tu_alloc(total * 8);
    for (int64_t e = 0; e < total; e++) diff[e] = tu_load(dt, dx, e) - tu_load(dt, dx0, e);
    double *dsd = tu_alloc(total * 8);
    for (int64_t e = 0; e < total; e++) dsd[e] = tu_load(dt, dsum, e);
    tn_cmp("dx(dsum) - dx(no dsum) == dsum", NORMA_F64, diff, -1, dsd, total,
           2.5 * tu_tol_tensor(dt), 0.0, fdx, &g);
    (void)pt;
    free(diff), free(dsd), free(h), free(sid), free(edx), free(edx0), free(edg), free(edb),
        free(fdx);
    free(dx), free(dx0), free(y0), free(sm0), free(si0), free(y1), free(s1), free(sm1), free(si1);
    free(y2), free(sm2), free(si2);
  }
#undef FWD
  norma_set_use_reference(0);
  free(x), free(res), free(dy), free(dsum), free(mu), free(sd), free(gamma), free(beta), free(esum);
}

static void test_residual(void) {
  int i = 0;
  for (int t = 0; t < 4; t++)
    for (int rms = 0; rms < 2; rms++) {
      residual_case(rms, 5, 33, TN_DTS[t], 800 + i++);
      residual_case(rms, 70, 1000, TN_DTS[t], 800 + i++); /* threads */
      residual_case(rms, 3, 4097, TN_DTS[t], 800 + i++);
    }
}

int main(void) {
  printf("test_norm_reference: ISA %s\n", norma_isa_name(norma_get_isa()));
  test_independent();
  test_large_mean();
  test_large_mean_silu();
  test_extreme_scales();
  test_exact();
  test_residual();
  return tu_finish("test_norm_reference");
}
