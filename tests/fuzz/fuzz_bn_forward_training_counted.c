/* fuzz_bn_forward_training_counted.c - norma_bn_forward_training_counted against norma.h
   (fuzz_common.h): NORMA_BN_COUNT_WEIGHTED allowed with running statistics, running_count
   required then (with the flag and a running statistic), finite and >= 0 (checked, not
   scanned), ignored otherwise. */
#include "fuzz_common.h"

typedef struct ctx {
  fz_bn b;
  double momentum;
} ctx;

enum { X, RES, GAMMA, BETA, Y, SMEAN, SINV, RMEAN, RVAR, RCOUNT, NARGS };
static const int pairs[][2] = {{Y, X}, {Y, RES}};

static norma_status call(fz_case *k) {
  const ctx *c = k->ctx;
  fz_arg *a = k->a;
  return norma_bn_forward_training_counted(fz_bn_ptr(&c->b), a[X].p, a[RES].p, a[GAMMA].p,
                                           a[BETA].p, a[Y].p, a[SMEAN].p, a[SINV].p, a[RMEAN].p,
                                           a[RVAR].p, a[RCOUNT].p, c->momentum);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz r = {data, size};
  fz_settings(&r);
  ctx c;
  fz_bn_make(&r, &c.b, 1, FZ_TRAIN_YES, 8);
  c.momentum = fz_momentum(&r);
  const int add = (c.b.d.flags & NORMA_BN_ADD_RELU) != 0;
  const int weighted = (c.b.d.flags & NORMA_BN_COUNT_WEIGHTED) != 0;
  fz_arg a[NARGS] = {
      {"x", FZ_IN, FZ_TENSOR, FZ_REQ, 1, c.b.T, 0, 0, 0},
      {"residual", FZ_IN, FZ_TENSOR, add ? FZ_REQ : FZ_IGN, 1, c.b.T, 0, 0, 0},
      {"gamma", FZ_IN, FZ_PARAM, FZ_OPT, 1, c.b.C, 0, 0, 0},
      {"beta", FZ_IN, FZ_PARAM, FZ_OPT, 1, c.b.C, 0, 0, 0},
      {"y", FZ_OUT, FZ_TENSOR, FZ_REQ, 0, c.b.T, 0, 0, 0},
      {"save_mean", FZ_OUT, FZ_PARAM, FZ_OPT, 0, c.b.C, 0, 0, 0},
      {"save_invstd", FZ_OUT, FZ_PARAM, FZ_OPT, 0, c.b.C, 0, 0, 0},
      {"running_mean", FZ_INOUT, FZ_PARAM, FZ_OPT, 1, c.b.C, 0, 0, 0},
      {"running_var", FZ_INOUT, FZ_PARAM, FZ_OPT, 1, c.b.C, 0, 0, 0},
      {"running_count", FZ_INOUT, FZ_F64, weighted ? FZ_OPT : FZ_IGN, 0, 1, 0, 0, 0},
  };
  fz_case k = {.ctx = &c, .pairs = pairs, .npairs = FZ_NPAIRS(pairs)};
  if (!fz_setup(&r, &k, a, NARGS, c.b.d.dtype, c.b.sizes_ok)) return 0;
  if (c.b.force_null) a[X].p = NULL;
  const int running = a[RMEAN].p || a[RVAR].p;
  const int bad_momentum = running && !(c.momentum >= 0 && c.momentum <= 1);
  const int no_count = weighted && running && fz_bad_running_count(a[RCOUNT].p);
  const norma_status want =
      fz_expect(&k, !c.b.valid || c.b.force_null || !a[X].p || bad_momentum || no_count,
                (c.b.d.flags & NORMA_CHECK_FINITE) != 0);
  fz_check(&k, call(&k), want, call);
  fz_free(&k);
  return 0;
}
