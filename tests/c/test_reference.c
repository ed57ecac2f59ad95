/* test_reference.c - norma against a float64 reference written here, independent of the
 * library's own reference kernels (which test_kernels uses as the oracle):
 *
 *  1. a handful of shapes / dtypes / layouts / flags: training forward (y, save_mean,
 *     save_invstd, running statistics), inference, backward (x given, x NULL, GLOBAL_STATS),
 *     for both the reference kernels and the production kernels;
 *  2. exact-statistics fills (values in pairs symmetric about a dyadic mean, as oneDNN's
 *     benchdnn does): save_mean, the biased variance (running_var with momentum 1 and
 *     NORMA_BN_BIASED_RUNNING_VAR) and the moments must be the exact values or 1 ulp off;
 *  3. large-mean accuracy: f32 data with mean 1e4, std 0.1 and f64 data with mean 1e8, std 1,
 *     both layouts: y, dx, dgamma, dbeta (and the moments) within 1e-4 (f32) / 1e-8 (f64)
 *     normwise relative error, the backward given the save_mean / save_invstd of the forward;
 *  4. channels-last statistics over many row blocks, whose later blocks take the one-pass
 *     kernel around the first block's anchors unless that is unsafe: per channel, ordinary
 *     data, a mean that drifts far from the first block's, a step after the first block,
 *     spreads of 1e30 and 1e-30, a constant, a constant with one outlier; the mean and the
 *     variance of every channel within 1e-5 relative (of the spread) of a long-double
 *     reference, in f32, f16 and bf16.
 */
#include "test_util.h"

typedef struct prob {
  int64_t n, c, s;
  norma_layout lay;
  norma_dtype dt;
  double eps;
  unsigned flags;
} prob;

static norma_bn_desc desc_of(const prob *p) {
  norma_bn_desc d = {p->n, p->c, p->s, p->lay, p->dt, p->eps, p->flags};
  return d;
}
static int act_of(unsigned flags) {
  return (flags & NORMA_BN_ADD_RELU) ? 2 : (flags & NORMA_BN_RELU) ? 1 : 0;
}
static double par(norma_dtype dt, const void *p, int64_t j, double dflt) {
  return p ? tu_pload(dt, p, j) : dflt;
}

/* ---- the independent reference (double results, long double sums) ---- */

/* per-channel batch mean (also unrounded, in long double, when mean_ld is given) and biased
   variance, two passes */
static void ind_stats(const prob *p, const void *x, double *mean, long double *mean_ld,
                      double *var) {
  const int64_t m = p->n * p->s;
  for (int64_t j = 0; j < p->c; j++) {
    long double sum = 0;
    for (int64_t i = 0; i < p->n; i++)
      for (int64_t sp = 0; sp < p->s; sp++)
        sum += tu_load(p->dt, x, tu_index(p->lay, p->c, p->s, i, j, sp));
    long double mu = sum / m, ss = 0;
    for (int64_t i = 0; i < p->n; i++)
      for (int64_t sp = 0; sp < p->s; sp++) {
        long double dlt = tu_load(p->dt, x, tu_index(p->lay, p->c, p->s, i, j, sp)) - mu;
        ss += dlt * dlt;
      }
    mean[j] = (double)mu;
    if (mean_ld) mean_ld[j] = mu;
    var[j] = (double)(ss / m);
  }
}

/* y = act((x - mean) * invstd * gamma + beta [+ res]) with the given mean / invstd */
static void ind_apply(const prob *p, const void *x, const void *res, const void *gamma,
                      const void *beta, const long double *mean, const double *invstd,
                      double *y) {
  const int act = act_of(p->flags);
  for (int64_t i = 0; i < p->n; i++)
    for (int64_t j = 0; j < p->c; j++)
      for (int64_t sp = 0; sp < p->s; sp++) {
        int64_t k = tu_index(p->lay, p->c, p->s, i, j, sp);
        double v = ((long double)tu_load(p->dt, x, k) - mean[j]) * invstd[j] *
                       par(p->dt, gamma, j, 1.0) +
                   par(p->dt, beta, j, 0.0);
        if (act == 2) v += tu_load(p->dt, res, k);
        if (act && !(v > 0)) v = 0.0;
        y[k] = v;
      }
}

/* Backward.  x_hat from x with the exact batch mean (what the library's removal of the
   rounding of save_mean promises), or from y when x is NULL; without global the mean of x_hat
   is removed (0 up to long double rounding when x is given); with global the given statistics
   are constants.  y is the forward's output as stored (mask y > 0). */
static void ind_backward(const prob *p, const void *x, const void *y, const void *dy,
                         const void *gamma, const void *beta, const double *mean,
                         const double *invstd, int global, double *dx, double *dres,
                         double *dgamma, double *dbeta) {
  const int act = act_of(p->flags);
  const int64_t m = p->n * p->s;
  double *bm = tu_alloc(p->c * sizeof(double)), *bv = tu_alloc(p->c * sizeof(double));
  long double *bml = tu_alloc(p->c * sizeof(long double));
  if (x && !global) ind_stats(p, x, bm, bml, bv);
  for (int64_t j = 0; j < p->c; j++) {
    const double gam = par(p->dt, gamma, j, 1.0), bet = par(p->dt, beta, j, 0.0);
    const long double mu = (x && !global) ? bml[j] : (long double)mean[j];
    long double sg = 0, sgx = 0, sx = 0;
#define XHAT(k) (x ? ((long double)tu_load(p->dt, x, k) - mu) * invstd[j] \
                   : ((long double)tu_load(p->dt, y, k) - bet) / gam)
#define GRAD(k) ((act && !(tu_load(p->dt, y, k) > 0)) ? 0.0L : (long double)tu_load(p->dt, dy, k))
    for (int64_t i = 0; i < p->n; i++)
      for (int64_t sp = 0; sp < p->s; sp++) {
        int64_t k = tu_index(p->lay, p->c, p->s, i, j, sp);
        sx += XHAT(k);
      }
    const long double off = !global ? sx / m : 0.0L;
    for (int64_t i = 0; i < p->n; i++)
      for (int64_t sp = 0; sp < p->s; sp++) {
        int64_t k = tu_index(p->lay, p->c, p->s, i, j, sp);
        long double g = GRAD(k), xh = XHAT(k) - off;
        sg += g;
        sgx += g * xh;
      }
    dgamma[j] = (double)sgx;
    dbeta[j] = (double)sg;
    for (int64_t i = 0; i < p->n; i++)
      for (int64_t sp = 0; sp < p->s; sp++) {
        int64_t k = tu_index(p->lay, p->c, p->s, i, j, sp);
        long double g = GRAD(k), xh = XHAT(k) - off;
        dx[k] = global ? (double)(gam * invstd[j] * g)
                       : (double)(gam * invstd[j] * (g - sg / m - xh * sgx / m));
        if (dres) dres[k] = (double)g;
      }
#undef XHAT
#undef GRAD
  }
  free(bm);
  free(bv);
  free(bml);
}

#define EXPECT_OK(st, what)                                                                    \
  TU_CHECK((st) == NORMA_OK, "[%s] %s returned %s: %s", tu_ctx, what, norma_status_string(st), \
           norma_last_error())

/* ---- 1. a handful of cases against the independent reference ---- */

static void independent_case(const prob *p, int gamma_null, int beta_null, uint64_t seed) {
  const int64_t total = p->n * p->c * p->s, m = p->n * p->s, c = p->c;
  const size_t tb = total * tu_esize(p->dt), pb = c * tu_psize(p->dt), dtb = total * sizeof(double);
  const norma_dtype dt = p->dt, pt = tu_ptype(p->dt);
  const double tt = tu_tol_tensor(dt), tp = tu_tol_param(dt);
  const double momentum = 0.3;
  const int act = act_of(p->flags);
  norma_bn_desc d = desc_of(p);
  tu_rng r = tu_rng_make(seed);
  void *x = tu_alloc(tb), *res = tu_alloc(tb), *dy = tu_alloc(tb);
  double *mu = tu_alloc(c * 8), *sd = tu_alloc(c * 8);
  for (int64_t j = 0; j < c; j++) mu[j] = tu_uniform(&r, -3, 3), sd[j] = tu_uniform(&r, 0.3, 3);
  tu_fill_channels(dt, p->lay, x, p->n, c, p->s, mu, sd, &r);
  tu_fill_uniform(dt, res, total, &r, -1.5, 1.5);
  tu_fill_uniform(dt, dy, total, &r, -1, 1.5);
  void *gamma = gamma_null ? NULL : tu_alloc(pb), *beta = beta_null ? NULL : tu_alloc(pb);
  if (gamma) tu_fill_param(dt, gamma, c, &r, -1.5, 1.5);
  if (gamma)
    for (int64_t j = 0; j < c; j++)
      if (fabs(tu_pload(dt, gamma, j)) < 0.2) tu_pstore(dt, gamma, j, 0.7);
  if (beta) tu_fill_param(dt, beta, c, &r, -1, 1);
  void *rm0 = tu_alloc(pb), *rv0 = tu_alloc(pb);
  tu_fill_param(dt, rm0, c, &r, -1, 1);
  tu_fill_param(dt, rv0, c, &r, 0.2, 3);

  /* the reference's expectations */
  double *bmean = tu_alloc(c * 8), *bvar = tu_alloc(c * 8), *binv = tu_alloc(c * 8);
  double *erm = tu_alloc(c * 8), *erv = tu_alloc(c * 8), *ey = tu_alloc(dtb), *eyi = tu_alloc(dtb);
  double *imean = tu_alloc(c * 8), *iinv = tu_alloc(c * 8);
  long double *bml = tu_alloc(c * sizeof(long double)), *iml = tu_alloc(c * sizeof(long double));
  ind_stats(p, x, bmean, bml, bvar);
  for (int64_t j = 0; j < c; j++) {
    binv[j] = 1.0 / sqrt(bvar[j] + p->eps);
    double v = (p->flags & NORMA_BN_BIASED_RUNNING_VAR) ? bvar[j] : bvar[j] * m / (m - 1.0);
    erm[j] = (1 - momentum) * tu_pload(dt, rm0, j) + momentum * bmean[j];
    erv[j] = (1 - momentum) * tu_pload(dt, rv0, j) + momentum * v;
    imean[j] = tu_pload(dt, rm0, j);
    iml[j] = imean[j];
    iinv[j] = 1.0 / sqrt(tu_pload(dt, rv0, j) + p->eps);
  }
  ind_apply(p, x, res, gamma, beta, bml, binv, ey);
  ind_apply(p, x, res, gamma, beta, iml, iinv, eyi);

  for (int use_ref = 1; use_ref >= 0; use_ref--) {
    norma_set_use_reference(use_ref);
    tu_set_ctx("independent %s n=%lld c=%lld s=%lld %s %s flags=0x%x%s%s", use_ref ? "ref" : "prod",
               (long long)p->n, (long long)c, (long long)p->s, tu_dt_name(dt),
               tu_layout_name(p->lay), p->flags, gamma_null ? " gamma=NULL" : "",
               beta_null ? " beta=NULL" : "");
    void *y = tu_poisoned(tb), *yi = tu_poisoned(tb), *sm = tu_poisoned(pb), *si = tu_poisoned(pb);
    void *rm = tu_dup(rm0, pb), *rv = tu_dup(rv0, pb);
    norma_status st = norma_bn_forward_training(&d, x, res, gamma, beta, y, sm, si, rm, rv,
                                                momentum);
    EXPECT_OK(st, "forward_training");
    tu_cmp_d("y", dt, y, ey, total, tt, 1.0);
    tu_cmp_d("save_mean", pt, sm, bmean, c, tp, 1.0);
    tu_cmp_d("save_invstd", pt, si, binv, c, tp, 1.0);
    tu_cmp_d("running_mean", pt, rm, erm, c, tp, 1.0);
    tu_cmp_d("running_var", pt, rv, erv, c, tp, 1.0);
    st = norma_bn_forward_inference(&d, x, res, gamma, beta, rm0, rv0, yi);
    EXPECT_OK(st, "forward_inference");
    tu_cmp_d("inference y", dt, yi, eyi, total, tt, 1.0);

    /* backward: batch statistics (x given, x NULL), then frozen statistics */
    double *smd = tu_alloc(c * 8), *sid = tu_alloc(c * 8);
    for (int64_t j = 0; j < c; j++) smd[j] = tu_pload(dt, sm, j), sid[j] = tu_pload(dt, si, j);
    for (int mode = 0; mode < 3; mode++) {
      const int global = mode == 2;
      const void *xin = mode == 1 ? NULL : x;
      if (mode == 1 && act) continue;
      norma_bn_desc db = d;
      if (global) db.flags |= NORMA_BN_GLOBAL_STATS;
      const void *yin = global ? yi : y;
      const void *smp = global ? rm0 : sm;
      void *gsi = NULL;
      if (global) {
        gsi = tu_alloc(pb);
        for (int64_t j = 0; j < c; j++) tu_pstore(dt, gsi, j, iinv[j]);
      }
      double *esm = global ? imean : smd, *esi = tu_alloc(c * 8);
      for (int64_t j = 0; j < c; j++) esi[j] = tu_pload(dt, global ? gsi : si, j);
      double *edx = tu_alloc(dtb), *edr = tu_alloc(dtb), *edg = tu_alloc(c * 8),
             *edb = tu_alloc(c * 8);
      ind_backward(p, xin, yin, dy, gamma, beta, esm, esi, global, edx, act == 2 ? edr : NULL,
                   edg, edb);
      void *dx = tu_poisoned(tb), *dr = tu_poisoned(tb), *dg = tu_poisoned(pb),
           *dbt = tu_poisoned(pb);
      st = norma_bn_backward(&db, xin, yin, dy, gamma, beta, smp, global ? gsi : si, dx, dr, dg,
                             dbt);
      EXPECT_OK(st, mode == 0 ? "backward" : mode == 1 ? "backward (x NULL)" : "backward global");
      const double sf = sqrt((double)m);
      /* x_hat recovered from a 16-bit y carries that rounding; the tolerance covers it */
      tu_cmp_d(mode == 0 ? "dx" : mode == 1 ? "dx (x NULL)" : "dx (global)", dt, dx, edx, total,
               tt, 1.0);
      tu_cmp_d(mode == 0 ? "dgamma" : mode == 1 ? "dgamma (x NULL)" : "dgamma (global)", pt, dg,
               edg, c, mode == 1 ? tt : tp, sf);
      tu_cmp_d(mode == 0 ? "dbeta" : mode == 1 ? "dbeta (x NULL)" : "dbeta (global)", pt, dbt,
               edb, c, tp, sf);
      if (act == 2) tu_cmp_d("dresidual", dt, dr, edr, total, 0.0, 0.0);
      else tu_check_poison("dresidual (ignored)", dr, tb);
      free(dx), free(dr), free(dg), free(dbt), free(edx), free(edr), free(edg), free(edb);
      free(esi), free(gsi);
    }
    free(smd), free(sid);
    free(y), free(yi), free(sm), free(si), free(rm), free(rv);
  }
  norma_set_use_reference(0);
  free(x), free(res), free(dy), free(mu), free(sd), free(gamma), free(beta), free(rm0), free(rv0);
  free(bmean), free(bvar), free(binv), free(erm), free(erv), free(ey), free(eyi), free(imean),
      free(iinv), free(bml), free(iml);
}

static void test_independent(void) {
  static const prob cases[] = {
      {2, 3, 7, NORMA_CHANNELS_FIRST, NORMA_F32, 1e-5, 0},
      {3, 5, 4, NORMA_CHANNELS_LAST, NORMA_F64, 1e-3, NORMA_BN_RELU},
      {1, 17, 49, NORMA_CHANNELS_FIRST, NORMA_F16, 1e-5, NORMA_BN_ADD_RELU},
      {4, 2, 33, NORMA_CHANNELS_LAST, NORMA_BF16, 0.0, NORMA_BN_BIASED_RUNNING_VAR},
      {7, 3, 1, NORMA_CHANNELS_FIRST, NORMA_F32, 0.1,
       NORMA_BN_ADD_RELU | NORMA_BN_BIASED_RUNNING_VAR},
      {2, 19, 9, NORMA_CHANNELS_LAST, NORMA_F64, 1e-5, 0},
      {2, 33, 5, NORMA_CHANNELS_LAST, NORMA_F32, 1e-5, NORMA_BN_RELU | NORMA_CHECK_FINITE},
      {3, 4, 130, NORMA_CHANNELS_FIRST, NORMA_BF16, 1e-5, NORMA_BN_RELU},
      {2, 40, 3, NORMA_CHANNELS_LAST, NORMA_F16, 1e-4, 0},
      {5, 2, 300, NORMA_CHANNELS_FIRST, NORMA_F64, 0.0, NORMA_BN_ADD_RELU},
  };
  for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++)
    independent_case(&cases[i], i % 3 == 1, i % 4 == 2, 1000 + i);
}

/* ---- 2. exact statistics ---- */

static void exact_case(int64_t n, int64_t c, int64_t s, norma_layout lay, norma_dtype dt,
                       uint64_t seed) {
  const int64_t m = n * s, total = n * c * s;
  const size_t tb = total * tu_esize(dt), pb = c * tu_psize(dt);
  const norma_dtype pt = tu_ptype(dt);
  tu_rng r = tu_rng_make(seed);
  void *x = tu_alloc(tb);
  double *emean = tu_alloc(c * 8), *em2 = tu_alloc(c * 8);
  int64_t *perm = tu_alloc(m * sizeof(int64_t));
  for (int64_t j = 0; j < c; j++) {
    emean[j] = 0.5 + 0.25 * (double)(j % 5) - (j % 2 ? 1.0 : 0.0); /* dyadic, varied */
    for (int64_t q = 0; q < m; q++) perm[q] = q;
    for (int64_t q = m - 1; q > 0; q--) { /* Fisher-Yates: pairs land anywhere */
      int64_t o = tu_below(&r, q + 1), t = perm[q];
      perm[q] = perm[o], perm[o] = t;
    }
    long long sumk2 = 0;
    for (int64_t q = 0; q + 1 < m; q += 2) {
      int64_t k = (q == 0) ? 1 + tu_below(&r, 8) : tu_below(&r, 9); /* at least one k != 0 */
      sumk2 += 2 * k * k;
      for (int h = 0; h < 2; h++) {
        int64_t pos = perm[q + h], i = pos / s, sp = pos % s;
        tu_store(dt, x, tu_index(lay, c, s, i, j, sp), emean[j] + (h ? -1.0 : 1.0) * k / 8.0);
      }
    }
    if (m % 2) { /* odd count: the mean itself */
      int64_t pos = perm[m - 1], i = pos / s, sp = pos % s;
      tu_store(dt, x, tu_index(lay, c, s, i, j, sp), emean[j]);
    }
    em2[j] = (double)sumk2 / 64.0; /* exact */
  }
  for (int use_ref = 1; use_ref >= 0; use_ref--) {
    norma_set_use_reference(use_ref);
    tu_set_ctx("exact stats %s n=%lld c=%lld s=%lld %s %s", use_ref ? "ref" : "prod",
               (long long)n, (long long)c, (long long)s, tu_dt_name(dt), tu_layout_name(lay));
    for (int biased = 1; biased >= 0; biased--) {
      norma_bn_desc d = {n, c, s, lay, dt, 0.0, biased ? NORMA_BN_BIASED_RUNNING_VAR : 0u};
      void *y = tu_poisoned(tb), *sm = tu_poisoned(pb), *si = tu_poisoned(pb);
      void *rm = tu_alloc(pb), *rv = tu_alloc(pb);
      tu_fill_param(dt, rm, c, &r, -5, 5);
      tu_fill_param(dt, rv, c, &r, 1, 5);
      norma_status st = norma_bn_forward_training(&d, x, NULL, NULL, NULL, y, sm, si, rm, rv, 1.0);
      EXPECT_OK(st, "forward_training");
      int64_t bad_mean = 0, bad_rm = 0, bad_var = 0, bad_inv = 0;
      int64_t worst_var = 0, worst_inv = 0, worst_mean = 0;
      for (int64_t j = 0; j < c; j++) {
        double var = em2[j] / (double)m; /* correctly rounded double of the exact value */
        double evar = biased ? var : em2[j] / (double)(m - 1);
        double einv = 1.0 / sqrt(var);
        int64_t um, ur, uv, ui;
        if (pt == NORMA_F64) {
          um = tu_ulps_f64(((double *)sm)[j], emean[j]);
          ur = tu_ulps_f64(((double *)rm)[j], emean[j]);
          uv = tu_ulps_f64(((double *)rv)[j], evar);
          ui = tu_ulps_f64(((double *)si)[j], einv);
        } else {
          um = tu_ulps_f32(((float *)sm)[j], (float)emean[j]);
          ur = tu_ulps_f32(((float *)rm)[j], (float)emean[j]);
          uv = tu_ulps_f32(((float *)rv)[j], (float)evar);
          ui = tu_ulps_f32(((float *)si)[j], (float)einv);
        }
        /* the mean and the biased variance: exact or 1 ulp; the unbiased variance and invstd
           take one or two more roundings (var * m / (m - 1); sqrt and a division) */
        bad_mean += um > 1;
        bad_rm += ur > 1;
        bad_var += uv > (biased ? 1 : 2);
        bad_inv += ui > (pt == NORMA_F64 ? 2 : 1);
        if (um > worst_mean) worst_mean = um;
        if (uv > worst_var) worst_var = uv;
        if (ui > worst_inv) worst_inv = ui;
      }
      TU_CHECK(bad_mean == 0, "[%s] save_mean off by > 1 ulp in %lld channels (worst %lld ulp)",
               tu_ctx, (long long)bad_mean, (long long)worst_mean);
      TU_CHECK(bad_rm == 0, "[%s] running_mean (momentum 1) off by > 1 ulp in %lld channels",
               tu_ctx, (long long)bad_rm);
      TU_CHECK(bad_var == 0, "[%s] running_var (momentum 1, %s) off by > %d ulp in %lld channels "
               "(worst %lld ulp)", tu_ctx, biased ? "biased" : "unbiased", biased ? 1 : 2,
               (long long)bad_var, (long long)worst_var);
      TU_CHECK(bad_inv == 0, "[%s] save_invstd off by > %d ulp in %lld channels (worst %lld ulp)",
               tu_ctx, pt == NORMA_F64 ? 2 : 1, (long long)bad_inv, (long long)worst_inv);
      free(y), free(sm), free(si), free(rm), free(rv);
    }
    /* the moments (double, computed at the data's working precision): the mean and the
       variance m2 / count, rounded to the parameter type, exact or 1 ulp */
    norma_bn_desc d = {n, c, s, lay, dt, 0.0, 0};
    int64_t *cnt = tu_poisoned(c * 8);
    double *mean = tu_poisoned(c * 8), *m2 = tu_poisoned(c * 8);
    norma_status st = norma_bn_moments(&d, x, cnt, mean, m2);
    EXPECT_OK(st, "moments");
    int64_t bad = 0, jb = 0;
    for (int64_t j = 0; j < c; j++) {
      int64_t um, uv;
      if (pt == NORMA_F64) {
        um = tu_ulps_f64(mean[j], emean[j]);
        uv = tu_ulps_f64(m2[j] / (double)m, em2[j] / (double)m);
      } else {
        um = tu_ulps_f32((float)mean[j], (float)emean[j]);
        uv = tu_ulps_f32((float)(m2[j] / (double)m), (float)(em2[j] / (double)m));
      }
      if (cnt[j] != m || um > 1 || uv > 1) bad++, jb = j;
    }
    TU_CHECK(bad == 0, "[%s] moments off by > 1 ulp in %lld channels (e.g. channel %lld: mean %a "
             "vs %a, m2 %a vs %a)", tu_ctx, (long long)bad, (long long)jb, mean[jb], emean[jb],
             m2[jb], em2[jb]);
    free(cnt), free(mean), free(m2);
  }
  norma_set_use_reference(0);
  free(x), free(emean), free(em2), free(perm);
}

static void test_exact(void) {
  static const norma_dtype dts[] = {NORMA_F32, NORMA_F64, NORMA_F16, NORMA_BF16};
  int i = 0;
  for (int t = 0; t < 4; t++)
    for (int l = 0; l < 2; l++) {
      norma_layout lay = (norma_layout)l;
      exact_case(4, 5, 16, lay, dts[t], 77 + i++);   /* m = 64: power of two */
      exact_case(3, 6, 14, lay, dts[t], 77 + i++);   /* m = 42 */
      exact_case(2, 3, 1021, lay, dts[t], 77 + i++); /* m = 2042, tails */
      exact_case(1, 17, 7, lay, dts[t], 77 + i++);   /* odd m = 7 */
      exact_case(64, 9, 1, lay, dts[t], 77 + i++);   /* [N, C], m = 64 */
    }
}

/* ---- 3. large mean ---- */

static void large_mean_case(int64_t n, int64_t c, int64_t s, norma_layout lay, norma_dtype dt,
                            double center, double spread, double tol, uint64_t seed) {
  const int64_t m = n * s, total = n * c * s;
  const size_t tb = total * tu_esize(dt), pb = c * tu_psize(dt), dtb = total * 8;
  prob p = {n, c, s, lay, dt, 1e-5, 0};
  norma_bn_desc d = desc_of(&p);
  tu_rng r = tu_rng_make(seed);
  void *x = tu_alloc(tb), *dy = tu_alloc(tb), *gamma = tu_alloc(pb), *beta = tu_alloc(pb);
  for (int64_t i = 0; i < total; i++) tu_store(dt, x, i, center + spread * tu_normal(&r));
  for (int64_t i = 0; i < total; i++) tu_store(dt, dy, i, 0.5 * tu_normal(&r) + 0.1);
  tu_fill_param(dt, gamma, c, &r, 0.5, 1.5);
  tu_fill_param(dt, beta, c, &r, -0.5, 0.5);
  double *mean = tu_alloc(c * 8), *var = tu_alloc(c * 8), *inv = tu_alloc(c * 8);
  long double *meanl = tu_alloc(c * sizeof(long double));
  ind_stats(&p, x, mean, meanl, var);
  for (int64_t j = 0; j < c; j++) inv[j] = 1.0 / sqrt(var[j] + p.eps);
  double *ey = tu_alloc(dtb), *edx = tu_alloc(dtb), *edg = tu_alloc(c * 8), *edb = tu_alloc(c * 8);
  ind_apply(&p, x, NULL, gamma, beta, meanl, inv, ey);
  ind_backward(&p, x, NULL, dy, gamma, beta, mean, inv, 0, edx, NULL, edg, edb);
  double *ediff = tu_alloc(c * 8);
  for (int64_t j = 0; j < c; j++) ediff[j] = var[j] * m;
  for (int use_ref = 1; use_ref >= 0; use_ref--) {
    norma_set_use_reference(use_ref);
    tu_set_ctx("large mean %s n=%lld c=%lld s=%lld %s %s mean %g std %g", use_ref ? "ref" : "prod",
               (long long)n, (long long)c, (long long)s, tu_dt_name(dt), tu_layout_name(lay),
               center, spread);
    void *y = tu_poisoned(tb), *sm = tu_poisoned(pb), *si = tu_poisoned(pb), *dx = tu_poisoned(tb),
         *dg = tu_poisoned(pb), *dbt = tu_poisoned(pb);
    norma_status st =
        norma_bn_forward_training(&d, x, NULL, gamma, beta, y, sm, si, NULL, NULL, 0.1);
    EXPECT_OK(st, "forward_training");
    double e;
    e = tu_normwise(dt, y, ey, total);
    TU_CHECK(e <= tol, "[%s] y normwise error %.3g > %.3g", tu_ctx, e, tol);
    e = tu_normwise(tu_ptype(dt), si, inv, c);
    TU_CHECK(e <= tol, "[%s] save_invstd normwise error %.3g > %.3g", tu_ctx, e, tol);
    st = norma_bn_backward(&d, x, NULL, dy, gamma, beta, sm, si, dx, NULL, dg, dbt);
    EXPECT_OK(st, "backward");
    e = tu_normwise(dt, dx, edx, total);
    TU_CHECK(e <= tol, "[%s] dx normwise error %.3g > %.3g", tu_ctx, e, tol);
    e = tu_normwise(tu_ptype(dt), dg, edg, c);
    TU_CHECK(e <= tol, "[%s] dgamma normwise error %.3g > %.3g", tu_ctx, e, tol);
    e = tu_normwise(tu_ptype(dt), dbt, edb, c);
    TU_CHECK(e <= tol, "[%s] dbeta normwise error %.3g > %.3g", tu_ctx, e, tol);
    /* x == NULL: x_hat from y (y is O(1): no large mean left) */
    tu_poison(dx, tb);
    st = norma_bn_backward(&d, NULL, y, dy, gamma, beta, sm, si, dx, NULL, dg, dbt);
    EXPECT_OK(st, "backward (x NULL)");
    e = tu_normwise(dt, dx, edx, total);
    TU_CHECK(e <= tol, "[%s] dx (x NULL) normwise error %.3g > %.3g", tu_ctx, e, tol);
    e = tu_normwise(tu_ptype(dt), dg, edg, c);
    TU_CHECK(e <= tol, "[%s] dgamma (x NULL) normwise error %.3g > %.3g", tu_ctx, e, tol);
    /* the split API's moments */
    int64_t *cnt = tu_alloc(c * 8);
    double *mo = tu_alloc(c * 8), *m2 = tu_alloc(c * 8);
    st = norma_bn_moments(&d, x, cnt, mo, m2);
    EXPECT_OK(st, "moments");
    e = tu_normwise(NORMA_F64, m2, ediff, c);
    TU_CHECK(e <= tol, "[%s] moments m2 normwise error %.3g > %.3g", tu_ctx, e, tol);
    double worst = 0;
    for (int64_t j = 0; j < c; j++) {
      double em = fabs(mo[j] - mean[j]) / spread;
      if (!(em <= worst)) worst = em;
    }
    TU_CHECK(worst <= tol, "[%s] moments mean off by %.3g std", tu_ctx, worst);
    free(cnt), free(mo), free(m2);
    free(y), free(sm), free(si), free(dx), free(dg), free(dbt);
  }
  norma_set_use_reference(0);
  free(x), free(dy), free(gamma), free(beta), free(mean), free(var), free(inv), free(ey), free(edx),
      free(edg), free(edb), free(ediff), free(meanl);
}

static void test_large_mean(void) {
  for (int l = 0; l < 2; l++) {
    norma_layout lay = (norma_layout)l;
    large_mean_case(4, 3, 1021, lay, NORMA_F32, 1e4, 0.1, 1e-4, 500 + l);
    large_mean_case(2, 17, 3001, lay, NORMA_F32, 1e4, 0.1, 1e-4, 510 + l);
    large_mean_case(2, 1, 150000, lay, NORMA_F32, -1e4, 0.1, 1e-4, 520 + l);
    large_mean_case(64, 40, 1, lay, NORMA_F32, 1e4, 0.1, 1e-4, 530 + l);
    large_mean_case(4, 3, 1021, lay, NORMA_F64, 1e8, 1.0, 1e-8, 540 + l);
    large_mean_case(2, 17, 701, lay, NORMA_F64, -1e8, 1.0, 1e-8, 550 + l);
  }
}

/* ---- 4. channels-last statistics over many row blocks ---- */

/* channel j's value at row r (of m rows) by kind j % 7; 16-bit storage gets magnitudes it
   can hold (kinds 3 and 4 are f32's concern) */
static double onepass_value(int64_t j, int64_t r, int64_t m, int wide, tu_rng *rng) {
  const double z = tu_normal(rng);
  switch (j % 7) {
  case 0: return 3.0 + z;                                        /* ordinary */
  case 1: return (double)r * 4.0 + z;                            /* drifts from block 0's mean */
  case 2: return wide ? (r < 300 ? 0.0 : 1e5) + 0.01 * z         /* a step after the first */
                      : (r < 300 ? 0.0 : 1e3) + z;               /* block, far from its spread */
  case 3: return wide ? 1e30 * z : 1.0 + z;                      /* d^2 would overflow f32 */
  case 4: return wide ? 1e-30 * z : 1.0 + z;                     /* d^2 would underflow f32 */
  case 5: return -2.5;                                           /* constant */
  default: return r == m / 2 ? 7.0 : 1.0;                        /* one outlier */
  }
}

static void onepass_case(int64_t n, int64_t c, int64_t s, norma_dtype dt, uint64_t seed) {
  const int64_t m = n * s, total = n * c * s;
  prob p = {n, c, s, NORMA_CHANNELS_LAST, dt, 0.0, 0};
  norma_bn_desc d = desc_of(&p);
  tu_rng r = tu_rng_make(seed);
  void *x = tu_alloc(total * tu_esize(dt));
  for (int64_t row = 0; row < m; row++)
    for (int64_t j = 0; j < c; j++) {
      tu_store(dt, x, row * c + j, onepass_value(j, row, m, dt == NORMA_F32, &r));
    }
  double *mean = tu_alloc(c * 8), *var = tu_alloc(c * 8);
  ind_stats(&p, x, mean, NULL, var);
  int64_t *cnt = tu_alloc(c * 8);
  double *mo = tu_alloc(c * 8), *m2 = tu_alloc(c * 8);
  tu_set_ctx("one-pass rows n=%lld c=%lld s=%lld %s", (long long)n, (long long)c, (long long)s,
             tu_dt_name(dt));
  EXPECT_OK(norma_bn_moments(&d, x, cnt, mo, m2), "moments");
  for (int64_t j = 0; j < c; j++) {
    const double sd = sqrt(var[j]);
    const double em = sd > 0 ? fabs(mo[j] - mean[j]) / sd : fabs(mo[j] - mean[j]);
    const double ev = var[j] > 0 ? fabs(m2[j] / (double)m - var[j]) / var[j] : fabs(m2[j]);
    TU_CHECK(em <= 1e-5 && ev <= 1e-5, "[%s] channel %lld (kind %lld): mean %.9g (exact %.9g), "
             "var %.9g (exact %.9g)", tu_ctx, (long long)j, (long long)(j % 7), mo[j], mean[j],
             m2[j] / (double)m, var[j]);
  }
  free(x), free(mean), free(var), free(cnt), free(mo), free(m2);
}

static void test_onepass_rows(void) {
  static const norma_dtype dts[] = {NORMA_F32, NORMA_F16, NORMA_BF16};
  for (int t = 0; t < 3; t++) {
    onepass_case(4, 7, 1500, dts[t], 600 + t);  /* 6000 rows: two segments, many blocks */
    onepass_case(2, 35, 1021, dts[t], 610 + t); /* tails of 8 and 16 lanes, a short last block */
    onepass_case(3, 700, 97, dts[t], 620 + t);  /* wide rows: blocks of 64 */
  }
}

int main(void) {
  test_independent();
  test_exact();
  test_large_mean();
  test_onepass_rows();
  return tu_finish("test_reference");
}
