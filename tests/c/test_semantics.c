/* test_semantics.c - documented behaviour at the edges, for the reference and the production
 * kernels (both layouts, several dtypes):
 *  - var == 0 with eps == 0: save_invstd = 0, y = beta and the backward's dx = 0 in that
 *    channel (PyTorch's rule), the other channels unaffected; inference with var + eps == 0:
 *    NaN where x == mean, +-Inf elsewhere;
 *  - momentum 0 leaves the running statistics bitwise unchanged; momentum 1 sets them to the
 *    batch mean and the unbiased variance (biased with the flag);
 *  - a NaN / Inf in x (no CHECK_FINITE) spoils only its channel: y, save_*, running_* of the
 *    other channels are bitwise those of a run without it; the same for a NaN in dy;
 *  - n * spatial == 1: inference allowed (y correct), training rejected, a GLOBAL_STATS
 *    backward allowed;
 *  - CHECK_FINITE on finite data changes nothing;
 *  - in-place use (y == x, y == residual, dx == dy, dx == x, dx == y, dresidual == dy) gives
 *    bitwise the out-of-place result.
 */
#include "test_util.h"

#define EXPECT_OK(st, what)                                                                    \
  TU_CHECK((st) == NORMA_OK, "[%s] %s returned %s: %s", tu_ctx, what, norma_status_string(st), \
           norma_last_error())

static const norma_dtype DTS[] = {NORMA_F32, NORMA_F64, NORMA_F16, NORMA_BF16};

/* value of channel j at logical position q (q over n*spatial) */
static int64_t idx_of(norma_layout lay, int64_t c, int64_t s, int64_t j, int64_t q) {
  return tu_index(lay, c, s, q / s, j, q % s);
}

/* ---- var == 0, eps == 0 ---- */
static void test_zero_var(void) {
  const int64_t n = 3, c = 19, s = 5, m = n * s, total = n * c * s;
  for (int t = 0; t < 4; t++)
    for (int l = 0; l < 2; l++)
      for (int use_ref = 0; use_ref < 2; use_ref++) {
        norma_dtype dt = DTS[t];
        norma_layout lay = (norma_layout)l;
        norma_set_use_reference(use_ref);
        tu_set_ctx("zero var %s %s %s", use_ref ? "ref" : "prod", tu_dt_name(dt),
                   tu_layout_name(lay));
        const size_t tb = total * tu_esize(dt), pb = c * tu_psize(dt);
        tu_rng r = tu_rng_make(11 + t * 2 + l);
        void *x = tu_alloc(tb), *y = tu_poisoned(tb), *sm = tu_poisoned(pb), *si = tu_poisoned(pb);
        void *rv = tu_alloc(pb), *rm = tu_alloc(pb);
        tu_fill_uniform(dt, x, total, &r, -2, 2);
        const int64_t zc = 17; /* the constant channel: a vector tail in channels-last */
        for (int64_t q = 0; q < m; q++) tu_store(dt, x, idx_of(lay, c, s, zc, q), 2.5);
        tu_fill_param(dt, rm, c, &r, -1, 1);
        tu_fill_param(dt, rv, c, &r, 1, 2);
        double rv_zc = tu_pload(dt, rv, zc), rm_zc = tu_pload(dt, rm, zc);
        void *beta = tu_alloc(pb), *dy = tu_alloc(tb), *dx = tu_poisoned(tb), *dg = tu_poisoned(pb),
             *dbt = tu_poisoned(pb);
        tu_fill_param(dt, beta, c, &r, -1, 1);
        tu_fill_uniform(dt, dy, total, &r, -1, 1);
        norma_bn_desc d = {n, c, s, lay, dt, 0.0, 0};
        norma_status st =
            norma_bn_forward_training(&d, x, NULL, NULL, beta, y, sm, si, rm, rv, 0.5);
        EXPECT_OK(st, "forward_training");
        /* header: var == 0 with eps == 0 gives invstd = 0, y = beta, dx = 0 (PyTorch's rule) */
        TU_CHECK(tu_pload(dt, si, zc) == 0.0,
                 "[%s] save_invstd of a constant channel with eps 0 is %g, want 0", tu_ctx,
                 tu_pload(dt, si, zc));
        TU_CHECK(tu_pload(dt, sm, zc) == 2.5, "[%s] save_mean of the constant channel %g", tu_ctx,
                 tu_pload(dt, sm, zc));
        TU_CHECK(fabs(tu_pload(dt, rv, zc) - 0.5 * rv_zc) <= 1e-6 * rv_zc,
                 "[%s] running_var of the constant channel %g, want %g", tu_ctx,
                 tu_pload(dt, rv, zc), 0.5 * rv_zc);
        TU_CHECK(fabs(tu_pload(dt, rm, zc) - (0.5 * rm_zc + 1.25)) <= 1e-6,
                 "[%s] running_mean of the constant channel", tu_ctx);
        int64_t not_beta = 0, bad_out = 0;
        const double bz = tu_round(dt, tu_pload(dt, beta, zc));
        for (int64_t j = 0; j < c; j++)
          for (int64_t q = 0; q < m; q++) {
            double v = tu_load(dt, y, idx_of(lay, c, s, j, q));
            if (j == zc) not_beta += v != bz;
            else bad_out += !isfinite(v);
          }
        TU_CHECK(not_beta == 0, "[%s] y of the constant channel: %lld of %lld values are not beta "
                 "(%g)", tu_ctx, (long long)not_beta, (long long)m, bz);
        TU_CHECK(bad_out == 0, "[%s] %lld non-finite y outside the constant channel", tu_ctx,
                 (long long)bad_out);
        int64_t bad_si = 0;
        for (int64_t j = 0; j < c; j++)
          bad_si += j != zc && !(tu_pload(dt, si, j) > 0 && isfinite(tu_pload(dt, si, j)));
        TU_CHECK(bad_si == 0, "[%s] save_invstd not finite and > 0 outside the constant channel",
                 tu_ctx);
        /* the backward with those statistics: dx = 0 in the channel, finite elsewhere */
        for (int pass = 0; pass < 2; pass++) {
          tu_poison(dx, tb);
          st = norma_bn_backward(&d, pass ? NULL : x, y, dy, NULL, beta, sm, si, dx, NULL, dg, dbt);
          EXPECT_OK(st, pass ? "backward (x NULL)" : "backward");
          int64_t nonzero = 0, bad = 0;
          for (int64_t j = 0; j < c; j++)
            for (int64_t q = 0; q < m; q++) {
              double v = tu_load(dt, dx, idx_of(lay, c, s, j, q));
              if (j == zc) nonzero += v != 0.0;
              else bad += !isfinite(v);
            }
          TU_CHECK(nonzero == 0, "[%s] backward%s: %lld dx of the constant channel are not 0",
                   tu_ctx, pass ? " (x NULL)" : "", (long long)nonzero);
          TU_CHECK(bad == 0, "[%s] backward%s: non-finite dx outside the constant channel", tu_ctx,
                   pass ? " (x NULL)" : "");
          TU_CHECK(isfinite(tu_pload(dt, dg, zc)) && isfinite(tu_pload(dt, dbt, zc)),
                   "[%s] backward%s: dgamma / dbeta of the constant channel not finite", tu_ctx,
                   pass ? " (x NULL)" : "");
        }
        free(beta), free(dy), free(dx), free(dg), free(dbt);

        /* inference with var + eps == 0: NaN where x == mean, +-Inf elsewhere */
        void *mean = tu_alloc(pb), *var = tu_alloc(pb), *gamma = tu_alloc(pb);
        tu_fill_param(dt, mean, c, &r, -1, 1);
        tu_fill_param(dt, var, c, &r, 0.5, 1);
        tu_fill_param(dt, gamma, c, &r, 0.5, 1);
        tu_pstore(dt, var, 3, 0.0);
        tu_pstore(dt, mean, 3, 0.5);
        tu_pstore(dt, gamma, 3, -2.0);
        for (int64_t q = 0; q < m; q++)
          tu_store(dt, x, idx_of(lay, c, s, 3, q), q % 3 == 0 ? 0.5 : q % 3 == 1 ? 1.5 : -1.0);
        tu_poison(y, tb);
        st = norma_bn_forward_inference(&d, x, NULL, gamma, NULL, mean, var, y);
        EXPECT_OK(st, "forward_inference");
        int64_t bad = 0;
        for (int64_t q = 0; q < m; q++) {
          double v = tu_load(dt, y, idx_of(lay, c, s, 3, q));
          /* gamma < 0: x > mean gives -Inf */
          bad += q % 3 == 0 ? !isnan(v) : q % 3 == 1 ? !(isinf(v) && v < 0) : !(isinf(v) && v > 0);
        }
        TU_CHECK(bad == 0, "[%s] inference with var + eps == 0: %lld wrong values in the channel",
                 tu_ctx, (long long)bad);
        bad = 0;
        for (int64_t j = 0; j < c; j++)
          for (int64_t q = 0; q < m; q++)
            bad += j != 3 && !isfinite(tu_load(dt, y, idx_of(lay, c, s, j, q)));
        TU_CHECK(bad == 0, "[%s] inference: non-finite y outside the var 0 channel", tu_ctx);
        free(x), free(y), free(sm), free(si), free(rv), free(rm), free(mean), free(var),
            free(gamma);
      }
  norma_set_use_reference(0);
}

/* ---- momentum 0 and 1 ---- */
static void test_momentum(void) {
  const int64_t n = 2, c = 11, s = 9, m = n * s, total = n * c * s;
  for (int t = 0; t < 4; t++)
    for (int l = 0; l < 2; l++)
      for (int use_ref = 0; use_ref < 2; use_ref++) {
        norma_dtype dt = DTS[t];
        norma_layout lay = (norma_layout)l;
        norma_set_use_reference(use_ref);
        tu_set_ctx("momentum %s %s %s", use_ref ? "ref" : "prod", tu_dt_name(dt),
                   tu_layout_name(lay));
        const size_t tb = total * tu_esize(dt), pb = c * tu_psize(dt);
        const double tp = tu_tol_param(dt);
        tu_rng r = tu_rng_make(300 + t * 2 + l);
        void *x = tu_alloc(tb), *y = tu_poisoned(tb), *sm = tu_poisoned(pb), *si = tu_poisoned(pb);
        void *rm = tu_alloc(pb), *rv = tu_alloc(pb);
        tu_fill_uniform(dt, x, total, &r, -3, 1);
        tu_fill_param(dt, rm, c, &r, -1, 1);
        tu_fill_param(dt, rv, c, &r, 1, 2);
        void *rm0 = tu_dup(rm, pb), *rv0 = tu_dup(rv, pb);
        norma_bn_desc d = {n, c, s, lay, dt, 1e-5, 0};
        norma_status st =
            norma_bn_forward_training(&d, x, NULL, NULL, NULL, y, sm, si, rm, rv, 0.0);
        EXPECT_OK(st, "forward_training momentum 0");
        tu_same_bits("running_mean with momentum 0", rm, rm0, pb);
        tu_same_bits("running_var with momentum 0", rv, rv0, pb);
        /* expected batch statistics */
        double *em = tu_alloc(c * 8), *ev = tu_alloc(c * 8), *eb = tu_alloc(c * 8);
        for (int64_t j = 0; j < c; j++) {
          long double sum = 0, ss = 0;
          for (int64_t q = 0; q < m; q++) sum += tu_load(dt, x, idx_of(lay, c, s, j, q));
          long double mu = sum / m;
          for (int64_t q = 0; q < m; q++) {
            long double dl = tu_load(dt, x, idx_of(lay, c, s, j, q)) - mu;
            ss += dl * dl;
          }
          em[j] = (double)mu;
          ev[j] = (double)(ss / (m - 1));
          eb[j] = (double)(ss / m);
        }
        for (int biased = 0; biased < 2; biased++) {
          d.flags = biased ? NORMA_BN_BIASED_RUNNING_VAR : 0;
          st = norma_bn_forward_training(&d, x, NULL, NULL, NULL, y, sm, si, rm, rv, 1.0);
          EXPECT_OK(st, "forward_training momentum 1");
          tu_cmp_d("running_mean with momentum 1", tu_ptype(dt), rm, em, c, tp, 1.0);
          tu_cmp_d(biased ? "running_var with momentum 1 (biased)"
                          : "running_var with momentum 1 (unbiased)",
                   tu_ptype(dt), rv, biased ? eb : ev, c, tp, 1.0);
          tu_same_bits("running_mean (momentum 1) == save_mean", rm, sm, pb);
        }
        free(x), free(y), free(sm), free(si), free(rm), free(rv), free(rm0), free(rv0), free(em),
            free(ev), free(eb);
      }
  norma_set_use_reference(0);
}

/* ---- NaN / Inf in x or dy stays in its channel ---- */
static void test_nan_propagation(void) {
  const int64_t n = 2, c = 21, s = 13, m = n * s, total = n * c * s;
  static const norma_dtype dts[] = {NORMA_F32, NORMA_BF16, NORMA_F64, NORMA_F16};
  for (int t = 0; t < 4; t++)
    for (int l = 0; l < 2; l++)
      for (int use_ref = 0; use_ref < 2; use_ref++)
        for (int kind = 0; kind < 2; kind++) { /* NaN, +Inf */
          norma_dtype dt = dts[t];
          norma_layout lay = (norma_layout)l;
          norma_set_use_reference(use_ref);
          tu_set_ctx("%s in x %s %s %s", kind ? "Inf" : "NaN", use_ref ? "ref" : "prod",
                     tu_dt_name(dt), tu_layout_name(lay));
          const size_t tb = total * tu_esize(dt), pb = c * tu_psize(dt);
          tu_rng r = tu_rng_make(900 + t * 8 + l * 4 + kind);
          void *x = tu_alloc(tb), *dy = tu_alloc(tb), *gamma = tu_alloc(pb), *beta = tu_alloc(pb);
          tu_fill_uniform(dt, x, total, &r, -1, 2);
          tu_fill_uniform(dt, dy, total, &r, -1, 1);
          tu_fill_param(dt, gamma, c, &r, 0.5, 1.5);
          tu_fill_param(dt, beta, c, &r, -1, 1);
          void *rm = tu_alloc(pb), *rv = tu_alloc(pb);
          tu_fill_param(dt, rm, c, &r, -1, 1);
          tu_fill_param(dt, rv, c, &r, 1, 2);
          const int64_t bc = 9, bq = 17; /* bad channel, position */
          void *xb = tu_dup(x, tb);
          tu_store(dt, xb, idx_of(lay, c, s, bc, bq), kind ? INFINITY : NAN);
          norma_bn_desc d = {n, c, s, lay, dt, 1e-5, 0};
          void *y0 = tu_poisoned(tb), *y1 = tu_poisoned(tb);
          void *sm0 = tu_poisoned(pb), *sm1 = tu_poisoned(pb), *si0 = tu_poisoned(pb),
               *si1 = tu_poisoned(pb);
          void *rm0 = tu_dup(rm, pb), *rm1 = tu_dup(rm, pb), *rv0 = tu_dup(rv, pb),
               *rv1 = tu_dup(rv, pb);
          norma_status st =
              norma_bn_forward_training(&d, x, NULL, gamma, beta, y0, sm0, si0, rm0, rv0, 0.1);
          EXPECT_OK(st, "forward_training (clean)");
          st = norma_bn_forward_training(&d, xb, NULL, gamma, beta, y1, sm1, si1, rm1, rv1, 0.1);
          EXPECT_OK(st, "forward_training (non-finite in x)");
          int64_t bad_other = 0, finite_bad = 0;
          for (int64_t j = 0; j < c; j++)
            for (int64_t q = 0; q < m; q++) {
              int64_t k = idx_of(lay, c, s, j, q);
              double a = tu_load(dt, y0, k), b = tu_load(dt, y1, k);
              if (j == bc) finite_bad += isfinite(b);
              else bad_other += memcmp(&a, &b, sizeof a) != 0;
            }
          TU_CHECK(bad_other == 0, "[%s] %lld y values of other channels changed", tu_ctx,
                   (long long)bad_other);
          TU_CHECK(finite_bad == 0, "[%s] %lld y values of the bad channel are finite", tu_ctx,
                   (long long)finite_bad);
          int64_t bad_stats = 0;
          for (int64_t j = 0; j < c; j++) {
            double v[8] = {tu_pload(dt, sm0, j), tu_pload(dt, sm1, j), tu_pload(dt, si0, j),
                           tu_pload(dt, si1, j), tu_pload(dt, rm0, j), tu_pload(dt, rm1, j),
                           tu_pload(dt, rv0, j), tu_pload(dt, rv1, j)};
            for (int a = 0; a < 8; a += 2) {
              if (j != bc) bad_stats += memcmp(&v[a], &v[a + 1], sizeof(double)) != 0;
              else if (a == 2) bad_stats += !isnan(v[a + 1]); /* invstd of NaN / Inf data: NaN */
              else bad_stats += isfinite(v[a + 1]);
            }
          }
          TU_CHECK(bad_stats == 0, "[%s] statistics: %lld wrong (bad channel must be non-finite, "
                   "others unchanged)", tu_ctx, (long long)bad_stats);

          /* NaN in dy: backward spoils only that channel */
          void *dyb = tu_dup(dy, tb);
          tu_store(dt, dyb, idx_of(lay, c, s, bc, bq), NAN);
          void *dx0 = tu_poisoned(tb), *dx1 = tu_poisoned(tb), *dg0 = tu_poisoned(pb),
               *dg1 = tu_poisoned(pb), *db0 = tu_poisoned(pb), *db1 = tu_poisoned(pb);
          st = norma_bn_backward(&d, x, NULL, dy, gamma, beta, sm0, si0, dx0, NULL, dg0, db0);
          EXPECT_OK(st, "backward (clean)");
          st = norma_bn_backward(&d, x, NULL, dyb, gamma, beta, sm0, si0, dx1, NULL, dg1, db1);
          EXPECT_OK(st, "backward (NaN in dy)");
          bad_other = 0, finite_bad = 0;
          for (int64_t j = 0; j < c; j++)
            for (int64_t q = 0; q < m; q++) {
              int64_t k = idx_of(lay, c, s, j, q);
              double a = tu_load(dt, dx0, k), b = tu_load(dt, dx1, k);
              if (j == bc) finite_bad += isfinite(b);
              else bad_other += memcmp(&a, &b, sizeof a) != 0;
            }
          for (int64_t j = 0; j < c; j++) {
            double a = tu_pload(dt, dg0, j), b = tu_pload(dt, dg1, j);
            double e = tu_pload(dt, db0, j), f = tu_pload(dt, db1, j);
            if (j == bc) finite_bad += isfinite(b) + isfinite(f);
            else bad_other += (memcmp(&a, &b, 8) != 0) + (memcmp(&e, &f, 8) != 0);
          }
          TU_CHECK(
              bad_other == 0 && finite_bad == 0,
              "[%s] NaN in dy: %lld other-channel values changed, %lld bad-channel values finite",
              tu_ctx, (long long)bad_other, (long long)finite_bad);
          free(x), free(xb), free(dy), free(dyb), free(gamma), free(beta), free(rm), free(rv);
          free(y0), free(y1), free(sm0), free(sm1), free(si0), free(si1), free(rm0), free(rm1),
              free(rv0), free(rv1), free(dx0), free(dx1), free(dg0), free(dg1), free(db0),
              free(db1);
        }
  norma_set_use_reference(0);
}

/* ---- one value per channel ---- */
static void test_single_value(void) {
  const int64_t c = 37;
  for (int t = 0; t < 4; t++)
    for (int l = 0; l < 2; l++)
      for (int use_ref = 0; use_ref < 2; use_ref++) {
        norma_dtype dt = DTS[t];
        norma_layout lay = (norma_layout)l;
        norma_set_use_reference(use_ref);
        tu_set_ctx("n*spatial == 1 %s %s %s", use_ref ? "ref" : "prod", tu_dt_name(dt),
                   tu_layout_name(lay));
        const size_t tb = c * tu_esize(dt), pb = c * tu_psize(dt);
        tu_rng r = tu_rng_make(40 + t * 2 + l);
        void *x = tu_alloc(tb), *y = tu_poisoned(tb), *gamma = tu_alloc(pb), *beta = tu_alloc(pb),
             *mean = tu_alloc(pb), *var = tu_alloc(pb);
        tu_fill_uniform(dt, x, c, &r, -2, 2);
        tu_fill_param(dt, gamma, c, &r, -1, 1);
        tu_fill_param(dt, beta, c, &r, -1, 1);
        tu_fill_param(dt, mean, c, &r, -1, 1);
        tu_fill_param(dt, var, c, &r, 0.5, 2);
        double *ey = tu_alloc(c * 8);
        for (int64_t j = 0; j < c; j++) {
          double v = (tu_load(dt, x, j) - tu_pload(dt, mean, j)) /
                         sqrt(tu_pload(dt, var, j) + 1e-3) * tu_pload(dt, gamma, j) +
                     tu_pload(dt, beta, j);
          ey[j] = v > 0 ? v : 0;
        }
        norma_bn_desc d = {1, c, 1, lay, dt, 1e-3, NORMA_BN_RELU};
        norma_status st = norma_bn_forward_inference(&d, x, NULL, gamma, beta, mean, var, y);
        EXPECT_OK(st, "forward_inference with n * spatial == 1");
        tu_cmp_d("inference y (n*spatial == 1)", dt, y, ey, c, tu_tol_tensor(dt), 1.0);
        /* training: rejected, nothing written */
        void *y2 = tu_poisoned(tb), *sm = tu_poisoned(pb);
        st = norma_bn_forward_training(&d, x, NULL, gamma, beta, y2, sm, NULL, NULL, NULL, 0.1);
        TU_CHECK(st == NORMA_ERR_INVALID_ARGUMENT, "[%s] training with n*spatial == 1 returned %s",
                 tu_ctx, norma_status_string(st));
        tu_check_poison("y after rejected training", y2, tb);
        tu_check_poison("save_mean after rejected training", sm, pb);
        /* frozen backward: allowed, dx = gamma * invstd * dy (masked by y > 0) */
        void *dy = tu_alloc(tb), *dx = tu_poisoned(tb), *si = tu_alloc(pb);
        tu_fill_uniform(dt, dy, c, &r, -1, 1);
        double *edx = tu_alloc(c * 8);
        for (int64_t j = 0; j < c; j++) {
          tu_pstore(dt, si, j, 1.0 / sqrt(tu_pload(dt, var, j) + 1e-3));
          double g = tu_load(dt, y, j) > 0 ? tu_load(dt, dy, j) : 0.0;
          edx[j] = tu_pload(dt, gamma, j) * tu_pload(dt, si, j) * g;
        }
        d.flags = NORMA_BN_RELU | NORMA_BN_GLOBAL_STATS;
        st = norma_bn_backward(&d, x, y, dy, gamma, beta, mean, si, dx, NULL, NULL, NULL);
        EXPECT_OK(st, "GLOBAL_STATS backward with n * spatial == 1");
        tu_cmp_d("dx (global, n*spatial == 1)", dt, dx, edx, c, tu_tol_tensor(dt), 1.0);
        d.flags = NORMA_BN_RELU;
        tu_poison(dx, tb);
        st = norma_bn_backward(&d, x, y, dy, gamma, beta, mean, si, dx, NULL, NULL, NULL);
        TU_CHECK(st == NORMA_ERR_INVALID_ARGUMENT, "[%s] batch-stats backward with n*spatial == 1 "
                 "returned %s", tu_ctx, norma_status_string(st));
        tu_check_poison("dx after rejected backward", dx, tb);
        free(x), free(y), free(gamma), free(beta), free(mean), free(var), free(ey), free(y2),
            free(sm), free(dy), free(dx), free(si), free(edx);
      }
  norma_set_use_reference(0);
}

/* ---- CHECK_FINITE on finite data, and in-place use ---- */
static void test_inplace(void) {
  const int64_t n = 3, c = 23, s = 37, total = n * c * s;
  for (int t = 0; t < 4; t++)
    for (int l = 0; l < 2; l++)
      for (int use_ref = 0; use_ref < 2; use_ref++)
        for (int fl = 0; fl < 3; fl++) {
          norma_dtype dt = DTS[t];
          norma_layout lay = (norma_layout)l;
          const unsigned flags = fl == 0 ? 0u : fl == 1 ? NORMA_BN_RELU : NORMA_BN_ADD_RELU;
          norma_set_use_reference(use_ref);
          tu_set_ctx("in place %s %s %s flags 0x%x", use_ref ? "ref" : "prod", tu_dt_name(dt),
                     tu_layout_name(lay), flags);
          const size_t tb = total * tu_esize(dt), pb = c * tu_psize(dt);
          tu_rng r = tu_rng_make(700 + t * 6 + l * 3 + fl);
          void *x = tu_alloc(tb), *res = tu_alloc(tb), *dy = tu_alloc(tb), *gamma = tu_alloc(pb),
               *beta = tu_alloc(pb);
          tu_fill_uniform(dt, x, total, &r, -1, 3);
          tu_fill_uniform(dt, res, total, &r, -1, 1);
          tu_fill_uniform(dt, dy, total, &r, -1, 1);
          tu_fill_param(dt, gamma, c, &r, 0.5, 1.5);
          tu_fill_param(dt, beta, c, &r, -0.5, 0.5);
          norma_bn_desc d = {n, c, s, lay, dt, 1e-5, flags};
          norma_bn_desc dchk = d;
          dchk.flags |= NORMA_CHECK_FINITE;
          void *y = tu_poisoned(tb), *sm = tu_poisoned(pb), *si = tu_poisoned(pb);
          norma_status st =
              norma_bn_forward_training(&d, x, res, gamma, beta, y, sm, si, NULL, NULL, 0);
          EXPECT_OK(st, "forward_training");
          /* CHECK_FINITE on finite data: identical */
          void *yc = tu_poisoned(tb);
          st = norma_bn_forward_training(&dchk, x, res, gamma, beta, yc, NULL, NULL, NULL, NULL, 0);
          EXPECT_OK(st, "forward_training CHECK_FINITE");
          tu_same_bits("y with CHECK_FINITE", yc, y, tb);
          /* y == x */
          void *xy = tu_dup(x, tb);
          st = norma_bn_forward_training(&d, xy, res, gamma, beta, xy, NULL, NULL, NULL, NULL, 0);
          EXPECT_OK(st, "forward_training y == x");
          tu_same_bits("y == x (training)", xy, y, tb);
          if (flags & NORMA_BN_ADD_RELU) { /* y == residual */
            void *ry = tu_dup(res, tb);
            st = norma_bn_forward_training(&d, x, ry, gamma, beta, ry, NULL, NULL, NULL, NULL, 0);
            EXPECT_OK(st, "forward_training y == residual");
            tu_same_bits("y == residual (training)", ry, y, tb);
            free(ry);
          }
          /* inference y == x */
          void *yi = tu_poisoned(tb), *mean = tu_alloc(pb), *var = tu_alloc(pb);
          tu_fill_param(dt, mean, c, &r, 0, 2);
          tu_fill_param(dt, var, c, &r, 0.5, 2);
          st = norma_bn_forward_inference(&d, x, res, gamma, beta, mean, var, yi);
          EXPECT_OK(st, "forward_inference");
          memcpy(xy, x, tb);
          st = norma_bn_forward_inference(&d, xy, res, gamma, beta, mean, var, xy);
          EXPECT_OK(st, "forward_inference y == x");
          tu_same_bits("y == x (inference)", xy, yi, tb);
          /* backward */
          void *dx = tu_poisoned(tb), *dr = tu_poisoned(tb), *dg = tu_poisoned(pb),
               *dbt = tu_poisoned(pb);
          st = norma_bn_backward(&d, x, y, dy, gamma, beta, sm, si, dx, dr, dg, dbt);
          EXPECT_OK(st, "backward");
          void *dxc = tu_poisoned(tb);
          st = norma_bn_backward(&dchk, x, y, dy, gamma, beta, sm, si, dxc, NULL, NULL, NULL);
          EXPECT_OK(st, "backward CHECK_FINITE");
          tu_same_bits("dx with CHECK_FINITE", dxc, dx, tb);
          void *buf = tu_dup(dy, tb), *buf2 = tu_alloc(tb);
          st = norma_bn_backward(&d, x, y, buf, gamma, beta, sm, si, buf, NULL, NULL, NULL);
          EXPECT_OK(st, "backward dx == dy");
          tu_same_bits("dx == dy", buf, dx, tb);
          memcpy(buf, x, tb);
          st = norma_bn_backward(&d, buf, y, dy, gamma, beta, sm, si, buf, NULL, NULL, NULL);
          EXPECT_OK(st, "backward dx == x");
          tu_same_bits("dx == x", buf, dx, tb);
          if (flags == 0) {
            /* dx == y with x NULL */
            void *dx2 = tu_poisoned(tb);
            st = norma_bn_backward(&d, NULL, y, dy, gamma, beta, sm, si, dx2, NULL, NULL, NULL);
            EXPECT_OK(st, "backward x NULL");
            memcpy(buf, y, tb);
            st = norma_bn_backward(&d, NULL, buf, dy, gamma, beta, sm, si, buf, NULL, NULL, NULL);
            EXPECT_OK(st, "backward x NULL, dx == y");
            tu_same_bits("dx == y (x NULL)", buf, dx2, tb);
            free(dx2);
          } else {
            memcpy(buf, y, tb);
            st = norma_bn_backward(&d, x, buf, dy, gamma, beta, sm, si, buf, NULL, NULL, NULL);
            EXPECT_OK(st, "backward dx == y");
            tu_same_bits("dx == y", buf, dx, tb);
          }
          if (flags & NORMA_BN_ADD_RELU) { /* dresidual == dy, dx separate */
            memcpy(buf, dy, tb);
            tu_poison(buf2, tb);
            st = norma_bn_backward(&d, x, y, buf, gamma, beta, sm, si, buf2, buf, NULL, NULL);
            EXPECT_OK(st, "backward dresidual == dy");
            tu_same_bits("dresidual == dy: dresidual", buf, dr, tb);
            tu_same_bits("dresidual == dy: dx", buf2, dx, tb);
          }
          free(x), free(res), free(dy), free(gamma), free(beta), free(y), free(sm), free(si),
              free(yc), free(xy), free(yi), free(mean), free(var), free(dx), free(dr), free(dg),
              free(dbt), free(dxc), free(buf), free(buf2);
        }
  norma_set_use_reference(0);
}

int main(void) {
  test_zero_var();
  test_momentum();
  test_nan_propagation();
  test_single_value();
  test_inplace();
  return tu_finish("test_semantics");
}
