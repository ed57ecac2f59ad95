/* fuzz_bn_backward_reduce.c - norma_bn_backward_reduce against norma.h (fuzz_common.h). */
#include "fuzz_common.h"

enum { X, Y, DY, GAMMA, BETA, MEAN, INV, SDY, SDYX, SX, NARGS };

static norma_status call(fz_case *k) {
  const fz_bn *b = k->ctx;
  fz_arg *a = k->a;
  return norma_bn_backward_reduce(fz_bn_ptr(b), a[X].p, a[Y].p, a[DY].p, a[GAMMA].p, a[BETA].p,
                                  a[MEAN].p, a[INV].p, a[SDY].p, a[SDYX].p, a[SX].p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz r = {data, size};
  fz_settings(&r);
  fz_bn b;
  fz_bn_make(&r, &b, 0, FZ_TRAIN_NO, 8);
  const int has = b.d.n > 0, act = fz_act(&b);
  const int x_absent = has && !act && fz_u8(&r) >= 192;
  fz_arg a[NARGS] = {
      {"x", FZ_IN, FZ_TENSOR, !has || x_absent ? FZ_IGN : act ? FZ_REQ : FZ_KEEP, 1, b.T, 0, 0, 0},
      {"y", FZ_IN, FZ_TENSOR, has && (act || x_absent) ? FZ_REQ : FZ_IGN, 1, b.T, 0, 0, 0},
      {"dy", FZ_IN, FZ_TENSOR, has ? FZ_REQ : FZ_IGN, 1, b.T, 0, 0, 0},
      {"gamma", FZ_IN, FZ_PARAM, FZ_OPT, 0, b.C, 0, 0, 0},
      {"beta", FZ_IN, FZ_PARAM, FZ_OPT, 0, b.C, 0, 0, 0},
      {"mean", FZ_IN, FZ_F64, FZ_REQ, 0, b.C, 0, 0, 0},
      {"invstd", FZ_IN, FZ_F64, FZ_REQ, 0, b.C, 0, 0, 0},
      {"sum_dy", FZ_OUT, FZ_F64, FZ_REQ, 0, b.C, 0, 0, 0},
      {"sum_dy_xhat", FZ_OUT, FZ_F64, FZ_REQ, 0, b.C, 0, 0, 0},
      {"sum_xhat", FZ_OUT, FZ_F64, FZ_OPT, 0, b.C, 0, 0, 0},
  };
  fz_case k = {.ctx = &b};
  if (!fz_setup(&r, &k, a, NARGS, b.d.dtype, b.sizes_ok)) return 0;
  if (x_absent || !has) a[X].p = NULL;
  if (b.force_null) a[MEAN].p = NULL;
  const int zero_gamma = b.valid && b.sizes_ok && x_absent && a[Y].p &&
                         fz_any_zero_param(b.d.dtype, a[GAMMA].p, b.C);
  const norma_status want = fz_expect(&k, !b.valid || !a[MEAN].p || zero_gamma,
                                      (b.d.flags & NORMA_CHECK_FINITE) != 0);
  fz_check(&k, call(&k), want, call);
  fz_free(&k);
  return 0;
}
