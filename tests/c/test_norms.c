/* test_norms.c - the production path of the norm family (LayerNorm, RMSNorm, GroupNorm,
 * InstanceNorm) against the library's float64 reference (norma_set_use_reference(1)).
 *
 * ctest runs it once per ISA path (NORMA_MAX_ISA = scalar, avx2, avx512; a cap above what the
 * CPU has falls back to the best it has).  Every call is made twice on the same inputs, with
 * the reference and with the production kernels, into poisoned outputs (NaN bytes), and every
 * element of every output is compared:
 *   LayerNorm / RMSNorm  forward (y, sum, save_mean, save_invstd / save_invrms) and backward
 *                        (dx, dgamma, dbeta) with and without residual (sum given or NULL),
 *                        dsum, gamma / beta, dgamma / dbeta, CHECK_FINITE;
 *                        d in {1, 3, 7, 17, 31, 32, 33, 1000, 4097, 8200} (vector tails, the
 *                        4096-value chunk) x rows in {1, 2, 5, 70, 130} (64-row blocks and at
 *                        most 64 units of rows in the backward);
 *   GroupNorm            forward (y, save_*) and backward (dx, dgamma, dbeta), both layouts,
 *                        NONE / RELU / SILU, gamma / beta NULL, CHECK_FINITE; C in {1, 3, 17,
 *                        64, 1000} with groups 1, C and divisors between, spatial in {1, 7, 49,
 *                        1021} (spatial 1 is the row path without activation), N in {1, 2, 5},
 *                        plus shapes past the engine's block boundaries;
 *   InstanceNorm         training forward (y, save_*, running statistics: both, one, none,
 *                        biased), inference, backward, both layouts, same grid with G = C.
 * Tolerances scale with the storage type: y relative to max(|y|, 1); dx relative to its
 * group's natural scale invstd * max|gamma|; statistics relative to themselves (floor 1 for the
 * mean); dgamma / dbeta relative to the sum of the magnitudes of their terms.  Outputs a call
 * must leave alone (sum without residual) keep their poison.
 *
 * Small shapes run every dtype x layout x variant; larger ones a rotating subset, so every
 * combination still meets the tail shapes (checked at the end).  NORMA_TEST_QUICK=1 shrinks the
 * budget (sanitizer builds).
 */
#define _POSIX_C_SOURCE 200809L
#include <time.h>

#include "test_norm_util.h"

enum { FAM_LN = 0, FAM_RMS = 1, FAM_GN = 2, FAM_IN = 3, NFAM = 4 };
static const char *FAM_NAME[NFAM] = {"LayerNorm", "RMSNorm", "GroupNorm", "InstanceNorm"};
#define MAXV 6
static int hits[NFAM][4][2][MAXV];
static int nvariants[NFAM];
static long n_cases = 0;

/* a tensor buffer, optionally misaligned by one element */
typedef struct tbuf {
  void *base, *p;
} tbuf;
static tbuf tb_make(size_t bytes, size_t esize, int misalign) {
  tbuf b;
  b.base = tu_poisoned(bytes + esize);
  b.p = (char *)b.base + (misalign ? esize : 0);
  return b;
}

static void set_ref(int on) { norma_set_use_reference(on); }

static double pmaxabs(norma_dtype dt, const void *p, int64_t j0, int64_t n, double dflt) {
  if (!p) return dflt;
  double m = 0;
  for (int64_t j = j0; j < j0 + n; j++) m = fmax(m, fabs(tu_pload(dt, p, j)));
  return m;
}

/* Floors of dgamma and dbeta: sum over the elements of channel ch of |dy| (|x_hat| + 1) and of
   |dy|, times `act_bound` (the largest factor the activation's derivative applies) */
static void grad_floors(norma_dtype dt, const tn_geo *g, const void *x, const void *dy,
                        const void *sm, const void *si, int rms, double act_bound, double *fg,
                        double *fb) {
  for (int64_t j = 0; j < g->c; j++) fg[j] = fb[j] = 0.0;
  const int64_t total = tn_total(g);
  for (int64_t e = 0; e < total; e++) {
    const int64_t G = tn_group_of(g, e), ch = tn_channel_of(g, e);
    const double mean = rms ? 0.0 : tu_pload(dt, sm, G), is = tu_pload(dt, si, G);
    const double xh = (tu_load(dt, x, e) - mean) * is, ady = fabs(tu_load(dt, dy, e));
    fg[ch] += ady * (fabs(xh) + 1.0);
    fb[ch] += ady;
  }
  for (int64_t j = 0; j < g->c; j++) {
    fg[j] = fmax(1.0, fg[j] * act_bound);
    fb[j] = fmax(1.0, fb[j] * act_bound);
  }
}

/* Floors of dx per group: invstd * max |gamma| over the group's channels * the scale of dy */
static void dx_floors(norma_dtype dt, const tn_geo *g, const void *gamma, const void *si,
                      double dy_scale, double *f) {
  const int64_t per = g->c / g->cpg;
  for (int64_t G = 0; G < tn_ngroups(g); G++) {
    const double gm = pmaxabs(dt, gamma, (G % per) * g->cpg, g->cpg, 1.0);
    f[G] = fmax(1.0, fabs(tu_pload(dt, si, G)) * gm * dy_scale);
  }
}

/* dy with a non-zero mean, correlated with the normalized input (so that dgamma and dbeta are
   far from 0): 0.5 * z + 0.25 + noise, z = (x - mu[G]) / sd[G] */
static void fill_dy(norma_dtype dt, const tn_geo *g, void *dy, const void *x, const double *mu,
                    const double *sd, tu_rng *r) {
  const int64_t total = tn_total(g);
  for (int64_t e = 0; e < total; e++) {
    const int64_t G = tn_group_of(g, e);
    const double z = (tu_load(dt, x, e) - mu[G]) / sd[G];
    tu_store(dt, dy, e, 0.5 * z + 0.25 + tu_uniform(r, -0.75, 0.75));
  }
}

/* gamma of both signs, and exactly 0 in about one channel of 16 (the backward treats a zero
   gamma apart) */
static void *make_gamma(norma_dtype dt, int64_t c, tu_rng *r) {
  void *p = tu_alloc((size_t)c * tu_psize(dt));
  for (int64_t j = 0; j < c; j++)
    tu_pstore(dt, p, j,
              tu_below(r, 16) == 0 ? 0.0
                                   : (tu_below(r, 4) == 0 ? -1 : 1) * tu_uniform(r, 0.5, 1.5));
  return p;
}

/* ================================ LayerNorm and RMSNorm ================================== */

typedef struct row_variant {
  const char *name;
  int residual;                 /* 0: none; 1: with sum; 2: sum NULL */
  int gamma_null, beta_null;    /* forward (and backward gamma) */
  int save_null;                /* forward: 1 save_mean NULL, 2 save_invstd NULL */
  unsigned flags;               /* NORMA_CHECK_FINITE */
  int dsum;                     /* backward: dsum given */
  int dgamma_null, dbeta_null;  /* backward */
} row_variant;

static const row_variant ROW_V[] = {
    {"plain", 0, 0, 0, 0, 0, 0, 0, 0},
    {"residual+sum/gamma=NULL/dsum", 1, 1, 0, 0, 0, 1, 0, 0},
    {"residual(sum=NULL)/beta=NULL/save_mean=NULL/check_finite/dsum/dgamma=NULL", 2, 0, 1, 1,
     NORMA_CHECK_FINITE, 1, 1, 0},
    {"gamma=beta=NULL/save_invstd=NULL/dbeta=NULL", 0, 1, 1, 2, 0, 0, 0, 1},
};
#define NROW_V ((int)(sizeof ROW_V / sizeof ROW_V[0]))

static void row_case(int rms, int64_t rows, int64_t d, norma_dtype dt, int vi, double eps,
                     int misalign, uint64_t seed) {
  const row_variant *v = &ROW_V[vi];
  const int fam = rms ? FAM_RMS : FAM_LN;
  const tn_geo g = tn_geo_ln(rows, d);
  const int64_t total = rows * d;
  const size_t es = tu_esize(dt), tb = (size_t)total * es, pb = (size_t)d * tu_psize(dt),
               gb = (size_t)rows * tu_psize(dt);
  const norma_dtype pt = tu_ptype(dt);
  const double tt = tu_tol_tensor(dt), tp = tu_tol_param(dt);
  norma_status st;
  n_cases++;
  hits[fam][dt][0][vi]++;
  tu_set_ctx("%s rows=%lld d=%lld %s %s eps=%g%s", FAM_NAME[fam], (long long)rows, (long long)d,
             tu_dt_name(dt), v->name, eps, misalign ? " misaligned" : "");
  tu_rng r = tu_rng_make(seed);
  double *mu = tu_alloc(rows * 8), *sd = tu_alloc(rows * 8);
  for (int64_t i = 0; i < rows; i++) {
    mu[i] = rms ? tu_uniform(&r, -1, 1) : tu_uniform(&r, -3, 3);
    sd[i] = tu_uniform(&r, 0.3, 3);
  }
  tbuf x = tb_make(tb, es, misalign), res = tb_make(tb, es, misalign),
       dy = tb_make(tb, es, misalign), dsum = tb_make(tb, es, misalign);
  tn_fill_groups(dt, &g, x.p, mu, sd, NULL, &r);
  tu_fill_uniform(dt, res.p, total, &r, -1.5, 1.5);
  fill_dy(dt, &g, dy.p, x.p, mu, sd, &r);
  tu_fill_uniform(dt, dsum.p, total, &r, -1, 1);
  void *gamma = v->gamma_null ? NULL : make_gamma(dt, d, &r);
  void *beta = NULL;
  if (!v->beta_null && !rms) {
    beta = tu_alloc(pb);
    tu_fill_param(dt, beta, d, &r, -0.5, 0.5);
  }
  const norma_ln_desc D = {rows, d, dt, eps, v->flags};
  const void *resp = v->residual ? res.p : NULL;

  /* ---- forward ---- */
  tbuf y_r = tb_make(tb, es, misalign), y_p = tb_make(tb, es, misalign);
  tbuf s_r = tb_make(tb, es, misalign), s_p = tb_make(tb, es, misalign);
  void *sm_r = tu_poisoned(gb), *sm_p = tu_poisoned(gb), *si_r = tu_poisoned(gb),
       *si_p = tu_poisoned(gb);
  void *sum_p = v->residual == 2 ? NULL : s_p.p;
  void *smp = v->save_null == 1 ? NULL : sm_p, *sip = v->save_null == 2 ? NULL : si_p;
  set_ref(1);
  if (rms) st = norma_rms_forward(&D, x.p, resp, gamma, y_r.p, s_r.p, si_r);
  else st = norma_ln_forward(&D, x.p, resp, gamma, beta, y_r.p, s_r.p, sm_r, si_r);
  EXPECT_OK(st, "reference forward");
  set_ref(0);
  if (rms) st = norma_rms_forward(&D, x.p, resp, gamma, y_p.p, sum_p, sip);
  else st = norma_ln_forward(&D, x.p, resp, gamma, beta, y_p.p, sum_p, smp, sip);
  EXPECT_OK(st, "forward");
  tu_cmp("y", dt, y_p.p, y_r.p, total, tt, 1.0);
  if (v->residual == 1) tn_same("sum", dt, s_p.p, s_r.p, total); /* one rounding: exact */
  if (!v->residual) {
    tu_check_poison("sum (no residual: must be ignored)", s_p.p, tb);
    tu_check_poison("sum (no residual: must be ignored; reference)", s_r.p, tb);
  }
  if (!rms && smp) tn_cmp("save_mean", pt, sm_p, pt, sm_r, rows, tp, 1.0, NULL, NULL);
  if (sip)
    tn_cmp(rms ? "save_invrms" : "save_invstd", pt, si_p, pt, si_r, rows, tp, 0.0, NULL, NULL);
  if (rms) tu_check_poison("save_mean (RMSNorm has none)", sm_r, gb);

  /* ---- backward, with the reference forward's statistics and h ---- */
  const void *h = v->residual ? s_r.p : x.p;
  tbuf dx_r = tb_make(tb, es, misalign), dx_p = tb_make(tb, es, misalign);
  void *dg_r = tu_poisoned(pb), *dg_p = tu_poisoned(pb), *db_r = tu_poisoned(pb),
       *db_p = tu_poisoned(pb);
  const void *dsp = v->dsum ? dsum.p : NULL;
  void *dgp = v->dgamma_null ? NULL : dg_p, *dbp = v->dbeta_null ? NULL : db_p;
  set_ref(1);
  if (rms) st = norma_rms_backward(&D, h, dy.p, dsp, gamma, si_r, dx_r.p, dg_r);
  else st = norma_ln_backward(&D, h, dy.p, dsp, gamma, sm_r, si_r, dx_r.p, dg_r, db_r);
  EXPECT_OK(st, "reference backward");
  set_ref(0);
  if (rms) st = norma_rms_backward(&D, h, dy.p, dsp, gamma, si_r, dx_p.p, dgp);
  else st = norma_ln_backward(&D, h, dy.p, dsp, gamma, sm_r, si_r, dx_p.p, dgp, dbp);
  EXPECT_OK(st, "backward");
  double *fdx = tu_alloc(rows * 8), *fg = tu_alloc(d * 8), *fb = tu_alloc(d * 8);
  dx_floors(dt, &g, gamma, si_r, 1.5, fdx);
  grad_floors(dt, &g, h, dy.p, sm_r, si_r, rms, 1.0, fg, fb);
  tn_cmp("dx", dt, dx_p.p, dt, dx_r.p, total, tt, 0.0, fdx, &g);
  if (dgp) tn_cmp("dgamma", pt, dg_p, pt, dg_r, d, tp, 0.0, fg, NULL);
  if (!rms && dbp) tn_cmp("dbeta", pt, db_p, pt, db_r, d, tp, 0.0, fb, NULL);
  if (rms) tu_check_poison("dbeta (RMSNorm has none; reference)", db_r, pb);

  free(mu), free(sd), free(x.base), free(res.base), free(dy.base), free(dsum.base);
  free(gamma), free(beta), free(y_r.base), free(y_p.base), free(s_r.base), free(s_p.base);
  free(sm_r), free(sm_p), free(si_r), free(si_p), free(dx_r.base), free(dx_p.base);
  free(dg_r), free(dg_p), free(db_r), free(db_p), free(fdx), free(fg), free(fb);
}

/* ================================ GroupNorm and InstanceNorm ============================= */

typedef struct grp_variant {
  const char *name;
  unsigned flags;               /* activation, CHECK_FINITE, BIASED_RUNNING_VAR (IN) */
  int gamma_null, beta_null;
  int save_null;                /* forward: 1 save_mean NULL, 2 save_invstd NULL */
  int dgamma_null, dbeta_null;  /* backward */
  int running;                  /* IN: 0 none, 1 both, 2 running_mean only, 3 running_var only */
} grp_variant;

static const grp_variant GN_V[] = {
    {"none", 0, 0, 0, 0, 0, 0, 0},
    {"relu/gamma=NULL", NORMA_RELU, 1, 0, 0, 0, 0, 0},
    {"silu/beta=NULL/dbeta=NULL", NORMA_SILU, 0, 1, 0, 0, 1, 0},
    {"none/gamma=beta=NULL/check_finite/save_mean=NULL/dgamma=NULL", NORMA_CHECK_FINITE, 1, 1, 1,
     1, 0, 0},
    {"relu/check_finite/save_invstd=NULL", NORMA_RELU | NORMA_CHECK_FINITE, 0, 0, 2, 0, 0, 0},
    {"silu/check_finite/dgamma=dbeta=NULL", NORMA_SILU | NORMA_CHECK_FINITE, 0, 0, 0, 1, 1, 0},
};
#define NGN_V ((int)(sizeof GN_V / sizeof GN_V[0]))

static const grp_variant IN_V[] = {
    {"none/running", 0, 0, 0, 0, 0, 0, 1},
    {"relu/gamma=NULL/no running", NORMA_RELU, 1, 0, 0, 0, 0, 0},
    {"silu/beta=NULL/biased running/dbeta=NULL", NORMA_SILU | NORMA_BN_BIASED_RUNNING_VAR, 0, 1,
     0, 0, 1, 1},
    {"none/check_finite/running_mean only/save_mean=NULL/dgamma=NULL", NORMA_CHECK_FINITE, 0, 0,
     1, 1, 0, 2},
    {"relu/biased/running_var only/save_invstd=NULL/gamma=beta=NULL",
     NORMA_RELU | NORMA_BN_BIASED_RUNNING_VAR, 1, 1, 2, 0, 0, 3},
};
#define NIN_V ((int)(sizeof IN_V / sizeof IN_V[0]))

static void group_case(int inorm, int64_t n, int64_t c, int64_t s, int64_t groups,
                       norma_layout lay, norma_dtype dt, int vi, double eps, int misalign,
                       uint64_t seed) {
  const grp_variant *v = inorm ? &IN_V[vi] : &GN_V[vi];
  const int fam = inorm ? FAM_IN : FAM_GN;
  if (inorm) groups = c;
  const tn_geo g = tn_geo_gn(n, c, s, groups, lay);
  const int64_t total = n * c * s, ng = tn_ngroups(&g);
  const size_t es = tu_esize(dt), tb = (size_t)total * es, pb = (size_t)c * tu_psize(dt),
               gb = (size_t)ng * tu_psize(dt);
  const norma_dtype pt = tu_ptype(dt);
  const double tt = tu_tol_tensor(dt), tp = tu_tol_param(dt);
  const unsigned act = v->flags & (NORMA_RELU | NORMA_SILU);
  const int train = !inorm || s >= 2;
  const double momentum = (seed & 1) ? 0.1 : 0.8;
  norma_status st;
  n_cases++;
  hits[fam][dt][lay][vi]++;
  tu_set_ctx("%s n=%lld c=%lld s=%lld G=%lld %s %s %s eps=%g%s", FAM_NAME[fam], (long long)n,
             (long long)c, (long long)s, (long long)groups, tu_dt_name(dt), tu_layout_name(lay),
             v->name, eps, misalign ? " misaligned" : "");
  tu_rng r = tu_rng_make(seed);
  double *mu = tu_alloc(ng * 8), *sd = tu_alloc(ng * 8), *off = tu_alloc(c * 8);
  for (int64_t G = 0; G < ng; G++) mu[G] = tu_uniform(&r, -3, 3), sd[G] = tu_uniform(&r, 0.3, 3);
  for (int64_t j = 0; j < c; j++) off[j] = tu_uniform(&r, -0.5, 0.5);
  tbuf x = tb_make(tb, es, misalign), dy = tb_make(tb, es, misalign);
  tn_fill_groups(dt, &g, x.p, mu, sd, off, &r);
  fill_dy(dt, &g, dy.p, x.p, mu, sd, &r);
  void *gamma = v->gamma_null ? NULL : make_gamma(dt, c, &r);
  void *beta = NULL;
  if (!v->beta_null) {
    beta = tu_alloc(pb);
    tu_fill_param(dt, beta, c, &r, -0.5, 0.5);
  }
  void *rm0 = tu_alloc(pb), *rv0 = tu_alloc(pb);
  tu_fill_param(dt, rm0, c, &r, -1, 1);
  tu_fill_param(dt, rv0, c, &r, 0.5, 2);
  norma_gn_desc GD = {n, c, s, groups, lay, dt, eps, v->flags};
  norma_in_desc ID = {n, c, s, lay, dt, eps, v->flags};

  /* ---- forward with the group / instance statistics ---- */
  tbuf y_r = tb_make(tb, es, misalign), y_p = tb_make(tb, es, misalign);
  void *sm_r = tu_poisoned(gb), *sm_p = tu_poisoned(gb), *si_r = tu_poisoned(gb),
       *si_p = tu_poisoned(gb);
  void *rm_r = tu_dup(rm0, pb), *rm_p = tu_dup(rm0, pb), *rv_r = tu_dup(rv0, pb),
       *rv_p = tu_dup(rv0, pb);
  void *smp = v->save_null == 1 ? NULL : sm_p, *sip = v->save_null == 2 ? NULL : si_p;
  const int want_rm = v->running == 1 || v->running == 2,
            want_rv = v->running == 1 || v->running == 3;
  if (train) {
    set_ref(1);
    if (inorm)
      st = norma_in_forward_training(&ID, x.p, gamma, beta, y_r.p, sm_r, si_r,
                                     want_rm ? rm_r : NULL, want_rv ? rv_r : NULL, momentum);
    else st = norma_gn_forward(&GD, x.p, gamma, beta, y_r.p, sm_r, si_r);
    EXPECT_OK(st, "reference forward");
    set_ref(0);
    if (inorm)
      st = norma_in_forward_training(&ID, x.p, gamma, beta, y_p.p, smp, sip,
                                     want_rm ? rm_p : NULL, want_rv ? rv_p : NULL, momentum);
    else st = norma_gn_forward(&GD, x.p, gamma, beta, y_p.p, smp, sip);
    EXPECT_OK(st, "forward");
    tu_cmp("y", dt, y_p.p, y_r.p, total, tt, 1.0);
    if (smp) tn_cmp("save_mean", pt, sm_p, pt, sm_r, ng, tp, 1.0, NULL, NULL);
    if (sip) tn_cmp("save_invstd", pt, si_p, pt, si_r, ng, tp, 0.0, NULL, NULL);
    if (inorm) {
      tn_cmp("running_mean", pt, rm_p, pt, rm_r, c, tp, 1.0, NULL, NULL);
      tn_cmp("running_var", pt, rv_p, pt, rv_r, c, tp, 1.0, NULL, NULL);
      /* those not given stay as they were (the reference's too) */
      if (!want_rm) tu_same_bits("running_mean (not given)", rm_p, rm0, pb);
      if (!want_rv) tu_same_bits("running_var (not given)", rv_p, rv0, pb);
      if (want_rm && momentum > 0)
        TU_CHECK(memcmp(rm_r, rm0, pb) != 0, "[%s] running_mean not updated", tu_ctx);
    }
  } else {
    /* InstanceNorm with spatial 1 has no training forward: statistics for the backward */
    for (int64_t G = 0; G < ng; G++) {
      tu_pstore(dt, sm_r, G, tu_uniform(&r, -1, 1));
      tu_pstore(dt, si_r, G, tu_uniform(&r, 0.5, 2));
    }
  }

  /* ---- InstanceNorm inference with given statistics ---- */
  if (inorm) {
    tbuf yi_r = tb_make(tb, es, misalign), yi_p = tb_make(tb, es, misalign);
    set_ref(1);
    st = norma_in_forward_inference(&ID, x.p, gamma, beta, rm0, rv0, yi_r.p);
    EXPECT_OK(st, "reference inference");
    set_ref(0);
    st = norma_in_forward_inference(&ID, x.p, gamma, beta, rm0, rv0, yi_p.p);
    EXPECT_OK(st, "inference");
    tu_cmp("inference y", dt, yi_p.p, yi_r.p, total, tt, 1.0);
    if (!train) { /* the y the RELU backward masks with */
      memcpy(y_r.p, yi_r.p, tb);
    }
    free(yi_r.base), free(yi_p.base);
  }

  /* ---- backward with the reference forward's statistics (and its y for RELU) ---- */
  tbuf dx_r = tb_make(tb, es, misalign), dx_p = tb_make(tb, es, misalign);
  void *dg_r = tu_poisoned(pb), *dg_p = tu_poisoned(pb), *db_r = tu_poisoned(pb),
       *db_p = tu_poisoned(pb);
  void *dgp = v->dgamma_null ? NULL : dg_p, *dbp = v->dbeta_null ? NULL : db_p;
  /* the backward is given y only where it needs it (RELU); SILU recomputes z */
  const void *yb = act == NORMA_RELU ? y_r.p : NULL;
  set_ref(1);
  if (inorm)
    st = norma_in_backward(&ID, x.p, yb, dy.p, gamma, beta, sm_r, si_r, dx_r.p, dg_r, db_r);
  else st = norma_gn_backward(&GD, x.p, yb, dy.p, gamma, beta, sm_r, si_r, dx_r.p, dg_r, db_r);
  EXPECT_OK(st, "reference backward");
  set_ref(0);
  if (inorm)
    st = norma_in_backward(&ID, x.p, yb, dy.p, gamma, beta, sm_r, si_r, dx_p.p, dgp, dbp);
  else st = norma_gn_backward(&GD, x.p, yb, dy.p, gamma, beta, sm_r, si_r, dx_p.p, dgp, dbp);
  EXPECT_OK(st, "backward");
  double *fdx = tu_alloc(ng * 8), *fg = tu_alloc(c * 8), *fb = tu_alloc(c * 8);
  const double ab = act == NORMA_SILU ? 1.1 : 1.0; /* |silu'| < 1.1 */
  dx_floors(dt, &g, gamma, si_r, 1.5 * ab, fdx);
  grad_floors(dt, &g, x.p, dy.p, sm_r, si_r, 0, ab, fg, fb);
  tn_cmp("dx", dt, dx_p.p, dt, dx_r.p, total, tt, 0.0, fdx, &g);
  if (dgp) tn_cmp("dgamma", pt, dg_p, pt, dg_r, c, tp, 0.0, fg, NULL);
  if (dbp) tn_cmp("dbeta", pt, db_p, pt, db_r, c, tp, 0.0, fb, NULL);

  free(mu), free(sd), free(off), free(x.base), free(dy.base), free(gamma), free(beta);
  free(rm0), free(rv0), free(y_r.base), free(y_p.base), free(sm_r), free(sm_p), free(si_r);
  free(si_p), free(rm_r), free(rm_p), free(rv_r), free(rv_p), free(dx_r.base), free(dx_p.base);
  free(dg_r), free(dg_p), free(db_r), free(db_p), free(fdx), free(fg), free(fb);
}

/* ================================ the grid ============================================== */

/* How much runs on a shape, by its element count (as in test_kernels):
     <= small:   every dtype x layout x variant;
     <= mid:     every dtype x layout, the first variant and one rotating variant;
     <= big:     every dtype x layout, one rotating variant;
     <= 4 * big: `top` rotating dtype x layout combinations, one rotating variant;
     above:      one rotating combination, one rotating variant. */
static int64_t small_, mid_, big_;
static int top_;
static uint64_t seed_ = 1;
static const double EPS[] = {1e-5, 0.0, 0.1, 1e-3};

static int should_run(int64_t total, int si, int k, int nk, int vi, int nv) {
  const int rot = (si + k) % nv;
  if (total > big_ && (k - 3 * si % nk + 2 * nk) % nk >= (total > 4 * big_ ? 1 : top_)) return 0;
  if (total <= small_) return 1;
  if (total <= mid_) return vi == 0 || vi == 1 + (si + k) % (nv - 1);
  return vi == rot;
}

static double now(void) {
  struct timespec t;
  clock_gettime(getenv("NORMA_TEST_CPUTIME") ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void run_rows(int rms, int quick) {
  static const int64_t Ds[] = {1, 3, 7, 17, 31, 32, 33, 1000, 4097, 8200};
  static const int64_t Rs[] = {1, 2, 5, 70, 130};
  int si = 0;
  for (int a = 0; a < 10; a++)
    for (int b = 0; b < 5; b++, si++) {
      const int64_t d = Ds[a], rows = Rs[b];
      if (quick && d >= 4097 && rows >= 70 && b % 2) continue;
      for (int k = 0; k < 4; k++)
        for (int vi = 0; vi < NROW_V; vi++) {
          if (!should_run(rows * d, si, k, 4, vi, NROW_V)) continue;
          seed_++;
          const double eps = EPS[(si + k + vi) % 4];
          row_case(rms, rows, d, TN_DTS[k], vi, eps, (si + k + vi) % 3 == 1, seed_ * 7919);
        }
    }
}

typedef struct gshape {
  int64_t n, c, s, g;
} gshape;

static void run_groups(int inorm, int quick) {
  static const int64_t Ns[] = {1, 2, 5}, Ss[] = {1, 7, 49, 1021};
  static const int64_t Cs[] = {1, 3, 17, 64, 1000};
  static const int64_t Gs[5][4] = {{1}, {1, 3}, {1, 17}, {1, 4, 32, 64}, {1, 8, 1000}};
  gshape shapes[256];
  int ns = 0;
  for (int a = 0; a < 3; a++)
    for (int b = 0; b < 5; b++)
      for (int e = 0; e < 4; e++)
        for (int q = 0; q < 4; q++) {
          const int64_t G = Gs[b][q];
          if (!G) break;
          if (inorm && q > 0) break; /* InstanceNorm: G = C */
          shapes[ns++] = (gshape){Ns[a], Cs[b], Ss[e], inorm ? Cs[b] : G};
        }
  if (inorm) /* spatial 2: the smallest training instance */
    for (int b = 0; b < 5; b++) shapes[ns++] = (gshape){3, Cs[b], 2, Cs[b]};
  /* the engine's boundaries: 4096-value channels-first chunks inside one group (cpg * s and
     s alone), 4096-row channels-last segments (s > 4096), 1024-channel rows-kernel calls,
     groups that straddle them, [N, C] tensors large enough for threads */
  shapes[ns++] = (gshape){2, 3, 4097, 1};
  shapes[ns++] = (gshape){1, 5, 8193, 5};
  shapes[ns++] = (gshape){2, 1030, 7, 2};
  shapes[ns++] = (gshape){2, 1030, 3, 1030};
  shapes[ns++] = (gshape){3, 6, 1500, 2};
  shapes[ns++] = (gshape){600, 64, 1, 8};
  shapes[ns++] = (gshape){2, 2048, 1, 4};
  const int nk = 8;
  /* outputs of 8 MiB and more are written with streaming (non-temporal) stores: f32 tensors of
     2.1M values, both layouts (channels-last with whole rows per unit), misaligned and not */
  if (!quick)
    for (int k = 0; k < 2; k++) {
      const norma_layout lay = (norma_layout)k;
      seed_++;
      group_case(inorm, lay ? 8 : 2, 64, lay ? 4100 : 16400, inorm ? 64 : 8, lay, NORMA_F32,
                 inorm ? (k ? 2 : 0) : (k ? 5 : 1), 1e-5, k, seed_ * 7919);
    }
  for (int si = 0; si < ns; si++) {
    const gshape sh = shapes[si];
    if (inorm && sh.g != sh.c) continue;
    if (!inorm && sh.c % sh.g) continue;
    const int64_t total = sh.n * sh.c * sh.s;
    if (quick && total > 1000000) continue;
    const int nv = inorm ? NIN_V : NGN_V;
    const double t0 = now();
    for (int k = 0; k < nk; k++)
      for (int vi = 0; vi < nv; vi++) {
        if (!should_run(total, si, k, nk, vi, nv)) continue;
        seed_++;
        double eps = EPS[(si + k + vi) % 4];
        group_case(inorm, sh.n, sh.c, sh.s, sh.g, (norma_layout)(k % 2), TN_DTS[k / 2], vi, eps,
                   (si + k + vi) % 3 == 1, seed_ * 7919);
      }
    if (getenv("NORMA_TEST_TIMING") && now() - t0 > 0.2)
      printf("    n=%lld c=%lld s=%lld G=%lld: %.2f s\n", (long long)sh.n, (long long)sh.c,
             (long long)sh.s, (long long)sh.g, now() - t0);
  }
}

int main(void) {
  const int quick = tu_quick();
  const char *env_isa = getenv("NORMA_MAX_ISA");
  printf("test_norms: NORMA_MAX_ISA=%s, production ISA %s, %d threads%s\n",
         env_isa ? env_isa : "(unset)", norma_isa_name(norma_get_isa()), norma_get_num_threads(),
         quick ? ", quick" : "");
  if (env_isa && strcmp(env_isa, "scalar") == 0)
    TU_CHECK(norma_get_isa() == NORMA_ISA_SCALAR, "NORMA_MAX_ISA=scalar but the ISA is %s",
             norma_isa_name(norma_get_isa()));
  small_ = quick ? 4000 : 20000;
  mid_ = quick ? 30000 : 200000;
  big_ = quick ? 120000 : 1000000;
  top_ = quick ? 1 : 2;
  nvariants[FAM_LN] = nvariants[FAM_RMS] = NROW_V;
  nvariants[FAM_GN] = NGN_V;
  nvariants[FAM_IN] = NIN_V;
  const int timing = getenv("NORMA_TEST_TIMING") != NULL;
  for (int fam = 0; fam < NFAM; fam++) {
    const double t0 = now();
    const long c0 = n_cases;
    if (fam <= FAM_RMS) {
      run_rows(fam == FAM_RMS, quick);
    } else { /* the group norms' grid is larger (layouts, activations): a smaller budget */
      small_ = quick ? 3000 : 16000;
      mid_ = quick ? 12000 : 40000;
      big_ = quick ? 40000 : 110000;
      top_ = quick ? 1 : 2;
      run_groups(fam == FAM_IN, quick);
    }
    if (timing)
      printf("  %s: %ld cases, %.2f s\n", FAM_NAME[fam], n_cases - c0, now() - t0);
  }
  /* every dtype x layout x variant of every op must have run */
  int missing = 0;
  for (int fam = 0; fam < NFAM; fam++)
    for (int dt = 0; dt < 4; dt++)
      for (int l = 0; l < (fam <= FAM_RMS ? 1 : 2); l++)
        for (int vi = 0; vi < nvariants[fam]; vi++)
          if (!hits[fam][dt][l][vi]) {
            missing++;
            fprintf(stderr, "never ran: %s %s %s variant %d\n", FAM_NAME[fam],
                    tu_dt_name((norma_dtype)dt), tu_layout_name((norma_layout)l), vi);
          }
  TU_CHECK(missing == 0, "%d op x dtype x layout x variant combinations never ran", missing);
  printf("test_norms: %ld cases\n", n_cases);
  return tu_finish("test_norms");
}
