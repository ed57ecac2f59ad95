/* fuzz_gn_backward.c - norma_gn_backward against norma.h (fuzz_norms.h): y required with
   NORMA_RELU (the mask), not read otherwise; dx may alias dy or x. */
#include "fuzz_norms.h"

enum { X, Y, DY, GAMMA, BETA, SMEAN, SINV, DX, DGAMMA, DBETA, NARGS };
static const int pairs[][2] = {{DX, DY}, {DX, X}, {DX, Y}};

static norma_status call(fz_case *k) {
  const fz_gn *g = k->ctx;
  fz_arg *a = k->a;
  return norma_gn_backward(fz_gn_ptr(g), a[X].p, a[Y].p, a[DY].p, a[GAMMA].p, a[BETA].p,
                           a[SMEAN].p, a[SINV].p, a[DX].p, a[DGAMMA].p, a[DBETA].p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz r = {data, size};
  fz_settings(&r);
  fz_gn g;
  fz_gn_make(&r, &g, 0, 0, 8);
  const int relu = (g.d.flags & NORMA_RELU) != 0;
  fz_arg a[NARGS] = {
      {"x", FZ_IN, FZ_TENSOR, FZ_REQ, 1, g.T, 0, 0, 0},
      {"y", FZ_IN, FZ_TENSOR, relu ? FZ_REQ : FZ_IGN, 1, g.T, 0, 0, 0},
      {"dy", FZ_IN, FZ_TENSOR, FZ_REQ, 1, g.T, 0, 0, 0},
      {"gamma", FZ_IN, FZ_PARAM, FZ_OPT, 1, g.C, 0, 0, 0},
      {"beta", FZ_IN, FZ_PARAM, FZ_OPT, 1, g.C, 0, 0, 0},
      {"save_mean", FZ_IN, FZ_PARAM, FZ_REQ, 1, g.S, 0, 0, 0},
      {"save_invstd", FZ_IN, FZ_PARAM, FZ_REQ, 1, g.S, 0, 0, 0},
      {"dx", FZ_OUT, FZ_TENSOR, FZ_REQ, 0, g.T, 0, 0, 0},
      {"dgamma", FZ_OUT, FZ_PARAM, FZ_OPT, 0, g.C, 0, 0, 0},
      {"dbeta", FZ_OUT, FZ_PARAM, FZ_OPT, 0, g.C, 0, 0, 0},
  };
  fz_case k = {.ctx = &g, .pairs = pairs, .npairs = FZ_NPAIRS(pairs)};
  if (!fz_setup(&r, &k, a, NARGS, g.d.dtype, g.sizes_ok)) return 0;
  if (g.force_null) a[DY].p = NULL;
  const norma_status want =
      fz_expect(&k, !g.valid || !a[DY].p, (g.d.flags & NORMA_CHECK_FINITE) != 0);
  fz_check(&k, call(&k), want, call);
  fz_free(&k);
  return 0;
}
