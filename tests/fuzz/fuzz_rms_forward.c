/* fuzz_rms_forward.c - norma_rms_forward against norma.h (fuzz_norms.h): sum ignored without
   residual, sum == x or residual in place. */
#include "fuzz_norms.h"

enum { X, RES, GAMMA, Y, SUM, SINV, NARGS };
static const int pairs[][2] = {{Y, X}, {Y, RES}, {SUM, X}, {SUM, RES}};

static norma_status call(fz_case *k) {
  const fz_ln *l = k->ctx;
  fz_arg *a = k->a;
  return norma_rms_forward(fz_ln_ptr(l), a[X].p, a[RES].p, a[GAMMA].p, a[Y].p, a[SUM].p,
                           a[SINV].p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz r = {data, size};
  fz_settings(&r);
  fz_ln l;
  fz_ln_make(&r, &l, 8);
  const int no_res = fz_u8(&r) < 100; /* then sum is ignored (NULL or a buffer of its own) */
  fz_arg a[NARGS] = {
      {"x", FZ_IN, FZ_TENSOR, FZ_REQ, 1, l.T, 0, 0, 0},
      {"residual", FZ_IN, FZ_TENSOR, no_res ? FZ_IGN : FZ_KEEP, 1, l.T, 0, 0, 0},
      {"gamma", FZ_IN, FZ_PARAM, FZ_OPT, 1, l.D, 0, 0, 0},
      {"y", FZ_OUT, FZ_TENSOR, FZ_REQ, 0, l.T, 0, 0, 0},
      {"sum", FZ_OUT, FZ_TENSOR, no_res ? FZ_IGN : FZ_OPT, 0, l.T, 0, 0, 0},
      {"save_invrms", FZ_OUT, FZ_PARAM, FZ_OPT, 0, l.R, 0, 0, 0},
  };
  fz_case k = {.ctx = &l, .pairs = pairs, .npairs = FZ_NPAIRS(pairs)};
  if (!fz_setup(&r, &k, a, NARGS, l.d.dtype, l.sizes_ok)) return 0;
  if (no_res) a[RES].p = NULL;
  if (l.force_null) a[X].p = NULL;
  const norma_status want =
      fz_expect(&k, !l.valid || !a[X].p, (l.d.flags & NORMA_CHECK_FINITE) != 0);
  fz_check(&k, call(&k), want, call);
  fz_free(&k);
  return 0;
}
