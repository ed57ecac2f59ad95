/* test_norm_errors.c - every documented error of the norm family's entry points
 * (norma_ln_forward / _backward, norma_rms_forward / _backward, norma_gn_forward / _backward,
 * norma_in_forward_training / _forward_inference / _backward).
 *
 * For each bad call: the status; norma_last_error() replaced by a message that names the
 * function and the offending argument (and its value where it has one); and every buffer the
 * call was given - outputs (poisoned), running statistics and inputs - bit-identical to what it
 * was before the call ("on any error nothing has been written").  Covered: NULL descriptor,
 * each required NULL argument, sizes < 1, groups < 1 or not dividing c, bad layout, bad dtype,
 * eps < 0 / NaN / Inf, unknown flag bits and flags the op does not take, RELU with SILU, size
 * overflow, InstanceNorm training with spatial 1, momentum outside [0, 1] with running
 * statistics, GroupNorm's RELU backward without y, overlapping outputs and inputs, and
 * NORMA_CHECK_FINITE with a NaN / Inf in each scanned input (NORMA_ERR_NONFINITE).  Also calls
 * that look odd but are valid (momentum out of range without running statistics, a NaN in an
 * input the call ignores, InstanceNorm inference with spatial 1).  Every dtype and layout,
 * reference and production.
 */
#include "test_norm_util.h"

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
  for (int i = 0; i < nregs; i++) free(regs[i].p), free(regs[i].copy);
  nregs = 0;
}

static void expect_error(int line, const char *call, norma_status got, norma_status want,
                         const char *fn, const char *words, const char *value) {
  const char *msg = norma_last_error();
  tu_check_at(got == want, line, "[%s] %s returned %s, want %s (%s)", tu_ctx, call,
              norma_status_string(got), norma_status_string(want), msg);
  if (got == NORMA_OK) return;
  const int fresh = msg && *msg && !strstr(msg, "424242");
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

#define EXPECT_ERR(want, fn, words, value, call)                \
  do {                                                          \
    snap();                                                     \
    tu_reset_last_error();                                      \
    norma_status st_ = (call);                                  \
    expect_error(__LINE__, #call, st_, want, fn, words, value); \
    verify(__LINE__, #call);                                    \
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

static void set_nonfinite(norma_dtype t, void *p, int64_t i, int inf) {
  tu_store(t, p, i, inf ? -INFINITY : NAN);
}

/* flags no norm of the family takes, and bits no flag has */
static const unsigned UNKNOWN1 = 1u << 7, UNKNOWN2 = 0x80000000u;

/* ================================ LayerNorm / RMSNorm ==================================== */

static void row_errors(int rms, norma_dtype dt) {
  const int64_t rows = 4, d = 6, total = rows * d;
  const size_t es = tu_esize(dt), tb = total * es, pb = d * tu_psize(dt), gb = rows * tu_psize(dt);
  const norma_dtype pt = tu_ptype(dt);
  const char *FWD = rms ? "norma_rms_forward" : "norma_ln_forward";
  const char *BWD = rms ? "norma_rms_backward" : "norma_ln_backward";
  const char *SI = rms ? "save_invrms" : "save_invstd";
  tu_rng r = tu_rng_make(11 + dt * 2 + rms);
  /* inputs, with room for one more element (partial overlaps) */
  void *x = reg("x", tu_alloc(tb + es), tb + es),
       *res = reg("residual", tu_alloc(tb + es), tb + es);
  void *dy = reg("dy", tu_alloc(tb + es), tb + es), *dsum = reg("dsum", tu_alloc(tb), tb);
  void *gamma = reg("gamma", tu_alloc(pb + 8), pb + 8), *beta = reg("beta", tu_alloc(pb), pb);
  void *smi = reg("save_mean (input)", tu_alloc(gb + 8), gb + 8);
  void *sii = reg("save_invstd (input)", tu_alloc(gb), gb);
  tu_fill_uniform(dt, x, total + 1, &r, -1, 1);
  tu_fill_uniform(dt, res, total + 1, &r, -1, 1);
  tu_fill_uniform(dt, dy, total + 1, &r, -1, 1);
  tu_fill_uniform(dt, dsum, total, &r, -1, 1);
  tu_fill_param(dt, gamma, d + 1, &r, 0.5, 1.5);
  tu_fill_param(dt, beta, d, &r, -1, 1);
  tu_fill_param(dt, smi, rows + 1, &r, -1, 1);
  tu_fill_param(dt, sii, rows, &r, 0.5, 2);
  /* outputs, poisoned */
  void *y = reg("y", tu_poisoned(tb + es), tb + es),
       *sum = reg("sum", tu_poisoned(tb + es), tb + es);
  void *sm = reg("save_mean", tu_poisoned(gb + 8), gb + 8),
       *si = reg(SI, tu_poisoned(gb + 8), gb + 8);
  void *dx = reg("dx", tu_poisoned(tb + es), tb + es);
  void *dg = reg("dgamma", tu_poisoned(pb + 8), pb + 8),
       *dbt = reg("dbeta", tu_poisoned(pb + 8), pb + 8);
  const norma_ln_desc D = {rows, d, dt, 1e-5, 0};
  norma_ln_desc dd;
#define WITH(field, val) (dd = D, dd.field = (val), &dd)
#define F(desc, xx, rr, yy, ss, m, s)                                      \
  (rms ? norma_rms_forward(desc, xx, rr, gamma, yy, ss, s)                 \
       : norma_ln_forward(desc, xx, rr, gamma, beta, yy, ss, m, s))
#define B(desc, xx, dd_, ds, m, s, ddx, g, b)                              \
  (rms ? norma_rms_backward(desc, xx, dd_, ds, gamma, s, ddx, g)            \
       : norma_ln_backward(desc, xx, dd_, ds, gamma, m, s, ddx, g, b))

  /* ---- forward ---- */
  INVALID(FWD, "d", NULL, F(NULL, x, res, y, sum, sm, si));
  INVALID(FWD, "x", NULL, F(&D, NULL, res, y, sum, sm, si));
  INVALID(FWD, "y", NULL, F(&D, x, res, NULL, sum, sm, si));
  INVALID(FWD, "rows", "0", F(WITH(rows, 0), x, res, y, sum, sm, si));
  INVALID(FWD, "rows", "-1", F(WITH(rows, -1), x, res, y, sum, sm, si));
  INVALID(FWD, "d->d", "0", F(WITH(d, 0), x, res, y, sum, sm, si));
  INVALID(FWD, "d->d", "-3", F(WITH(d, -3), x, res, y, sum, sm, si));
  INVALID(FWD, "dtype", "4", F(WITH(dtype, (norma_dtype)4), x, res, y, sum, sm, si));
  INVALID(FWD, "dtype", "-1", F(WITH(dtype, (norma_dtype)-1), x, res, y, sum, sm, si));
  INVALID(FWD, "eps", "-1", F(WITH(eps, -1.0), x, res, y, sum, sm, si));
  INVALID(FWD, "eps", NULL, F(WITH(eps, -1e-300), x, res, y, sum, sm, si));
  INVALID(FWD, "eps", NULL, F(WITH(eps, NAN), x, res, y, sum, sm, si));
  INVALID(FWD, "eps", NULL, F(WITH(eps, INFINITY), x, res, y, sum, sm, si));
  INVALID(FWD, "flags", NULL, F(WITH(flags, UNKNOWN1), x, res, y, sum, sm, si));
  INVALID(FWD, "flags", NULL,
          F(WITH(flags, UNKNOWN2 | NORMA_CHECK_FINITE), x, res, y, sum, sm, si));
  /* flags LayerNorm / RMSNorm do not take */
  INVALID(FWD, "flags", NULL, F(WITH(flags, NORMA_RELU), x, res, y, sum, sm, si));
  INVALID(FWD, "flags", NULL, F(WITH(flags, NORMA_SILU), x, res, y, sum, sm, si));
  INVALID(FWD, "flags", NULL, F(WITH(flags, NORMA_BN_ADD_RELU), x, res, y, sum, sm, si));
  INVALID(FWD, "flags", NULL, F(WITH(flags, NORMA_BN_BIASED_RUNNING_VAR), x, res, y, sum, sm, si));
  INVALID(FWD, "flags", NULL, F(WITH(flags, NORMA_BN_GLOBAL_STATS), x, res, y, sum, sm, si));
  INVALID(FWD, "flags", NULL, F(WITH(flags, NORMA_BN_COUNT_WEIGHTED), x, res, y, sum, sm, si));
  INVALID(FWD, "flags|NORMA_RELU|NORMA_SILU", NULL,
          F(WITH(flags, NORMA_RELU | NORMA_SILU), x, res, y, sum, sm, si));
  /* sizes whose element or byte count overflows */
  dd = D, dd.rows = (int64_t)1 << 62, dd.d = 4;
  INVALID(FWD, "rows|d->d|size|overflows", NULL, F(&dd, x, res, y, sum, sm, si));
  dd = D, dd.rows = INT64_MAX, dd.d = 2;
  INVALID(FWD, "rows|d->d|size|overflows", NULL, F(&dd, x, res, y, sum, sm, si));
  dd = D, dd.rows = (int64_t)1 << 31, dd.d = (int64_t)1 << 31; /* 2^62 elements: bytes overflow */
  INVALID(FWD, "rows|d->d|size|overflows", NULL, F(&dd, x, res, y, sum, sm, si));
  /* overlaps */
  INVALID(FWD, "y|x", NULL, F(&D, x, res, (char *)x + es, sum, sm, si));
  INVALID(FWD, "y|residual", NULL, F(&D, x, res, (char *)res + es, NULL, sm, si));
  INVALID(FWD, "y|sum", NULL, F(&D, x, res, y, y, sm, si));
  INVALID(FWD, "y|sum", NULL, F(&D, x, res, y, (char *)y + es, sm, si));
  INVALID(FWD, "sum|x", NULL, F(&D, x, res, y, (char *)x + es, sm, si));
  INVALID(FWD, "sum|residual", NULL, F(&D, x, res, y, (char *)res + es, sm, si));
  INVALID(FWD, "y|gamma", NULL, F(&D, x, res, gamma, sum, sm, si));
  INVALID(FWD, "y|save_mean|save_invrms|save_invstd", NULL, F(&D, x, res, y, sum, y, y));
  if (!rms) {
    INVALID(FWD, "save_mean|save_invstd", NULL, F(&D, x, res, y, sum, sm, sm));
    INVALID(FWD, "save_mean|save_invstd", NULL, F(&D, x, res, y, sum, sm, (char *)sm + 4));
    INVALID(FWD, "beta|save_mean", NULL, F(&D, x, res, y, sum, beta, si));
  }
  INVALID(FWD, "x|save_invrms|save_invstd", NULL, F(&D, x, res, y, sum, sm, x));
  INVALID(FWD, "gamma|save_invrms|save_invstd", NULL, F(&D, x, res, y, sum, sm, gamma));
  /* CHECK_FINITE: every input scanned */
  dd = D, dd.flags = NORMA_CHECK_FINITE;
  set_nonfinite(dt, x, total - 1, 0);
  snap();
  NONFINITE(FWD, "x", F(&dd, x, res, y, sum, sm, si));
  tu_store(dt, x, total - 1, 0.5);
  set_nonfinite(dt, x, 7, 1);
  snap();
  NONFINITE(FWD, "x", F(&dd, x, res, y, sum, sm, si));
  tu_store(dt, x, 7, 0.25);
  set_nonfinite(dt, res, total - 1, 1);
  snap();
  NONFINITE(FWD, "residual", F(&dd, x, res, y, sum, sm, si));
  /* ... without residual, the NaN is not an input: success, sum untouched */
  EXPECT_SUCCESS(F(&dd, x, NULL, y, sum, sm, si));
  tu_check_poison("sum (no residual)", sum, tb + es);
  tu_poison(y, tb + es), tu_poison(sm, gb + 8), tu_poison(si, gb + 8);
  tu_store(dt, res, total - 1, 0.5);
  set_nonfinite(pt, gamma, d - 1, 0);
  snap();
  NONFINITE(FWD, "gamma", F(&dd, x, res, y, sum, sm, si));
  tu_pstore(dt, gamma, d - 1, 1.0);
  if (!rms) {
    set_nonfinite(pt, beta, 0, 1);
    snap();
    NONFINITE(FWD, "beta", F(&dd, x, res, y, sum, sm, si));
    /* ... without CHECK_FINITE it propagates: no error */
    EXPECT_SUCCESS(F(&D, x, res, y, sum, sm, si));
    tu_poison(y, tb + es), tu_poison(sum, tb + es), tu_poison(sm, gb + 8), tu_poison(si, gb + 8);
    tu_pstore(dt, beta, 0, 0.0);
  }

  /* ---- backward ---- */
  INVALID(BWD, "d", NULL, B(NULL, x, dy, dsum, smi, sii, dx, dg, dbt));
  INVALID(BWD, "x", NULL, B(&D, NULL, dy, dsum, smi, sii, dx, dg, dbt));
  INVALID(BWD, "dy", NULL, B(&D, x, NULL, dsum, smi, sii, dx, dg, dbt));
  if (!rms) INVALID(BWD, "save_mean", NULL, B(&D, x, dy, dsum, NULL, sii, dx, dg, dbt));
  INVALID(BWD, SI, NULL, B(&D, x, dy, dsum, smi, NULL, dx, dg, dbt));
  INVALID(BWD, "dx", NULL, B(&D, x, dy, dsum, smi, sii, NULL, dg, dbt));
  INVALID(BWD, "rows", "0", B(WITH(rows, 0), x, dy, dsum, smi, sii, dx, dg, dbt));
  INVALID(BWD, "d->d", "-2", B(WITH(d, -2), x, dy, dsum, smi, sii, dx, dg, dbt));
  INVALID(BWD, "dtype", "7", B(WITH(dtype, (norma_dtype)7), x, dy, dsum, smi, sii, dx, dg, dbt));
  INVALID(BWD, "eps", NULL, B(WITH(eps, -0.5), x, dy, dsum, smi, sii, dx, dg, dbt));
  INVALID(BWD, "eps", NULL, B(WITH(eps, NAN), x, dy, dsum, smi, sii, dx, dg, dbt));
  INVALID(BWD, "flags", NULL, B(WITH(flags, NORMA_RELU), x, dy, dsum, smi, sii, dx, dg, dbt));
  INVALID(BWD, "flags", NULL,
          B(WITH(flags, NORMA_BN_GLOBAL_STATS), x, dy, dsum, smi, sii, dx, dg, dbt));
  INVALID(BWD, "flags", NULL, B(WITH(flags, UNKNOWN1), x, dy, dsum, smi, sii, dx, dg, dbt));
  dd = D, dd.rows = (int64_t)1 << 62, dd.d = 4;
  INVALID(BWD, "rows|d->d|size|overflows", NULL, B(&dd, x, dy, dsum, smi, sii, dx, dg, dbt));
  INVALID(BWD, "dx|dy", NULL, B(&D, x, dy, dsum, smi, sii, (char *)dy + es, dg, dbt));
  INVALID(BWD, "dx|x", NULL, B(&D, x, dy, dsum, smi, sii, (char *)x + es, dg, dbt));
  INVALID(BWD, "dx|dgamma", NULL, B(&D, x, dy, dsum, smi, sii, dx, dx, dbt));
  INVALID(BWD, "dgamma|gamma", NULL, B(&D, x, dy, dsum, smi, sii, dx, gamma, dbt));
  INVALID(BWD, "dgamma|save_invrms|save_invstd", NULL, B(&D, x, dy, dsum, smi, sii, dx, sii, dbt));
  if (!rms) {
    INVALID(BWD, "dgamma|dbeta", NULL, B(&D, x, dy, dsum, smi, sii, dx, dg, dg));
    INVALID(BWD, "dgamma|dbeta", NULL, B(&D, x, dy, dsum, smi, sii, dx, dg, (char *)dg + 4));
    INVALID(BWD, "dbeta|save_mean", NULL, B(&D, x, dy, dsum, smi, sii, dx, dg, smi));
  }
  dd = D, dd.flags = NORMA_CHECK_FINITE;
  set_nonfinite(dt, x, total - 1, 1);
  snap();
  NONFINITE(BWD, "x", B(&dd, x, dy, dsum, smi, sii, dx, dg, dbt));
  tu_store(dt, x, total - 1, 0.5);
  set_nonfinite(dt, dy, 3, 0);
  snap();
  NONFINITE(BWD, "dy", B(&dd, x, dy, dsum, smi, sii, dx, dg, dbt));
  tu_store(dt, dy, 3, 0.5);
  set_nonfinite(dt, dsum, total - 1, 0);
  snap();
  NONFINITE(BWD, "dsum", B(&dd, x, dy, dsum, smi, sii, dx, dg, dbt));
  EXPECT_SUCCESS(B(&dd, x, dy, NULL, smi, sii, dx, dg, dbt)); /* dsum NULL: not scanned */
  tu_poison(dx, tb + es), tu_poison(dg, pb + 8), tu_poison(dbt, pb + 8);
  tu_store(dt, dsum, total - 1, 0.5);
  set_nonfinite(pt, gamma, 2, 1);
  snap();
  NONFINITE(BWD, "gamma", B(&dd, x, dy, dsum, smi, sii, dx, dg, dbt));
  tu_pstore(dt, gamma, 2, 1.0);
  if (!rms) {
    set_nonfinite(pt, smi, rows - 1, 0);
    snap();
    NONFINITE(BWD, "save_mean", B(&dd, x, dy, dsum, smi, sii, dx, dg, dbt));
    tu_pstore(dt, smi, rows - 1, 0.0);
  }
  set_nonfinite(pt, sii, 0, 0);
  snap();
  NONFINITE(BWD, SI, B(&dd, x, dy, dsum, smi, sii, dx, dg, dbt));
  tu_pstore(dt, sii, 0, 1.0);
#undef WITH
#undef F
#undef B
  clear_regs();
}

/* ================================ GroupNorm / InstanceNorm =============================== */

static void group_errors(int inorm, norma_dtype dt, norma_layout lay) {
  const int64_t n = 2, c = 6, s = 5, groups = inorm ? c : 3, total = n * c * s, ng = n * groups;
  const size_t es = tu_esize(dt), tb = total * es, pb = c * tu_psize(dt), gb = ng * tu_psize(dt);
  const norma_dtype pt = tu_ptype(dt);
  const char *FWD = inorm ? "norma_in_forward_training" : "norma_gn_forward";
  const char *BWD = inorm ? "norma_in_backward" : "norma_gn_backward";
  const char *INF = "norma_in_forward_inference";
  tu_rng r = tu_rng_make(31 + dt * 4 + lay * 2 + inorm);
  void *x = reg("x", tu_alloc(tb + es), tb + es), *dy = reg("dy", tu_alloc(tb + es), tb + es);
  void *yin = reg("y (input)", tu_alloc(tb + es), tb + es);
  void *gamma = reg("gamma", tu_alloc(pb + 8), pb + 8),
       *beta = reg("beta", tu_alloc(pb + 8), pb + 8);
  void *mean = reg("mean", tu_alloc(pb), pb), *var = reg("var", tu_alloc(pb), pb);
  void *smi = reg("save_mean (input)", tu_alloc(gb + 8), gb + 8);
  void *sii = reg("save_invstd (input)", tu_alloc(gb + 8), gb + 8);
  tu_fill_uniform(dt, x, total + 1, &r, -1, 1);
  tu_fill_uniform(dt, dy, total + 1, &r, -1, 1);
  tu_fill_uniform(dt, yin, total + 1, &r, -1, 1);
  tu_fill_param(dt, gamma, c + 1, &r, 0.5, 1.5);
  tu_fill_param(dt, beta, c + 1, &r, -1, 1);
  tu_fill_param(dt, mean, c, &r, -1, 1);
  tu_fill_param(dt, var, c, &r, 0.5, 2);
  tu_fill_param(dt, smi, ng + 1, &r, -1, 1);
  tu_fill_param(dt, sii, ng + 1, &r, 0.5, 2);
  void *y = reg("y", tu_poisoned(tb + es), tb + es);
  void *sm = reg("save_mean", tu_poisoned(gb + 8), gb + 8),
       *si = reg("save_invstd", tu_poisoned(gb + 8), gb + 8);
  void *rm = reg("running_mean", tu_alloc(pb + 8), pb + 8),
       *rv = reg("running_var", tu_alloc(pb), pb);
  tu_fill_param(dt, rm, c + 1, &r, -1, 1);
  tu_fill_param(dt, rv, c, &r, 0.5, 2);
  void *dx = reg("dx", tu_poisoned(tb + es), tb + es);
  void *dg = reg("dgamma", tu_poisoned(pb + 8), pb + 8),
       *dbt = reg("dbeta", tu_poisoned(pb + 8), pb + 8);
  const norma_gn_desc GD = {n, c, s, groups, lay, dt, 1e-5, 0};
  const norma_in_desc ID = {n, c, s, lay, dt, 1e-5, 0};
  norma_gn_desc gd;
  norma_in_desc id;
  const double mom = 0.1;
  /* one macro per call, the descriptor's field changed by `set` (a statement on gd / id) */
#define FD(set, xx, yy, m, s_, rmm, rvv, mo)                                                       \
  (gd = GD, id = ID, set,                                                                          \
   inorm ? norma_in_forward_training(&id, xx, gamma, beta, yy, m, s_, rmm, rvv, mo)                \
         : norma_gn_forward(&gd, xx, gamma, beta, yy, m, s_))
#define F(xx, yy, m, s_) FD((void)0, xx, yy, m, s_, rm, rv, mom)
#define BD(set, xx, yy, dd_, m, s_, ddx, g, b)                                                     \
  (gd = GD, id = ID, set,                                                                          \
   inorm ? norma_in_backward(&id, xx, yy, dd_, gamma, beta, m, s_, ddx, g, b)                      \
         : norma_gn_backward(&gd, xx, yy, dd_, gamma, beta, m, s_, ddx, g, b))
#define B(xx, yy, dd_, m, s_, ddx, g, b) BD((void)0, xx, yy, dd_, m, s_, ddx, g, b)
#define BOTH(field, val) (gd.field = (val), id.field = (val))

  /* ---- forward ---- */
  INVALID(FWD, "d", NULL,
          inorm ? norma_in_forward_training(NULL, x, gamma, beta, y, sm, si, rm, rv, mom)
                : norma_gn_forward(NULL, x, gamma, beta, y, sm, si));
  INVALID(FWD, "x", NULL, F(NULL, y, sm, si));
  INVALID(FWD, "y", NULL, F(x, NULL, sm, si));
  INVALID(FWD, "n", "0", FD(BOTH(n, 0), x, y, sm, si, rm, rv, mom));
  INVALID(FWD, "n", "-1", FD(BOTH(n, -1), x, y, sm, si, rm, rv, mom));
  INVALID(FWD, "c", "0", FD(BOTH(c, 0), x, y, sm, si, rm, rv, mom));
  INVALID(FWD, "c", "-6", FD(BOTH(c, -6), x, y, sm, si, rm, rv, mom));
  INVALID(FWD, "spatial", "0", FD(BOTH(spatial, 0), x, y, sm, si, rm, rv, mom));
  INVALID(FWD, "spatial", "-2", FD(BOTH(spatial, -2), x, y, sm, si, rm, rv, mom));
  if (!inorm) {
    INVALID(FWD, "groups", "0", FD(gd.groups = 0, x, y, sm, si, rm, rv, mom));
    INVALID(FWD, "groups", "-3", FD(gd.groups = -3, x, y, sm, si, rm, rv, mom));
    INVALID(FWD, "groups", "4",
            FD(gd.groups = 4, x, y, sm, si, rm, rv, mom)); /* 4 does not divide 6 */
    INVALID(FWD, "groups", "12", FD(gd.groups = 12, x, y, sm, si, rm, rv, mom)); /* more than c */
  } else {
    /* training needs more than one value per instance */
    INVALID(FWD, "spatial", "1", FD(id.spatial = 1, x, y, sm, si, rm, rv, mom));
  }
  INVALID(FWD, "layout", "2", FD(BOTH(layout, (norma_layout)2), x, y, sm, si, rm, rv, mom));
  INVALID(FWD, "layout", "-1", FD(BOTH(layout, (norma_layout)-1), x, y, sm, si, rm, rv, mom));
  INVALID(FWD, "dtype", "4", FD(BOTH(dtype, (norma_dtype)4), x, y, sm, si, rm, rv, mom));
  INVALID(FWD, "dtype", "-1", FD(BOTH(dtype, (norma_dtype)-1), x, y, sm, si, rm, rv, mom));
  INVALID(FWD, "eps", "-1", FD(BOTH(eps, -1.0), x, y, sm, si, rm, rv, mom));
  INVALID(FWD, "eps", NULL, FD(BOTH(eps, NAN), x, y, sm, si, rm, rv, mom));
  INVALID(FWD, "eps", NULL, FD(BOTH(eps, -INFINITY), x, y, sm, si, rm, rv, mom));
  INVALID(FWD, "eps", NULL, FD(BOTH(eps, INFINITY), x, y, sm, si, rm, rv, mom));
  INVALID(FWD, "flags", NULL, FD(BOTH(flags, UNKNOWN1), x, y, sm, si, rm, rv, mom));
  INVALID(FWD, "flags", NULL, FD(BOTH(flags, UNKNOWN2 | NORMA_RELU), x, y, sm, si, rm, rv, mom));
  INVALID(FWD, "flags", NULL, FD(BOTH(flags, NORMA_BN_ADD_RELU), x, y, sm, si, rm, rv, mom));
  INVALID(FWD, "flags", NULL, FD(BOTH(flags, NORMA_BN_GLOBAL_STATS), x, y, sm, si, rm, rv, mom));
  INVALID(FWD, "flags", NULL, FD(BOTH(flags, NORMA_BN_COUNT_WEIGHTED), x, y, sm, si, rm, rv, mom));
  if (!inorm) /* GroupNorm has no running statistics */
    INVALID(FWD, "flags", NULL,
            FD(gd.flags = NORMA_BN_BIASED_RUNNING_VAR, x, y, sm, si, rm, rv, mom));
  INVALID(FWD, "flags|NORMA_RELU|NORMA_SILU", NULL,
          FD(BOTH(flags, NORMA_RELU | NORMA_SILU), x, y, sm, si, rm, rv, mom));
  INVALID(FWD, "n|c|spatial|size|overflows", NULL,
          FD((BOTH(n, (int64_t)1 << 62), BOTH(c, 6), BOTH(spatial, 1)), x, y, sm, si, rm, rv, mom));
  INVALID(FWD, "n|c|spatial|size|overflows", NULL,
          FD((BOTH(n, (int64_t)1 << 31), BOTH(c, 6), BOTH(spatial, (int64_t)1 << 31)), x, y, sm, si,
             rm, rv, mom));
  INVALID(FWD, "n|c|spatial|size|overflows", NULL,
          FD((BOTH(n, INT64_MAX), BOTH(spatial, 2)), x, y, sm, si, rm, rv, mom));
  if (inorm) {
    INVALID(FWD, "momentum", "1.5", FD((void)0, x, y, sm, si, rm, rv, 1.5));
    INVALID(FWD, "momentum", "-0.25", FD((void)0, x, y, sm, si, rm, NULL, -0.25));
    INVALID(FWD, "momentum", NULL, FD((void)0, x, y, sm, si, NULL, rv, NAN));
    INVALID(FWD, "momentum", NULL, FD((void)0, x, y, sm, si, NULL, rv, INFINITY));
  }
  /* overlaps */
  INVALID(FWD, "y|x", NULL, F(x, (char *)x + es, sm, si));
  INVALID(FWD, "save_mean|save_invstd", NULL, F(x, y, sm, sm));
  INVALID(FWD, "save_mean|save_invstd", NULL, F(x, y, sm, (char *)sm + 4));
  INVALID(FWD, "save_mean|y", NULL, F(x, y, (char *)y + es, si));
  INVALID(FWD, "y|gamma", NULL, F(x, gamma, sm, si));
  INVALID(FWD, "save_invstd|beta", NULL, F(x, y, sm, beta));
  INVALID(FWD, "save_invstd|x", NULL, F(x, y, sm, x));
  if (inorm) {
    INVALID(FWD, "running_mean|running_var", NULL, FD((void)0, x, y, sm, si, rm, rm, mom));
    INVALID(FWD, "running_mean|running_var", NULL,
            FD((void)0, x, y, sm, si, rm, (char *)rm + 4, mom));
    INVALID(FWD, "running_mean|save_mean", NULL, FD((void)0, x, y, sm, si, sm, rv, mom));
    INVALID(FWD, "running_var|gamma", NULL, FD((void)0, x, y, sm, si, rm, gamma, mom));
  }
  /* CHECK_FINITE */
  set_nonfinite(dt, x, total - 1, 0);
  snap();
  NONFINITE(FWD, "x", FD(BOTH(flags, NORMA_CHECK_FINITE), x, y, sm, si, rm, rv, mom));
  tu_store(dt, x, total - 1, 0.5);
  set_nonfinite(dt, x, 9, 1);
  snap();
  NONFINITE(FWD, "x", FD(BOTH(flags, NORMA_CHECK_FINITE | NORMA_SILU), x, y, sm, si, rm, rv, mom));
  tu_store(dt, x, 9, 0.5);
  set_nonfinite(pt, gamma, c - 1, 1);
  snap();
  NONFINITE(FWD, "gamma", FD(BOTH(flags, NORMA_CHECK_FINITE), x, y, sm, si, rm, rv, mom));
  tu_pstore(dt, gamma, c - 1, 1.0);
  set_nonfinite(pt, beta, 0, 0);
  snap();
  NONFINITE(FWD, "beta",
            FD(BOTH(flags, NORMA_CHECK_FINITE | NORMA_RELU), x, y, sm, si, rm, rv, mom));
  tu_pstore(dt, beta, 0, 0.0);
  if (inorm) {
    set_nonfinite(pt, rm, 2, 0);
    snap();
    NONFINITE(FWD, "running_mean", FD(BOTH(flags, NORMA_CHECK_FINITE), x, y, sm, si, rm, rv, mom));
    tu_pstore(dt, rm, 2, 0.0);
    set_nonfinite(pt, rv, c - 1, 1);
    snap();
    NONFINITE(FWD, "running_var", FD(BOTH(flags, NORMA_CHECK_FINITE), x, y, sm, si, rm, rv, mom));
    tu_pstore(dt, rv, c - 1, 1.0);
    /* valid oddities: momentum out of range without running statistics */
    EXPECT_SUCCESS(FD((void)0, x, y, sm, si, NULL, NULL, 7.0));
    EXPECT_SUCCESS(FD((void)0, x, y, sm, si, NULL, NULL, NAN));
    tu_poison(y, tb + es), tu_poison(sm, gb + 8), tu_poison(si, gb + 8);
  }

  /* ---- InstanceNorm inference ---- */
  if (inorm) {
#define FI(set, xx, m, v, yy)                                                                      \
  (id = ID, set, norma_in_forward_inference(&id, xx, gamma, beta, m, v, yy))
    INVALID(INF, "d", NULL, norma_in_forward_inference(NULL, x, gamma, beta, mean, var, y));
    INVALID(INF, "x", NULL, FI((void)0, NULL, mean, var, y));
    INVALID(INF, "mean", NULL, FI((void)0, x, NULL, var, y));
    INVALID(INF, "var", NULL, FI((void)0, x, mean, NULL, y));
    INVALID(INF, "y", NULL, FI((void)0, x, mean, var, NULL));
    INVALID(INF, "n", "0", FI(id.n = 0, x, mean, var, y));
    INVALID(INF, "c", "-1", FI(id.c = -1, x, mean, var, y));
    INVALID(INF, "spatial", "0", FI(id.spatial = 0, x, mean, var, y));
    INVALID(INF, "layout", "3", FI(id.layout = (norma_layout)3, x, mean, var, y));
    INVALID(INF, "dtype", "5", FI(id.dtype = (norma_dtype)5, x, mean, var, y));
    INVALID(INF, "eps", NULL, FI(id.eps = -2.0, x, mean, var, y));
    INVALID(INF, "flags", NULL, FI(id.flags = NORMA_BN_ADD_RELU, x, mean, var, y));
    INVALID(INF, "flags", NULL, FI(id.flags = UNKNOWN1, x, mean, var, y));
    INVALID(INF, "flags|NORMA_RELU|NORMA_SILU", NULL,
            FI(id.flags = NORMA_RELU | NORMA_SILU, x, mean, var, y));
    INVALID(INF, "n|c|spatial|size|overflows", NULL,
            FI((id.n = (int64_t)1 << 62, id.spatial = 1), x, mean, var, y));
    INVALID(INF, "y|x", NULL, FI((void)0, x, mean, var, (char *)x + es));
    INVALID(INF, "y|mean", NULL, FI((void)0, x, mean, var, mean));
    INVALID(INF, "y|gamma", NULL, FI((void)0, x, mean, var, gamma));
    set_nonfinite(dt, x, total - 1, 1);
    snap();
    NONFINITE(INF, "x", FI(id.flags = NORMA_CHECK_FINITE, x, mean, var, y));
    tu_store(dt, x, total - 1, 0.5);
    set_nonfinite(pt, mean, 1, 0);
    snap();
    NONFINITE(INF, "mean", FI(id.flags = NORMA_CHECK_FINITE, x, mean, var, y));
    tu_pstore(dt, mean, 1, 0.0);
    set_nonfinite(pt, var, c - 1, 1);
    snap();
    NONFINITE(INF, "var", FI(id.flags = NORMA_CHECK_FINITE, x, mean, var, y));
    tu_pstore(dt, var, c - 1, 1.0);
    set_nonfinite(pt, gamma, 0, 0);
    snap();
    NONFINITE(INF, "gamma", FI(id.flags = NORMA_CHECK_FINITE, x, mean, var, y));
    tu_pstore(dt, gamma, 0, 1.0);
    set_nonfinite(pt, beta, 3, 1);
    snap();
    NONFINITE(INF, "beta", FI(id.flags = NORMA_CHECK_FINITE, x, mean, var, y));
    tu_pstore(dt, beta, 3, 0.0);
    /* spatial 1 is fine for inference (one value per instance, given statistics) */
    EXPECT_SUCCESS(FI((id.spatial = 1, id.n = 5), x, mean, var, y));
    tu_poison(y, tb + es);
#undef FI
  }

  /* ---- backward ---- */
  INVALID(BWD, "d", NULL,
          inorm ? norma_in_backward(NULL, x, yin, dy, gamma, beta, smi, sii, dx, dg, dbt)
                : norma_gn_backward(NULL, x, yin, dy, gamma, beta, smi, sii, dx, dg, dbt));
  INVALID(BWD, "x", NULL, B(NULL, yin, dy, smi, sii, dx, dg, dbt));
  INVALID(BWD, "dy", NULL, B(x, yin, NULL, smi, sii, dx, dg, dbt));
  INVALID(BWD, "save_mean", NULL, B(x, yin, dy, NULL, sii, dx, dg, dbt));
  INVALID(BWD, "save_invstd", NULL, B(x, yin, dy, smi, NULL, dx, dg, dbt));
  INVALID(BWD, "dx", NULL, B(x, yin, dy, smi, sii, NULL, dg, dbt));
  INVALID(BWD, "y", NULL, BD(BOTH(flags, NORMA_RELU), x, NULL, dy, smi, sii, dx, dg, dbt));
  INVALID(BWD, "n", "0", BD(BOTH(n, 0), x, yin, dy, smi, sii, dx, dg, dbt));
  INVALID(BWD, "c", "-1", BD(BOTH(c, -1), x, yin, dy, smi, sii, dx, dg, dbt));
  INVALID(BWD, "spatial", "0", BD(BOTH(spatial, 0), x, yin, dy, smi, sii, dx, dg, dbt));
  if (!inorm) {
    INVALID(BWD, "groups", "0", BD(gd.groups = 0, x, yin, dy, smi, sii, dx, dg, dbt));
    INVALID(BWD, "groups", "5", BD(gd.groups = 5, x, yin, dy, smi, sii, dx, dg, dbt));
  }
  INVALID(BWD, "layout", "2", BD(BOTH(layout, (norma_layout)2), x, yin, dy, smi, sii, dx, dg, dbt));
  INVALID(BWD, "dtype", "4", BD(BOTH(dtype, (norma_dtype)4), x, yin, dy, smi, sii, dx, dg, dbt));
  INVALID(BWD, "eps", NULL, BD(BOTH(eps, -1e-3), x, yin, dy, smi, sii, dx, dg, dbt));
  INVALID(BWD, "flags", NULL,
          BD(BOTH(flags, NORMA_BN_ADD_RELU), x, yin, dy, smi, sii, dx, dg, dbt));
  INVALID(BWD, "flags", NULL,
          BD(BOTH(flags, NORMA_BN_GLOBAL_STATS), x, yin, dy, smi, sii, dx, dg, dbt));
  INVALID(BWD, "flags", NULL, BD(BOTH(flags, UNKNOWN2), x, yin, dy, smi, sii, dx, dg, dbt));
  INVALID(BWD, "flags|NORMA_RELU|NORMA_SILU", NULL,
          BD(BOTH(flags, NORMA_RELU | NORMA_SILU), x, yin, dy, smi, sii, dx, dg, dbt));
  INVALID(BWD, "n|c|spatial|size|overflows", NULL,
          BD((BOTH(n, (int64_t)1 << 62), BOTH(spatial, 1)), x, yin, dy, smi, sii, dx, dg, dbt));
  INVALID(BWD, "dx|dy", NULL, B(x, yin, dy, smi, sii, (char *)dy + es, dg, dbt));
  INVALID(BWD, "dx|x", NULL, B(x, yin, dy, smi, sii, (char *)x + es, dg, dbt));
  INVALID(BWD, "dx|y", NULL,
          BD(BOTH(flags, NORMA_RELU), x, yin, dy, smi, sii, (char *)yin + es, dg, dbt));
  INVALID(BWD, "dgamma|dbeta", NULL, B(x, yin, dy, smi, sii, dx, dg, dg));
  INVALID(BWD, "dgamma|dbeta", NULL, B(x, yin, dy, smi, sii, dx, dg, (char *)dg + 4));
  INVALID(BWD, "dgamma|gamma", NULL, B(x, yin, dy, smi, sii, dx, gamma, dbt));
  INVALID(BWD, "dbeta|beta", NULL, B(x, yin, dy, smi, sii, dx, dg, beta));
  INVALID(BWD, "dgamma|save_mean", NULL, B(x, yin, dy, smi, sii, dx, smi, dbt));
  INVALID(BWD, "dx|dgamma", NULL, B(x, yin, dy, smi, sii, dx, (char *)dx + es, dbt));
  /* CHECK_FINITE */
  set_nonfinite(dt, x, total - 1, 0);
  snap();
  NONFINITE(BWD, "x", BD(BOTH(flags, NORMA_CHECK_FINITE), x, yin, dy, smi, sii, dx, dg, dbt));
  tu_store(dt, x, total - 1, 0.5);
  set_nonfinite(dt, dy, 4, 1);
  snap();
  NONFINITE(BWD, "dy",
            BD(BOTH(flags, NORMA_CHECK_FINITE | NORMA_SILU), x, yin, dy, smi, sii, dx, dg, dbt));
  tu_store(dt, dy, 4, 0.5);
  set_nonfinite(dt, yin, total - 1, 0);
  snap();
  NONFINITE(BWD, "y",
            BD(BOTH(flags, NORMA_CHECK_FINITE | NORMA_RELU), x, yin, dy, smi, sii, dx, dg, dbt));
  /* ... y is not an input without RELU: its NaN is ignored */
  EXPECT_SUCCESS(BD(BOTH(flags, NORMA_CHECK_FINITE), x, yin, dy, smi, sii, dx, dg, dbt));
  EXPECT_SUCCESS(
      BD(BOTH(flags, NORMA_CHECK_FINITE | NORMA_SILU), x, NULL, dy, smi, sii, dx, dg, dbt));
  tu_poison(dx, tb + es), tu_poison(dg, pb + 8), tu_poison(dbt, pb + 8);
  tu_store(dt, yin, total - 1, 0.5);
  set_nonfinite(pt, gamma, 1, 0);
  snap();
  NONFINITE(BWD, "gamma", BD(BOTH(flags, NORMA_CHECK_FINITE), x, yin, dy, smi, sii, dx, dg, dbt));
  tu_pstore(dt, gamma, 1, 1.0);
  set_nonfinite(pt, beta, c - 1, 1);
  snap();
  NONFINITE(BWD, "beta",
            BD(BOTH(flags, NORMA_CHECK_FINITE | NORMA_SILU), x, yin, dy, smi, sii, dx, dg, dbt));
  tu_pstore(dt, beta, c - 1, 0.0);
  set_nonfinite(pt, smi, ng - 1, 0);
  snap();
  NONFINITE(BWD, "save_mean",
            BD(BOTH(flags, NORMA_CHECK_FINITE), x, yin, dy, smi, sii, dx, dg, dbt));
  tu_pstore(dt, smi, ng - 1, 0.0);
  set_nonfinite(pt, sii, 0, 1);
  snap();
  NONFINITE(BWD, "save_invstd",
            BD(BOTH(flags, NORMA_CHECK_FINITE), x, yin, dy, smi, sii, dx, dg, dbt));
  tu_pstore(dt, sii, 0, 1.0);
#undef FD
#undef F
#undef BD
#undef B
#undef BOTH
  clear_regs();
}

int main(void) {
  for (int ref = 0; ref < 2; ref++)
    for (int t = 0; t < 4; t++) {
      const norma_dtype dt = TN_DTS[t];
      norma_set_use_reference(ref);
      for (int rms = 0; rms < 2; rms++) {
        tu_set_ctx("%s %s %s", ref ? "ref" : "prod", rms ? "RMSNorm" : "LayerNorm", tu_dt_name(dt));
        row_errors(rms, dt);
      }
      for (int inorm = 0; inorm < 2; inorm++)
        for (int l = 0; l < 2; l++) {
          tu_set_ctx("%s %s %s %s", ref ? "ref" : "prod", inorm ? "InstanceNorm" : "GroupNorm",
                     tu_dt_name(dt), tu_layout_name((norma_layout)l));
          group_errors(inorm, dt, (norma_layout)l);
        }
    }
  norma_set_use_reference(0);
  return tu_finish("test_norm_errors");
}
