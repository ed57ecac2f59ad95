/* fuzz_bn_forward_apply.c - norma_bn_forward_apply against norma.h (fuzz_common.h). */
#include "fuzz_common.h"

enum { X, RES, GAMMA, BETA, MEAN, INV, Y, NARGS };

static norma_status call(fz_case *k) {
  const fz_bn *b = k->ctx;
  fz_arg *a = k->a;
  return norma_bn_forward_apply(fz_bn_ptr(b), a[X].p, a[RES].p, a[GAMMA].p, a[BETA].p,
                                a[MEAN].p, a[INV].p, a[Y].p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz r = {data, size};
  fz_settings(&r);
  fz_bn b;
  fz_bn_make(&r, &b, 0, FZ_TRAIN_NO, 8);
  /* n == 0: nothing to do; only d, mean and invstd are checked */
  const int has = b.d.n > 0, add = (b.d.flags & NORMA_BN_ADD_RELU) != 0;
  const int t = has ? FZ_REQ : FZ_IGN;
  fz_arg a[NARGS] = {
      {"x", FZ_IN, FZ_TENSOR, t, 1, b.T, 0, 0, 0},
      {"residual", FZ_IN, FZ_TENSOR, has && add ? FZ_REQ : FZ_IGN, 1, b.T, 0, 0, 0},
      {"gamma", FZ_IN, FZ_PARAM, has ? FZ_OPT : FZ_IGN, 1, b.C, 0, 0, 0},
      {"beta", FZ_IN, FZ_PARAM, has ? FZ_OPT : FZ_IGN, 1, b.C, 0, 0, 0},
      {"mean", FZ_IN, FZ_F64, FZ_REQ, 0, b.C, 0, 0, 0},
      {"invstd", FZ_IN, FZ_F64, FZ_REQ, 0, b.C, 0, 0, 0},
      {"y", FZ_OUT, FZ_TENSOR, t, 0, b.T, 0, 0, 0},
  };
  fz_case k = {.ctx = &b};
  if (!fz_setup(&r, &k, a, NARGS, b.d.dtype, b.sizes_ok)) return 0;
  if (b.force_null) a[MEAN].p = NULL;
  const norma_status want = fz_expect(&k, !b.valid || !a[MEAN].p,
                                      (b.d.flags & NORMA_CHECK_FINITE) != 0);
  fz_check(&k, call(&k), want, call);
  fz_free(&k);
  return 0;
}
