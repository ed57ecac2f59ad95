/* fuzz_gn_forward.c - norma_gn_forward against norma.h (fuzz_norms.h): groups, activations. */
#include "fuzz_norms.h"

enum { X, GAMMA, BETA, Y, SMEAN, SINV, NARGS };
static const int pairs[][2] = {{Y, X}};

static norma_status call(fz_case *k) {
  const fz_gn *g = k->ctx;
  fz_arg *a = k->a;
  return norma_gn_forward(fz_gn_ptr(g), a[X].p, a[GAMMA].p, a[BETA].p, a[Y].p, a[SMEAN].p,
                          a[SINV].p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz r = {data, size};
  fz_settings(&r);
  fz_gn g;
  fz_gn_make(&r, &g, 0, 0, 8);
  fz_arg a[NARGS] = {
      {"x", FZ_IN, FZ_TENSOR, FZ_REQ, 1, g.T, 0, 0, 0},
      {"gamma", FZ_IN, FZ_PARAM, FZ_OPT, 1, g.C, 0, 0, 0},
      {"beta", FZ_IN, FZ_PARAM, FZ_OPT, 1, g.C, 0, 0, 0},
      {"y", FZ_OUT, FZ_TENSOR, FZ_REQ, 0, g.T, 0, 0, 0},
      {"save_mean", FZ_OUT, FZ_PARAM, FZ_OPT, 0, g.S, 0, 0, 0},
      {"save_invstd", FZ_OUT, FZ_PARAM, FZ_OPT, 0, g.S, 0, 0, 0},
  };
  fz_case k = {.ctx = &g, .pairs = pairs, .npairs = FZ_NPAIRS(pairs)};
  if (!fz_setup(&r, &k, a, NARGS, g.d.dtype, g.sizes_ok)) return 0;
  if (g.force_null) a[X].p = NULL;
  const norma_status want =
      fz_expect(&k, !g.valid || !a[X].p, (g.d.flags & NORMA_CHECK_FINITE) != 0);
  fz_check(&k, call(&k), want, call);
  fz_free(&k);
  return 0;
}
