/* fuzz_in_forward_inference.c - norma_in_forward_inference against norma.h (fuzz_norms.h):
   given per-channel statistics, spatial == 1 allowed. */
#include "fuzz_norms.h"

typedef struct ctx {
  fz_gn g;
  norma_in_desc d;
} ctx;

enum { X, GAMMA, BETA, MEAN, VAR, Y, NARGS };
static const int pairs[][2] = {{Y, X}};

static norma_status call(fz_case *k) {
  const ctx *c = k->ctx;
  fz_arg *a = k->a;
  return norma_in_forward_inference(c->g.present ? &c->d : NULL, a[X].p, a[GAMMA].p, a[BETA].p,
                                    a[MEAN].p, a[VAR].p, a[Y].p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz r = {data, size};
  fz_settings(&r);
  ctx c;
  fz_gn_make(&r, &c.g, 1, 0, 8);
  c.d = fz_in_desc(&c.g);
  const fz_gn *g = &c.g;
  fz_arg a[NARGS] = {
      {"x", FZ_IN, FZ_TENSOR, FZ_REQ, 1, g->T, 0, 0, 0},
      {"gamma", FZ_IN, FZ_PARAM, FZ_OPT, 1, g->C, 0, 0, 0},
      {"beta", FZ_IN, FZ_PARAM, FZ_OPT, 1, g->C, 0, 0, 0},
      {"mean", FZ_IN, FZ_PARAM, FZ_REQ, 1, g->C, 0, 0, 0},
      {"var", FZ_IN, FZ_PARAM, FZ_REQ, 1, g->C, 0, 0, 0},
      {"y", FZ_OUT, FZ_TENSOR, FZ_REQ, 0, g->T, 0, 0, 0},
  };
  fz_case k = {.ctx = &c, .pairs = pairs, .npairs = FZ_NPAIRS(pairs)};
  if (!fz_setup(&r, &k, a, NARGS, g->d.dtype, g->sizes_ok)) return 0;
  if (g->force_null) a[X].p = NULL;
  const norma_status want =
      fz_expect(&k, !g->valid || !a[X].p, (g->d.flags & NORMA_CHECK_FINITE) != 0);
  fz_check(&k, call(&k), want, call);
  fz_free(&k);
  return 0;
}
