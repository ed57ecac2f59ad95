/* test_split.c - the statistics / apply split API, for the reference and production kernels:
 *  - norma_bn_moments == the merge of norma_bn_moments_accumulate over tiles (tiles of rows and
 *    of channels, via strides, both layouts, every dtype, a padded leading dimension), and the
 *    accumulation repeats itself bitwise for the same call order at any thread count;
 *  - norma_bn_moments_merge of two halves of a batch == the moments of the whole; merging an
 *    empty set (count 0) is the identity, both ways;
 *  - stats_from_moments: mean, invstd, save_mean, save_invstd and the running statistics per the
 *    documented formulas;
 *  - stats_from_moments + forward_apply == forward_training;
 *  - backward_reduce + param_grads + backward_apply == backward;
 *  - backward_apply and param_grads against their documented formulas for given sums;
 *  - n == 0 is allowed (moments count 0, sums 0, nothing written by forward_apply).
 */
#include "test_util.h"

#define EXPECT_OK(st, what)                                                                    \
  TU_CHECK((st) == NORMA_OK, "[%s] %s returned %s: %s", tu_ctx, what, norma_status_string(st), \
           norma_last_error())

static const norma_dtype DTS[] = {NORMA_F32, NORMA_F64, NORMA_F16, NORMA_BF16};

static void make_data(norma_dtype dt, norma_layout lay, int64_t n, int64_t c, int64_t s, void *x,
                      tu_rng *r, double spread_mean) {
  double *mu = tu_alloc(c * 8), *sd = tu_alloc(c * 8);
  for (int64_t j = 0; j < c; j++)
    mu[j] = tu_uniform(r, -spread_mean, spread_mean), sd[j] = tu_uniform(r, 0.2, 2);
  tu_fill_channels(dt, lay, x, n, c, s, mu, sd, r);
  free(mu), free(sd);
}

static void zero_moments(int64_t c, int64_t *cnt, double *mean, double *m2) {
  for (int64_t j = 0; j < c; j++) cnt[j] = 0, mean[j] = 0, m2[j] = 0;
}

/* accumulates the whole tensor tile by tile: tiles of row_tile rows x ch_tile channels */
static void accumulate_tiles(norma_dtype dt, norma_layout lay, int64_t n, int64_t c, int64_t s,
                             const void *x, int64_t row_tile, int64_t ch_tile, int64_t *cnt,
                             double *mean, double *m2) {
  const size_t es = tu_esize(dt);
  norma_status st;
  if (lay == NORMA_CHANNELS_FIRST) {
    for (int64_t i = 0; i < n; i++)
      for (int64_t r0 = 0; r0 < s; r0 += row_tile)
        for (int64_t c0 = 0; c0 < c; c0 += ch_tile) {
          int64_t rows = s - r0 < row_tile ? s - r0 : row_tile;
          int64_t chs = c - c0 < ch_tile ? c - c0 : ch_tile;
          const char *p = (const char *)x + ((i * c + c0) * s + r0) * es;
          st = norma_bn_moments_accumulate(dt, rows, chs, p, 1, s, cnt + c0, mean + c0, m2 + c0);
          EXPECT_OK(st, "moments_accumulate (channels-first tile)");
        }
  } else {
    const int64_t R = n * s;
    for (int64_t r0 = 0; r0 < R; r0 += row_tile)
      for (int64_t c0 = 0; c0 < c; c0 += ch_tile) {
        int64_t rows = R - r0 < row_tile ? R - r0 : row_tile;
        int64_t chs = c - c0 < ch_tile ? c - c0 : ch_tile;
        const char *p = (const char *)x + (r0 * c + c0) * es;
        st = norma_bn_moments_accumulate(dt, rows, chs, p, c, 1, cnt + c0, mean + c0, m2 + c0);
        EXPECT_OK(st, "moments_accumulate (channels-last tile)");
      }
  }
}

static void test_accumulate(void) {
  typedef struct { int64_t n, c, s, rt, ct; } cfg;
  static const cfg cfgs[] = {{3, 5, 37, 8, 2}, {2, 17, 100, 33, 17}, {4, 3, 1, 1, 1},
                             {2, 40, 513, 100, 7}, {1, 1, 5000, 999, 1}};
  for (int t = 0; t < 4; t++)
    for (int l = 0; l < 2; l++)
      for (int k = 0; k < 5; k++)
        for (int use_ref = 0; use_ref < 2; use_ref++) {
          const cfg f = cfgs[k];
          norma_dtype dt = DTS[t];
          norma_layout lay = (norma_layout)l;
          norma_set_use_reference(use_ref);
          tu_set_ctx("accumulate %s n=%lld c=%lld s=%lld tiles %lldx%lld %s %s",
                     use_ref ? "ref" : "prod", (long long)f.n, (long long)f.c, (long long)f.s,
                     (long long)f.rt, (long long)f.ct, tu_dt_name(dt), tu_layout_name(lay));
          const int64_t total = f.n * f.c * f.s, c = f.c;
          /* norma_bn_moments may accumulate f32 / f16 / bf16 data in f32 (x - shift)^2 */
          const double tm = dt == NORMA_F64 ? 1e-12 : 1e-5;
          tu_rng r = tu_rng_make(100 + t * 50 + l * 10 + k);
          void *x = tu_alloc(total * tu_esize(dt));
          make_data(dt, lay, f.n, c, f.s, x, &r, k == 4 ? 1000.0 : 3.0);
          norma_bn_desc d = {f.n, c, f.s, lay, dt, 1e-5, 0};
          int64_t *cw = tu_poisoned(c * 8), *ca = tu_alloc(c * 8), *cb = tu_alloc(c * 8);
          double *mw = tu_poisoned(c * 8), *m2w = tu_poisoned(c * 8);
          double *ma = tu_alloc(c * 8), *m2a = tu_alloc(c * 8), *mb = tu_alloc(c * 8),
                 *m2b = tu_alloc(c * 8);
          norma_status st = norma_bn_moments(&d, x, cw, mw, m2w);
          EXPECT_OK(st, "moments");
          zero_moments(c, ca, ma, m2a);
          accumulate_tiles(dt, lay, f.n, c, f.s, x, f.rt, f.ct, ca, ma, m2a);
          int cnt_ok = 1;
          for (int64_t j = 0; j < c; j++) cnt_ok &= ca[j] == cw[j] && cw[j] == f.n * f.s;
          TU_CHECK(cnt_ok, "[%s] accumulated count != n * spatial", tu_ctx);
          tu_cmp_d("accumulated mean", NORMA_F64, ma, mw, c, tm, 1.0);
          tu_cmp_d("accumulated m2", NORMA_F64, m2a, m2w, c, tm, 1.0);
          /* the same calls again, at other thread counts: bitwise the same */
          for (int th = 1; th <= 3; th += 2) {
            norma_set_num_threads(th);
            zero_moments(c, cb, mb, m2b);
            accumulate_tiles(dt, lay, f.n, c, f.s, x, f.rt, f.ct, cb, mb, m2b);
            tu_same_bits("accumulate repeated: mean", mb, ma, c * 8);
            tu_same_bits("accumulate repeated: m2", m2b, m2a, c * 8);
          }
          norma_set_num_threads(0);
          /* a channels-last block with a padded leading dimension (ld = c + 3) */
          if (lay == NORMA_CHANNELS_LAST) {
            const int64_t R = f.n * f.s, ld = c + 3;
            const size_t es = tu_esize(dt);
            char *xp = tu_poisoned(R * ld * es);
            for (int64_t q = 0; q < R; q++)
              memcpy(xp + q * ld * es, (char *)x + q * c * es, c * es);
            zero_moments(c, cb, mb, m2b);
            st = norma_bn_moments_accumulate(dt, R, c, xp, ld, 1, cb, mb, m2b);
            EXPECT_OK(st, "moments_accumulate (ld = c + 3)");
            tu_cmp_d("accumulated mean (padded ld)", NORMA_F64, mb, mw, c, tm, 1.0);
            tu_cmp_d("accumulated m2 (padded ld)", NORMA_F64, m2b, m2w, c, tm, 1.0);
            free(xp);
          }
          /* merge of two halves of the batch (split along n, or along spatial when n == 1) */
          int64_t n1 = f.n / 2;
          if (n1 > 0 && lay == NORMA_CHANNELS_FIRST) {
            norma_bn_desc d1 = d, d2 = d;
            d1.n = n1, d2.n = f.n - n1;
            st = norma_bn_moments(&d1, x, ca, ma, m2a);
            EXPECT_OK(st, "moments (first half)");
            st = norma_bn_moments(&d2, (char *)x + n1 * c * f.s * tu_esize(dt), cb, mb, m2b);
            EXPECT_OK(st, "moments (second half)");
          } else if (n1 > 0) {
            norma_bn_desc d1 = d, d2 = d;
            d1.n = n1, d2.n = f.n - n1;
            st = norma_bn_moments(&d1, x, ca, ma, m2a);
            EXPECT_OK(st, "moments (first half)");
            st = norma_bn_moments(&d2, (char *)x + n1 * c * f.s * tu_esize(dt), cb, mb, m2b);
            EXPECT_OK(st, "moments (second half)");
          } else { /* n == 1: halves by accumulate, rows 0..h and h..s */
            int64_t h = f.s / 2;
            zero_moments(c, ca, ma, m2a);
            zero_moments(c, cb, mb, m2b);
            if (lay == NORMA_CHANNELS_FIRST) {
              st = norma_bn_moments_accumulate(dt, h, c, x, 1, f.s, ca, ma, m2a);
              EXPECT_OK(st, "moments_accumulate (first half)");
              st = norma_bn_moments_accumulate(dt, f.s - h, c, (char *)x + h * tu_esize(dt), 1,
                                               f.s, cb, mb, m2b);
            } else {
              st = norma_bn_moments_accumulate(dt, h, c, x, c, 1, ca, ma, m2a);
              EXPECT_OK(st, "moments_accumulate (first half)");
              st = norma_bn_moments_accumulate(dt, f.s - h, c, (char *)x + h * c * tu_esize(dt), c,
                                               1, cb, mb, m2b);
            }
            EXPECT_OK(st, "moments_accumulate (second half)");
          }
          /* expected merge, computed here */
          double *em = tu_alloc(c * 8), *em2 = tu_alloc(c * 8);
          for (int64_t j = 0; j < c; j++) {
            double na = (double)ca[j], nb = (double)cb[j], nn = na + nb, delta = mb[j] - ma[j];
            em[j] = ma[j] + delta * nb / nn;
            em2[j] = m2a[j] + m2b[j] + delta * delta * na * nb / nn;
          }
          st = norma_bn_moments_merge(c, ca, ma, m2a, cb, mb, m2b);
          EXPECT_OK(st, "moments_merge");
          cnt_ok = 1;
          for (int64_t j = 0; j < c; j++) cnt_ok &= ca[j] == f.n * f.s;
          TU_CHECK(cnt_ok, "[%s] merged count wrong", tu_ctx);
          tu_cmp_d("merged mean vs whole", NORMA_F64, ma, mw, c, tm, 1.0);
          tu_cmp_d("merged m2 vs whole", NORMA_F64, m2a, m2w, c, tm, 1.0);
          tu_cmp_d("merged mean vs formula", NORMA_F64, ma, em, c, 1e-15, 1.0);
          tu_cmp_d("merged m2 vs formula", NORMA_F64, m2a, em2, c, 1e-15, 1.0);
          /* count 0 is the identity of the merge, on either side */
          int64_t *cz = tu_alloc(c * 8);
          double *mz = tu_alloc(c * 8), *m2z = tu_alloc(c * 8);
          zero_moments(c, cz, mz, m2z);
          int64_t *c2 = tu_dup(ca, c * 8);
          double *mm2 = tu_dup(ma, c * 8), *m22 = tu_dup(m2a, c * 8);
          st = norma_bn_moments_merge(c, c2, mm2, m22, cz, mz, m2z);
          EXPECT_OK(st, "moments_merge (b empty)");
          tu_same_bits("merge with empty b: count", c2, ca, c * 8);
          tu_same_bits("merge with empty b: mean", mm2, ma, c * 8);
          tu_same_bits("merge with empty b: m2", m22, m2a, c * 8);
          st = norma_bn_moments_merge(c, cz, mz, m2z, ca, ma, m2a);
          EXPECT_OK(st, "moments_merge (a empty)");
          tu_same_bits("merge into empty a: count", cz, ca, c * 8);
          tu_same_bits("merge into empty a: mean", mz, ma, c * 8);
          tu_same_bits("merge into empty a: m2", m2z, m2a, c * 8);
          /* n == 0 moments are empty sets */
          norma_bn_desc d0 = d;
          d0.n = 0;
          tu_poison(cz, c * 8), tu_poison(mz, c * 8), tu_poison(m2z, c * 8);
          st = norma_bn_moments(&d0, x, cz, mz, m2z);
          EXPECT_OK(st, "moments with n == 0");
          int zero = 1;
          for (int64_t j = 0; j < c; j++) zero &= cz[j] == 0 && mz[j] == 0 && m2z[j] == 0;
          TU_CHECK(zero, "[%s] moments with n == 0 not (0, 0, 0)", tu_ctx);
          free(cz), free(mz), free(m2z), free(c2), free(mm2), free(m22), free(em), free(em2);
          free(x), free(cw), free(ca), free(cb), free(mw), free(m2w), free(ma), free(m2a), free(mb),
              free(m2b);
        }
  norma_set_use_reference(0);
}

/* stats_from_moments against its formulas */
static void test_stats_from_moments(void) {
  const int64_t c = 13;
  for (int t = 0; t < 4; t++)
    for (int biased = 0; biased < 2; biased++) {
      norma_dtype dt = DTS[t];
      tu_set_ctx("stats_from_moments %s %s", tu_dt_name(dt), biased ? "biased" : "unbiased");
      const size_t pb = c * tu_psize(dt);
      tu_rng r = tu_rng_make(60 + t * 2 + biased);
      int64_t *cnt = tu_alloc(c * 8);
      double *mean = tu_alloc(c * 8), *m2 = tu_alloc(c * 8), *mo = tu_poisoned(c * 8),
             *io = tu_poisoned(c * 8);
      for (int64_t j = 0; j < c; j++) {
        cnt[j] = 2 + tu_below(&r, 1000);
        mean[j] = tu_uniform(&r, -10, 10);
        m2[j] = tu_uniform(&r, 0, 5) * cnt[j];
      }
      void *sm = tu_poisoned(pb), *si = tu_poisoned(pb), *rm = tu_alloc(pb), *rv = tu_alloc(pb);
      tu_fill_param(dt, rm, c, &r, -1, 1);
      tu_fill_param(dt, rv, c, &r, 0.5, 2);
      double *erm = tu_alloc(c * 8), *erv = tu_alloc(c * 8), *ei = tu_alloc(c * 8);
      const double mom = 0.3, eps = 1e-3;
      for (int64_t j = 0; j < c; j++) {
        double var = m2[j] / cnt[j];
        ei[j] = 1.0 / sqrt(var + eps);
        erm[j] = (1 - mom) * tu_pload(dt, rm, j) + mom * mean[j];
        erv[j] =
            (1 - mom) * tu_pload(dt, rv, j) + mom * (biased ? var : var * cnt[j] / (cnt[j] - 1.0));
      }
      norma_bn_desc d = {
          1, c, 1, NORMA_CHANNELS_FIRST, dt, eps, biased ? NORMA_BN_BIASED_RUNNING_VAR : 0u};
      /* m2 == 0 with eps == 0: invstd 0 (the training forward's rule) */
      m2[c - 1] = 0.0;
      double *io0 = tu_poisoned(c * 8), *mo0 = tu_poisoned(c * 8);
      void *si0 = tu_poisoned(pb);
      norma_bn_desc d0 = d;
      d0.eps = 0.0;
      norma_status st0 =
          norma_bn_stats_from_moments(&d0, cnt, mean, m2, mo0, io0, NULL, si0, NULL, NULL, 0);
      EXPECT_OK(st0, "stats_from_moments (eps 0)");
      TU_CHECK(io0[c - 1] == 0.0 && tu_pload(dt, si0, c - 1) == 0.0,
               "[%s] m2 == 0, eps == 0: invstd %g, save_invstd %g, want 0", tu_ctx, io0[c - 1],
               tu_pload(dt, si0, c - 1));
      TU_CHECK(io0[0] == 1.0 / sqrt(m2[0] / cnt[0]), "[%s] eps 0: invstd_out[0] %.17g, want %.17g",
               tu_ctx, io0[0], 1.0 / sqrt(m2[0] / cnt[0]));
      free(io0), free(mo0), free(si0);
      for (int64_t j = 0; j < c; j++) {
        double var = m2[j] / cnt[j];
        ei[j] = 1.0 / sqrt(var + eps);
        erv[j] =
            (1 - mom) * tu_pload(dt, rv, j) + mom * (biased ? var : var * cnt[j] / (cnt[j] - 1.0));
      }
      norma_status st = norma_bn_stats_from_moments(&d, cnt, mean, m2, mo, io, sm, si, rm, rv, mom);
      EXPECT_OK(st, "stats_from_moments");
      tu_same_bits("mean_out == mean", mo, mean, c * 8);
      tu_cmp_d("invstd_out", NORMA_F64, io, ei, c, 1e-15, 0.0);
      tu_cmp_d("save_mean", tu_ptype(dt), sm, mean, c, dt == NORMA_F64 ? 0.0 : 6e-8, 0.0);
      tu_cmp_d("save_invstd", tu_ptype(dt), si, ei, c, dt == NORMA_F64 ? 1e-15 : 6e-8, 0.0);
      tu_cmp_d("running_mean", tu_ptype(dt), rm, erm, c, dt == NORMA_F64 ? 1e-15 : 6e-8, 1.0);
      tu_cmp_d("running_var", tu_ptype(dt), rv, erv, c, dt == NORMA_F64 ? 1e-15 : 6e-8, 1.0);
      free(cnt), free(mean), free(m2), free(mo), free(io), free(sm), free(si), free(rm), free(rv),
          free(erm), free(erv), free(ei);
    }
}

/* the split pieces against the fused calls */
static void test_split_vs_fused(void) {
  typedef struct { int64_t n, c, s; } shape;
  /* {3, 17, 2}: channels-first runs of two, the wide view (op_bn.c), whose statistics and sums
     alone repeat no constants; {24, 17, 6}, {16, 33, 9}: runs of six and nine with enough
     samples take it too */
  static const shape shapes[] = {{2, 3, 49}, {5, 17, 7}, {2, 64, 1021}, {16, 33, 1}, {3, 17, 2},
                                 {24, 17, 6}, {16, 33, 9}};
  static const unsigned flag_list[] = {0, NORMA_BN_RELU, NORMA_BN_ADD_RELU,
                                       NORMA_BN_BIASED_RUNNING_VAR};
  int k = 0;
  for (int si = 0; si < (int)(sizeof shapes / sizeof *shapes); si++)
    for (int t = 0; t < 4; t++)
      for (int l = 0; l < 2; l++)
        for (int use_ref = 0; use_ref < 2; use_ref++, k++) {
          const shape sh = shapes[si];
          norma_dtype dt = DTS[t];
          norma_layout lay = (norma_layout)l;
          const unsigned flags = flag_list[k % 4];
          const int act = (flags & NORMA_BN_ADD_RELU) ? 2 : (flags & NORMA_BN_RELU) ? 1 : 0;
          norma_set_use_reference(use_ref);
          tu_set_ctx("split vs fused %s n=%lld c=%lld s=%lld %s %s flags 0x%x",
                     use_ref ? "ref" : "prod", (long long)sh.n, (long long)sh.c, (long long)sh.s,
                     tu_dt_name(dt), tu_layout_name(lay), flags);
          const int64_t c = sh.c, m = sh.n * sh.s, total = sh.n * c * sh.s;
          const size_t tb = total * tu_esize(dt), pb = c * tu_psize(dt), db = c * 8;
          const double tt = tu_tol_tensor(dt), tp = tu_tol_param(dt);
          tu_rng r = tu_rng_make(3000 + k);
          void *x = tu_alloc(tb), *res = tu_alloc(tb), *dy = tu_alloc(tb), *gamma = tu_alloc(pb),
               *beta = tu_alloc(pb), *rm0 = tu_alloc(pb), *rv0 = tu_alloc(pb);
          make_data(dt, lay, sh.n, c, sh.s, x, &r, 5.0);
          tu_fill_uniform(dt, res, total, &r, -1, 1);
          tu_fill_uniform(dt, dy, total, &r, -1, 1.3);
          tu_fill_param(dt, gamma, c, &r, 0.5, 1.5);
          tu_fill_param(dt, beta, c, &r, -0.5, 0.5);
          tu_fill_param(dt, rm0, c, &r, -1, 1);
          tu_fill_param(dt, rv0, c, &r, 0.5, 2);
          norma_bn_desc d = {sh.n, c, sh.s, lay, dt, 1e-4, flags};
          /* fused */
          void *y = tu_poisoned(tb), *sm = tu_poisoned(pb), *si_ = tu_poisoned(pb);
          void *rm = tu_dup(rm0, pb), *rv = tu_dup(rv0, pb);
          norma_status st =
              norma_bn_forward_training(&d, x, res, gamma, beta, y, sm, si_, rm, rv, 0.2);
          EXPECT_OK(st, "forward_training");
          /* split */
          int64_t *cnt = tu_poisoned(c * 8);
          double *mean = tu_poisoned(db), *m2 = tu_poisoned(db), *mo = tu_poisoned(db),
                 *io = tu_poisoned(db);
          void *y2 = tu_poisoned(tb), *sm2 = tu_poisoned(pb), *si2 = tu_poisoned(pb);
          void *rm2 = tu_dup(rm0, pb), *rv2 = tu_dup(rv0, pb);
          st = norma_bn_moments(&d, x, cnt, mean, m2);
          EXPECT_OK(st, "moments");
          st = norma_bn_stats_from_moments(&d, cnt, mean, m2, mo, io, sm2, si2, rm2, rv2, 0.2);
          EXPECT_OK(st, "stats_from_moments");
          st = norma_bn_forward_apply(&d, x, res, gamma, beta, mo, io, y2);
          EXPECT_OK(st, "forward_apply");
          tu_cmp("y: split vs fused", dt, y2, y, total, tt, 1.0);
          tu_cmp("save_mean: split vs fused", tu_ptype(dt), sm2, sm, c, tp, 1.0);
          tu_cmp("save_invstd: split vs fused", tu_ptype(dt), si2, si_, c, tp, 1.0);
          tu_cmp("running_mean: split vs fused", tu_ptype(dt), rm2, rm, c, tp, 1.0);
          tu_cmp("running_var: split vs fused", tu_ptype(dt), rv2, rv, c, tp, 1.0);
          /* backward, fused and split (mean / invstd: the saved ones, as double) */
          void *dx = tu_poisoned(tb), *dr = tu_poisoned(tb), *dg = tu_poisoned(pb),
               *dbt = tu_poisoned(pb);
          st = norma_bn_backward(&d, x, y, dy, gamma, beta, sm, si_, dx, dr, dg, dbt);
          EXPECT_OK(st, "backward");
          double *bm = tu_alloc(db), *bi = tu_alloc(db);
          for (int64_t j = 0; j < c; j++) bm[j] = tu_pload(dt, sm, j), bi[j] = tu_pload(dt, si_, j);
          double *sdy = tu_poisoned(db), *sdx = tu_poisoned(db), *sx = tu_poisoned(db);
          st = norma_bn_backward_reduce(&d, x, y, dy, gamma, beta, bm, bi, sdy, sdx, sx);
          EXPECT_OK(st, "backward_reduce");
          void *dg2 = tu_poisoned(pb), *db2 = tu_poisoned(pb), *dx2 = tu_poisoned(tb),
               *dr2 = tu_poisoned(tb);
          st = norma_bn_param_grads(&d, sdy, sdx, sx, m, dg2, db2);
          EXPECT_OK(st, "param_grads");
          st =
              norma_bn_backward_apply(&d, x, y, dy, gamma, beta, bm, bi, sdy, sdx, sx, m, dx2, dr2);
          EXPECT_OK(st, "backward_apply");
          const double sf = sqrt((double)m);
          tu_cmp("dx: split vs fused", dt, dx2, dx, total, tt, 1.0);
          tu_cmp("dgamma: split vs fused", tu_ptype(dt), dg2, dg, c, tp, sf);
          tu_cmp("dbeta: split vs fused", tu_ptype(dt), db2, dbt, c, tp, sf);
          if (act == 2) tu_cmp("dresidual: split vs fused", dt, dr2, dr, total, 0.0, 0.0);
          else tu_check_poison("backward_apply dresidual (ignored)", dr2, tb);
          /* x == NULL: x_hat from y */
          if (!act) {
            tu_poison(dx, tb), tu_poison(dx2, tb);
            st = norma_bn_backward(&d, NULL, y, dy, gamma, beta, sm, si_, dx, NULL, dg, dbt);
            EXPECT_OK(st, "backward (x NULL)");
            st = norma_bn_backward_reduce(&d, NULL, y, dy, gamma, beta, bm, bi, sdy, sdx, sx);
            EXPECT_OK(st, "backward_reduce (x NULL)");
            st = norma_bn_param_grads(&d, sdy, sdx, sx, m, dg2, db2);
            EXPECT_OK(st, "param_grads (x NULL)");
            st = norma_bn_backward_apply(&d, NULL, y, dy, gamma, beta, bm, bi, sdy, sdx, sx, m, dx2,
                                         NULL);
            EXPECT_OK(st, "backward_apply (x NULL)");
            tu_cmp("dx (x NULL): split vs fused", dt, dx2, dx, total, tt, 1.0);
            /* x_hat recovered from a stored y: as accurate as the storage type */
            tu_cmp("dgamma (x NULL): split vs fused", tu_ptype(dt), dg2, dg, c, tt > tp ? tt : tp,
                   sf);
          }
          /* GLOBAL_STATS */
          norma_bn_desc dgl = d;
          dgl.flags |= NORMA_BN_GLOBAL_STATS;
          tu_poison(dx, tb), tu_poison(dx2, tb);
          st = norma_bn_backward(&dgl, x, y, dy, gamma, beta, sm, si_, dx, NULL, dg, dbt);
          EXPECT_OK(st, "backward (global)");
          st = norma_bn_backward_reduce(&dgl, x, y, dy, gamma, beta, bm, bi, sdy, sdx, sx);
          EXPECT_OK(st, "backward_reduce (global)");
          st = norma_bn_param_grads(&dgl, sdy, sdx, sx, m, dg2, db2);
          EXPECT_OK(st, "param_grads (global)");
          st = norma_bn_backward_apply(&dgl, x, y, dy, gamma, beta, bm, bi, sdy, sdx, sx, m, dx2,
                                       NULL);
          EXPECT_OK(st, "backward_apply (global)");
          tu_cmp("dx (global): split vs fused", dt, dx2, dx, total, tt, 1.0);
          tu_cmp("dgamma (global): split vs fused", tu_ptype(dt), dg2, dg, c, tp, sf);
          tu_cmp("dbeta (global): split vs fused", tu_ptype(dt), db2, dbt, c, tp, sf);

          free(x), free(res), free(dy), free(gamma), free(beta), free(rm0), free(rv0), free(y),
              free(sm), free(si_), free(rm), free(rv), free(cnt), free(mean), free(m2), free(mo),
              free(io), free(y2), free(sm2), free(si2), free(rm2), free(rv2), free(dx), free(dr),
              free(dg), free(dbt), free(bm), free(bi), free(sdy), free(sdx), free(sx), free(dg2),
              free(db2), free(dx2), free(dr2);
        }
  norma_set_use_reference(0);
}

/* backward_apply and param_grads against the documented formulas, for given sums (offsets
   s = sum_xhat / count small and large) */
static void test_apply_formulas(void) {
  const int64_t n = 3, c = 9, s = 11, total = n * c * s;
  for (int t = 0; t < 4; t++)
    for (int l = 0; l < 2; l++)
      for (int use_ref = 0; use_ref < 2; use_ref++)
        for (int big = 0; big < 2; big++) {
          norma_dtype dt = DTS[t];
          norma_layout lay = (norma_layout)l;
          norma_set_use_reference(use_ref);
          tu_set_ctx("apply formulas %s %s %s, |sum_xhat/count| %s", use_ref ? "ref" : "prod",
                     tu_dt_name(dt), tu_layout_name(lay), big ? "0.5" : "0.01");
          const size_t tb = total * tu_esize(dt), pb = c * tu_psize(dt), db = c * 8;
          tu_rng r = tu_rng_make(8000 + t * 8 + l * 4 + use_ref * 2 + big);
          void *x = tu_alloc(tb), *dy = tu_alloc(tb), *gamma = tu_alloc(pb), *beta = tu_alloc(pb);
          tu_fill_uniform(dt, x, total, &r, -2, 2);
          tu_fill_uniform(dt, dy, total, &r, -1, 1);
          tu_fill_param(dt, gamma, c, &r, 0.5, 1.5);
          tu_fill_param(dt, beta, c, &r, -0.5, 0.5);
          double *mean = tu_alloc(db), *inv = tu_alloc(db), *sdy = tu_alloc(db),
                 *sdx = tu_alloc(db), *sx = tu_alloc(db);
          const int64_t count = 1000;
          for (int64_t j = 0; j < c; j++) {
            mean[j] = tu_uniform(&r, -0.5, 0.5), inv[j] = tu_uniform(&r, 0.5, 2);
            sdy[j] = tu_uniform(&r, -50, 50), sdx[j] = tu_uniform(&r, -50, 50);
            sx[j] = (big ? 0.5 : 0.01) * count * (j % 2 ? 1 : -1);
          }
          double *edx = tu_alloc(total * 8), *edg = tu_alloc(db), *edb = tu_alloc(db);
          for (int64_t j = 0; j < c; j++) {
            double so = sx[j] / count, S = sdx[j] - so * sdy[j];
            double g0 = tu_pload(dt, gamma, j);
            edg[j] = S, edb[j] = sdy[j];
            for (int64_t i = 0; i < n; i++)
              for (int64_t sp = 0; sp < s; sp++) {
                int64_t q = tu_index(lay, c, s, i, j, sp);
                double xh = (tu_load(dt, x, q) - mean[j]) * inv[j] - so;
                edx[q] = g0 * inv[j] * (tu_load(dt, dy, q) - sdy[j] / count - xh * S / count);
              }
          }
          norma_bn_desc d = {n, c, s, lay, dt, 1e-5, 0};
          void *dx = tu_poisoned(tb), *dg = tu_poisoned(pb), *dbt = tu_poisoned(pb);
          norma_status st = norma_bn_backward_apply(&d, x, NULL, dy, gamma, beta, mean, inv, sdy,
                                                    sdx, sx, count, dx, NULL);
          EXPECT_OK(st, "backward_apply");
          tu_cmp_d("backward_apply dx vs the documented formula", dt, dx, edx, total,
                   tu_tol_tensor(dt), 1.0);
          st = norma_bn_param_grads(&d, sdy, sdx, sx, count, dg, dbt);
          EXPECT_OK(st, "param_grads");
          tu_cmp_d("param_grads dgamma vs the documented formula", tu_ptype(dt), dg, edg, c,
                   tu_tol_param(dt), 1.0);
          tu_cmp_d("param_grads dbeta", tu_ptype(dt), dbt, edb, c, tu_tol_param(dt), 1.0);
          /* sum_xhat NULL: s = 0 */
          for (int64_t j = 0; j < c; j++) {
            double g0 = tu_pload(dt, gamma, j);
            edg[j] = sdx[j];
            for (int64_t i = 0; i < n; i++)
              for (int64_t sp = 0; sp < s; sp++) {
                int64_t q = tu_index(lay, c, s, i, j, sp);
                double xh = (tu_load(dt, x, q) - mean[j]) * inv[j];
                edx[q] = g0 * inv[j] * (tu_load(dt, dy, q) - sdy[j] / count - xh * sdx[j] / count);
              }
          }
          tu_poison(dx, tb);
          st = norma_bn_backward_apply(&d, x, NULL, dy, gamma, beta, mean, inv, sdy, sdx, NULL,
                                       count, dx, NULL);
          EXPECT_OK(st, "backward_apply (sum_xhat NULL)");
          tu_cmp_d("backward_apply dx (sum_xhat NULL)", dt, dx, edx, total, tu_tol_tensor(dt), 1.0);
          st = norma_bn_param_grads(&d, sdy, sdx, NULL, count, dg, dbt);
          EXPECT_OK(st, "param_grads (sum_xhat NULL)");
          tu_cmp_d("param_grads dgamma (sum_xhat NULL)", tu_ptype(dt), dg, edg, c, tu_tol_param(dt),
                   1.0);
          free(x), free(dy), free(gamma), free(beta), free(mean), free(inv), free(sdy), free(sdx),
              free(sx), free(edx), free(edg), free(edb), free(dx), free(dg), free(dbt);
        }
  norma_set_use_reference(0);
}

int main(void) {
  test_accumulate();
  test_stats_from_moments();
  test_split_vs_fused();
  test_apply_formulas();
  return tu_finish("test_split");
}
