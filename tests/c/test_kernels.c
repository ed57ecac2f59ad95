/* test_kernels.c - production kernels against the library's reference kernels.
 *
 * Every call is made twice, once with norma_set_use_reference(1) (the scalar double oracle)
 * and once with norma_set_use_reference(0) (the production kernels, on the ISA capped by
 * NORMA_MAX_ISA: ctest runs this program once with scalar and once with avx2), on a grid of
 * shapes that hits every vector tail: C in {1, 3, 17, 64, 1000}, spatial in {1, 7, 49, 1021},
 * N in {1, 2, 5}, plus a few large reductions whose channel slab exceeds the L2 cache.  All
 * dtypes and both layouts run the plain variant on every shape; the flag variants (RELU,
 * ADD_RELU, BIASED_RUNNING_VAR, CHECK_FINITE, GLOBAL_STATS, gamma/beta NULL, x NULL in the
 * backward, dresidual NULL, misaligned pointers, eps 0) run on every shape up to a size and on
 * a rotating subset above it, so every dtype x layout x variant meets tail shapes.
 *
 * Outputs start poisoned (NaN bytes), so an element a kernel forgets to write fails; every
 * element of every output is compared.  Arguments a call must ignore (dresidual without
 * ADD_RELU) must keep their poison.
 */
#define _POSIX_C_SOURCE 200809L
#include <time.h>

#include "test_util.h"

typedef struct variant {
  const char *name;
  unsigned flags;
  int gamma_null, beta_null;
  int global;    /* backward with NORMA_BN_GLOBAL_STATS and constant statistics */
  int dres_null; /* ADD_RELU backward without dresidual */
} variant;

static const variant VARIANTS[] = {
    {"plain", 0, 0, 0, 0, 0},
    {"relu/gamma=NULL", NORMA_BN_RELU, 1, 0, 0, 0},
    {"add_relu/beta=NULL", NORMA_BN_ADD_RELU, 0, 1, 0, 0},
    {"biased+check_finite/gamma=beta=NULL/global", NORMA_BN_BIASED_RUNNING_VAR | NORMA_CHECK_FINITE,
     1, 1, 1, 0},
    {"relu+biased/global", NORMA_BN_RELU | NORMA_BN_BIASED_RUNNING_VAR, 0, 0, 1, 0},
    {"add_relu+check_finite/gamma=NULL/global/dres=NULL", NORMA_BN_ADD_RELU | NORMA_CHECK_FINITE, 1,
     0, 1, 1},
    {"add_relu+biased/dres=NULL", NORMA_BN_ADD_RELU | NORMA_BN_BIASED_RUNNING_VAR, 0, 0, 0, 1},
};
#define NVARIANTS ((int)(sizeof VARIANTS / sizeof VARIANTS[0]))

static long n_cases = 0;
static int variant_hits[4][2][NVARIANTS];

/* one tensor buffer, optionally misaligned by one element */
typedef struct tbuf {
  void *base, *p;
} tbuf;
static int g_align64; /* tb_make: every buffer from a 64-byte boundary (the same phase) */
static tbuf tb_make(size_t bytes, size_t esize, int misalign) {
  tbuf b;
  if (g_align64) {
    const size_t sz = (bytes + esize + 63) / 64 * 64;
    b.base = aligned_alloc(64, sz);
    TU_CHECK(b.base != NULL, "aligned_alloc(%zu)", sz);
    if (!b.base) exit(2);
    tu_poison(b.base, sz);
  } else {
    b.base = tu_poisoned(bytes + esize);
  }
  b.p = (char *)b.base + (misalign ? esize : 0);
  return b;
}

static void set_ref(int on) { norma_set_use_reference(on); }

#define EXPECT_OK(st, what)                                                                    \
  TU_CHECK((st) == NORMA_OK, "[%s] %s returned %s: %s", tu_ctx, what, norma_status_string(st), \
           norma_last_error())

/* lite: training forward, inference and the backward with x only (no split API, no x == NULL
   pass): for the very large shapes that exercise the streaming (non-temporal) stores */
static void run_case(int64_t n, int64_t c, int64_t s, norma_layout lay, norma_dtype dt, int vi,
                     double eps, int misalign, uint64_t seed, int lite) {
  const variant *v = &VARIANTS[vi];
  const int64_t m = n * s, total = n * c * s;
  const size_t es = tu_esize(dt), ps = tu_psize(dt), tb = (size_t)total * es, pb = (size_t)c * ps;
  const size_t db = (size_t)c * sizeof(double);
  const int train = m >= 2;
  const int act = (v->flags & NORMA_BN_ADD_RELU) ? 2 : (v->flags & NORMA_BN_RELU) ? 1 : 0;
  const double tt = tu_tol_tensor(dt), tp = tu_tol_param(dt);
  const double tsum = dt == NORMA_F64 ? 1e-12 : 1e-5; /* double results of the split API */
  /* reductions (dgamma, dbeta, the sums of the split API) may accumulate long runs in f32:
     their error is relative to the sum of |terms| (~m), not to the result (~sqrt(m) for
     sum_xhat, which is ~0) */
  const double sfloor = fmax(1.0, fmax(sqrt((double)m), (double)m / 64.0));
  const double momentum = (seed & 1) ? 0.1 : 0.75;
  norma_status st;
  n_cases++;
  variant_hits[dt][lay][vi]++;
  tu_set_ctx("n=%lld c=%lld s=%lld %s %s %s eps=%g%s", (long long)n, (long long)c, (long long)s,
             tu_dt_name(dt), tu_layout_name(lay), v->name, eps, misalign ? " misaligned" : "");

  tu_rng r = tu_rng_make(seed);
  double *mu = tu_alloc(db), *sd = tu_alloc(db);
  for (int64_t j = 0; j < c; j++) {
    mu[j] = tu_uniform(&r, -2, 2);
    sd[j] = tu_uniform(&r, 0.5, 2);
  }
  tbuf x = tb_make(tb, es, misalign), res = tb_make(tb, es, misalign),
       dy = tb_make(tb, es, misalign);
  tu_fill_channels(dt, lay, x.p, n, c, s, mu, sd, &r);
  tu_fill_uniform(dt, res.p, total, &r, -1, 1);
  /* dy correlated with x_hat, with a non-zero mean: dgamma and dbeta are far from 0 */
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < c; j++)
      for (int64_t sp = 0; sp < s; sp++) {
        int64_t k = tu_index(lay, c, s, i, j, sp);
        double z = (tu_load(dt, x.p, k) - mu[j]) / sd[j];
        tu_store(dt, dy.p, k, 0.5 * z + 0.25 + tu_uniform(&r, -0.75, 0.75));
      }
  void *gamma = NULL, *beta = NULL;
  if (!v->gamma_null) {
    gamma = tu_alloc(pb);
    for (int64_t j = 0; j < c; j++)
      tu_pstore(dt, gamma, j, (tu_below(&r, 4) == 0 ? -1 : 1) * tu_uniform(&r, 0.5, 1.5));
  }
  if (!v->beta_null) {
    beta = tu_alloc(pb);
    tu_fill_param(dt, beta, c, &r, -0.5, 0.5);
  }
  void *rm0 = tu_alloc(pb), *rv0 = tu_alloc(pb);
  tu_fill_param(dt, rm0, c, &r, -1, 1);
  tu_fill_param(dt, rv0, c, &r, 0.5, 2);

  tbuf y_r = tb_make(tb, es, misalign), y_p = tb_make(tb, es, misalign);
  tbuf dx_r = tb_make(tb, es, misalign), dx_p = tb_make(tb, es, misalign);
  tbuf dr_r = tb_make(tb, es, misalign), dr_p = tb_make(tb, es, misalign);
  void *sm_r = tu_poisoned(pb), *sm_p = tu_poisoned(pb), *si_r = tu_poisoned(pb),
       *si_p = tu_poisoned(pb);
  void *rm_r = tu_dup(rm0, pb), *rm_p = tu_dup(rm0, pb), *rv_r = tu_dup(rv0, pb),
       *rv_p = tu_dup(rv0, pb);
  void *dg_r = tu_poisoned(pb), *dg_p = tu_poisoned(pb), *db_r = tu_poisoned(pb),
       *db_p = tu_poisoned(pb);
  norma_bn_desc d = {n, c, s, lay, dt, eps, v->flags | (v->global ? NORMA_BN_GLOBAL_STATS : 0)};
  const void *resp = act == 2 ? res.p : NULL;

  /* ---- inference (with the running statistics); its output is the y of a frozen layer ---- */
  tbuf yi_r = tb_make(tb, es, misalign), yi_p = tb_make(tb, es, misalign);
  set_ref(1);
  st = norma_bn_forward_inference(&d, x.p, resp, gamma, beta, rm0, rv0, yi_r.p);
  EXPECT_OK(st, "reference forward_inference");
  set_ref(0);
  st = norma_bn_forward_inference(&d, x.p, resp, gamma, beta, rm0, rv0, yi_p.p);
  EXPECT_OK(st, "forward_inference");
  tu_cmp("inference y", dt, yi_p.p, yi_r.p, total, tt, 1.0);

  /* ---- training forward ---- */
  if (train) {
    set_ref(1);
    st = norma_bn_forward_training(&d, x.p, resp, gamma, beta, y_r.p, sm_r, si_r, rm_r, rv_r,
                                   momentum);
    EXPECT_OK(st, "reference forward_training");
    set_ref(0);
    st = norma_bn_forward_training(&d, x.p, resp, gamma, beta, y_p.p, sm_p, si_p, rm_p, rv_p,
                                   momentum);
    EXPECT_OK(st, "forward_training");
    tu_cmp("training y", dt, y_p.p, y_r.p, total, tt, 1.0);
    tu_cmp("save_mean", tu_ptype(dt), sm_p, sm_r, c, tp, 1.0);
    tu_cmp("save_invstd", tu_ptype(dt), si_p, si_r, c, tp, 1.0);
    tu_cmp("running_mean", tu_ptype(dt), rm_p, rm_r, c, tp, 1.0);
    tu_cmp("running_var", tu_ptype(dt), rv_p, rv_r, c, tp, 1.0);
  }
  /* the statistics and y the backward gets: the batch ones, or a frozen layer's constants */
  void *gs_mean = tu_alloc(pb), *gs_invstd = tu_alloc(pb);
  for (int64_t j = 0; j < c; j++) {
    tu_pstore(dt, gs_mean, j, tu_pload(dt, rm0, j));
    tu_pstore(dt, gs_invstd, j, 1.0 / sqrt(tu_pload(dt, rv0, j) + eps));
  }
  const void *bw_mean = v->global ? gs_mean : sm_r, *bw_invstd = v->global ? gs_invstd : si_r;
  const void *bw_y = v->global ? yi_r.p : y_r.p;
  /* dx = gamma * invstd * (something of order 1): its natural scale per channel */
  double *dx_floor = tu_alloc(db);
  for (int64_t j = 0; j < c; j++)
    dx_floor[j] =
        fmax(1.0, fabs(gamma ? tu_pload(dt, gamma, j) : 1.0) * tu_pload(dt, bw_invstd, j));

  /* ---- backward, with x, then with x == NULL (x_hat recovered from y) ---- */
  if (train || v->global) {
    for (int pass = 0; pass < 2; pass++) {
      const void *xin = pass == 0 ? x.p : NULL;
      if (pass == 1 && (act != 0 || lite)) break; /* x is required with RELU / ADD_RELU */
      void *dres_r = (act == 2 && v->dres_null) ? NULL : dr_r.p;
      void *dres_p = (act == 2 && v->dres_null) ? NULL : dr_p.p;
      /* the second pass also leaves dgamma / dbeta out (NULL allowed) */
      void *g_r = pass ? NULL : dg_r, *g_p = pass ? NULL : dg_p;
      void *b_r = pass ? NULL : db_r, *b_p = pass ? NULL : db_p;
      tu_poison(dx_r.p, tb);
      tu_poison(dx_p.p, tb);
      tu_poison(dr_r.p, tb);
      tu_poison(dr_p.p, tb);
      tu_poison(dg_p, pb);
      tu_poison(db_p, pb);
      set_ref(1);
      st = norma_bn_backward(&d, xin, bw_y, dy.p, gamma, beta, bw_mean, bw_invstd, dx_r.p, dres_r,
                             g_r, b_r);
      EXPECT_OK(st, pass ? "reference backward (x NULL)" : "reference backward");
      set_ref(0);
      st = norma_bn_backward(&d, xin, bw_y, dy.p, gamma, beta, bw_mean, bw_invstd, dx_p.p, dres_p,
                             g_p, b_p);
      EXPECT_OK(st, pass ? "backward (x NULL)" : "backward");
      tu_cmp_chan(pass ? "dx (x NULL)" : "dx", dt, dx_p.p, dx_r.p, lay, n, c, s, tt, dx_floor);
      if (act == 2 && !v->dres_null) {
        tu_cmp("dresidual", dt, dr_p.p, dr_r.p, total, 0.0, 0.0);
      } else {
        tu_check_poison("dresidual (must be ignored)", dr_p.p, tb);
      }
      if (pass == 0) {
        tu_cmp("dgamma", tu_ptype(dt), dg_p, dg_r, c, tp, sfloor);
        tu_cmp("dbeta", tu_ptype(dt), db_p, db_r, c, tp, sfloor);
      } else {
        tu_check_poison("dgamma (NULL passed)", dg_p, pb);
      }
    }
  }

  /* ---- split API: moments, forward_apply, backward_reduce / param_grads / backward_apply ---- */
  if (train && !lite) {
    int64_t *cnt_r = tu_poisoned(c * 8), *cnt_p = tu_poisoned(c * 8);
    double *mean_r = tu_poisoned(db), *mean_p = tu_poisoned(db), *m2_r = tu_poisoned(db),
           *m2_p = tu_poisoned(db);
    set_ref(1);
    st = norma_bn_moments(&d, x.p, cnt_r, mean_r, m2_r);
    EXPECT_OK(st, "reference moments");
    set_ref(0);
    st = norma_bn_moments(&d, x.p, cnt_p, mean_p, m2_p);
    EXPECT_OK(st, "moments");
    int cnt_ok = 1;
    for (int64_t j = 0; j < c; j++) cnt_ok &= cnt_r[j] == m && cnt_p[j] == m;
    TU_CHECK(cnt_ok, "[%s] moments count != n * spatial", tu_ctx);
    tu_cmp_d("moments mean", NORMA_F64, mean_p, mean_r, c, tsum, 1.0);
    tu_cmp_d("moments m2", NORMA_F64, m2_p, m2_r, c, tsum, 1.0);

    double *mean = tu_alloc(db), *invstd = tu_alloc(db);
    for (int64_t j = 0; j < c; j++) {
      mean[j] = mean_r[j];
      invstd[j] = 1.0 / sqrt(m2_r[j] / (double)m + eps);
    }
    tu_poison(y_r.p, tb);
    tu_poison(y_p.p, tb);
    set_ref(1);
    st = norma_bn_forward_apply(&d, x.p, resp, gamma, beta, mean, invstd, y_r.p);
    EXPECT_OK(st, "reference forward_apply");
    set_ref(0);
    st = norma_bn_forward_apply(&d, x.p, resp, gamma, beta, mean, invstd, y_p.p);
    EXPECT_OK(st, "forward_apply");
    tu_cmp("forward_apply y", dt, y_p.p, y_r.p, total, tt, 1.0);

    double *sdy_r = tu_poisoned(db), *sdy_p = tu_poisoned(db), *sdx_r = tu_poisoned(db),
           *sdx_p = tu_poisoned(db), *sx_r = tu_poisoned(db), *sx_p = tu_poisoned(db);
    /* x NULL (x_hat from y) where allowed and the seed says so */
    const void *xin = (act == 0 && (seed & 2)) ? NULL : x.p;
    set_ref(1);
    st = norma_bn_backward_reduce(&d, xin, y_r.p, dy.p, gamma, beta, mean, invstd, sdy_r, sdx_r,
                                  sx_r);
    EXPECT_OK(st, "reference backward_reduce");
    set_ref(0);
    st = norma_bn_backward_reduce(&d, xin, y_r.p, dy.p, gamma, beta, mean, invstd, sdy_p, sdx_p,
                                  sx_p);
    EXPECT_OK(st, "backward_reduce");
    tu_cmp_d("sum_dy", NORMA_F64, sdy_p, sdy_r, c, tsum, sfloor);
    tu_cmp_d("sum_dy_xhat", NORMA_F64, sdx_p, sdx_r, c, tsum, sfloor);
    tu_cmp_d("sum_xhat", NORMA_F64, sx_p, sx_r, c, tsum, sfloor);

    tu_poison(dg_r, pb);
    tu_poison(dg_p, pb);
    tu_poison(db_r, pb);
    tu_poison(db_p, pb);
    set_ref(1);
    st = norma_bn_param_grads(&d, sdy_r, sdx_r, sx_r, m, dg_r, db_r);
    EXPECT_OK(st, "reference param_grads");
    set_ref(0);
    st = norma_bn_param_grads(&d, sdy_r, sdx_r, sx_r, m, dg_p, db_p);
    EXPECT_OK(st, "param_grads");
    tu_cmp("param_grads dgamma", tu_ptype(dt), dg_p, dg_r, c, tp, sfloor);
    tu_cmp("param_grads dbeta", tu_ptype(dt), db_p, db_r, c, tp, sfloor);

    void *dres_r = (act == 2 && v->dres_null) ? NULL : dr_r.p;
    void *dres_p = (act == 2 && v->dres_null) ? NULL : dr_p.p;
    tu_poison(dx_r.p, tb);
    tu_poison(dx_p.p, tb);
    tu_poison(dr_r.p, tb);
    tu_poison(dr_p.p, tb);
    set_ref(1);
    st = norma_bn_backward_apply(&d, xin, y_r.p, dy.p, gamma, beta, mean, invstd, sdy_r, sdx_r,
                                 sx_r, m, dx_r.p, dres_r);
    EXPECT_OK(st, "reference backward_apply");
    set_ref(0);
    st = norma_bn_backward_apply(&d, xin, y_r.p, dy.p, gamma, beta, mean, invstd, sdy_r, sdx_r,
                                 sx_r, m, dx_p.p, dres_p);
    EXPECT_OK(st, "backward_apply");
    for (int64_t j = 0; j < c; j++)
      dx_floor[j] = fmax(1.0, fabs(gamma ? tu_pload(dt, gamma, j) : 1.0) * invstd[j]);
    tu_cmp_chan("backward_apply dx", dt, dx_p.p, dx_r.p, lay, n, c, s, tt, dx_floor);
    if (act == 2 && !v->dres_null)
      tu_cmp("backward_apply dresidual", dt, dr_p.p, dr_r.p, total, 0.0, 0.0);
    else tu_check_poison("backward_apply dresidual (must be ignored)", dr_p.p, tb);

    free(cnt_r), free(cnt_p), free(mean_r), free(mean_p), free(m2_r), free(m2_p);
    free(mean), free(invstd);
    free(sdy_r), free(sdy_p), free(sdx_r), free(sdx_p), free(sx_r), free(sx_p);
  }

  free(mu), free(sd), free(x.base), free(res.base), free(dy.base), free(gamma), free(beta);
  free(rm0), free(rv0), free(y_r.base), free(y_p.base), free(dx_r.base), free(dx_p.base);
  free(dr_r.base), free(dr_p.base), free(sm_r), free(sm_p), free(si_r), free(si_p);
  free(yi_r.base), free(yi_p.base), free(gs_mean), free(gs_invstd), free(dx_floor);
  free(rm_r), free(rm_p), free(rv_r), free(rv_p), free(dg_r), free(dg_p), free(db_r), free(db_p);
}

typedef struct shape {
  int64_t n, c, s;
} shape;

int main(void) {
  const int quick = tu_quick();
  const char *env_isa = getenv("NORMA_MAX_ISA");
  printf("test_kernels: NORMA_MAX_ISA=%s, production ISA %s, %d threads%s\n",
         env_isa ? env_isa : "(unset)", norma_isa_name(norma_get_isa()), norma_get_num_threads(),
         quick ? ", quick" : "");
  if (env_isa && strcmp(env_isa, "scalar") == 0)
    TU_CHECK(norma_get_isa() == NORMA_ISA_SCALAR, "NORMA_MAX_ISA=scalar but the ISA is %s",
             norma_isa_name(norma_get_isa()));

  static const int64_t Ns[] = {1, 2, 5}, Cs[] = {1, 3, 17, 64, 1000}, Ss[] = {1, 7, 49, 1021};
  shape shapes[96];
  int ns = 0;
  for (int a = 0; a < 3; a++)
    for (int b = 0; b < 5; b++)
      for (int e = 0; e < 4; e++) shapes[ns++] = (shape){Ns[a], Cs[b], Ss[e]};
  /* large reductions: one channel's slab (n * spatial values) exceeds the 2 MiB L2 */
  shapes[ns++] = (shape){2, 2, 300001};
  shapes[ns++] = (shape){1, 1, 1048573};
  shapes[ns++] = (shape){3, 5, 70001};
  /* the library's block boundaries: 1024 channels per rows-kernel call, 64-row blocks and
     4096-row segments (channels-last, and [N, C] = channels-first with spatial 1), 4096-value
     chunks of a channels-first run */
  shapes[ns++] = (shape){1, 1024, 65};
  shapes[ns++] = (shape){2, 1025, 32};
  shapes[ns++] = (shape){65, 2048, 1};
  shapes[ns++] = (shape){1, 3, 8193};
  shapes[ns++] = (shape){2, 2, 4097};
  shapes[ns++] = (shape){4097, 5, 1};
  /* channels-last rows in the AVX-512 strips (up to 256 elements, four vectors per strip):
     whole strips, a partial last strip and vector, several 64-row blocks with a tail */
  shapes[ns++] = (shape){2, 129, 49};
  shapes[ns++] = (shape){1, 250, 130};
  shapes[ns++] = (shape){2, 256, 33};
  /* channels-first runs of 2 values: the blocked wide view ([N][C S] rows) */
  shapes[ns++] = (shape){3, 17, 2};
  shapes[ns++] = (shape){40, 1000, 2};
  /* and runs of 3 to 12 with enough samples (op_bn.c, wide_cf_runs), S columns a channel;
     7 samples of runs of 4 stay channels-first */
  shapes[ns++] = (shape){16, 17, 3};
  shapes[ns++] = (shape){8, 1000, 4};
  shapes[ns++] = (shape){7, 33, 4};
  shapes[ns++] = (shape){24, 64, 6};
  shapes[ns++] = (shape){48, 5, 9};
  shapes[ns++] = (shape){128, 3, 12};
  /* the bounds a direction has of its own: the forward's 8 samples of runs of 6 and 16 of
     runs of 12 (at most 128 columns a sample), the forward's and backward's 16 samples of
     runs of 9 and of 8 (the backward: at most 256 columns a sample) */
  shapes[ns++] = (shape){8, 17, 6};
  shapes[ns++] = (shape){16, 31, 12};
  shapes[ns++] = (shape){16, 33, 9};
  shapes[ns++] = (shape){16, 300, 8};
  /* channels-last rows of more than 1024 channels: the backward apply in blocks of 512
     channels (a partial last block, a partial last vector), the forward's apply of rows of
     more than 1280 in blocks of equal widths (1537: 784 and 753 channels on AVX-512) */
  shapes[ns++] = (shape){3, 1100, 7};
  shapes[ns++] = (shape){2, 1537, 5};
  /* channels-last rows that end inside a line, in the split schedule: the apply's aligned
     super-rows of 2 (728 channels) and 4 (100, AVX2) rows, from the first row or (misaligned
     pointers) a later one */
  shapes[ns++] = (shape){8, 728, 49};
  shapes[ns++] = (shape){2, 100, 300};
  /* and the inference's super-rows of 16 rows (301 channels: 4816 values, engine.c's
     NORM_SR_MAX_INFER_C; two threads from 140704 values, 16 super-rows each) */
  shapes[ns++] = (shape){4, 301, 144};
  /* few rows of many channels: inference in units of channels, one per thread */
  shapes[ns++] = (shape){17, 8200, 1};
  /* and a unit per thread (unit_per_thread in engine.c, the backward's and the forward's of
     at most 128 rows: 90 rows of 1360 channels, units of 688 and 672 on 2 threads) */
  shapes[ns++] = (shape){1, 1360, 90};

  /* How much of dtype x layout x variant runs on a shape, by its element count:
       <= small: every dtype x layout x variant;
       <= mid:   every dtype x layout, the plain variant and one rotating variant;
       <= big:   every dtype x layout, one rotating variant (plain included);
       above:    `top` dtype x layout combinations (rotating), one rotating variant.
     Every dtype x layout x variant still meets the small tail shapes (checked at the end). */
  const int64_t small = quick ? 5000 : 20000, mid = quick ? 50000 : 200000,
                big = quick ? 200000 : 1000000;
  const int top = quick ? 1 : 3;
  static const double eps_list[] = {1e-5, 0.0, 0.1, 1e-3};
  uint64_t seed = 1;
  const int timing = getenv("NORMA_TEST_TIMING") != NULL;
  for (int si = 0; si < ns; si++) {
    const shape sh = shapes[si];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const int64_t total = sh.n * sh.c * sh.s;
    for (int k = 0; k < 8; k++) {
      norma_dtype dt = (norma_dtype)(k / 2);
      norma_layout lay = (norma_layout)(k % 2);
      if (total > big && (k - 3 * si % 8 + 8) % 8 >= top) continue;
      for (int vi = 0; vi < NVARIANTS; vi++) {
        const int rot = (si + k) % NVARIANTS; /* the rotating variant */
        int run = total <= small ? 1
                  : total <= mid ? (vi == 0 || vi == 1 + (si + k) % (NVARIANTS - 1))
                                 : vi == rot;
        if (!run) continue;
        seed++;
        double eps = eps_list[(si + k + vi) % 4];
        if (eps == 0.0 && sh.n * sh.s < 16) eps = 1e-5; /* avoid constant channels */
        int misalign = (si + k + vi) % 3 == 1;
        run_case(sh.n, sh.c, sh.s, lay, dt, vi, eps, misalign, seed * 7919, 0);
      }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (timing)
      printf("  n=%lld c=%lld s=%lld: %.2f s\n", (long long)sh.n, (long long)sh.c, (long long)sh.s,
             (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
  }
  /* f32 inference super-rows of 25616 values (1601 channels), beyond NORM_SR_MAX_INFER_C
     (AVX-512 only): 520 rows, 16 super-rows a thread on two threads; too big for the grid's
     rotation to be sure to reach f32 channels-last, so on its own; the super-rows need every
     tensor at the same phase of a line (64-byte buffers, then all misaligned by one value or
     none) */
  g_align64 = 1;
  for (int mis = 0; mis < 2; mis++) {
    seed++;
    run_case(2, 1601, 260, NORMA_CHANNELS_LAST, NORMA_F32, mis, 1e-5, mis, seed * 7919, 1);
  }
  g_align64 = 0;
  /* outputs over ~8 MiB take non-temporal stores (norma_bn_query_plan says which): one shape
     past that for every dtype x layout (f16 / bf16 need ~4.5M elements), fewer operations */
  {
    const int64_t n = 2, c = 3, s = 850003;
    for (int k = 0; k < 8; k++) {
      norma_dtype dt = (norma_dtype)(k / 2);
      norma_layout lay = (norma_layout)(k % 2);
      if (quick && k != 1) continue;
      norma_bn_desc d = {n, c, s, lay, dt, 1e-5, 0};
      norma_bn_plan plan;
      if (norma_bn_query_plan(&d, NORMA_BN_OP_FORWARD_INFERENCE, &plan) == NORMA_OK &&
          !plan.streaming_stores)
        printf("test_kernels: note: n=%lld c=%lld s=%lld %s %s does not use streaming stores\n",
               (long long)n, (long long)c, (long long)s, tu_dt_name(dt), tu_layout_name(lay));
      seed++;
      run_case(n, c, s, lay, dt, k % 3, 1e-5, k % 2 == 0, seed * 7919, 1);
    }
  }
  /* every output written with streaming stores (norma_set_streaming_stores from 1 byte): the
     channels-last rows that end inside a line take the wide view (k rows of whole lines) or,
     where the rows do not divide, ordinary stores; whole-line and long rows stream */
  {
    static const shape nt_shapes[] = {{2, 24, 49}, {3, 100, 16}, {2, 17, 64}, {2, 300, 8},
                                      {2, 72, 7},  {1, 24, 7},   {2, 48, 9},  {1, 530, 5},
                                      /* rows of 2 KiB and more that end inside a line: each
                                         row's streaming stores start where they are aligned,
                                         its constants (AVX-512) from whole 64-byte blocks */
                                      {2, 1106, 9}, {1, 1115, 7}, {2, 1041, 3},
                                      /* and enough of them for the backward's fours of rows
                                         that start on one offset (4 P rows, P = 16, 4, 2),
                                         in blocks of whole groups */
                                      {2, 999, 100}, {4, 1004, 40}, {3, 1000, 11},
                                      /* channels-first runs of a vector or more, under 2 KiB:
                                         the forward's and the backward's one stream over a
                                         sample's channels, vectors across two channels at
                                         every phase */
                                      {3, 37, 19}, {2, 45, 33}, {2, 9, 255}};
    TU_CHECK(norma_set_streaming_stores(1, INT64_MAX) == NORMA_OK, "set_streaming_stores");
    for (size_t i = 0; i < sizeof nt_shapes / sizeof nt_shapes[0]; i++)
      for (int k = 0; k < 8; k++) {
        if (quick && k % 3 != 1) continue;
        const shape sh = nt_shapes[i];
        seed++;
        run_case(sh.n, sh.c, sh.s, (norma_layout)(k % 2), (norma_dtype)(k / 2),
                 (int)((i + k) % NVARIANTS), 1e-5, (int)(i + k) % 3 == 1, seed * 7919, 0);
      }
    /* channels-last rows that follow each other and end inside a line: the line across each
       row boundary is one vector, its lanes from two rows and its constants from both ends
       of the arrays (AVX-512); every dtype and variant, rows of 35 and 50 channels (a row
       boundary every two or three lines, at every phase) and of 1106 */
    static const shape wrap_shapes[] = {{2, 1106, 9}, {3, 35, 5}, {1, 50, 11}};
    for (size_t i = 0; i < sizeof wrap_shapes / sizeof wrap_shapes[0]; i++)
      for (int dt = 0; dt < 4; dt++)
        for (int vi = 0; vi < NVARIANTS; vi++) {
          if (quick && (vi + dt) % 3 != 0) continue;
          const shape sh = wrap_shapes[i];
          seed++;
          run_case(sh.n, sh.c, sh.s, NORMA_CHANNELS_LAST, (norma_dtype)dt, vi, 1e-5,
                   (int)(i + vi) % 2, seed * 7919, 0);
        }
    TU_CHECK(norma_set_streaming_stores(0, INT64_MAX) == NORMA_OK, "set_streaming_stores");
  }
  /* every dtype x layout x variant must have run */
  int missing = 0;
  for (int dt = 0; dt < 4; dt++)
    for (int l = 0; l < 2; l++)
      for (int vi = 0; vi < NVARIANTS; vi++) missing += variant_hits[dt][l][vi] == 0;
  TU_CHECK(missing == 0, "%d dtype x layout x variant combinations never ran", missing);
  printf("test_kernels: %ld cases\n", n_cases);
  return tu_finish("test_kernels");
}
