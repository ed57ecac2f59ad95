/* test_adjacent.c - an output placed right after an input gives the results of separate
 * buffers.  In the caches, channels-last BatchNorm gives thread 0 the first and the last share
 * of the rows when an output begins just past the end of an input (engine.c,
 * out_follows_input), instead of contiguous shares: every segment's partials and every row's
 * values must stay what they were.  For f32 and bf16, 1 and 2 threads, plain, ReLU and
 * residual + ReLU, the training forward (y after x, y after the residual) and the backward (dx
 * after dy, dx after x, dresidual after dx) are run with the outputs at the end of one buffer
 * holding the inputs, and compared bit for bit with the same calls on separate buffers; the
 * forward's y is also checked against the reference kernels (NORMA_USE_REFERENCE through
 * norma_set_use_reference), within the usual rounding.  Every output starts poisoned.  Shapes:
 * rows that make 4 segments, 2 segments and 1 (the channels split then, and the shares stay
 * contiguous), a tail of 17 channels, and a call small enough to run on one thread.
 */
#include "test_util.h"

#define EXPECT_OK(st, what)                                                                    \
  TU_CHECK((st) == NORMA_OK, "[%s] %s returned %s: %s", tu_ctx, what, norma_status_string(st), \
           norma_last_error())

typedef struct shape {
  int64_t n, c, s;
} shape;

static int same(const void *a, const void *b, size_t bytes) { return memcmp(a, b, bytes) == 0; }

/* one case: the forward and the backward on separate buffers, then with outputs adjacent */
static void run_case(shape sh, norma_dtype dt, unsigned flags, int threads) {
  const int64_t total = sh.n * sh.c * sh.s, c = sh.c;
  const size_t tb = (size_t)total * tu_esize(dt), pb = (size_t)c * tu_psize(dt);
  tu_set_ctx("%s %lldx%lldx%lld flags %u threads %d", tu_dt_name(dt), (long long)sh.n,
             (long long)sh.c, (long long)sh.s, flags, threads);
  norma_set_num_threads(threads);
  const norma_bn_desc d = {sh.n, c, sh.s, NORMA_CHANNELS_LAST, dt, 1e-5, flags};
  const int add = (flags & NORMA_BN_ADD_RELU) != 0;
  tu_rng r = tu_rng_make(1234 + (uint64_t)c);
  /* one buffer: x | res | y (forward), then dy | dx | dres (backward), each right after the
     last (the sizes are multiples of the element size only: no padding) */
  char *fb = tu_poisoned(3 * tb + 64), *bb = tu_poisoned(3 * tb + 64); /* outputs poisoned */
  void *x = fb, *res = fb + tb, *y = add ? fb + 2 * tb : fb + tb;
  void *dy = bb, *dx = bb + tb, *dres = bb + 2 * tb;
  tu_fill_uniform(dt, x, total, &r, -2.0, 3.0);
  if (add) tu_fill_uniform(dt, res, total, &r, -1.0, 1.0); /* else y's slot: left poisoned */
  tu_fill_uniform(dt, dy, total, &r, -1.0, 1.0);
  void *gamma = tu_alloc(pb), *beta = tu_alloc(pb);
  tu_fill_param(dt, gamma, c, &r, 0.5, 1.5);
  tu_fill_param(dt, beta, c, &r, -0.5, 0.5);
  /* separate copies of the inputs, and separate outputs */
  void *xs = tu_dup(x, tb), *rs = tu_dup(res, tb), *dys = tu_dup(dy, tb);
  void *ys = tu_poisoned(tb), *dxs = tu_poisoned(tb), *drs = tu_poisoned(tb);
  void *sm[2], *si[2], *dg[2], *db[2];
  for (int k = 0; k < 2; k++)
    sm[k] = tu_alloc(pb), si[k] = tu_alloc(pb), dg[k] = tu_alloc(pb), db[k] = tu_alloc(pb);

  EXPECT_OK(norma_bn_forward_training(&d, xs, add ? rs : NULL, gamma, beta, ys, sm[0], si[0],
                                      NULL, NULL, 0.1),
            "forward (separate)");
  EXPECT_OK(norma_bn_forward_training(&d, x, add ? res : NULL, gamma, beta, y, sm[1], si[1],
                                      NULL, NULL, 0.1),
            "forward (adjacent)");
  TU_CHECK(same(ys, y, tb), "[%s] forward y differs with y after %s", tu_ctx,
           add ? "residual" : "x");
  TU_CHECK(same(sm[0], sm[1], pb) && same(si[0], si[1], pb), "[%s] save_mean / save_invstd differ",
           tu_ctx);

  const int masked = (flags & (NORMA_BN_RELU | NORMA_BN_ADD_RELU)) != 0;
  EXPECT_OK(norma_bn_backward(&d, xs, masked ? ys : NULL, dys, gamma, beta, sm[0], si[0], dxs,
                              add ? drs : NULL, dg[0], db[0]),
            "backward (separate)");
  EXPECT_OK(norma_bn_backward(&d, x, masked ? y : NULL, dy, gamma, beta, sm[1], si[1], dx,
                              add ? dres : NULL, dg[1], db[1]),
            "backward (adjacent)");
  TU_CHECK(same(dxs, dx, tb), "[%s] backward dx differs with dx after dy", tu_ctx);
  if (add) TU_CHECK(same(drs, dres, tb), "[%s] dresidual differs with it after dx", tu_ctx);
  TU_CHECK(same(dg[0], dg[1], pb) && same(db[0], db[1], pb), "[%s] dgamma / dbeta differ", tu_ctx);

  /* dx right after x: the forward's buffer again, its third slot when there is no residual */
  if (!add) {
    void *dx2 = fb + 2 * tb;
    EXPECT_OK(norma_bn_backward(&d, x, masked ? y : NULL, dys, gamma, beta, sm[1], si[1], dx2,
                                NULL, NULL, NULL),
              "backward (dx after y)");
    TU_CHECK(same(dxs, dx2, tb), "[%s] backward dx differs with dx after y", tu_ctx);
  }

  /* the forward's y against the reference kernels */
  norma_set_use_reference(1);
  void *yr = tu_poisoned(tb);
  EXPECT_OK(norma_bn_forward_training(&d, xs, add ? rs : NULL, gamma, beta, yr, sm[0], si[0],
                                      NULL, NULL, 0.1),
            "forward (reference)");
  norma_set_use_reference(0);
  int64_t bad = 0;
  const double tol = dt == NORMA_F32 ? 1e-5 : 2e-2;
  for (int64_t i = 0; i < total; i++) {
    const double a = tu_load(dt, y, i), b = tu_load(dt, yr, i);
    if (!(fabs(a - b) <= tol * (1.0 + fabs(b)))) bad++;
  }
  TU_CHECK(bad == 0, "[%s] %lld values of y off the reference", tu_ctx, (long long)bad);

  free(yr);
  for (int k = 0; k < 2; k++) free(sm[k]), free(si[k]), free(dg[k]), free(db[k]);
  free(xs), free(rs), free(dys), free(ys), free(dxs), free(drs), free(gamma), free(beta);
  free(fb), free(bb);
}

int main(void) {
  static const shape shapes[] = {
      {1, 256, 576},  /* 576 rows: 4 segments */
      {4, 720, 49},   /* 196 rows: 2 segments */
      {1, 1280, 81},  /* 81 rows: 1 segment, the channels split */
      {3, 17, 4107},  /* 12321 rows of 17 channels */
      {4, 64, 513},   /* 2052 rows of 64 */
      {2, 24, 25},    /* small: one thread */
  };
  static const norma_dtype dts[] = {NORMA_F32, NORMA_BF16};
  static const unsigned flagss[] = {0, NORMA_BN_RELU, NORMA_BN_ADD_RELU};
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
    for (size_t di = 0; di < sizeof dts / sizeof dts[0]; di++)
      for (size_t fi = 0; fi < sizeof flagss / sizeof flagss[0]; fi++)
        for (int th = 1; th <= 2; th++) run_case(shapes[si], dts[di], flagss[fi], th);
  norma_set_num_threads(0);
  return tu_finish("test_adjacent");
}
