/* fuzz_bn_fold_into_weights.c - norma_bn_fold_into_weights against norma.h (fuzz_common.h). */
#include "fuzz_common.h"

typedef struct ctx {
  int64_t c, per;
  double eps;
} ctx;

enum { WEIGHT, BIAS, GAMMA, BETA, MEAN, VAR, NARGS };

static norma_status call(fz_case *k) {
  const ctx *c = k->ctx;
  fz_arg *a = k->a;
  return norma_bn_fold_into_weights(c->c, c->per, a[WEIGHT].p, a[BIAS].p, a[GAMMA].p, a[BETA].p,
                                    a[MEAN].p, a[VAR].p, c->eps);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz r = {data, size};
  ctx c;
  c.c = fz_size(&r, 9);
  c.per = fz_size(&r, 9);
  c.eps = fz_eps(&r);
  const int c_ok = c.c >= 1 && c.c <= NORMA_MAX_TENSOR_BYTES / 4 && c.eps >= 0 && isfinite(c.eps);
  const int valid = c_ok && c.per >= 1 &&
                    (fz_i128)c.c * c.per <= (fz_i128)(NORMA_MAX_TENSOR_BYTES / 4);
  /* var is read for c_out channels before per_out is checked: size it whenever c_out is */
  const int c_small = c_ok && c.c <= FZ_CAP_ELEMS;
  const int w_small = valid && c.c * c.per <= FZ_CAP_ELEMS;
  const int64_t n = c_small ? c.c : 64, w = w_small ? c.c * c.per : 64;
  fz_arg a[NARGS] = {
      {"weight", FZ_INOUT, FZ_F32, FZ_REQ, 0, w, 0, 0, 0},
      {"bias", FZ_INOUT, FZ_F32, FZ_REQ, 0, n, 0, 0, 0},
      {"gamma", FZ_IN, FZ_F32, FZ_OPT, 0, n, 0, 0, 0},
      {"beta", FZ_IN, FZ_F32, FZ_OPT, 0, n, 0, 0, 0},
      {"mean", FZ_IN, FZ_F32, FZ_REQ, 0, n, 0, 0, 0},
      {"var", FZ_IN, FZ_F32, FZ_REQ, 0, n, 0, 0, 0},
  };
  fz_case k = {.ctx = &c};
  if (!fz_setup(&r, &k, a, NARGS, NORMA_F32, c_small)) return 0;
  int force_null = 0;
  if (c_ok && !c_small) a[MEAN].p = NULL, force_null = 1;
  if (valid && !w_small) a[WEIGHT].p = NULL, force_null = 1;
  const int sizes_ok = c_small;
  int bad_var = 0;
  if (sizes_ok && a[VAR].p)
    for (int64_t j = 0; j < c.c; j++) bad_var |= !((double)((const float *)a[VAR].p)[j] + c.eps > 0.0);
  const norma_status want = fz_expect(&k, !valid || force_null || bad_var, 0);
  fz_check(&k, call(&k), want, call);
  fz_free(&k);
  return 0;
}
