/* test_norm_semantics.c - the documented behaviour of the norm family at its edges, with the
 * expected numbers computed here, for the reference and the production kernels (ctest runs it
 * once per ISA path):
 *  - LayerNorm with d == 1 gives y = beta (x_hat is 0), dx = dsum, dgamma = 0; GroupNorm with
 *    groups of one value (spatial 1, groups == c) likewise y = act(beta);
 *  - RMSNorm of an all-zero row with eps == 0: invrms 0, y = 0, dx = dsum there;
 *  - var == eps == 0 (a constant row / group / instance, also of a non-dyadic constant whose
 *    mean does not come out exact in a naive sum): invstd 0, y = act(beta), dx = 0 there;
 *  - InstanceNorm's running statistics follow PyTorch (the batch average of the instances'
 *    mean and unbiased variance, biased with NORMA_BN_BIASED_RUNNING_VAR), worked out on
 *    explicit numbers; momentum 0 leaves them bitwise unchanged;
 *  - GroupNorm with groups == c equals InstanceNorm, GroupNorm with groups == 1 on [N, C, 1]
 *    equals LayerNorm over C, InstanceNorm inference with given statistics equals BatchNorm
 *    inference with them: bitwise, forward and backward;
 *  - the backward with statistics supplied by the caller: the offset of x_hat is removed when it
 *    is small (rounding of a stored mean), the statistics are used as given otherwise;
 *  - every allowed exact aliasing (y == x, y == residual, sum == x / residual, dx == dy,
 *    dx == x, dx == dsum, dx == y) gives bitwise the results of separate buffers, on small
 *    tensors and on tensors large enough to use threads.
 */
#include "test_norm_util.h"

static const char *mode_name(int use_ref) { return use_ref ? "ref" : "prod"; }

/* ---- LayerNorm d == 1, GroupNorm groups of one value ---------------------------------------- */

static void test_single_value_groups(void) {
  const int64_t rows = 70;
  for (int t = 0; t < 4; t++)
    for (int use_ref = 0; use_ref < 2; use_ref++)
      for (int ei = 0; ei < 2; ei++) {
        const norma_dtype dt = TN_DTS[t], pt = tu_ptype(dt);
        const double eps = ei ? 0.0 : 1e-5;
        norma_set_use_reference(use_ref);
        tu_set_ctx("LN d=1 %s %s eps=%g", mode_name(use_ref), tu_dt_name(dt), eps);
        const size_t tb = rows * tu_esize(dt), gb = rows * tu_psize(dt), pb = tu_psize(dt);
        tu_rng r = tu_rng_make(40 + t);
        void *x = tu_alloc(tb), *dy = tu_alloc(tb), *dsum = tu_alloc(tb);
        tu_fill_uniform(dt, x, rows, &r, -3, 3);
        tu_fill_uniform(dt, dy, rows, &r, -1, 1);
        tu_fill_uniform(dt, dsum, rows, &r, -1, 1);
        void *gamma = tu_alloc(pb), *beta = tu_alloc(pb);
        tu_pstore(dt, gamma, 0, -1.75);
        tu_pstore(dt, beta, 0, 0.3);
        void *y = tu_poisoned(tb), *sm = tu_poisoned(gb), *si = tu_poisoned(gb);
        norma_ln_desc d = {rows, 1, dt, eps, 0};
        EXPECT_OK(norma_ln_forward(&d, x, NULL, gamma, beta, y, NULL, sm, si), "ln_forward");
        const double eb = tu_round(dt, tu_pload(dt, beta, 0));
        const double einv = eps ? tu_round(pt, 1.0 / sqrt(eps)) : 0.0;
        int64_t bad_y = 0, bad_m = 0, bad_i = 0;
        for (int64_t i = 0; i < rows; i++) {
          bad_y += tu_load(dt, y, i) != eb;
          bad_m += tu_pload(dt, sm, i) != tu_round(pt, tu_load(dt, x, i));
          bad_i += tu_pload(dt, si, i) != einv;
        }
        TU_CHECK(bad_y == 0, "[%s] y != beta (%g) in %lld rows (e.g. %g)", tu_ctx, eb,
                 (long long)bad_y, tu_load(dt, y, 0));
        TU_CHECK(bad_m == 0, "[%s] save_mean != x in %lld rows", tu_ctx, (long long)bad_m);
        TU_CHECK(bad_i == 0, "[%s] save_invstd != %s in %lld rows (e.g. %g)", tu_ctx,
                 eps ? "1/sqrt(eps)" : "0", (long long)bad_i, tu_pload(dt, si, 0));
        /* backward: x_hat == 0 everywhere: dx = dsum (bitwise), dgamma = 0, dbeta = sum dy */
        void *dx = tu_poisoned(tb), *dg = tu_poisoned(pb), *dbt = tu_poisoned(pb);
        EXPECT_OK(norma_ln_backward(&d, x, dy, dsum, gamma, sm, si, dx, dg, dbt), "ln_backward");
        tn_same("dx == dsum", dt, dx, dsum, rows);
        TU_CHECK(tu_pload(dt, dg, 0) == 0.0, "[%s] dgamma = %g, want 0", tu_ctx,
                 tu_pload(dt, dg, 0));
        double sdy = 0;
        for (int64_t i = 0; i < rows; i++) sdy += tu_load(dt, dy, i);
        TU_CHECK(fabs(tu_pload(dt, dbt, 0) - sdy) <= tu_tol_param(dt) * rows,
                 "[%s] dbeta = %g, want %g", tu_ctx, tu_pload(dt, dbt, 0), sdy);
        free(x), free(dy), free(dsum), free(gamma), free(beta), free(y), free(sm), free(si);
        free(dx), free(dg), free(dbt);
      }
  /* GroupNorm on [N, C] with groups == c: every group is one value; with each activation */
  static const unsigned acts[] = {0, NORMA_RELU, NORMA_SILU};
  const int64_t n = 40, c = 24;
  for (int t = 0; t < 4; t++)
    for (int use_ref = 0; use_ref < 2; use_ref++)
      for (int a = 0; a < 3; a++) {
        const norma_dtype dt = TN_DTS[t];
        norma_set_use_reference(use_ref);
        tu_set_ctx("GN one value per group %s %s act 0x%x", mode_name(use_ref), tu_dt_name(dt),
                   acts[a]);
        const size_t tb = n * c * tu_esize(dt), pb = c * tu_psize(dt), gb = n * c * tu_psize(dt);
        tu_rng r = tu_rng_make(60 + t);
        void *x = tu_alloc(tb), *gamma = tu_alloc(pb), *beta = tu_alloc(pb), *y = tu_poisoned(tb);
        void *sm = tu_poisoned(gb), *si = tu_poisoned(gb);
        tu_fill_uniform(dt, x, n * c, &r, -3, 3);
        tu_fill_param(dt, gamma, c, &r, -2, 2);
        tu_fill_param(dt, beta, c, &r, -1, 1);
        norma_gn_desc d = {n, c, 1, c, (norma_layout)(t % 2), dt, 1e-5, acts[a]};
        EXPECT_OK(norma_gn_forward(&d, x, gamma, beta, y, sm, si), "gn_forward");
        int64_t bad = 0, worst = -1;
        for (int64_t i = 0; i < n * c; i++) {
          const double b = tu_pload(dt, beta, i % c);
          const double z = acts[a] == NORMA_RELU   ? (b > 0 ? b : 0)
                           : acts[a] == NORMA_SILU ? b / (1 + exp(-b))
                                                   : b;
          const double tol = acts[a] == NORMA_SILU ? 2 * tu_tol_tensor(dt) : 0.0; /* exp rounding */
          if (!(fabs(tu_load(dt, y, i) - tu_round(dt, z)) <= tol * fabs(z))) bad++, worst = i;
        }
        TU_CHECK(bad == 0, "[%s] y != act(beta) in %lld values (e.g. [%lld] %g)", tu_ctx,
                 (long long)bad, (long long)worst, worst >= 0 ? tu_load(dt, y, worst) : 0.0);
        free(x), free(gamma), free(beta), free(y), free(sm), free(si);
      }
  norma_set_use_reference(0);
}

/* ---- RMSNorm of an all-zero row with eps == 0 -------------------------------------------------
 */

static void test_rms_zero_row(void) {
  const int64_t rows = 6, d = 37, zr = 2;
  for (int t = 0; t < 4; t++)
    for (int use_ref = 0; use_ref < 2; use_ref++) {
      const norma_dtype dt = TN_DTS[t], pt = tu_ptype(dt);
      norma_set_use_reference(use_ref);
      tu_set_ctx("RMS zero row %s %s", mode_name(use_ref), tu_dt_name(dt));
      const size_t tb = rows * d * tu_esize(dt), pb = d * tu_psize(dt), gb = rows * tu_psize(dt);
      tu_rng r = tu_rng_make(80 + t);
      void *x = tu_alloc(tb), *dy = tu_alloc(tb), *dsum = tu_alloc(tb), *gamma = tu_alloc(pb);
      tu_fill_uniform(dt, x, rows * d, &r, -2, 2);
      for (int64_t j = 0; j < d; j++) tu_store(dt, x, zr * d + j, 0.0);
      tu_fill_uniform(dt, dy, rows * d, &r, -1, 1);
      tu_fill_uniform(dt, dsum, rows * d, &r, -1, 1);
      tu_fill_param(dt, gamma, d, &r, -1.5, 1.5);
      void *y = tu_poisoned(tb), *si = tu_poisoned(gb);
      norma_ln_desc D = {rows, d, dt, 0.0, 0};
      EXPECT_OK(norma_rms_forward(&D, x, NULL, gamma, y, NULL, si), "rms_forward");
      TU_CHECK(tu_pload(dt, si, zr) == 0.0, "[%s] invrms of the zero row = %g, want 0", tu_ctx,
               tu_pload(dt, si, zr));
      int64_t bad = 0;
      for (int64_t j = 0; j < d; j++) bad += tu_load(dt, y, zr * d + j) != 0.0;
      TU_CHECK(bad == 0, "[%s] y of the zero row has %lld non-zero values", tu_ctx, (long long)bad);
      /* the other rows: y = x * invrms * gamma, invrms = 1 / sqrt(mean x^2) */
      double *ey = tu_alloc(rows * d * 8), *ei = tu_alloc(rows * 8);
      for (int64_t i = 0; i < rows; i++) {
        double q = 0;
        for (int64_t j = 0; j < d; j++) q += tu_load(dt, x, i * d + j) * tu_load(dt, x, i * d + j);
        ei[i] = q == 0 ? 0.0 : 1.0 / sqrt(q / d);
        for (int64_t j = 0; j < d; j++)
          ey[i * d + j] = tu_load(dt, x, i * d + j) * ei[i] * tu_pload(dt, gamma, j);
      }
      tu_cmp_d("y", dt, y, ey, rows * d, tu_tol_tensor(dt), 1.0);
      tu_cmp_d("save_invrms", pt, si, ei, rows, tu_tol_param(dt), 0.0);
      /* backward: the zero row's dx is dsum (invrms 0), bitwise */
      void *dx = tu_poisoned(tb), *dg = tu_poisoned(pb);
      EXPECT_OK(norma_rms_backward(&D, x, dy, dsum, gamma, si, dx, dg), "rms_backward");
      tn_same("dx of the zero row == dsum", dt, (char *)dx + zr * d * tu_esize(dt),
              (char *)dsum + zr * d * tu_esize(dt), d);
      int fin = 1;
      for (int64_t k = 0; k < rows * d; k++) fin &= isfinite(tu_load(dt, dx, k));
      for (int64_t j = 0; j < d; j++) fin &= isfinite(tu_pload(dt, dg, j));
      TU_CHECK(fin, "[%s] dx / dgamma not finite", tu_ctx);
      free(x), free(dy), free(dsum), free(gamma), free(y), free(si), free(ey), free(ei);
      free(dx), free(dg);
    }
  norma_set_use_reference(0);
}

/* ---- var == eps == 0: a constant row / group / instance ---------------------------------------
 */

/* kind 0: LayerNorm rows x d (row zr constant); 1: GroupNorm [n, c, s] groups G (group zg of
   sample 1 constant); 2: InstanceNorm (instance (1, zc) constant).  The constant is 0.1 (not
   dyadic: a naive sum / count does not give it back exactly) or 2.5. */
static void zero_var_case(int kind, int64_t n, int64_t c, int64_t s, int64_t G, norma_layout lay,
                          norma_dtype dt, double konst, unsigned act, int use_ref) {
  const norma_dtype pt = tu_ptype(dt);
  const tn_geo g = kind == 0 ? tn_geo_ln(n, c) : tn_geo_gn(n, c, s, kind == 2 ? c : G, lay);
  const int64_t total = tn_total(&g), ng = tn_ngroups(&g);
  const int64_t zg = kind == 0 ? 1 : (c / g.cpg) + (c / g.cpg) / 2; /* a group of sample 1 */
  const size_t tb = total * tu_esize(dt), pb = c * tu_psize(dt), gb = ng * tu_psize(dt);
  norma_set_use_reference(use_ref);
  tu_set_ctx("var == eps == 0 %s %s n=%lld c=%lld s=%lld cpg=%lld %s %s const %g act 0x%x",
             mode_name(use_ref), kind == 0 ? "LN" : kind == 1 ? "GN" : "IN", (long long)n,
             (long long)c, (long long)s, (long long)g.cpg, tu_dt_name(dt), tu_layout_name(lay),
             konst, act);
  tu_rng r = tu_rng_make(90 + (uint64_t)(n * 31 + c * 7 + s + dt));
  void *x = tu_alloc(tb), *dy = tu_alloc(tb), *gamma = tu_alloc(pb), *beta = tu_alloc(pb);
  tu_fill_uniform(dt, x, total, &r, -2, 2);
  TN_FOR_GROUP(&g, zg, e) tu_store(dt, x, e, konst);
  tu_fill_uniform(dt, dy, total, &r, -1, 1);
  tu_fill_param(dt, gamma, c, &r, 0.5, 1.5);
  tu_fill_param(dt, beta, c, &r, -1, 1);
  void *y = tu_poisoned(tb), *sm = tu_poisoned(gb), *si = tu_poisoned(gb);
  norma_ln_desc ld = {n, c, dt, 0.0, 0};
  norma_gn_desc gd = {n, c, s, c / g.cpg, lay, dt, 0.0, act};
  norma_in_desc id = {n, c, s, lay, dt, 0.0, act};
  if (kind == 0) EXPECT_OK(norma_ln_forward(&ld, x, NULL, gamma, beta, y, NULL, sm, si), "forward");
  else if (kind == 1) EXPECT_OK(norma_gn_forward(&gd, x, gamma, beta, y, sm, si), "forward");
  else
    EXPECT_OK(norma_in_forward_training(&id, x, gamma, beta, y, sm, si, NULL, NULL, 0), "forward");
  TU_CHECK(tu_pload(dt, si, zg) == 0.0, "[%s] save_invstd of the constant group = %g, want 0",
           tu_ctx, tu_pload(dt, si, zg));
  TU_CHECK(tu_pload(dt, sm, zg) == tu_round(pt, tu_round(dt, konst)),
           "[%s] save_mean of the constant group = %.9g, want %.9g", tu_ctx, tu_pload(dt, sm, zg),
           tu_round(pt, tu_round(dt, konst)));
  int64_t bad = 0, worst = -1;
  TN_FOR_GROUP(&g, zg, e) {
    const double b = tu_pload(dt, beta, tn_channel_of(&g, e));
    const double z = act == NORMA_RELU   ? (b > 0 ? b : 0)
                     : act == NORMA_SILU ? b / (1 + exp(-b))
                                         : b;
    const double tol = act == NORMA_SILU ? 2 * tu_tol_tensor(dt) : 0.0;
    if (!(fabs(tu_load(dt, y, e) - tu_round(dt, z)) <= tol * fabs(z))) bad++, worst = e;
  }
  TU_CHECK(bad == 0, "[%s] y != act(beta) in %lld values of the constant group (e.g. [%lld] %g)",
           tu_ctx, (long long)bad, (long long)worst, worst >= 0 ? tu_load(dt, y, worst) : 0.0);
  /* backward: dx = 0 in that group, finite elsewhere */
  void *dx = tu_poisoned(tb), *dg = tu_poisoned(pb), *dbt = tu_poisoned(pb);
  const void *yb = act == NORMA_RELU ? y : NULL;
  if (kind == 0)
    EXPECT_OK(norma_ln_backward(&ld, x, dy, NULL, gamma, sm, si, dx, dg, dbt), "backward");
  else if (kind == 1)
    EXPECT_OK(norma_gn_backward(&gd, x, yb, dy, gamma, beta, sm, si, dx, dg, dbt), "backward");
  else EXPECT_OK(norma_in_backward(&id, x, yb, dy, gamma, beta, sm, si, dx, dg, dbt), "backward");
  bad = 0;
  TN_FOR_GROUP(&g, zg, e) bad += tu_load(dt, dx, e) != 0.0;
  TU_CHECK(bad == 0, "[%s] dx != 0 in %lld values of the constant group", tu_ctx, (long long)bad);
  int fin = 1;
  for (int64_t k = 0; k < total; k++)
    fin &= isfinite(tu_load(dt, dx, k)) && isfinite(tu_load(dt, y, k));
  for (int64_t j = 0; j < c; j++)
    fin &= isfinite(tu_pload(dt, dg, j)) && isfinite(tu_pload(dt, dbt, j));
  TU_CHECK(fin, "[%s] y / dx / dgamma / dbeta not finite", tu_ctx);
  free(x), free(dy), free(gamma), free(beta), free(y), free(sm), free(si), free(dx), free(dg),
      free(dbt);
  norma_set_use_reference(0);
}

static void test_zero_var(void) {
  static const double konsts[] = {2.5, 0.1};
  for (int t = 0; t < 4; t++)
    for (int use_ref = 0; use_ref < 2; use_ref++)
      for (int k = 0; k < 2; k++) {
        const norma_dtype dt = TN_DTS[t];
        const double K = konsts[k];
        zero_var_case(0, 4, 3, 1, 1, NORMA_CHANNELS_LAST, dt, K, 0, use_ref);
        zero_var_case(0, 3, 1000, 1, 1, NORMA_CHANNELS_LAST, dt, K, 0, use_ref);
        zero_var_case(0, 3, 4097, 1, 1, NORMA_CHANNELS_LAST, dt, K, 0, use_ref);
        for (int l = 0; l < 2; l++) {
          const norma_layout lay = (norma_layout)l;
          zero_var_case(1, 2, 12, 7, 4, lay, dt, K, 0, use_ref);
          zero_var_case(1, 2, 12, 7, 3, lay, dt, K, NORMA_RELU, use_ref);
          zero_var_case(1, 3, 8, 1, 2, lay, dt, K, 0, use_ref);
          zero_var_case(1, 2, 6, 1500, 2, lay, dt, K, NORMA_SILU, use_ref);
          zero_var_case(2, 2, 5, 33, 5, lay, dt, K, 0, use_ref);
          zero_var_case(2, 2, 5, 4099, 5, lay, dt, K, NORMA_RELU, use_ref);
        }
      }
}

/* ---- InstanceNorm running statistics (PyTorch) on explicit numbers ----------------------------
 */

static void test_in_running(void) {
  /* x[n = 2][c = 2][s = 4] */
  static const double X[2][2][4] = {{{1, 2, 3, 4}, {0, 0, 1, 1}}, {{2, 4, 6, 8}, {-1, 1, -1, 1}}};
  static const double RM0[2] = {0.5, -1.0}, RV0[2] = {2.0, 0.5};
  for (int t = 0; t < 4; t++)
    for (int l = 0; l < 2; l++)
      for (int use_ref = 0; use_ref < 2; use_ref++)
        for (int biased = 0; biased < 2; biased++) {
          const norma_dtype dt = TN_DTS[t], pt = tu_ptype(dt);
          const norma_layout lay = (norma_layout)l;
          norma_set_use_reference(use_ref);
          tu_set_ctx("IN running %s %s %s %s", mode_name(use_ref), tu_dt_name(dt),
                     tu_layout_name(lay), biased ? "biased" : "unbiased");
          const size_t tb = 16 * tu_esize(dt), pb = 2 * tu_psize(dt);
          void *x = tu_alloc(tb), *y = tu_poisoned(tb), *rm = tu_alloc(pb), *rv = tu_alloc(pb);
          for (int i = 0; i < 2; i++)
            for (int ch = 0; ch < 2; ch++)
              for (int sp = 0; sp < 4; sp++)
                tu_store(dt, x, tu_index(lay, 2, 4, i, ch, sp), X[i][ch][sp]);
          for (int ch = 0; ch < 2; ch++)
            tu_pstore(dt, rm, ch, RM0[ch]), tu_pstore(dt, rv, ch, RV0[ch]);
          const double mom = 0.1;
          norma_in_desc d = {2, 2, 4, lay, dt, 1e-5, biased ? NORMA_BN_BIASED_RUNNING_VAR : 0u};
          EXPECT_OK(norma_in_forward_training(&d, x, NULL, NULL, y, NULL, NULL, rm, rv, mom),
                    "forward");
          double erm[2], erv[2];
          for (int ch = 0; ch < 2; ch++) {
            double am = 0, av = 0;
            for (int i = 0; i < 2; i++) {
              double m = 0, ss = 0;
              for (int sp = 0; sp < 4; sp++) m += X[i][ch][sp];
              m /= 4;
              for (int sp = 0; sp < 4; sp++) ss += (X[i][ch][sp] - m) * (X[i][ch][sp] - m);
              am += m;
              av += ss / (biased ? 4.0 : 3.0); /* PyTorch: unbiased, n = spatial */
            }
            erm[ch] = (1 - mom) * RM0[ch] + mom * am / 2;
            erv[ch] = (1 - mom) * RV0[ch] + mom * av / 2;
          }
          /* the numbers, worked out: channel 0 means 2.5 and 5, unbiased variances 5/3 and 20/3 */
          if (!biased) {
            TU_CHECK(fabs(erm[0] - 0.825) < 1e-15 &&
                         fabs(erv[0] - (1.8 + 0.1 * 25.0 / 6.0)) < 1e-15,
                     "[%s] the test's own expectation is wrong", tu_ctx);
          }
          tu_cmp_d("running_mean", pt, rm, erm, 2, tu_tol_param(dt) * 0.1, 0.0);
          tu_cmp_d("running_var", pt, rv, erv, 2, tu_tol_param(dt) * 0.1, 0.0);
          /* momentum 0: unchanged, bitwise */
          void *rm2 = tu_dup(rm, pb), *rv2 = tu_dup(rv, pb);
          EXPECT_OK(norma_in_forward_training(&d, x, NULL, NULL, y, NULL, NULL, rm2, rv2, 0.0),
                    "forward (momentum 0)");
          tu_same_bits("running_mean (momentum 0)", rm2, rm, pb);
          tu_same_bits("running_var (momentum 0)", rv2, rv, pb);
          free(x), free(y), free(rm), free(rv), free(rm2), free(rv2);
        }
  norma_set_use_reference(0);
}

/* ---- equivalences -----------------------------------------------------------------------------
 */

/* GroupNorm with groups == c against InstanceNorm, and GroupNorm with groups == 1 on [N, C, 1]
   against LayerNorm over C: forward and backward, bitwise */
static void equiv_case(int which, int64_t n, int64_t c, int64_t s, norma_layout lay,
                       norma_dtype dt, unsigned act, int use_ref) {
  const tn_geo g = which == 0 ? tn_geo_gn(n, c, s, c, lay) : tn_geo_gn(n, c, 1, 1, lay);
  if (which == 1) s = 1;
  const int64_t total = tn_total(&g), ng = tn_ngroups(&g);
  const size_t tb = total * tu_esize(dt), pb = c * tu_psize(dt), gb = ng * tu_psize(dt);
  norma_set_use_reference(use_ref);
  tu_set_ctx("%s %s n=%lld c=%lld s=%lld %s %s act 0x%x",
             which == 0 ? "GN(G=C) == IN" : "GN(G=1, s=1) == LN", mode_name(use_ref), (long long)n,
             (long long)c, (long long)s, tu_dt_name(dt), tu_layout_name(lay), act);
  tu_rng r = tu_rng_make(120 + (uint64_t)(n + c + s + dt + lay));
  double *mu = tu_alloc(ng * 8), *sd = tu_alloc(ng * 8);
  for (int64_t G = 0; G < ng; G++) mu[G] = tu_uniform(&r, -3, 3), sd[G] = tu_uniform(&r, 0.3, 3);
  void *x = tu_alloc(tb), *dy = tu_alloc(tb), *gamma = tu_alloc(pb), *beta = tu_alloc(pb);
  tn_fill_groups(dt, &g, x, mu, sd, NULL, &r);
  tu_fill_uniform(dt, dy, total, &r, -1, 1.2);
  tu_fill_param(dt, gamma, c, &r, -1.5, 1.5);
  tu_fill_param(dt, beta, c, &r, -0.5, 0.5);
  void *y1 = tu_poisoned(tb), *y2 = tu_poisoned(tb), *sm1 = tu_poisoned(gb), *sm2 = tu_poisoned(gb);
  void *si1 = tu_poisoned(gb), *si2 = tu_poisoned(gb), *dx1 = tu_poisoned(tb),
       *dx2 = tu_poisoned(tb);
  void *dg1 = tu_poisoned(pb), *dg2 = tu_poisoned(pb), *db1 = tu_poisoned(pb),
       *db2 = tu_poisoned(pb);
  norma_gn_desc gd = {n, c, s, which == 0 ? c : 1, lay, dt, 1e-5, act};
  EXPECT_OK(norma_gn_forward(&gd, x, gamma, beta, y1, sm1, si1), "gn_forward");
  EXPECT_OK(norma_gn_backward(&gd, x, y1, dy, gamma, beta, sm1, si1, dx1, dg1, db1), "gn_backward");
  if (which == 0) {
    norma_in_desc id = {n, c, s, lay, dt, 1e-5, act};
    EXPECT_OK(norma_in_forward_training(&id, x, gamma, beta, y2, sm2, si2, NULL, NULL, 0),
              "in_forward");
    EXPECT_OK(norma_in_backward(&id, x, y2, dy, gamma, beta, sm2, si2, dx2, dg2, db2),
              "in_backward");
  } else {
    norma_ln_desc ld = {n, c, dt, 1e-5, 0};
    EXPECT_OK(norma_ln_forward(&ld, x, NULL, gamma, beta, y2, NULL, sm2, si2), "ln_forward");
    EXPECT_OK(norma_ln_backward(&ld, x, dy, NULL, gamma, sm2, si2, dx2, dg2, db2), "ln_backward");
  }
  tn_same("y", dt, y1, y2, total);
  tu_same_bits("save_mean", sm1, sm2, gb);
  tu_same_bits("save_invstd", si1, si2, gb);
  tn_same("dx", dt, dx1, dx2, total);
  tu_same_bits("dgamma", dg1, dg2, pb);
  tu_same_bits("dbeta", db1, db2, pb);
  free(mu), free(sd), free(x), free(dy), free(gamma), free(beta), free(y1), free(y2), free(sm1);
  free(sm2), free(si1), free(si2), free(dx1), free(dx2), free(dg1), free(dg2), free(db1), free(db2);
  norma_set_use_reference(0);
}

/* InstanceNorm inference with given per-channel statistics against BatchNorm inference */
/* InstanceNorm inference with given per-channel statistics against BatchNorm inference; with
   eps0, eps is 0 and the last channel's var is 0: y is NaN where x == mean, +-Inf elsewhere
   (BatchNorm's documented rule) */
static void in_bn_case(int64_t n, int64_t c, int64_t s, norma_layout lay, norma_dtype dt,
                       unsigned act, int eps0, int use_ref) {
  const int64_t total = n * c * s;
  const size_t tb = total * tu_esize(dt), pb = c * tu_psize(dt);
  norma_set_use_reference(use_ref);
  tu_set_ctx("IN inference == BN inference %s n=%lld c=%lld s=%lld %s %s act 0x%x%s",
             mode_name(use_ref), (long long)n, (long long)c, (long long)s, tu_dt_name(dt),
             tu_layout_name(lay), act, eps0 ? " var 0, eps 0" : "");
  tu_rng r = tu_rng_make(140 + (uint64_t)(n + c + s + dt + lay));
  void *x = tu_alloc(tb), *gamma = tu_alloc(pb), *beta = tu_alloc(pb), *mean = tu_alloc(pb),
       *var = tu_alloc(pb), *y1 = tu_poisoned(tb), *y2 = tu_poisoned(tb);
  tu_fill_uniform(dt, x, total, &r, -3, 4);
  tu_fill_param(dt, gamma, c, &r, -1.5, 1.5);
  tu_fill_param(dt, beta, c, &r, -0.5, 0.5);
  tu_fill_param(dt, mean, c, &r, -1, 1);
  tu_fill_param(dt, var, c, &r, 0.2, 3);
  const int64_t zc = c - 1, ze = tu_index(lay, c, s, n - 1, zc, s - 1);
  if (eps0) {
    tu_pstore(dt, var, zc, 0.0);
    tu_pstore(dt, gamma, zc, 1.25);
    tu_pstore(dt, mean, zc, 0.5);
    tu_store(dt, x, ze, 0.5); /* x == mean there */
  }
  const double eps = eps0 ? 0.0 : 1e-3;
  norma_in_desc id = {n, c, s, lay, dt, eps, act};
  norma_bn_desc bd = {n, c, s, lay, dt, eps, act};
  EXPECT_OK(norma_in_forward_inference(&id, x, gamma, beta, mean, var, y1), "in_forward_inference");
  EXPECT_OK(norma_bn_forward_inference(&bd, x, NULL, gamma, beta, mean, var, y2),
            "bn_forward_inference");
  tn_same("y", dt, y1, y2, total);
  if (eps0 && !act) {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++)
      for (int64_t sp = 0; sp < s; sp++) {
        const int64_t e = tu_index(lay, c, s, i, zc, sp);
        const double v = tu_load(dt, y1, e), xv = tu_load(dt, x, e);
        bad += e == ze ? !isnan(v) : !(isinf(v) && (v > 0) == (xv > 0.5));
      }
    TU_CHECK(bad == 0, "[%s] var + eps == 0: %lld values are not NaN (x == mean) / +-Inf", tu_ctx,
             (long long)bad);
  }
  free(x), free(gamma), free(beta), free(mean), free(var), free(y1), free(y2);
  norma_set_use_reference(0);
}

static void test_equivalences(void) {
  static const unsigned acts[] = {0, NORMA_RELU, NORMA_SILU};
  for (int t = 0; t < 4; t++)
    for (int l = 0; l < 2; l++)
      for (int use_ref = 0; use_ref < 2; use_ref++) {
        const norma_dtype dt = TN_DTS[t];
        const norma_layout lay = (norma_layout)l;
        for (int a = 0; a < 3; a++) {
          equiv_case(0, 2, 6, 49, lay, dt, acts[a], use_ref);
          equiv_case(0, 1, 3, 1021, lay, dt, acts[(a + t) % 3], use_ref);
        }
        equiv_case(0, 2, 32, 1089, lay, dt, acts[(t + l) % 3], use_ref); /* threads */
        equiv_case(1, 5, 33, 1, lay, dt, 0, use_ref);
        equiv_case(1, 3, 4100, 1, lay, dt, 0, use_ref);
        equiv_case(1, 300, 130, 1, lay, dt, 0, use_ref); /* threads */
        in_bn_case(2, 5, 7, lay, dt, 0, 0, use_ref);
        in_bn_case(3, 17, 49, lay, dt, NORMA_RELU, 0, use_ref);
        in_bn_case(4, 9, 1, lay, dt, 0, 0, use_ref);
        in_bn_case(2, 64, 600, lay, dt, t % 2 ? NORMA_RELU : 0, 0, use_ref); /* threads */
        in_bn_case(2, 9, 33, lay, dt, 0, 1, use_ref);
        in_bn_case(3, 4, 5, lay, dt, NORMA_RELU, 1, use_ref);
      }
}

/* ---- the backward with statistics supplied by the caller ----------------------------------------
 */

/* LayerNorm / GroupNorm backward given save_mean = batch mean + shift * std and
   save_invstd = 1 / std.  The backward removes the offset s = mean(x_hat) only when |s| <= 1/16
   (what rounding a stored mean can cause); a larger one means the statistics are the caller's
   and they are used as given.  Expected: x_hat from the exact batch mean for shift 0.03, from
   the given mean for shift 0.5; dx = invstd (k - mean_G(k) - x_hat mean_G(k x_hat)), k = gamma dy,
   dgamma = sum dy x_hat, dbeta = sum dy. */
static void given_stats_case(int gn, norma_layout lay, norma_dtype dt, double shift, int use_ref) {
  const int64_t n = 3, c = gn ? 8 : 40, s = gn ? 11 : 1, G = gn ? 2 : 1;
  const tn_geo g = gn ? tn_geo_gn(n, c, s, G, lay) : tn_geo_ln(n, c);
  const int64_t total = tn_total(&g), ng = tn_ngroups(&g), cnt = tn_count(&g);
  const size_t tb = total * tu_esize(dt), pb = c * tu_psize(dt), gb = ng * tu_psize(dt);
  norma_set_use_reference(use_ref);
  tu_set_ctx("given statistics %s %s %s %s shift %g std", mode_name(use_ref), gn ? "GN" : "LN",
             tu_dt_name(dt), tu_layout_name(lay), shift);
  tu_rng r = tu_rng_make(200 + (uint64_t)(gn * 8 + dt * 2 + lay));
  double *mu = tu_alloc(ng * 8), *sd = tu_alloc(ng * 8);
  for (int64_t k = 0; k < ng; k++) mu[k] = tu_uniform(&r, -2, 2), sd[k] = tu_uniform(&r, 0.5, 2);
  void *x = tu_alloc(tb), *dy = tu_alloc(tb), *gamma = tu_alloc(pb), *beta = tu_alloc(pb);
  tn_fill_groups(dt, &g, x, mu, sd, NULL, &r);
  tu_fill_uniform(dt, dy, total, &r, -1, 1.2);
  tu_fill_param(dt, gamma, c, &r, 0.5, 1.5);
  tu_fill_param(dt, beta, c, &r, -0.5, 0.5);
  void *sm = tu_alloc(gb), *si = tu_alloc(gb);
  double *edx = tu_alloc(total * 8), *edg = tu_alloc(c * 8), *edb = tu_alloc(c * 8);
  for (int64_t j = 0; j < c; j++) edg[j] = edb[j] = 0;
  for (int64_t k = 0; k < ng; k++) {
    double m = 0, q = 0;
    TN_FOR_GROUP(&g, k, e) m += tu_load(dt, x, e);
    m /= (double)cnt;
    TN_FOR_GROUP(&g, k, e) q += (tu_load(dt, x, e) - m) * (tu_load(dt, x, e) - m);
    const double std = sqrt(q / (double)cnt);
    tu_pstore(dt, sm, k, m + shift * std);
    tu_pstore(dt, si, k, 1.0 / std);
    const double is = tu_pload(dt, si, k);
    /* which mean x_hat is taken from: the batch mean (small shift), or the given one */
    const double xm = fabs(shift) <= 0.0625 ? m : tu_pload(dt, sm, k);
    double A = 0, B = 0;
    TN_FOR_GROUP(&g, k, e) {
      const int64_t ch = tn_channel_of(&g, e);
      const double xh = (tu_load(dt, x, e) - xm) * is,
                   kk = tu_pload(dt, gamma, ch) * tu_load(dt, dy, e);
      A += kk, B += kk * xh;
      edg[ch] += tu_load(dt, dy, e) * xh, edb[ch] += tu_load(dt, dy, e);
    }
    TN_FOR_GROUP(&g, k, e) {
      const int64_t ch = tn_channel_of(&g, e);
      const double xh = (tu_load(dt, x, e) - xm) * is,
                   kk = tu_pload(dt, gamma, ch) * tu_load(dt, dy, e);
      edx[e] = is * (kk - A / (double)cnt - xh * B / (double)cnt);
    }
  }
  void *dx = tu_poisoned(tb), *dg = tu_poisoned(pb), *dbt = tu_poisoned(pb);
  if (gn) {
    norma_gn_desc d = {n, c, s, G, lay, dt, 1e-5, 0};
    EXPECT_OK(norma_gn_backward(&d, x, NULL, dy, gamma, beta, sm, si, dx, dg, dbt), "gn_backward");
  } else {
    norma_ln_desc d = {n, c, dt, 1e-5, 0};
    EXPECT_OK(norma_ln_backward(&d, x, dy, NULL, gamma, sm, si, dx, dg, dbt), "ln_backward");
  }
  const double tt = tu_tol_tensor(dt) * 4, tp = tu_tol_param(dt) * 4;
  tu_cmp_d("dx", dt, dx, edx, total, tt, 2.0);
  tu_cmp_d("dgamma", tu_ptype(dt), dg, edg, c, tp, (double)(n * s));
  tu_cmp_d("dbeta", tu_ptype(dt), dbt, edb, c, tp, (double)(n * s));
  free(mu), free(sd), free(x), free(dy), free(gamma), free(beta), free(sm), free(si), free(edx);
  free(edg), free(edb), free(dx), free(dg), free(dbt);
  norma_set_use_reference(0);
}

static void test_given_stats(void) {
  for (int t = 0; t < 4; t++)
    for (int use_ref = 0; use_ref < 2; use_ref++)
      for (int gn = 0; gn < 2; gn++)
        for (int l = 0; l < 1 + gn; l++) {
          given_stats_case(gn, (norma_layout)l, TN_DTS[t], 0.03, use_ref);
          given_stats_case(gn, (norma_layout)l, TN_DTS[t], 0.5, use_ref);
          given_stats_case(gn, (norma_layout)l, TN_DTS[t], -2.0, use_ref);
        }
}

/* ---- allowed exact aliasing -------------------------------------------------------------------
 */

/* runs `op` on separate buffers and on aliased ones; every output compared bitwise */
static void alias_rows(int rms, int64_t rows, int64_t d, norma_dtype dt, int use_ref) {
  const int64_t total = rows * d;
  const size_t tb = total * tu_esize(dt), pb = d * tu_psize(dt), gb = rows * tu_psize(dt);
  norma_set_use_reference(use_ref);
  tu_set_ctx("aliasing %s %s rows=%lld d=%lld %s", mode_name(use_ref), rms ? "RMS" : "LN",
             (long long)rows, (long long)d, tu_dt_name(dt));
  const tn_geo g = tn_geo_ln(rows, d);
  tu_rng r = tu_rng_make(160 + (uint64_t)(rows + d + dt));
  double *mu = tu_alloc(rows * 8), *sd = tu_alloc(rows * 8);
  for (int64_t i = 0; i < rows; i++) mu[i] = tu_uniform(&r, -2, 2), sd[i] = tu_uniform(&r, 0.5, 2);
  void *x = tu_alloc(tb), *res = tu_alloc(tb), *dy = tu_alloc(tb), *dsum = tu_alloc(tb);
  tn_fill_groups(dt, &g, x, mu, sd, NULL, &r);
  tu_fill_uniform(dt, res, total, &r, -1, 1);
  tu_fill_uniform(dt, dy, total, &r, -1, 1);
  tu_fill_uniform(dt, dsum, total, &r, -1, 1);
  void *gamma = tu_alloc(pb), *beta = tu_alloc(pb);
  tu_fill_param(dt, gamma, d, &r, -1.5, 1.5);
  tu_fill_param(dt, beta, d, &r, -0.5, 0.5);
  const norma_ln_desc D = {rows, d, dt, 1e-5, 0};
#define FWD(xx, rr, yy, ss, sm, si)                                             \
  (rms ? norma_rms_forward(&D, xx, rr, gamma, yy, ss, si)                        \
       : norma_ln_forward(&D, xx, rr, gamma, beta, yy, ss, sm, si))
#define BWD(xx, dd, ds, sm, si, ddx, dg, db)                                     \
  (rms ? norma_rms_backward(&D, xx, dd, ds, gamma, si, ddx, dg)                  \
       : norma_ln_backward(&D, xx, dd, ds, gamma, sm, si, ddx, dg, db))
  /* separate buffers */
  void *y = tu_poisoned(tb), *ys = tu_poisoned(tb), *sum = tu_poisoned(tb), *sm = tu_poisoned(gb),
       *si = tu_poisoned(gb);
  EXPECT_OK(FWD(x, NULL, y, NULL, sm, si), "forward");
  EXPECT_OK(FWD(x, res, ys, sum, sm, si), "forward (residual)");
  void *dx = tu_poisoned(tb), *dxs = tu_poisoned(tb), *dg = tu_poisoned(pb), *db = tu_poisoned(pb);
  EXPECT_OK(BWD(x, dy, NULL, sm, si, dx, dg, db), "backward");
  EXPECT_OK(BWD(x, dy, dsum, sm, si, dxs, NULL, NULL), "backward (dsum)");
  /* y == x */
  void *a = tu_dup(x, tb);
  EXPECT_OK(FWD(a, NULL, a, NULL, NULL, NULL), "forward y == x");
  tn_same("y == x", dt, a, y, total);
  /* y == x with residual, sum separate */
  void *s2 = tu_poisoned(tb);
  memcpy(a, x, tb);
  EXPECT_OK(FWD(a, res, a, s2, NULL, NULL), "forward y == x (residual)");
  tn_same("y == x (residual)", dt, a, ys, total);
  tn_same("sum (y == x)", dt, s2, sum, total);
  /* y == residual, sum NULL */
  void *b = tu_dup(res, tb);
  EXPECT_OK(FWD(x, b, b, NULL, NULL, NULL), "forward y == residual");
  tn_same("y == residual", dt, b, ys, total);
  /* inputs aliasing each other, the sum over both: x == residual == sum (h = 2x) */
  {
    void *ya = tu_poisoned(tb), *yb = tu_poisoned(tb), *sa = tu_poisoned(tb), *xx = tu_dup(x, tb);
    void *x2 = tu_dup(x, tb);
    EXPECT_OK(FWD(x, x2, ya, sa, NULL, NULL), "forward residual == copy of x");
    EXPECT_OK(FWD(xx, xx, yb, xx, NULL, NULL), "forward x == residual == sum");
    tn_same("y (x == residual == sum)", dt, yb, ya, total);
    tn_same("sum (x == residual == sum)", dt, xx, sa, total);
    free(ya), free(yb), free(sa), free(xx), free(x2);
  }
  /* backward: dx == dy, dx == x, dx == dsum */
  void *dg2 = tu_poisoned(pb), *db2 = tu_poisoned(pb);
  memcpy(a, dy, tb);
  EXPECT_OK(BWD(x, a, NULL, sm, si, a, dg2, db2), "backward dx == dy");
  tn_same("dx == dy", dt, a, dx, total);
  tu_same_bits("dgamma (dx == dy)", dg2, dg, pb);
  if (!rms) tu_same_bits("dbeta (dx == dy)", db2, db, pb);
  memcpy(a, x, tb);
  EXPECT_OK(BWD(a, dy, NULL, sm, si, a, dg2, db2), "backward dx == x");
  tn_same("dx == x", dt, a, dx, total);
  tu_same_bits("dgamma (dx == x)", dg2, dg, pb);
  memcpy(a, dsum, tb);
  EXPECT_OK(BWD(x, dy, a, sm, si, a, NULL, NULL), "backward dx == dsum");
  tn_same("dx == dsum", dt, a, dxs, total);
  /* dsum == dy (inputs), dx over both */
  {
    void *dx3 = tu_poisoned(tb), *dyc = tu_dup(dy, tb);
    EXPECT_OK(BWD(x, dy, dyc, sm, si, dx3, NULL, NULL), "backward dsum == copy of dy");
    memcpy(a, dy, tb);
    EXPECT_OK(BWD(x, a, a, sm, si, a, NULL, NULL), "backward dx == dy == dsum");
    tn_same("dx == dy == dsum", dt, a, dx3, total);
    free(dx3), free(dyc);
  }
#undef FWD
#undef BWD
  free(mu), free(sd), free(x), free(res), free(dy), free(dsum), free(gamma), free(beta), free(y);
  free(ys), free(sum), free(sm), free(si), free(dx), free(dxs), free(dg), free(db), free(a);
  free(s2), free(b), free(dg2), free(db2);
  norma_set_use_reference(0);
}

static void alias_groups(int inorm, int64_t n, int64_t c, int64_t s, int64_t G, norma_layout lay,
                         norma_dtype dt, unsigned act, int use_ref) {
  if (inorm) G = c;
  const tn_geo g = tn_geo_gn(n, c, s, G, lay);
  const int64_t total = tn_total(&g), ng = tn_ngroups(&g);
  const size_t tb = total * tu_esize(dt), pb = c * tu_psize(dt), gb = ng * tu_psize(dt);
  norma_set_use_reference(use_ref);
  tu_set_ctx("aliasing %s %s n=%lld c=%lld s=%lld G=%lld %s %s act 0x%x", mode_name(use_ref),
             inorm ? "IN" : "GN", (long long)n, (long long)c, (long long)s, (long long)G,
             tu_dt_name(dt), tu_layout_name(lay), act);
  tu_rng r = tu_rng_make(180 + (uint64_t)(n + c + s + dt + lay));
  double *mu = tu_alloc(ng * 8), *sd = tu_alloc(ng * 8);
  for (int64_t k = 0; k < ng; k++) mu[k] = tu_uniform(&r, -2, 2), sd[k] = tu_uniform(&r, 0.5, 2);
  void *x = tu_alloc(tb), *dy = tu_alloc(tb), *gamma = tu_alloc(pb), *beta = tu_alloc(pb);
  tn_fill_groups(dt, &g, x, mu, sd, NULL, &r);
  tu_fill_uniform(dt, dy, total, &r, -1, 1);
  tu_fill_param(dt, gamma, c, &r, -1.5, 1.5);
  tu_fill_param(dt, beta, c, &r, -0.5, 0.5);
  void *rm0 = tu_alloc(pb), *rv0 = tu_alloc(pb);
  tu_fill_param(dt, rm0, c, &r, -1, 1);
  tu_fill_param(dt, rv0, c, &r, 0.5, 2);
  const norma_gn_desc GD = {n, c, s, G, lay, dt, 1e-5, act};
  const norma_in_desc ID = {n, c, s, lay, dt, 1e-5, act};
  void *rm = tu_dup(rm0, pb), *rv = tu_dup(rv0, pb), *rm2 = tu_dup(rm0, pb), *rv2 = tu_dup(rv0, pb);
#define FWD(xx, yy, sm, si, rmm, rvv)                                                      \
  (inorm ? norma_in_forward_training(&ID, xx, gamma, beta, yy, sm, si, rmm, rvv, 0.25)     \
         : norma_gn_forward(&GD, xx, gamma, beta, yy, sm, si))
#define BWD(xx, yy, dd, ddx, dg, db)                                                        \
  (inorm ? norma_in_backward(&ID, xx, yy, dd, gamma, beta, sm, si, ddx, dg, db)             \
         : norma_gn_backward(&GD, xx, yy, dd, gamma, beta, sm, si, ddx, dg, db))
  void *y = tu_poisoned(tb), *sm = tu_poisoned(gb), *si = tu_poisoned(gb);
  EXPECT_OK(FWD(x, y, sm, si, rm, rv), "forward");
  void *dx = tu_poisoned(tb), *dg = tu_poisoned(pb), *db = tu_poisoned(pb);
  EXPECT_OK(BWD(x, y, dy, dx, dg, db), "backward");
  /* y == x */
  void *a = tu_dup(x, tb), *sm2 = tu_poisoned(gb), *si2 = tu_poisoned(gb);
  EXPECT_OK(FWD(a, a, sm2, si2, rm2, rv2), "forward y == x");
  tn_same("y == x", dt, a, y, total);
  tu_same_bits("save_mean (y == x)", sm2, sm, gb);
  tu_same_bits("save_invstd (y == x)", si2, si, gb);
  if (inorm) {
    tu_same_bits("running_mean (y == x)", rm2, rm, pb);
    tu_same_bits("running_var (y == x)", rv2, rv, pb);
    /* inference y == x */
    void *yi = tu_poisoned(tb);
    EXPECT_OK(norma_in_forward_inference(&ID, x, gamma, beta, rm0, rv0, yi), "inference");
    memcpy(a, x, tb);
    EXPECT_OK(norma_in_forward_inference(&ID, a, gamma, beta, rm0, rv0, a), "inference y == x");
    tn_same("inference y == x", dt, a, yi, total);
    free(yi);
  }
  /* backward: dx == dy, dx == x, dx == y (RELU: y is an input) */
  void *dg2 = tu_poisoned(pb), *db2 = tu_poisoned(pb);
  memcpy(a, dy, tb);
  EXPECT_OK(BWD(x, y, a, a, dg2, db2), "backward dx == dy");
  tn_same("dx == dy", dt, a, dx, total);
  tu_same_bits("dgamma (dx == dy)", dg2, dg, pb);
  tu_same_bits("dbeta (dx == dy)", db2, db, pb);
  memcpy(a, x, tb);
  EXPECT_OK(BWD(a, y, dy, a, dg2, db2), "backward dx == x");
  tn_same("dx == x", dt, a, dx, total);
  tu_same_bits("dgamma (dx == x)", dg2, dg, pb);
  if (act == NORMA_RELU) {
    memcpy(a, y, tb);
    EXPECT_OK(BWD(x, a, dy, a, dg2, db2), "backward dx == y");
    tn_same("dx == y", dt, a, dx, total);
    tu_same_bits("dgamma (dx == y)", dg2, dg, pb);
  }
#undef FWD
#undef BWD
  free(mu), free(sd), free(x), free(dy), free(gamma), free(beta), free(rm0), free(rv0), free(rm);
  free(rv), free(rm2), free(rv2), free(y), free(sm), free(si), free(dx), free(dg), free(db);
  free(a), free(sm2), free(si2), free(dg2), free(db2);
  norma_set_use_reference(0);
}

static void test_aliasing(void) {
  static const unsigned acts[] = {0, NORMA_RELU, NORMA_SILU};
  for (int t = 0; t < 4; t++)
    for (int use_ref = 0; use_ref < 2; use_ref++) {
      const norma_dtype dt = TN_DTS[t];
      for (int rms = 0; rms < 2; rms++) {
        alias_rows(rms, 5, 33, dt, use_ref);
        alias_rows(rms, 3, 4097, dt, use_ref);
        alias_rows(rms, 130, 600, dt, use_ref); /* threads */
      }
      for (int l = 0; l < 2; l++) {
        const norma_layout lay = (norma_layout)l;
        for (int a = 0; a < 3; a++) {
          alias_groups(0, 2, 12, 7, 3, lay, dt, acts[a], use_ref);
          alias_groups(1, 2, 5, 49, 5, lay, dt, acts[a], use_ref);
        }
        alias_groups(0, 3, 64, 1, 8, lay, dt, NORMA_RELU, use_ref);
        alias_groups(0, 600, 64, 1, 8, lay, dt, 0, use_ref);                 /* threads, rows */
        alias_groups(0, 3, 64, 400, 8, lay, dt, acts[(t + l) % 3], use_ref); /* threads */
        alias_groups(1, 2, 32, 1089, 32, lay, dt, acts[(t + l + 1) % 3], use_ref);
      }
    }
}

/* ---- a row's results do not depend on its neighbours ------------------------------------------
 */

/* LayerNorm forward of rows 1..R-1 of a tensor, called on its own, gives rows 1..R-1 of the
   call on the whole tensor bit for bit: the engine takes rows by pairs (their statistics in one
   interleaved kernel call), and shifting by one row changes every row's partner and which row
   goes alone. */
static void row_shift_case(norma_dtype dt, int64_t d, int fill, int res) {
  const int64_t R = 9;
  const size_t es = tu_esize(dt), ps = tu_esize(tu_ptype(dt)), bytes = (size_t)(R * d) * es;
  tu_set_ctx("row shift dtype %d d=%lld fill=%d res=%d", (int)dt, (long long)d, fill, res);
  tu_rng rng = tu_rng_make(0x5eed + (uint64_t)d * 8 + (uint64_t)fill * 2 + (uint64_t)res);
  void *x = tu_alloc(bytes), *r = tu_alloc(bytes), *g = tu_alloc((size_t)d * ps),
       *b = tu_alloc((size_t)d * ps);
  void *y0 = tu_poisoned(bytes), *y1 = tu_poisoned(bytes), *s0 = tu_poisoned(bytes),
       *s1 = tu_poisoned(bytes);
  void *m0 = tu_poisoned((size_t)R * ps), *m1 = tu_poisoned((size_t)R * ps),
       *i0 = tu_poisoned((size_t)R * ps), *i1 = tu_poisoned((size_t)R * ps);
  const double big = dt == NORMA_F16 || dt == NORMA_BF16 ? 1000.0 : 1e6;
  for (int64_t e = 0; e < R * d; e++) {
    double v = tu_uniform(&rng, -1.0, 1.0);
    if (fill == 1) v += big;                          /* large mean */
    if (fill == 2) v = (e / d) % 2 ? 0.0 : -0.0;      /* zero rows of both signs */
    if (fill == 3) v = 3.0;                           /* constant rows */
    tu_store(dt, x, e, v);
    tu_store(dt, r, e, tu_uniform(&rng, -0.5, 0.5));
  }
  tu_fill_param(dt, g, d, &rng, 0.5, 1.5);
  tu_fill_param(dt, b, d, &rng, -0.5, 0.5);
  norma_ln_desc D = {R, d, dt, 1e-5, 0};
  EXPECT_OK(norma_ln_forward(&D, x, res ? r : NULL, g, b, y0, res ? s0 : NULL, m0, i0), "whole");
  D.rows = R - 1;
  const char *x1 = (char *)x + (size_t)d * es, *r1 = res ? (char *)r + (size_t)d * es : NULL;
  EXPECT_OK(norma_ln_forward(&D, x1, r1, g, b, y1, res ? s1 : NULL, m1, i1), "shifted");
  const size_t rb = (size_t)((R - 1) * d) * es;
  TU_CHECK(memcmp((char *)y0 + (size_t)d * es, y1, rb) == 0, "[%s] y differs", tu_ctx);
  TU_CHECK(!res || memcmp((char *)s0 + (size_t)d * es, s1, rb) == 0, "[%s] sum differs", tu_ctx);
  TU_CHECK(memcmp((char *)m0 + ps, m1, (size_t)(R - 1) * ps) == 0, "[%s] save_mean differs",
           tu_ctx);
  TU_CHECK(memcmp((char *)i0 + ps, i1, (size_t)(R - 1) * ps) == 0, "[%s] save_invstd differs",
           tu_ctx);
  free(x), free(r), free(g), free(b), free(y0), free(y1), free(s0), free(s1);
  free(m0), free(m1), free(i0), free(i1);
}

static void test_row_shift(void) {
  static const int64_t ds[] = {1, 31, 33, 64, 100, 768, 1000, 1280};
  for (int t = 0; t < 4; t++)
    for (int k = 0; k < (int)(sizeof ds / sizeof ds[0]); k++)
      for (int fill = 0; fill < 4; fill++)
        for (int res = 0; res < 2; res++) row_shift_case(TN_DTS[t], ds[k], fill, res);
}

int main(void) {
  printf("test_norm_semantics: ISA %s\n", norma_isa_name(norma_get_isa()));
  test_single_value_groups();
  test_rms_zero_row();
  test_zero_var();
  test_in_running();
  test_equivalences();
  test_given_stats();
  test_aliasing();
  test_row_shift();
  return tu_finish("test_norm_semantics");
}
