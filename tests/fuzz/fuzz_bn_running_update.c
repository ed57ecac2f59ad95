/* fuzz_bn_running_update.c - norma_bn_running_update against norma.h (fuzz_common.h): only
   d->c, d->dtype and d->flags are read and checked (n, spatial, layout, eps may be anything);
   count >= 2; with a running statistic: momentum in [0, 1], and with NORMA_BN_COUNT_WEIGHTED
   running_count required, *running_count finite and >= 0; running_count ignored without the
   flag. */
#include "fuzz_common.h"

typedef struct ctx {
  norma_bn_desc d;
  int present;
  int64_t count;
  double momentum;
} ctx;

enum { MEAN, VAR, RMEAN, RVAR, RCOUNT, NARGS };

static norma_status call(fz_case *k) {
  const ctx *c = k->ctx;
  fz_arg *a = k->a;
  return norma_bn_running_update(c->present ? &c->d : NULL, c->count, a[MEAN].p, a[VAR].p,
                                 a[RMEAN].p, a[RVAR].p, a[RCOUNT].p, c->momentum);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz r = {data, size};
  fz_settings(&r);
  ctx c;
  fz_desc(&r, &c.d, &c.present, 8);
  c.count = fz_u8(&r) < 64 ? (int64_t)fz_pick(&r, 4) : fz_size(&r, 1000);
  c.momentum = fz_momentum(&r);
  const norma_bn_desc *d = &c.d;
  const int valid = c.present && d->c >= 1 && d->c <= NORMA_MAX_TENSOR_BYTES / 8 &&
                    fz_dtype_ok(d->dtype) && !(d->flags & ~FZ_BN_FLAGS) &&
                    !((d->flags & NORMA_BN_RELU) && (d->flags & NORMA_BN_ADD_RELU));
  const int sizes_ok = valid && d->c <= FZ_CAP_ELEMS;
  const int64_t C = valid ? d->c : 64;
  const int weighted = (d->flags & NORMA_BN_COUNT_WEIGHTED) != 0;
  fz_arg a[NARGS] = {
      {"mean", FZ_IN, FZ_F64, FZ_REQ, 1, C, 0, 0, 0},
      {"var", FZ_IN, FZ_F64, FZ_REQ, 1, C, 0, 0, 0},
      {"running_mean", FZ_INOUT, FZ_PARAM, FZ_OPT, 1, C, 0, 0, 0},
      {"running_var", FZ_INOUT, FZ_PARAM, FZ_OPT, 1, C, 0, 0, 0},
      {"running_count", FZ_INOUT, FZ_F64, weighted ? FZ_OPT : FZ_IGN, 0, 1, 0, 0, 0},
  };
  fz_case k = {.ctx = &c};
  if (!fz_setup(&r, &k, a, NARGS, d->dtype, sizes_ok)) return 0;
  const int force_null = valid && !sizes_ok;
  if (force_null) a[MEAN].p = NULL;
  const int running = a[RMEAN].p || a[RVAR].p;
  const int bad = !valid || force_null || !a[MEAN].p || c.count < 2 ||
                  (running && !(c.momentum >= 0 && c.momentum <= 1)) ||
                  (running && weighted && fz_bad_running_count(a[RCOUNT].p));
  const norma_status want = fz_expect(&k, bad, (d->flags & NORMA_CHECK_FINITE) != 0);
  fz_check(&k, call(&k), want, call);
  fz_free(&k);
  return 0;
}
