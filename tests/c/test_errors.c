/* test_errors.c - every documented error of every entry point.
 *
 * For each bad call: the status code; norma_last_error() replaced by a message that names the
 * function and the offending argument (and its value where it has one); and every buffer the
 * call was given - outputs (poisoned), running statistics, accumulators and inputs - still
 * bit-identical to what it was before the call ("on any error nothing has been written").
 * Runs for every dtype and layout, with the reference and the production kernels.
 * Also: status strings, version, thread and ISA settings, the thread-local last error, and
 * calls that look odd but are valid (momentum out of range without running statistics,
 * NaN in an ignored residual, n == 0 in the split API, ...).
 */
#include <pthread.h>

#include "test_util.h"

/* ---- the buffers of a call, snapshotted before and compared after ---- */

#define MAX_REGIONS 48
static struct {
  const char *name;
  void *p;
  size_t bytes;
  void *copy;
} regs[MAX_REGIONS];
static int nregs = 0;

static void *reg(const char *name, void *p, size_t bytes) {
  regs[nregs].name = name;
  regs[nregs].p = p;
  regs[nregs].bytes = bytes;
  regs[nregs].copy = tu_alloc(bytes);
  nregs++;
  return p;
}
static void snap(void) {
  for (int i = 0; i < nregs; i++) memcpy(regs[i].copy, regs[i].p, regs[i].bytes);
}
static void verify(int line, const char *call) {
  int changed = 0;
  for (int i = 0; i < nregs; i++)
    if (memcmp(regs[i].copy, regs[i].p, regs[i].bytes) != 0) {
      tu_check_at(0, line, "[%s] %s: %s was modified by a failing call", tu_ctx, call,
                  regs[i].name);
      changed = 1;
      memcpy(regs[i].p, regs[i].copy, regs[i].bytes); /* restore for the next case */
    }
  if (!changed) tu_passed++;
}
static void clear_regs(void) {
  for (int i = 0; i < nregs; i++) free(regs[i].copy);
  nregs = 0;
}

static void expect_error(int line, const char *call, norma_status got, norma_status want,
                         const char *fn, const char *words, const char *value) {
  const char *msg = norma_last_error();
  tu_check_at(got == want, line, "[%s] %s returned %s, want %s (%s)", tu_ctx, call,
              norma_status_string(got), norma_status_string(want), msg);
  if (got == NORMA_OK) return;
  int fresh = msg && *msg && !strstr(msg, "424242");
  tu_check_at(fresh, line, "[%s] %s: last error not set (\"%s\")", tu_ctx, call,
              msg ? msg : "(null)");
  if (!fresh) return;
  tu_check_at(strstr(msg, fn) != NULL, line, "[%s] %s: message \"%s\" does not name %s", tu_ctx,
              call, msg, fn);
  /* words: alternatives separated by '|'; one must appear as a whole word */
  int found = 0;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", words);
  for (char *w = strtok(buf, "|"); w && !found; w = strtok(NULL, "|")) found = tu_has_word(msg, w);
  tu_check_at(found, line, "[%s] %s: message \"%s\" does not name the argument (%s)", tu_ctx, call,
              msg, words);
  if (value)
    tu_check_at(strstr(msg, value) != NULL, line,
                "[%s] %s: message \"%s\" does not give the value %s", tu_ctx, call, msg, value);
}

#define EXPECT_ERR(want, fn, words, value, call)                                   \
  do {                                                                             \
    snap();                                                                        \
    tu_reset_last_error();                                                         \
    norma_status st_ = (call);                                                     \
    expect_error(__LINE__, #call, st_, want, fn, words, value);                    \
    verify(__LINE__, #call);                                                       \
  } while (0)
#define INVALID(fn, words, value, call)                                                            \
  EXPECT_ERR(NORMA_ERR_INVALID_ARGUMENT, fn, words, value, call)
#define NONFINITE(fn, words, call) EXPECT_ERR(NORMA_ERR_NONFINITE, fn, words, NULL, call)
#define EXPECT_SUCCESS(call)                                                                \
  do {                                                                                      \
    norma_status st_ = (call);                                                              \
    TU_CHECK(st_ == NORMA_OK, "[%s] %s returned %s: %s", tu_ctx, #call,                     \
             norma_status_string(st_), norma_last_error());                                 \
  } while (0)

/* ---- BatchNorm entry points ---- */

static const char FWD[] = "norma_bn_forward_training", INF[] = "norma_bn_forward_inference",
                  BWD[] = "norma_bn_backward", MOM[] = "norma_bn_moments",
                  ACC[] = "norma_bn_moments_accumulate", MRG[] = "norma_bn_moments_merge",
                  SFM[] = "norma_bn_stats_from_moments", FAP[] = "norma_bn_forward_apply",
                  BRD[] = "norma_bn_backward_reduce", BAP[] = "norma_bn_backward_apply",
                  PGR[] = "norma_bn_param_grads";

static void set_nonfinite(norma_dtype t, void *p, int64_t i, int inf) {
  tu_store(t, p, i, inf ? -INFINITY : NAN);
}

static void bn_errors(norma_dtype dt, norma_layout lay) {
  const int64_t n = 2, c = 5, s = 3, total = n * c * s;
  const size_t es = tu_esize(dt), tb = total * es, pb = c * tu_psize(dt), db = c * 8;
  const norma_dtype pt = tu_ptype(dt);
  tu_rng r = tu_rng_make(5 + dt * 2 + lay);
  /* inputs, each with room for one more element (for the partial-overlap cases) */
  void *x = reg("x", tu_alloc(tb + es), tb + es);
  void *res = reg("residual", tu_alloc(tb), tb);
  void *dy = reg("dy", tu_alloc(tb + es), tb + es);
  void *yin = reg("y (input)", tu_alloc(tb), tb);
  void *gamma = reg("gamma", tu_alloc(pb), pb), *beta = reg("beta", tu_alloc(pb), pb);
  void *mean = reg("mean", tu_alloc(pb), pb), *var = reg("var", tu_alloc(pb), pb);
  void *smi = reg("save_mean (input)", tu_alloc(pb), pb),
       *sii = reg("save_invstd (input)", tu_alloc(pb), pb);
  tu_fill_uniform(dt, x, total + 1, &r, -1, 1);
  tu_fill_uniform(dt, res, total, &r, -1, 1);
  tu_fill_uniform(dt, dy, total + 1, &r, -1, 1);
  tu_fill_uniform(dt, yin, total, &r, -1, 1);
  tu_fill_param(dt, gamma, c, &r, 0.5, 1.5);
  tu_fill_param(dt, beta, c, &r, -1, 1);
  tu_fill_param(dt, mean, c, &r, -1, 1);
  tu_fill_param(dt, var, c, &r, 0.5, 2);
  tu_fill_param(dt, smi, c, &r, -1, 1);
  tu_fill_param(dt, sii, c, &r, 0.5, 2);
  /* outputs: poisoned; running statistics: valid values */
  void *y = reg("y", tu_poisoned(tb), tb);
  void *sm = reg("save_mean", tu_poisoned(pb), pb), *si = reg("save_invstd", tu_poisoned(pb), pb);
  void *rm = reg("running_mean", tu_alloc(pb), pb), *rv = reg("running_var", tu_alloc(pb), pb);
  tu_fill_param(dt, rm, c, &r, -1, 1);
  tu_fill_param(dt, rv, c, &r, 0.5, 2);
  void *dx = reg("dx", tu_poisoned(tb), tb), *dres = reg("dresidual", tu_poisoned(tb), tb);
  void *dg = reg("dgamma", tu_poisoned(pb), pb), *dbt = reg("dbeta", tu_poisoned(pb), pb);
  /* split API */
  int64_t *cnt = reg("count", tu_poisoned(c * 8), c * 8);
  double *mo = reg("moments mean", tu_poisoned(db), db), *m2 = reg("m2", tu_poisoned(db), db);
  int64_t *acnt = reg("acc count", tu_alloc(c * 8), c * 8);
  double *amean = reg("acc mean", tu_alloc(db), db), *am2 = reg("acc m2", tu_alloc(db), db);
  int64_t *bcnt = reg("count_b", tu_alloc(c * 8), c * 8);
  double *bmean = reg("mean_b", tu_alloc(db), db), *bm2 = reg("m2_b", tu_alloc(db), db);
  double *mean_out = reg("mean_out", tu_poisoned(db), db),
         *inv_out = reg("invstd_out", tu_poisoned(db), db);
  double *dmean = reg("mean (double)", tu_alloc(db), db),
         *dinv = reg("invstd (double)", tu_alloc(db), db);
  double *sdy = reg("sum_dy", tu_poisoned(db), db), *sdx = reg("sum_dy_xhat", tu_poisoned(db), db),
         *sx = reg("sum_xhat", tu_poisoned(db), db);
  double *isdy = reg("sum_dy (input)", tu_alloc(db), db),
         *isdx = reg("sum_dy_xhat (input)", tu_alloc(db), db),
         *isx = reg("sum_xhat (input)", tu_alloc(db), db);
  for (int64_t j = 0; j < c; j++) {
    acnt[j] = 4 + j, amean[j] = 0.5 * j, am2[j] = 1.5 + j;
    bcnt[j] = 3, bmean[j] = -0.25 * j, bm2[j] = 2.0;
    dmean[j] = 0.1 * j, dinv[j] = 1.0 + 0.1 * j;
    isdy[j] = 3.0 - j, isdx[j] = 0.5 * j, isx[j] = 0.01 * j;
  }
  int64_t *cnt2 = reg("count (valid)", tu_alloc(c * 8), c * 8);
  for (int64_t j = 0; j < c; j++) cnt2[j] = 6;

  const norma_bn_desc D = {n, c, s, lay, dt, 1e-5, 0};
  norma_bn_desc d;
#define WITH(field, val) (d = D, d.field = (val), &d)
  const double mom = 0.1;

  /* ---- forward_training ---- */
  INVALID(FWD, "d", NULL,
          norma_bn_forward_training(NULL, x, res, gamma, beta, y, sm, si, rm, rv, mom));
  INVALID(FWD, "x", NULL,
          norma_bn_forward_training(&D, NULL, res, gamma, beta, y, sm, si, rm, rv, mom));
  INVALID(FWD, "y", NULL,
          norma_bn_forward_training(&D, x, res, gamma, beta, NULL, sm, si, rm, rv, mom));
  INVALID(FWD, "n", "0",
          norma_bn_forward_training(WITH(n, 0), x, res, gamma, beta, y, sm, si, rm, rv, mom));
  INVALID(FWD, "n", "-1",
          norma_bn_forward_training(WITH(n, -1), x, res, gamma, beta, y, sm, si, rm, rv, mom));
  INVALID(FWD, "c", "0",
          norma_bn_forward_training(WITH(c, 0), x, res, gamma, beta, y, sm, si, rm, rv, mom));
  INVALID(FWD, "c", "-3",
          norma_bn_forward_training(WITH(c, -3), x, res, gamma, beta, y, sm, si, rm, rv, mom));
  INVALID(FWD, "spatial", "0",
          norma_bn_forward_training(WITH(spatial, 0), x, res, gamma, beta, y, sm, si, rm, rv, mom));
  INVALID(
      FWD, "spatial", "-7",
      norma_bn_forward_training(WITH(spatial, -7), x, res, gamma, beta, y, sm, si, rm, rv, mom));
  INVALID(FWD, "layout", "2",
          norma_bn_forward_training(WITH(layout, (norma_layout)2), x, res, gamma, beta, y, sm, si,
                                    rm, rv, mom));
  INVALID(FWD, "layout", "-1",
          norma_bn_forward_training(WITH(layout, (norma_layout)-1), x, res, gamma, beta, y, sm, si,
                                    rm, rv, mom));
  INVALID(FWD, "dtype", "4",
          norma_bn_forward_training(WITH(dtype, (norma_dtype)4), x, res, gamma, beta, y, sm, si, rm,
                                    rv, mom));
  INVALID(FWD, "dtype", "-1",
          norma_bn_forward_training(WITH(dtype, (norma_dtype)-1), x, res, gamma, beta, y, sm, si,
                                    rm, rv, mom));
  INVALID(FWD, "eps", "-1",
          norma_bn_forward_training(WITH(eps, -1.0), x, res, gamma, beta, y, sm, si, rm, rv, mom));
  INVALID(
      FWD, "eps", NULL,
      norma_bn_forward_training(WITH(eps, -1e-300), x, res, gamma, beta, y, sm, si, rm, rv, mom));
  INVALID(FWD, "eps", NULL,
          norma_bn_forward_training(WITH(eps, NAN), x, res, gamma, beta, y, sm, si, rm, rv, mom));
  INVALID(
      FWD, "eps", NULL,
      norma_bn_forward_training(WITH(eps, INFINITY), x, res, gamma, beta, y, sm, si, rm, rv, mom));
  INVALID(
      FWD, "flags", NULL,
      norma_bn_forward_training(WITH(flags, 1u << 5), x, res, gamma, beta, y, sm, si, rm, rv, mom));
  INVALID(FWD, "flags", NULL,
          norma_bn_forward_training(WITH(flags, 0x80000000u | NORMA_BN_RELU), x, res, gamma, beta,
                                    y, sm, si, rm, rv, mom));
  INVALID(FWD, "flags|NORMA_BN_RELU|NORMA_BN_ADD_RELU", NULL,
          norma_bn_forward_training(WITH(flags, NORMA_BN_RELU | NORMA_BN_ADD_RELU), x, res, gamma,
                                    beta, y, sm, si, rm, rv, mom));
  INVALID(FWD, "residual", NULL,
          norma_bn_forward_training(WITH(flags, NORMA_BN_ADD_RELU), x, NULL, gamma, beta, y, sm, si,
                                    rm, rv, mom));
  d = D, d.n = 1, d.spatial = 1;
  INVALID(FWD, "n|spatial", "1",
          norma_bn_forward_training(&d, x, res, gamma, beta, y, sm, si, rm, rv, mom));
  /* sizes whose element or byte count overflows */
  d = D, d.n = d.c = d.spatial = (int64_t)1 << 31;
  INVALID(FWD, "n|c|spatial|size", NULL,
          norma_bn_forward_training(&d, x, res, gamma, beta, y, sm, si, rm, rv, mom));
  d = D, d.n = (int64_t)1 << 31, d.c = (int64_t)1 << 31, d.spatial = 1;
  INVALID(FWD, "n|c|spatial|size", NULL,
          norma_bn_forward_training(&d, x, res, gamma, beta, y, sm, si, rm, rv, mom));
  d = D, d.n = (int64_t)1 << 42, d.c = (int64_t)1 << 20,
  d.spatial = 1; /* 2^62 elements: bytes overflow */
  INVALID(FWD, "n|c|spatial|size", NULL,
          norma_bn_forward_training(&d, x, res, gamma, beta, y, sm, si, rm, rv, mom));
  d = D, d.n = INT64_MAX, d.c = 1, d.spatial = 2;
  INVALID(FWD, "n|c|spatial|size", NULL,
          norma_bn_forward_training(&d, x, res, gamma, beta, y, sm, si, rm, rv, mom));
  INVALID(FWD, "momentum", "1.5",
          norma_bn_forward_training(&D, x, res, gamma, beta, y, sm, si, rm, rv, 1.5));
  INVALID(FWD, "momentum", "-0.25",
          norma_bn_forward_training(&D, x, res, gamma, beta, y, sm, si, rm, NULL, -0.25));
  INVALID(FWD, "momentum", NULL,
          norma_bn_forward_training(&D, x, res, gamma, beta, y, sm, si, NULL, rv, NAN));
  /* overlaps */
  INVALID(FWD, "y|x", NULL,
          norma_bn_forward_training(&D, x, res, gamma, beta, (char *)x + es, sm, si, rm, rv, mom));
  INVALID(FWD, "y|residual", NULL,
          norma_bn_forward_training(WITH(flags, NORMA_BN_ADD_RELU), x, (char *)y + es, gamma, beta,
                                    y, sm, si, rm, rv, mom));
  INVALID(FWD, "save_mean|save_invstd", NULL,
          norma_bn_forward_training(&D, x, res, gamma, beta, y, sm, sm, rm, rv, mom));
  INVALID(FWD, "running_mean|running_var", NULL,
          norma_bn_forward_training(&D, x, res, gamma, beta, y, sm, si, rm, rm, mom));
  INVALID(FWD, "save_mean|y", NULL,
          norma_bn_forward_training(&D, x, res, gamma, beta, y, (char *)y + es, si, rm, rv, mom));
  INVALID(FWD, "y|gamma", NULL,
          norma_bn_forward_training(&D, x, res, y, beta, y, sm, si, rm, rv, mom));
  INVALID(FWD, "save_invstd|x", NULL,
          norma_bn_forward_training(&D, x, res, gamma, beta, y, sm, x, rm, rv, mom));
  /* CHECK_FINITE: every input scanned */
  d = D, d.flags = NORMA_CHECK_FINITE | NORMA_BN_ADD_RELU;
  const int64_t bad = total - 1; /* the last element: past every vector body */
  set_nonfinite(dt, x, bad, 0);
  snap();
  NONFINITE(FWD, "x", norma_bn_forward_training(&d, x, res, gamma, beta, y, sm, si, rm, rv, mom));
  set_nonfinite(dt, x, 7, 1);
  NONFINITE(FWD, "x", norma_bn_forward_training(&d, x, res, gamma, beta, y, sm, si, rm, rv, mom));
  tu_store(dt, x, bad, 0.5), tu_store(dt, x, 7, 0.25);
  set_nonfinite(dt, res, 3, 1);
  NONFINITE(FWD, "residual",
            norma_bn_forward_training(&d, x, res, gamma, beta, y, sm, si, rm, rv, mom));
  /* ... but a residual is ignored without ADD_RELU: no error */
  d.flags = NORMA_CHECK_FINITE;
  tu_poison(y, tb);
  EXPECT_SUCCESS(norma_bn_forward_training(&d, x, res, gamma, beta, y, NULL, NULL, NULL, NULL, 0));
  tu_poison(y, tb);
  tu_store(dt, res, 3, 0.5);
  d.flags = NORMA_CHECK_FINITE;
  set_nonfinite(pt, gamma, 4, 0);
  NONFINITE(FWD, "gamma",
            norma_bn_forward_training(&d, x, res, gamma, beta, y, sm, si, rm, rv, mom));
  tu_pstore(dt, gamma, 4, 1.0);
  set_nonfinite(pt, beta, 0, 1);
  NONFINITE(FWD, "beta",
            norma_bn_forward_training(&d, x, res, gamma, beta, y, sm, si, rm, rv, mom));
  tu_pstore(dt, beta, 0, 0.0);
  set_nonfinite(pt, rm, 2, 0);
  NONFINITE(FWD, "running_mean",
            norma_bn_forward_training(&d, x, res, gamma, beta, y, sm, si, rm, rv, mom));
  tu_pstore(dt, rm, 2, 0.0);
  set_nonfinite(pt, rv, 1, 1);
  NONFINITE(FWD, "running_var",
            norma_bn_forward_training(&d, x, res, gamma, beta, y, sm, si, rm, rv, mom));
  tu_pstore(dt, rv, 1, 1.0);
  /* valid oddities: momentum outside [0, 1] without running statistics; RELU with an unused
     residual; y == residual */
  EXPECT_SUCCESS(norma_bn_forward_training(&D, x, NULL, gamma, beta, y, sm, si, NULL, NULL, 7.0));
  EXPECT_SUCCESS(norma_bn_forward_training(WITH(flags, NORMA_BN_RELU), x, NULL, NULL, NULL, y, NULL,
                                           NULL, NULL, NULL, 0));
  {
    void *ry = tu_dup(res, tb);
    EXPECT_SUCCESS(norma_bn_forward_training(WITH(flags, NORMA_BN_ADD_RELU), x, ry, gamma, beta, ry,
                                             NULL, NULL, NULL, NULL, 0));
    free(ry);
  }
  tu_poison(y, tb), tu_poison(sm, pb), tu_poison(si, pb);

  /* ---- forward_inference ---- */
  INVALID(INF, "d", NULL, norma_bn_forward_inference(NULL, x, res, gamma, beta, mean, var, y));
  INVALID(INF, "x", NULL, norma_bn_forward_inference(&D, NULL, res, gamma, beta, mean, var, y));
  INVALID(INF, "mean", NULL, norma_bn_forward_inference(&D, x, res, gamma, beta, NULL, var, y));
  INVALID(INF, "var", NULL, norma_bn_forward_inference(&D, x, res, gamma, beta, mean, NULL, y));
  INVALID(INF, "y", NULL, norma_bn_forward_inference(&D, x, res, gamma, beta, mean, var, NULL));
  INVALID(INF, "n", "0", norma_bn_forward_inference(WITH(n, 0), x, res, gamma, beta, mean, var, y));
  INVALID(INF, "c", "-2",
          norma_bn_forward_inference(WITH(c, -2), x, res, gamma, beta, mean, var, y));
  INVALID(INF, "spatial", "0",
          norma_bn_forward_inference(WITH(spatial, 0), x, res, gamma, beta, mean, var, y));
  INVALID(
      INF, "layout", "5",
      norma_bn_forward_inference(WITH(layout, (norma_layout)5), x, res, gamma, beta, mean, var, y));
  INVALID(
      INF, "dtype", "9",
      norma_bn_forward_inference(WITH(dtype, (norma_dtype)9), x, res, gamma, beta, mean, var, y));
  INVALID(INF, "eps", NULL,
          norma_bn_forward_inference(WITH(eps, -0.5), x, res, gamma, beta, mean, var, y));
  INVALID(INF, "flags", NULL,
          norma_bn_forward_inference(WITH(flags, 1u << 9), x, res, gamma, beta, mean, var, y));
  INVALID(INF, "flags|NORMA_BN_RELU|NORMA_BN_ADD_RELU", NULL,
          norma_bn_forward_inference(WITH(flags, NORMA_BN_RELU | NORMA_BN_ADD_RELU), x, res, gamma,
                                     beta, mean, var, y));
  INVALID(INF, "residual", NULL,
          norma_bn_forward_inference(WITH(flags, NORMA_BN_ADD_RELU), x, NULL, gamma, beta, mean,
                                     var, y));
  d = D, d.n = d.c = d.spatial = (int64_t)1 << 31;
  INVALID(INF, "n|c|spatial|size", NULL,
          norma_bn_forward_inference(&d, x, res, gamma, beta, mean, var, y));
  INVALID(INF, "y|x", NULL,
          norma_bn_forward_inference(&D, x, res, gamma, beta, mean, var, (char *)x + es));
  INVALID(INF, "y|mean", NULL, norma_bn_forward_inference(&D, x, res, gamma, beta, y, var, y));
  d = D, d.flags = NORMA_CHECK_FINITE;
  set_nonfinite(dt, x, 0, 0);
  NONFINITE(INF, "x", norma_bn_forward_inference(&d, x, res, gamma, beta, mean, var, y));
  tu_store(dt, x, 0, 0.5);
  set_nonfinite(pt, mean, c - 1, 1);
  NONFINITE(INF, "mean", norma_bn_forward_inference(&d, x, res, gamma, beta, mean, var, y));
  tu_pstore(dt, mean, c - 1, 0.0);
  set_nonfinite(pt, var, 2, 0);
  NONFINITE(INF, "var", norma_bn_forward_inference(&d, x, res, gamma, beta, mean, var, y));
  tu_pstore(dt, var, 2, 1.0);
  set_nonfinite(pt, gamma, 2, 0);
  NONFINITE(INF, "gamma", norma_bn_forward_inference(&d, x, res, gamma, beta, mean, var, y));
  tu_pstore(dt, gamma, 2, 1.0);
  d.flags |= NORMA_BN_ADD_RELU;
  set_nonfinite(dt, res, total - 1, 1);
  NONFINITE(INF, "residual", norma_bn_forward_inference(&d, x, res, gamma, beta, mean, var, y));
  tu_store(dt, res, total - 1, 0.0);

  /* ---- backward ---- */
  INVALID(BWD, "d", NULL,
          norma_bn_backward(NULL, x, yin, dy, gamma, beta, smi, sii, dx, dres, dg, dbt));
  INVALID(BWD, "dy", NULL,
          norma_bn_backward(&D, x, yin, NULL, gamma, beta, smi, sii, dx, dres, dg, dbt));
  INVALID(BWD, "save_mean", NULL,
          norma_bn_backward(&D, x, yin, dy, gamma, beta, NULL, sii, dx, dres, dg, dbt));
  INVALID(BWD, "save_invstd", NULL,
          norma_bn_backward(&D, x, yin, dy, gamma, beta, smi, NULL, dx, dres, dg, dbt));
  INVALID(BWD, "dx", NULL,
          norma_bn_backward(&D, x, yin, dy, gamma, beta, smi, sii, NULL, dres, dg, dbt));
  INVALID(BWD, "n", "0",
          norma_bn_backward(WITH(n, 0), x, yin, dy, gamma, beta, smi, sii, dx, dres, dg, dbt));
  INVALID(BWD, "c", "0",
          norma_bn_backward(WITH(c, 0), x, yin, dy, gamma, beta, smi, sii, dx, dres, dg, dbt));
  INVALID(
      BWD, "spatial", "-1",
      norma_bn_backward(WITH(spatial, -1), x, yin, dy, gamma, beta, smi, sii, dx, dres, dg, dbt));
  INVALID(BWD, "layout", "3",
          norma_bn_backward(WITH(layout, (norma_layout)3), x, yin, dy, gamma, beta, smi, sii, dx,
                            dres, dg, dbt));
  INVALID(BWD, "dtype", "5",
          norma_bn_backward(WITH(dtype, (norma_dtype)5), x, yin, dy, gamma, beta, smi, sii, dx,
                            dres, dg, dbt));
  INVALID(BWD, "eps", NULL,
          norma_bn_backward(WITH(eps, NAN), x, yin, dy, gamma, beta, smi, sii, dx, dres, dg, dbt));
  INVALID(BWD, "flags", NULL,
          norma_bn_backward(WITH(flags, 1u << 30), x, yin, dy, gamma, beta, smi, sii, dx, dres, dg,
                            dbt));
  INVALID(BWD, "flags|NORMA_BN_RELU|NORMA_BN_ADD_RELU", NULL,
          norma_bn_backward(WITH(flags, NORMA_BN_RELU | NORMA_BN_ADD_RELU), x, yin, dy, gamma, beta,
                            smi, sii, dx, dres, dg, dbt));
  d = D, d.n = 1, d.spatial = 1;
  INVALID(BWD, "n|spatial", "1",
          norma_bn_backward(&d, x, yin, dy, gamma, beta, smi, sii, dx, dres, dg, dbt));
  d = D, d.n = d.c = d.spatial = (int64_t)1 << 31;
  INVALID(BWD, "n|c|spatial|size", NULL,
          norma_bn_backward(&d, x, yin, dy, gamma, beta, smi, sii, dx, dres, dg, dbt));
  INVALID(BWD, "x", NULL,
          norma_bn_backward(WITH(flags, NORMA_BN_RELU), NULL, yin, dy, gamma, beta, smi, sii, dx,
                            dres, dg, dbt));
  INVALID(BWD, "x", NULL,
          norma_bn_backward(WITH(flags, NORMA_BN_ADD_RELU), NULL, yin, dy, gamma, beta, smi, sii,
                            dx, dres, dg, dbt));
  INVALID(BWD, "y", NULL,
          norma_bn_backward(WITH(flags, NORMA_BN_RELU), x, NULL, dy, gamma, beta, smi, sii, dx,
                            dres, dg, dbt));
  INVALID(BWD, "y", NULL,
          norma_bn_backward(&D, NULL, NULL, dy, gamma, beta, smi, sii, dx, dres, dg, dbt));
  tu_pstore(dt, gamma, 3, 0.0);
  INVALID(BWD, "gamma", NULL,
          norma_bn_backward(&D, NULL, yin, dy, gamma, beta, smi, sii, dx, dres, dg, dbt));
  tu_pstore(dt, gamma, 3, -0.0);
  INVALID(BWD, "gamma", NULL,
          norma_bn_backward(&D, NULL, yin, dy, gamma, beta, smi, sii, dx, dres, dg, dbt));
  tu_pstore(dt, gamma, 3, 1.0);
  INVALID(BWD, "dx|dy", NULL,
          norma_bn_backward(&D, x, yin, dy, gamma, beta, smi, sii, (char *)dy + es, dres, dg, dbt));
  INVALID(BWD, "dx|x", NULL,
          norma_bn_backward(&D, x, yin, dy, gamma, beta, smi, sii, (char *)x + es, dres, dg, dbt));
  INVALID(BWD, "dresidual|dx", NULL,
          norma_bn_backward(WITH(flags, NORMA_BN_ADD_RELU), x, yin, dy, gamma, beta, smi, sii, dx,
                            dx, dg, dbt));
  INVALID(BWD, "dgamma|dbeta", NULL,
          norma_bn_backward(&D, x, yin, dy, gamma, beta, smi, sii, dx, dres, dg, dg));
  INVALID(BWD, "dgamma|save_mean", NULL,
          norma_bn_backward(&D, x, yin, dy, gamma, beta, smi, sii, dx, dres, smi, dbt));
  INVALID(BWD, "dbeta|dx", NULL,
          norma_bn_backward(&D, x, yin, dy, gamma, beta, smi, sii, dx, dres, dg, dx));
  d = D, d.flags = NORMA_CHECK_FINITE | NORMA_BN_RELU;
  set_nonfinite(dt, dy, total - 1, 0);
  NONFINITE(BWD, "dy", norma_bn_backward(&d, x, yin, dy, gamma, beta, smi, sii, dx, dres, dg, dbt));
  tu_store(dt, dy, total - 1, 0.5);
  set_nonfinite(dt, x, 1, 1);
  NONFINITE(BWD, "x", norma_bn_backward(&d, x, yin, dy, gamma, beta, smi, sii, dx, dres, dg, dbt));
  tu_store(dt, x, 1, 0.5);
  set_nonfinite(dt, yin, 4, 0);
  NONFINITE(BWD, "y", norma_bn_backward(&d, x, yin, dy, gamma, beta, smi, sii, dx, dres, dg, dbt));
  d.flags = NORMA_CHECK_FINITE;
  NONFINITE(BWD, "y",
            norma_bn_backward(&d, NULL, yin, dy, gamma, beta, smi, sii, dx, dres, dg, dbt));
  tu_store(dt, yin, 4, 0.5);
  set_nonfinite(pt, sii, 1, 1);
  NONFINITE(BWD, "save_invstd",
            norma_bn_backward(&d, x, yin, dy, gamma, beta, smi, sii, dx, dres, dg, dbt));
  tu_pstore(dt, sii, 1, 1.0);
  set_nonfinite(pt, smi, 0, 0);
  NONFINITE(BWD, "save_mean",
            norma_bn_backward(&d, x, yin, dy, gamma, beta, smi, sii, dx, dres, dg, dbt));
  tu_pstore(dt, smi, 0, 0.0);
  set_nonfinite(pt, gamma, 1, 0);
  NONFINITE(BWD, "gamma",
            norma_bn_backward(&d, x, yin, dy, gamma, beta, smi, sii, dx, dres, dg, dbt));
  tu_pstore(dt, gamma, 1, 1.0);
  set_nonfinite(pt, beta, 1, 1);
  NONFINITE(BWD, "beta",
            norma_bn_backward(&d, NULL, yin, dy, gamma, beta, smi, sii, dx, dres, dg, dbt));
  tu_pstore(dt, beta, 1, 0.0);
  /* y is ignored when x is given without RELU / ADD_RELU: a NaN there is no error */
  set_nonfinite(dt, yin, 4, 0);
  EXPECT_SUCCESS(norma_bn_backward(&d, x, yin, dy, gamma, beta, smi, sii, dx, NULL, NULL, NULL));
  tu_store(dt, yin, 4, 0.5);
  tu_poison(dx, tb);
  /* valid: GLOBAL_STATS with one value per channel, dresidual ignored without ADD_RELU */
  d = D, d.n = 1, d.spatial = 1, d.flags = NORMA_BN_GLOBAL_STATS;
  EXPECT_SUCCESS(norma_bn_backward(&d, x, NULL, dy, gamma, beta, smi, sii, dx, NULL, dg, dbt));
  tu_poison(dx, tb), tu_poison(dg, pb), tu_poison(dbt, pb);
  EXPECT_SUCCESS(norma_bn_backward(&D, x, NULL, dy, NULL, NULL, smi, sii, dx, dres, NULL, NULL));
  tu_check_poison("dresidual without ADD_RELU", dres, tb);
  tu_poison(dx, tb);

  /* ---- split API ---- */
  INVALID(MOM, "d", NULL, norma_bn_moments(NULL, x, cnt, mo, m2));
  INVALID(MOM, "x", NULL, norma_bn_moments(&D, NULL, cnt, mo, m2));
  INVALID(MOM, "count", NULL, norma_bn_moments(&D, x, NULL, mo, m2));
  INVALID(MOM, "mean", NULL, norma_bn_moments(&D, x, cnt, NULL, m2));
  INVALID(MOM, "m2", NULL, norma_bn_moments(&D, x, cnt, mo, NULL));
  INVALID(MOM, "n", "-1", norma_bn_moments(WITH(n, -1), x, cnt, mo, m2));
  INVALID(MOM, "c", "0", norma_bn_moments(WITH(c, 0), x, cnt, mo, m2));
  INVALID(MOM, "spatial", "0", norma_bn_moments(WITH(spatial, 0), x, cnt, mo, m2));
  INVALID(MOM, "layout", "4", norma_bn_moments(WITH(layout, (norma_layout)4), x, cnt, mo, m2));
  INVALID(MOM, "dtype", "-2", norma_bn_moments(WITH(dtype, (norma_dtype)-2), x, cnt, mo, m2));
  INVALID(MOM, "flags", NULL, norma_bn_moments(WITH(flags, 1u << 12), x, cnt, mo, m2));
  INVALID(MOM, "mean|m2", NULL, norma_bn_moments(&D, x, cnt, mo, mo));
  INVALID(MOM, "m2|x", NULL, norma_bn_moments(&D, x, cnt, mo, (double *)x));
  set_nonfinite(dt, x, total - 1, 0);
  NONFINITE(MOM, "x", norma_bn_moments(WITH(flags, NORMA_CHECK_FINITE), x, cnt, mo, m2));
  tu_store(dt, x, total - 1, 0.5);
  EXPECT_SUCCESS(norma_bn_moments(WITH(n, 0), x, cnt, mo, m2));
  {
    int zero = 1;
    for (int64_t j = 0; j < c; j++) zero &= cnt[j] == 0 && mo[j] == 0.0 && m2[j] == 0.0;
    TU_CHECK(zero, "[%s] moments with n == 0: count/mean/m2 not 0", tu_ctx);
    tu_poison(cnt, c * 8), tu_poison(mo, db), tu_poison(m2, db);
  }

  INVALID(ACC, "dtype", "6",
          norma_bn_moments_accumulate((norma_dtype)6, 3, c, x, c, 1, acnt, amean, am2));
  INVALID(ACC, "rows", "-1", norma_bn_moments_accumulate(dt, -1, c, x, c, 1, acnt, amean, am2));
  INVALID(ACC, "channels", "0", norma_bn_moments_accumulate(dt, 3, 0, x, c, 1, acnt, amean, am2));
  INVALID(ACC, "row_stride|strides", "-5",
          norma_bn_moments_accumulate(dt, 3, c, x, -5, 1, acnt, amean, am2));
  INVALID(ACC, "channel_stride|strides", "-1",
          norma_bn_moments_accumulate(dt, 3, c, x, c, -1, acnt, amean, am2));
  INVALID(ACC, "x", NULL, norma_bn_moments_accumulate(dt, 3, c, NULL, c, 1, acnt, amean, am2));
  INVALID(ACC, "count", NULL, norma_bn_moments_accumulate(dt, 3, c, x, c, 1, NULL, amean, am2));
  INVALID(ACC, "mean", NULL, norma_bn_moments_accumulate(dt, 3, c, x, c, 1, acnt, NULL, am2));
  INVALID(ACC, "m2", NULL, norma_bn_moments_accumulate(dt, 3, c, x, c, 1, acnt, amean, NULL));
  INVALID(ACC, "rows|row_stride|channels|channel_stride|strides", NULL,
          norma_bn_moments_accumulate(dt, (int64_t)1 << 40, c, x, (int64_t)1 << 40, 1, acnt, amean,
                                      am2));
  acnt[2] = -1;
  INVALID(ACC, "count", NULL, norma_bn_moments_accumulate(dt, 3, c, x, c, 1, acnt, amean, am2));
  acnt[2] = 6;
  /* rows == 0: a no-op, x may be NULL */
  snap();
  EXPECT_SUCCESS(norma_bn_moments_accumulate(dt, 0, c, NULL, c, 1, acnt, amean, am2));
  verify(__LINE__, "moments_accumulate with rows == 0");

  INVALID(MRG, "c", "0", norma_bn_moments_merge(0, acnt, amean, am2, bcnt, bmean, bm2));
  INVALID(MRG, "c", "-4", norma_bn_moments_merge(-4, acnt, amean, am2, bcnt, bmean, bm2));
  INVALID(MRG, "count_a", NULL, norma_bn_moments_merge(c, NULL, amean, am2, bcnt, bmean, bm2));
  INVALID(MRG, "mean_a", NULL, norma_bn_moments_merge(c, acnt, NULL, am2, bcnt, bmean, bm2));
  INVALID(MRG, "m2_a", NULL, norma_bn_moments_merge(c, acnt, amean, NULL, bcnt, bmean, bm2));
  INVALID(MRG, "count_b", NULL, norma_bn_moments_merge(c, acnt, amean, am2, NULL, bmean, bm2));
  INVALID(MRG, "mean_b", NULL, norma_bn_moments_merge(c, acnt, amean, am2, bcnt, NULL, bm2));
  INVALID(MRG, "m2_b", NULL, norma_bn_moments_merge(c, acnt, amean, am2, bcnt, bmean, NULL));
  bcnt[4] = -2;
  INVALID(MRG, "count|count_b|count_a", NULL,
          norma_bn_moments_merge(c, acnt, amean, am2, bcnt, bmean, bm2));
  bcnt[4] = 3;

  INVALID(
      SFM, "d", NULL,
      norma_bn_stats_from_moments(NULL, cnt2, amean, am2, mean_out, inv_out, sm, si, rm, rv, mom));
  INVALID(SFM, "c", "0",
          norma_bn_stats_from_moments(WITH(c, 0), cnt2, amean, am2, mean_out, inv_out, sm, si, rm,
                                      rv, mom));
  INVALID(SFM, "dtype", "8",
          norma_bn_stats_from_moments(WITH(dtype, (norma_dtype)8), cnt2, amean, am2, mean_out,
                                      inv_out, sm, si, rm, rv, mom));
  INVALID(SFM, "eps", NULL,
          norma_bn_stats_from_moments(WITH(eps, -2.0), cnt2, amean, am2, mean_out, inv_out, sm, si,
                                      rm, rv, mom));
  INVALID(SFM, "flags", NULL,
          norma_bn_stats_from_moments(WITH(flags, 1u << 7), cnt2, amean, am2, mean_out, inv_out, sm,
                                      si, rm, rv, mom));
  INVALID(
      SFM, "count", NULL,
      norma_bn_stats_from_moments(&D, NULL, amean, am2, mean_out, inv_out, sm, si, rm, rv, mom));
  INVALID(SFM, "mean", NULL,
          norma_bn_stats_from_moments(&D, cnt2, NULL, am2, mean_out, inv_out, sm, si, rm, rv, mom));
  INVALID(
      SFM, "m2", NULL,
      norma_bn_stats_from_moments(&D, cnt2, amean, NULL, mean_out, inv_out, sm, si, rm, rv, mom));
  INVALID(SFM, "mean_out", NULL,
          norma_bn_stats_from_moments(&D, cnt2, amean, am2, NULL, inv_out, sm, si, rm, rv, mom));
  INVALID(SFM, "invstd_out", NULL,
          norma_bn_stats_from_moments(&D, cnt2, amean, am2, mean_out, NULL, sm, si, rm, rv, mom));
  INVALID(
      SFM, "momentum", "-1",
      norma_bn_stats_from_moments(&D, cnt2, amean, am2, mean_out, inv_out, sm, si, rm, NULL, -1.0));
  cnt2[3] = 1;
  INVALID(
      SFM, "count", "3",
      norma_bn_stats_from_moments(&D, cnt2, amean, am2, mean_out, inv_out, sm, si, rm, rv, mom));
  cnt2[3] = 0;
  INVALID(
      SFM, "count", "3",
      norma_bn_stats_from_moments(&D, cnt2, amean, am2, mean_out, inv_out, sm, si, rm, rv, mom));
  cnt2[3] = 6;
  INVALID(
      SFM, "mean_out|invstd_out", NULL,
      norma_bn_stats_from_moments(&D, cnt2, amean, am2, mean_out, mean_out, sm, si, rm, rv, mom));
  INVALID(
      SFM, "save_mean|running_mean", NULL,
      norma_bn_stats_from_moments(&D, cnt2, amean, am2, mean_out, inv_out, sm, si, sm, rv, mom));
  {
    /* only c, dtype, eps and flags are read: nonsense n / spatial / layout are fine */
    norma_bn_desc odd = D;
    odd.n = -3, odd.spatial = 0, odd.layout = (norma_layout)77;
    EXPECT_SUCCESS(norma_bn_stats_from_moments(&odd, cnt2, amean, am2, mean_out, inv_out, NULL,
                                               NULL, NULL, NULL, 5.0));
    tu_poison(mean_out, db), tu_poison(inv_out, db);
  }

  INVALID(FAP, "d", NULL, norma_bn_forward_apply(NULL, x, res, gamma, beta, dmean, dinv, y));
  INVALID(FAP, "x", NULL, norma_bn_forward_apply(&D, NULL, res, gamma, beta, dmean, dinv, y));
  INVALID(FAP, "y", NULL, norma_bn_forward_apply(&D, x, res, gamma, beta, dmean, dinv, NULL));
  INVALID(FAP, "mean", NULL, norma_bn_forward_apply(&D, x, res, gamma, beta, NULL, dinv, y));
  INVALID(FAP, "invstd", NULL, norma_bn_forward_apply(&D, x, res, gamma, beta, dmean, NULL, y));
  INVALID(FAP, "n", "-1", norma_bn_forward_apply(WITH(n, -1), x, res, gamma, beta, dmean, dinv, y));
  INVALID(FAP, "c", "0", norma_bn_forward_apply(WITH(c, 0), x, res, gamma, beta, dmean, dinv, y));
  INVALID(FAP, "eps", NULL,
          norma_bn_forward_apply(WITH(eps, -1.0), x, res, gamma, beta, dmean, dinv, y));
  INVALID(FAP, "flags|NORMA_BN_RELU|NORMA_BN_ADD_RELU", NULL,
          norma_bn_forward_apply(WITH(flags, NORMA_BN_RELU | NORMA_BN_ADD_RELU), x, res, gamma,
                                 beta, dmean, dinv, y));
  INVALID(
      FAP, "residual", NULL,
      norma_bn_forward_apply(WITH(flags, NORMA_BN_ADD_RELU), x, NULL, gamma, beta, dmean, dinv, y));
  INVALID(FAP, "y|x", NULL,
          norma_bn_forward_apply(&D, x, res, gamma, beta, dmean, dinv, (char *)x + es));
  set_nonfinite(dt, x, 2, 0);
  NONFINITE(
      FAP, "x",
      norma_bn_forward_apply(WITH(flags, NORMA_CHECK_FINITE), x, res, gamma, beta, dmean, dinv, y));
  tu_store(dt, x, 2, 0.5);
  snap();
  EXPECT_SUCCESS(norma_bn_forward_apply(WITH(n, 0), x, res, gamma, beta, dmean, dinv, y));
  verify(__LINE__, "forward_apply with n == 0");

  INVALID(BRD, "d", NULL,
          norma_bn_backward_reduce(NULL, x, yin, dy, gamma, beta, dmean, dinv, sdy, sdx, sx));
  INVALID(BRD, "dy", NULL,
          norma_bn_backward_reduce(&D, x, yin, NULL, gamma, beta, dmean, dinv, sdy, sdx, sx));
  INVALID(BRD, "mean", NULL,
          norma_bn_backward_reduce(&D, x, yin, dy, gamma, beta, NULL, dinv, sdy, sdx, sx));
  INVALID(BRD, "invstd", NULL,
          norma_bn_backward_reduce(&D, x, yin, dy, gamma, beta, dmean, NULL, sdy, sdx, sx));
  INVALID(BRD, "sum_dy", NULL,
          norma_bn_backward_reduce(&D, x, yin, dy, gamma, beta, dmean, dinv, NULL, sdx, sx));
  INVALID(BRD, "sum_dy_xhat", NULL,
          norma_bn_backward_reduce(&D, x, yin, dy, gamma, beta, dmean, dinv, sdy, NULL, sx));
  INVALID(
      BRD, "n", "-2",
      norma_bn_backward_reduce(WITH(n, -2), x, yin, dy, gamma, beta, dmean, dinv, sdy, sdx, sx));
  INVALID(BRD, "x", NULL,
          norma_bn_backward_reduce(WITH(flags, NORMA_BN_RELU), NULL, yin, dy, gamma, beta, dmean,
                                   dinv, sdy, sdx, sx));
  INVALID(BRD, "y", NULL,
          norma_bn_backward_reduce(WITH(flags, NORMA_BN_ADD_RELU), x, NULL, dy, gamma, beta, dmean,
                                   dinv, sdy, sdx, sx));
  INVALID(BRD, "y", NULL,
          norma_bn_backward_reduce(&D, NULL, NULL, dy, gamma, beta, dmean, dinv, sdy, sdx, sx));
  tu_pstore(dt, gamma, 0, 0.0);
  INVALID(BRD, "gamma", NULL,
          norma_bn_backward_reduce(&D, NULL, yin, dy, gamma, beta, dmean, dinv, sdy, sdx, sx));
  tu_pstore(dt, gamma, 0, 1.0);
  INVALID(BRD, "sum_dy|sum_dy_xhat", NULL,
          norma_bn_backward_reduce(&D, x, yin, dy, gamma, beta, dmean, dinv, sdy, sdy, sx));
  INVALID(BRD, "sum_xhat|sum_dy", NULL,
          norma_bn_backward_reduce(&D, x, yin, dy, gamma, beta, dmean, dinv, sdy, sdx, sdy + 1));
  set_nonfinite(dt, dy, 5, 1);
  NONFINITE(BRD, "dy",
            norma_bn_backward_reduce(WITH(flags, NORMA_CHECK_FINITE), x, yin, dy, gamma, beta,
                                     dmean, dinv, sdy, sdx, sx));
  tu_store(dt, dy, 5, 0.5);
  EXPECT_SUCCESS(
      norma_bn_backward_reduce(WITH(n, 0), x, yin, dy, gamma, beta, dmean, dinv, sdy, sdx, sx));
  {
    int zero = 1;
    for (int64_t j = 0; j < c; j++) zero &= sdy[j] == 0.0 && sdx[j] == 0.0 && sx[j] == 0.0;
    TU_CHECK(zero, "[%s] backward_reduce with n == 0: sums not 0", tu_ctx);
    tu_poison(sdy, db), tu_poison(sdx, db), tu_poison(sx, db);
  }

  INVALID(BAP, "d", NULL,
          norma_bn_backward_apply(NULL, x, yin, dy, gamma, beta, dmean, dinv, isdy, isdx, isx, 6,
                                  dx, dres));
  INVALID(BAP, "dy", NULL,
          norma_bn_backward_apply(&D, x, yin, NULL, gamma, beta, dmean, dinv, isdy, isdx, isx, 6,
                                  dx, dres));
  INVALID(BAP, "dx", NULL,
          norma_bn_backward_apply(&D, x, yin, dy, gamma, beta, dmean, dinv, isdy, isdx, isx, 6,
                                  NULL, dres));
  INVALID(BAP, "mean", NULL,
          norma_bn_backward_apply(&D, x, yin, dy, gamma, beta, NULL, dinv, isdy, isdx, isx, 6, dx,
                                  dres));
  INVALID(BAP, "invstd", NULL,
          norma_bn_backward_apply(&D, x, yin, dy, gamma, beta, dmean, NULL, isdy, isdx, isx, 6, dx,
                                  dres));
  INVALID(BAP, "sum_dy", NULL,
          norma_bn_backward_apply(&D, x, yin, dy, gamma, beta, dmean, dinv, NULL, isdx, isx, 6, dx,
                                  dres));
  INVALID(BAP, "sum_dy_xhat", NULL,
          norma_bn_backward_apply(&D, x, yin, dy, gamma, beta, dmean, dinv, isdy, NULL, isx, 6, dx,
                                  dres));
  INVALID(BAP, "count", "0",
          norma_bn_backward_apply(&D, x, yin, dy, gamma, beta, dmean, dinv, isdy, isdx, isx, 0, dx,
                                  dres));
  INVALID(BAP, "count", "-6",
          norma_bn_backward_apply(&D, x, yin, dy, gamma, beta, dmean, dinv, isdy, isdx, isx, -6, dx,
                                  dres));
  INVALID(BAP, "x", NULL,
          norma_bn_backward_apply(WITH(flags, NORMA_BN_RELU), NULL, yin, dy, gamma, beta, dmean,
                                  dinv, isdy, isdx, isx, 6, dx, dres));
  INVALID(BAP, "y", NULL,
          norma_bn_backward_apply(&D, NULL, NULL, dy, gamma, beta, dmean, dinv, isdy, isdx, isx, 6,
                                  dx, dres));
  INVALID(BAP, "dx|dy", NULL,
          norma_bn_backward_apply(&D, x, yin, dy, gamma, beta, dmean, dinv, isdy, isdx, isx, 6,
                                  (char *)dy + es, dres));
  INVALID(BAP, "dresidual|dx", NULL,
          norma_bn_backward_apply(WITH(flags, NORMA_BN_ADD_RELU), x, yin, dy, gamma, beta, dmean,
                                  dinv, isdy, isdx, isx, 6, dx, dx));
  INVALID(BAP, "n", "-1",
          norma_bn_backward_apply(WITH(n, -1), x, yin, dy, gamma, beta, dmean, dinv, isdy, isdx,
                                  isx, 6, dx, dres));
  set_nonfinite(dt, x, 9, 0);
  NONFINITE(BAP, "x",
            norma_bn_backward_apply(WITH(flags, NORMA_CHECK_FINITE), x, yin, dy, gamma, beta, dmean,
                                    dinv, isdy, isdx, isx, 6, dx, dres));
  tu_store(dt, x, 9, 0.5);
  /* GLOBAL_STATS: sums and count unused */
  EXPECT_SUCCESS(norma_bn_backward_apply(WITH(flags, NORMA_BN_GLOBAL_STATS), x, NULL, dy, gamma,
                                         beta, dmean, dinv, NULL, NULL, NULL, 0, dx, NULL));
  tu_poison(dx, tb);

  INVALID(PGR, "d", NULL, norma_bn_param_grads(NULL, isdy, isdx, isx, 6, dg, dbt));
  INVALID(PGR, "sum_dy", NULL, norma_bn_param_grads(&D, NULL, isdx, isx, 6, dg, dbt));
  INVALID(PGR, "sum_dy_xhat", NULL, norma_bn_param_grads(&D, isdy, NULL, isx, 6, dg, dbt));
  INVALID(PGR, "c", "0", norma_bn_param_grads(WITH(c, 0), isdy, isdx, isx, 6, dg, dbt));
  INVALID(PGR, "dtype", "4",
          norma_bn_param_grads(WITH(dtype, (norma_dtype)4), isdy, isdx, isx, 6, dg, dbt));
  INVALID(PGR, "dgamma|dbeta", NULL, norma_bn_param_grads(&D, isdy, isdx, isx, 6, dg, dg));
  EXPECT_SUCCESS(norma_bn_param_grads(&D, isdy, isdx, NULL, 6, NULL, NULL));

  /* ---- query_plan: checked like the op's descriptor ---- */
  norma_bn_plan *plan;
  {
    static const char QP[] = "norma_bn_query_plan";
    plan = reg("plan", tu_poisoned(sizeof(norma_bn_plan)), sizeof(norma_bn_plan));
    INVALID(QP, "d", NULL, norma_bn_query_plan(NULL, NORMA_BN_OP_FORWARD_TRAINING, plan));
    INVALID(QP, "plan", NULL, norma_bn_query_plan(&D, NORMA_BN_OP_BACKWARD, NULL));
    INVALID(QP, "op", "3", norma_bn_query_plan(&D, (norma_bn_op)3, plan));
    INVALID(QP, "op", "-1", norma_bn_query_plan(&D, (norma_bn_op)-1, plan));
    INVALID(QP, "c", "0", norma_bn_query_plan(WITH(c, 0), NORMA_BN_OP_FORWARD_INFERENCE, plan));
    INVALID(QP, "n", "0", norma_bn_query_plan(WITH(n, 0), NORMA_BN_OP_FORWARD_TRAINING, plan));
    INVALID(QP, "layout", "7",
            norma_bn_query_plan(WITH(layout, (norma_layout)7), NORMA_BN_OP_BACKWARD, plan));
    INVALID(QP, "dtype", "5",
            norma_bn_query_plan(WITH(dtype, (norma_dtype)5), NORMA_BN_OP_BACKWARD, plan));
    INVALID(QP, "eps", NULL,
            norma_bn_query_plan(WITH(eps, -1.0), NORMA_BN_OP_FORWARD_TRAINING, plan));
    INVALID(QP, "flags", NULL,
            norma_bn_query_plan(WITH(flags, 1u << 20), NORMA_BN_OP_FORWARD_TRAINING, plan));
    INVALID(QP, "flags|NORMA_BN_RELU|NORMA_BN_ADD_RELU", NULL,
            norma_bn_query_plan(WITH(flags, NORMA_BN_RELU | NORMA_BN_ADD_RELU),
                                NORMA_BN_OP_FORWARD_INFERENCE, plan));
    d = D, d.n = d.c = d.spatial = (int64_t)1 << 31;
    INVALID(QP, "n|c|spatial|size", NULL,
            norma_bn_query_plan(&d, NORMA_BN_OP_FORWARD_INFERENCE, plan));
    /* one value per channel: rejected for training and a batch-statistics backward, as those
       calls reject it; fine for inference and a GLOBAL_STATS backward */
    d = D, d.n = 1, d.spatial = 1;
    INVALID(QP, "n|spatial", "1", norma_bn_query_plan(&d, NORMA_BN_OP_FORWARD_TRAINING, plan));
    INVALID(QP, "n|spatial", "1", norma_bn_query_plan(&d, NORMA_BN_OP_BACKWARD, plan));
    EXPECT_SUCCESS(norma_bn_query_plan(&d, NORMA_BN_OP_FORWARD_INFERENCE, plan));
    d.flags = NORMA_BN_GLOBAL_STATS;
    EXPECT_SUCCESS(norma_bn_query_plan(&d, NORMA_BN_OP_BACKWARD, plan));
    tu_poison(plan, sizeof *plan);
  }

  clear_regs();
  /* the buffers themselves */
  free(x), free(res), free(dy), free(yin), free(gamma), free(beta), free(mean), free(var),
      free(smi), free(sii), free(y), free(sm), free(si), free(rm), free(rv), free(dx), free(dres),
      free(dg), free(dbt), free(cnt), free(mo), free(m2), free(acnt), free(amean), free(am2),
      free(bcnt), free(bmean), free(bm2), free(mean_out), free(inv_out), free(dmean), free(dinv),
      free(sdy), free(sdx), free(sx), free(isdy), free(isdx), free(isx), free(cnt2), free(plan);
#undef WITH
}

/* ---- folding ---- */
static void fold_errors(void) {
  const int64_t c = 6, per = 4;
  static const char FOLD[] = "norma_bn_fold", FIW[] = "norma_bn_fold_into_weights";
  float *gamma = reg("gamma", tu_alloc(c * 4), c * 4), *beta = reg("beta", tu_alloc(c * 4), c * 4);
  float *mean = reg("mean", tu_alloc(c * 4), c * 4), *var = reg("var", tu_alloc(c * 4), c * 4);
  float *scale = reg("scale", tu_poisoned((c + 1) * 4), (c + 1) * 4),
        *shift = reg("shift", tu_poisoned(c * 4), c * 4);
  float *w = reg("weight", tu_alloc(c * per * 4), c * per * 4),
        *b = reg("bias", tu_alloc(c * 4), c * 4);
  for (int64_t j = 0; j < c; j++) {
    gamma[j] = 1.0f + 0.1f * j, beta[j] = 0.5f - 0.2f * j, mean[j] = 0.3f * j, var[j] = 1.0f + j;
    b[j] = 0.25f * j;
  }
  for (int64_t k = 0; k < c * per; k++) w[k] = 0.01f * (float)k - 0.1f;
  INVALID(FOLD, "c", "0", norma_bn_fold(0, gamma, beta, mean, var, 1e-5, scale, shift));
  INVALID(FOLD, "c", "-1", norma_bn_fold(-1, gamma, beta, mean, var, 1e-5, scale, shift));
  INVALID(FOLD, "mean", NULL, norma_bn_fold(c, gamma, beta, NULL, var, 1e-5, scale, shift));
  INVALID(FOLD, "var", NULL, norma_bn_fold(c, gamma, beta, mean, NULL, 1e-5, scale, shift));
  INVALID(FOLD, "scale", NULL, norma_bn_fold(c, gamma, beta, mean, var, 1e-5, NULL, shift));
  INVALID(FOLD, "shift", NULL, norma_bn_fold(c, gamma, beta, mean, var, 1e-5, scale, NULL));
  INVALID(FOLD, "eps", "-0.5", norma_bn_fold(c, gamma, beta, mean, var, -0.5, scale, shift));
  INVALID(FOLD, "eps", NULL, norma_bn_fold(c, gamma, beta, mean, var, NAN, scale, shift));
  INVALID(FOLD, "scale|shift", NULL, norma_bn_fold(c, gamma, beta, mean, var, 1e-5, scale, scale));
  INVALID(FOLD, "scale|shift", NULL,
          norma_bn_fold(c, gamma, beta, mean, var, 1e-5, scale, scale + 1));
  var[4] = -1.0f;
  INVALID(FOLD, "var", "4", norma_bn_fold(c, gamma, beta, mean, var, 1e-5, scale, shift));
  INVALID(FIW, "var", "4", norma_bn_fold_into_weights(c, per, w, b, gamma, beta, mean, var, 1e-5));
  var[4] = 0.0f;
  INVALID(FOLD, "var|eps", NULL, norma_bn_fold(c, gamma, beta, mean, var, 0.0, scale, shift));
  INVALID(FIW, "var|eps", NULL,
          norma_bn_fold_into_weights(c, per, w, b, gamma, beta, mean, var, 0.0));
  var[4] = 2.0f;
  INVALID(FIW, "c_out", "0",
          norma_bn_fold_into_weights(0, per, w, b, gamma, beta, mean, var, 1e-5));
  INVALID(FIW, "per_out", "0",
          norma_bn_fold_into_weights(c, 0, w, b, gamma, beta, mean, var, 1e-5));
  INVALID(FIW, "per_out", "-3",
          norma_bn_fold_into_weights(c, -3, w, b, gamma, beta, mean, var, 1e-5));
  INVALID(FIW, "weight", NULL,
          norma_bn_fold_into_weights(c, per, NULL, b, gamma, beta, mean, var, 1e-5));
  INVALID(FIW, "bias", NULL,
          norma_bn_fold_into_weights(c, per, w, NULL, gamma, beta, mean, var, 1e-5));
  INVALID(FIW, "mean", NULL,
          norma_bn_fold_into_weights(c, per, w, b, gamma, beta, NULL, var, 1e-5));
  INVALID(FIW, "var", NULL,
          norma_bn_fold_into_weights(c, per, w, b, gamma, beta, mean, NULL, 1e-5));
  INVALID(FIW, "eps", NULL, norma_bn_fold_into_weights(c, per, w, b, gamma, beta, mean, var, -1.0));
  INVALID(FIW, "c_out|per_out", NULL,
          norma_bn_fold_into_weights(c, (int64_t)1 << 61, w, b, gamma, beta, mean, var, 1e-5));
  INVALID(FIW, "bias|weight", NULL,
          norma_bn_fold_into_weights(c, per, w, w + 1, gamma, beta, mean, var, 1e-5));
  clear_regs();
  free(gamma), free(beta), free(mean), free(var), free(scale), free(shift), free(w), free(b);
}

/* ---- query_plan: what it reports is consistent with the settings ---- */
static void plan_sanity(void) {
  typedef struct { int64_t n, c, s; } shape;
  static const shape shapes[] = {{1, 1, 2}, {2, 3, 49}, {4, 64, 3136}, {32, 256, 196},
                                 {2, 1, 1000000}, {256, 1000, 1}};
  const norma_isa isa = norma_get_isa();
  for (int ref = 0; ref < 2; ref++)
    for (int th = 1; th <= 4; th += 3)
      for (int si = 0; si < 6; si++)
        for (int t = 0; t < 4; t++)
          for (int l = 0; l < 2; l++)
            for (int op = 0; op < 3; op++) {
              norma_set_use_reference(ref);
              norma_set_num_threads(th);
              norma_bn_desc d = {shapes[si].n, shapes[si].c, shapes[si].s, (norma_layout)l,
                                 (norma_dtype)t, 1e-5, op == 1 ? NORMA_BN_RELU : 0u};
              tu_set_ctx("query_plan %s threads %d n=%lld c=%lld s=%lld %s %s op %d",
                         ref ? "ref" : "prod", th, (long long)d.n, (long long)d.c,
                         (long long)d.spatial, tu_dt_name(d.dtype), tu_layout_name(d.layout), op);
              norma_bn_plan p;
              memset(&p, 0xff, sizeof p);
              norma_status st = norma_bn_query_plan(&d, (norma_bn_op)op, &p);
              if (!TU_CHECK(st == NORMA_OK, "[%s] returned %s: %s", tu_ctx,
                            norma_status_string(st), norma_last_error()))
                continue;
              /* the reference's training forward reads 3 times (header) */
              const int max_passes = ref && op == NORMA_BN_OP_FORWARD_TRAINING ? 3 : 2;
              int ok = p.dram_passes >= 1 && p.dram_passes <= max_passes &&
                       (p.fused == 0 || p.fused == 1) &&
                       (p.fused ? p.unit >= 1 && p.unit <= d.c : p.unit == 0) &&
                       p.threads >= 1 && p.threads <= th &&
                       (p.streaming_stores == 0 || p.streaming_stores == 1) &&
                       p.reference == ref &&
                       /* the ISA capped, or scalar for a dtype without vector kernels */
                       (ref || p.isa == isa || p.isa == NORMA_ISA_SCALAR);
              TU_CHECK(ok, "[%s] inconsistent plan: dram_passes %d fused %d unit %lld threads %d "
                       "isa %d streaming %d reference %d", tu_ctx, p.dram_passes, p.fused,
                       (long long)p.unit, p.threads, (int)p.isa, p.streaming_stores, p.reference);
            }
  norma_set_use_reference(0);
  /* the far channels-first f32 backward: fused units (of a channel, 3.2 MB of x and dy, where
     the L2 is under 6 MiB), which the apply reads again from the caches: one pass;
     channels-last, split: two */
  for (int th = 1; th <= 2; th++) {
    norma_set_num_threads(th);
    norma_bn_desc d = {32, 64, 112 * 112, NORMA_CHANNELS_FIRST, NORMA_F32, 1e-5, 0};
    norma_bn_plan p;
    tu_set_ctx("query_plan threads %d backward NCHW 32x64x112x112", th);
    TU_CHECK(norma_bn_query_plan(&d, NORMA_BN_OP_BACKWARD, &p) == NORMA_OK &&
                 p.fused == 1 && p.dram_passes == 1,
             "[%s] fused %d unit %lld dram_passes %d", tu_ctx, p.fused, (long long)p.unit,
             p.dram_passes);
    d.layout = NORMA_CHANNELS_LAST;
    TU_CHECK(norma_bn_query_plan(&d, NORMA_BN_OP_BACKWARD, &p) == NORMA_OK && p.dram_passes == 2,
             "[%s] channels-last: dram_passes %d", tu_ctx, p.dram_passes);
  }
  norma_set_num_threads(0);
}

/* ---- settings, status strings, last error ---- */
static void *other_thread(void *arg) {
  const char **out = arg;
  out[0] = norma_last_error()[0] == '\0' ? "empty" : "not empty";
  (void)norma_bn_forward_training(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0);
  out[1] = strstr(norma_last_error(), "norma_bn_forward_training") ? "set" : "not set";
  return NULL;
}

static void misc(void) {
  tu_set_ctx("settings");
  /* norma_set_max_isa */
  norma_isa before = norma_get_isa();
  tu_reset_last_error();
  norma_status st = norma_set_max_isa((norma_isa)7);
  expect_error(__LINE__, "norma_set_max_isa(7)", st, NORMA_ERR_INVALID_ARGUMENT,
               "norma_set_max_isa", "isa", "7");
  st = norma_set_max_isa((norma_isa)-1);
  TU_CHECK(st == NORMA_ERR_INVALID_ARGUMENT, "norma_set_max_isa(-1) returned %s",
           norma_status_string(st));
  TU_CHECK(norma_get_isa() == before, "a rejected norma_set_max_isa changed the ISA");
  TU_CHECK(norma_set_max_isa(NORMA_ISA_SCALAR) == NORMA_OK && norma_get_isa() == NORMA_ISA_SCALAR,
           "norma_set_max_isa(SCALAR) did not select scalar");
  TU_CHECK(norma_set_max_isa(NORMA_ISA_AVX2) == NORMA_OK, "norma_set_max_isa(AVX2) failed");
  TU_CHECK(norma_get_isa() == NORMA_ISA_SCALAR || norma_get_isa() == NORMA_ISA_AVX2, "bad ISA");
  TU_CHECK(norma_set_max_isa(before) == NORMA_OK && norma_get_isa() == before, "ISA not restored");
  TU_CHECK(strcmp(norma_isa_name(NORMA_ISA_SCALAR), "scalar") == 0 &&
               strcmp(norma_isa_name(NORMA_ISA_AVX2), "avx2") == 0,
           "norma_isa_name");
  /* status strings */
  static const char *names[] = {"NORMA_OK", "NORMA_ERR_INVALID_ARGUMENT", "NORMA_ERR_UNSUPPORTED",
                                "NORMA_ERR_OUT_OF_MEMORY", "NORMA_ERR_NONFINITE",
                                "NORMA_ERR_COMMUNICATION"};
  for (int i = 0; i < 6; i++)
    TU_CHECK(strcmp(norma_status_string((norma_status)i), names[i]) == 0,
             "norma_status_string(%d) = %s", i, norma_status_string((norma_status)i));
  TU_CHECK(strcmp(norma_status_string((norma_status)99), "unknown status") == 0,
           "norma_status_string(99) = %s", norma_status_string((norma_status)99));
  /* version */
  char v[32];
  snprintf(v, sizeof v, "%d.%d.%d", NORMA_VERSION_MAJOR, NORMA_VERSION_MINOR, NORMA_VERSION_PATCH);
  TU_CHECK(strcmp(norma_version(), v) == 0, "norma_version() = %s, header says %s", norma_version(),
           v);
  /* threads */
  norma_set_num_threads(3);
  TU_CHECK(norma_get_num_threads() == 3, "norma_get_num_threads() = %d after set(3)",
           norma_get_num_threads());
  norma_set_num_threads(0);
  TU_CHECK(norma_get_num_threads() >= 1, "default threads %d", norma_get_num_threads());
  norma_set_num_threads(-5);
  TU_CHECK(norma_get_num_threads() >= 1, "threads after set(-5): %d", norma_get_num_threads());
  /* reference switch */
  norma_set_use_reference(1);
  TU_CHECK(norma_get_use_reference() == 1, "use_reference not 1");
  norma_set_use_reference(0);
  TU_CHECK(norma_get_use_reference() == 0, "use_reference not 0");
  /* last error: thread-local, "" in a fresh thread, not cleared by a successful call */
  tu_reset_last_error();
  const char *out[2] = {NULL, NULL};
  pthread_t th;
  TU_CHECK(pthread_create(&th, NULL, other_thread, out) == 0, "pthread_create");
  pthread_join(th, NULL);
  TU_CHECK(out[0] && strcmp(out[0], "empty") == 0,
           "norma_last_error() in a new thread is not \"\"");
  TU_CHECK(out[1] && strcmp(out[1], "set") == 0,
           "a failure in another thread was not recorded there");
  TU_CHECK(strstr(norma_last_error(), "424242") != NULL,
           "another thread's failure replaced this thread's last error: \"%s\"",
           norma_last_error());
  float sc[2], sh[2];
  const float mean2[2] = {0, 1}, var2[2] = {1, 2};
  TU_CHECK(norma_bn_fold(2, NULL, NULL, mean2, var2, 0.0, sc, sh) == NORMA_OK, "fold failed");
  TU_CHECK(strstr(norma_last_error(), "424242") != NULL,
           "a successful call cleared the last error: \"%s\"", norma_last_error());
}

int main(void) {
  for (int ref = 0; ref < 2; ref++)
    for (int t = 0; t < 4; t++)
      for (int l = 0; l < 2; l++) {
        norma_set_use_reference(ref);
        tu_set_ctx("%s %s %s", ref ? "ref" : "prod", tu_dt_name((norma_dtype)t),
                   tu_layout_name((norma_layout)l));
        bn_errors((norma_dtype)t, (norma_layout)l);
      }
  norma_set_use_reference(0);
  tu_set_ctx("fold");
  fold_errors();
  plan_sanity();
  misc();
  return tu_finish("test_errors");
}
