/* fuzz_ln_backward.c - norma_ln_backward against norma.h (fuzz_norms.h): dx may alias dy, x or
   dsum. */
#include "fuzz_norms.h"

enum { X, DY, DSUM, GAMMA, SMEAN, SINV, DX, DGAMMA, DBETA, NARGS };
static const int pairs[][2] = {{DX, DY}, {DX, X}, {DX, DSUM}};

static norma_status call(fz_case *k) {
  const fz_ln *l = k->ctx;
  fz_arg *a = k->a;
  return norma_ln_backward(fz_ln_ptr(l), a[X].p, a[DY].p, a[DSUM].p, a[GAMMA].p, a[SMEAN].p,
                           a[SINV].p, a[DX].p, a[DGAMMA].p, a[DBETA].p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz r = {data, size};
  fz_settings(&r);
  fz_ln l;
  fz_ln_make(&r, &l, 8);
  fz_arg a[NARGS] = {
      {"x", FZ_IN, FZ_TENSOR, FZ_REQ, 1, l.T, 0, 0, 0},
      {"dy", FZ_IN, FZ_TENSOR, FZ_REQ, 1, l.T, 0, 0, 0},
      {"dsum", FZ_IN, FZ_TENSOR, FZ_OPT, 1, l.T, 0, 0, 0},
      {"gamma", FZ_IN, FZ_PARAM, FZ_OPT, 1, l.D, 0, 0, 0},
      {"save_mean", FZ_IN, FZ_PARAM, FZ_REQ, 1, l.R, 0, 0, 0},
      {"save_invstd", FZ_IN, FZ_PARAM, FZ_REQ, 1, l.R, 0, 0, 0},
      {"dx", FZ_OUT, FZ_TENSOR, FZ_REQ, 0, l.T, 0, 0, 0},
      {"dgamma", FZ_OUT, FZ_PARAM, FZ_OPT, 0, l.D, 0, 0, 0},
      {"dbeta", FZ_OUT, FZ_PARAM, FZ_OPT, 0, l.D, 0, 0, 0},
  };
  fz_case k = {.ctx = &l, .pairs = pairs, .npairs = FZ_NPAIRS(pairs)};
  if (!fz_setup(&r, &k, a, NARGS, l.d.dtype, l.sizes_ok)) return 0;
  if (l.force_null) a[DY].p = NULL;
  const norma_status want =
      fz_expect(&k, !l.valid || !a[DY].p, (l.d.flags & NORMA_CHECK_FINITE) != 0);
  fz_check(&k, call(&k), want, call);
  fz_free(&k);
  return 0;
}
