/* fuzz_in_forward_training.c - norma_in_forward_training against norma.h (fuzz_norms.h):
   spatial >= 2, running statistics, momentum in [0, 1] when one is given. */
#include "fuzz_norms.h"

typedef struct ctx {
  fz_gn g;
  norma_in_desc d;
  double momentum;
} ctx;

enum { X, GAMMA, BETA, Y, SMEAN, SINV, RMEAN, RVAR, NARGS };
static const int pairs[][2] = {{Y, X}};

static norma_status call(fz_case *k) {
  const ctx *c = k->ctx;
  fz_arg *a = k->a;
  return norma_in_forward_training(c->g.present ? &c->d : NULL, a[X].p, a[GAMMA].p, a[BETA].p,
                                   a[Y].p, a[SMEAN].p, a[SINV].p, a[RMEAN].p, a[RVAR].p,
                                   c->momentum);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz r = {data, size};
  fz_settings(&r);
  ctx c;
  fz_gn_make(&r, &c.g, 1, 1, 8);
  c.d = fz_in_desc(&c.g);
  c.momentum = fz_momentum(&r);
  const fz_gn *g = &c.g;
  fz_arg a[NARGS] = {
      {"x", FZ_IN, FZ_TENSOR, FZ_REQ, 1, g->T, 0, 0, 0},
      {"gamma", FZ_IN, FZ_PARAM, FZ_OPT, 1, g->C, 0, 0, 0},
      {"beta", FZ_IN, FZ_PARAM, FZ_OPT, 1, g->C, 0, 0, 0},
      {"y", FZ_OUT, FZ_TENSOR, FZ_REQ, 0, g->T, 0, 0, 0},
      {"save_mean", FZ_OUT, FZ_PARAM, FZ_OPT, 0, g->S, 0, 0, 0},
      {"save_invstd", FZ_OUT, FZ_PARAM, FZ_OPT, 0, g->S, 0, 0, 0},
      {"running_mean", FZ_INOUT, FZ_PARAM, FZ_OPT, 1, g->C, 0, 0, 0},
      {"running_var", FZ_INOUT, FZ_PARAM, FZ_OPT, 1, g->C, 0, 0, 0},
  };
  fz_case k = {.ctx = &c, .pairs = pairs, .npairs = FZ_NPAIRS(pairs)};
  if (!fz_setup(&r, &k, a, NARGS, g->d.dtype, g->sizes_ok)) return 0;
  if (g->force_null) a[X].p = NULL;
  const int bad_momentum = (a[RMEAN].p || a[RVAR].p) && fz_momentum_bad(c.momentum);
  const norma_status want = fz_expect(&k, !g->valid || !a[X].p || bad_momentum,
                                      (g->d.flags & NORMA_CHECK_FINITE) != 0);
  fz_check(&k, call(&k), want, call);
  fz_free(&k);
  return 0;
}
