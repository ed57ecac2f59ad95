/* fuzz_bn_backward.c - norma_bn_backward against norma.h (fuzz_common.h). */
#include "fuzz_common.h"

enum { X, Y, DY, GAMMA, BETA, SMEAN, SINV, DX, DRES, DGAMMA, DBETA, NARGS };

static norma_status call(fz_case *k) {
  const fz_bn *b = k->ctx;
  fz_arg *a = k->a;
  return norma_bn_backward(fz_bn_ptr(b), a[X].p, a[Y].p, a[DY].p, a[GAMMA].p, a[BETA].p,
                           a[SMEAN].p, a[SINV].p, a[DX].p, a[DRES].p, a[DGAMMA].p, a[DBETA].p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz r = {data, size};
  fz_settings(&r);
  fz_bn b;
  fz_bn_make(&r, &b, 1, FZ_TRAIN_UNLESS_GLOBAL, 8);
  const int act = fz_act(&b), add = (b.d.flags & NORMA_BN_ADD_RELU) != 0;
  /* without an activation x may be NULL when y is given (x_hat from y); y is read only then */
  const int x_absent = !act && fz_u8(&r) >= 192;
  fz_arg a[NARGS] = {
      {"x", FZ_IN, FZ_TENSOR, x_absent ? FZ_IGN : act ? FZ_REQ : FZ_KEEP, 1, b.T, 0, 0, 0},
      {"y", FZ_IN, FZ_TENSOR, act || x_absent ? FZ_REQ : FZ_IGN, 1, b.T, 0, 0, 0},
      {"dy", FZ_IN, FZ_TENSOR, FZ_REQ, 1, b.T, 0, 0, 0},
      {"gamma", FZ_IN, FZ_PARAM, FZ_OPT, 1, b.C, 0, 0, 0},
      {"beta", FZ_IN, FZ_PARAM, FZ_OPT, 1, b.C, 0, 0, 0},
      {"save_mean", FZ_IN, FZ_PARAM, FZ_REQ, 1, b.C, 0, 0, 0},
      {"save_invstd", FZ_IN, FZ_PARAM, FZ_REQ, 1, b.C, 0, 0, 0},
      {"dx", FZ_OUT, FZ_TENSOR, FZ_REQ, 0, b.T, 0, 0, 0},
      {"dresidual", FZ_OUT, FZ_TENSOR, add ? FZ_OPT : FZ_IGN, 0, b.T, 0, 0, 0},
      {"dgamma", FZ_OUT, FZ_PARAM, FZ_OPT, 0, b.C, 0, 0, 0},
      {"dbeta", FZ_OUT, FZ_PARAM, FZ_OPT, 0, b.C, 0, 0, 0},
  };
  fz_case k = {.ctx = &b};
  if (!fz_setup(&r, &k, a, NARGS, b.d.dtype, b.sizes_ok)) return 0;
  if (x_absent) a[X].p = NULL;
  if (b.force_null) a[DY].p = NULL;
  /* gamma == 0 in a channel cannot give x_hat back from y */
  const int zero_gamma = b.valid && b.sizes_ok && x_absent && a[Y].p &&
                         fz_any_zero_param(b.d.dtype, a[GAMMA].p, b.C);
  const norma_status want = fz_expect(&k, !b.valid || !a[DY].p || zero_gamma,
                                      (b.d.flags & NORMA_CHECK_FINITE) != 0);
  fz_check(&k, call(&k), want, call);
  fz_free(&k);
  return 0;
}
