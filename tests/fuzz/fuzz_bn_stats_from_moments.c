/* fuzz_bn_stats_from_moments.c - norma_bn_stats_from_moments against norma.h: only c, dtype,
   eps and flags of d are read; every count must be >= 2 (fuzz_common.h). */
#include "fuzz_common.h"

typedef struct ctx {
  fz_bn b;
  double momentum;
} ctx;

enum { COUNT, MEAN, M2, MEAN_OUT, INV_OUT, SMEAN, SINV, RMEAN, RVAR, NARGS };

static norma_status call(fz_case *k) {
  const ctx *c = k->ctx;
  fz_arg *a = k->a;
  return norma_bn_stats_from_moments(fz_bn_ptr(&c->b), a[COUNT].p, a[MEAN].p, a[M2].p,
                                     a[MEAN_OUT].p, a[INV_OUT].p, a[SMEAN].p, a[SINV].p,
                                     a[RMEAN].p, a[RVAR].p, c->momentum);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz r = {data, size};
  fz_settings(&r);
  ctx c;
  fz_bn_make(&r, &c.b, 0, FZ_TRAIN_NO, 8);
  c.momentum = fz_momentum(&r);
  /* n, spatial and layout are not read: the descriptor is judged as [1, c, 1] */
  norma_bn_desc one = c.b.d;
  one.n = 1, one.spatial = 1, one.layout = NORMA_CHANNELS_FIRST;
  const int valid = fz_desc_valid(&one, c.b.present, 1, 0);
  const int sizes_ok = valid && one.c <= FZ_CAP_ELEMS;
  const int64_t n = valid ? one.c : 64;
  fz_arg a[NARGS] = {
      {"count", FZ_IN, FZ_I64, FZ_REQ, 0, n, 0, 0, 0},
      {"mean", FZ_IN, FZ_F64, FZ_REQ, 0, n, 0, 0, 0},
      {"m2", FZ_IN, FZ_F64, FZ_REQ, 0, n, 0, 0, 0},
      {"mean_out", FZ_OUT, FZ_F64, FZ_REQ, 0, n, 0, 0, 0},
      {"invstd_out", FZ_OUT, FZ_F64, FZ_REQ, 0, n, 0, 0, 0},
      {"save_mean", FZ_OUT, FZ_PARAM, FZ_OPT, 0, n, 0, 0, 0},
      {"save_invstd", FZ_OUT, FZ_PARAM, FZ_OPT, 0, n, 0, 0, 0},
      {"running_mean", FZ_INOUT, FZ_PARAM, FZ_OPT, 0, n, 0, 0, 0},
      {"running_var", FZ_INOUT, FZ_PARAM, FZ_OPT, 0, n, 0, 0, 0},
  };
  fz_case k = {.ctx = &c};
  if (!fz_setup(&r, &k, a, NARGS, c.b.d.dtype, sizes_ok)) return 0;
  const int force_null = valid && !sizes_ok;
  if (force_null) a[COUNT].p = NULL;
  const int bad_momentum = (a[RMEAN].p || a[RVAR].p) && !(c.momentum >= 0 && c.momentum <= 1);
  int few = 0;
  if (sizes_ok && a[COUNT].p && !k.invalid)
    for (int64_t j = 0; j < n; j++) few |= ((const int64_t *)a[COUNT].p)[j] < 2;
  const norma_status want = fz_expect(&k, !valid || force_null || bad_momentum || few ||
                                               fz_counted_without_count(&c.b, a[RMEAN].p, a[RVAR].p), 0);
  fz_check(&k, call(&k), want, call);
  fz_free(&k);
  return 0;
}
