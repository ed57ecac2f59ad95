/* fuzz_bn_fold.c - norma_bn_fold against norma.h: scale / shift may alias an input exactly,
   not each other; var + eps > 0 in every channel (fuzz_common.h). */
#include "fuzz_common.h"

typedef struct ctx {
  int64_t c;
  double eps;
} ctx;

enum { GAMMA, BETA, MEAN, VAR, SCALE, SHIFT, NARGS };

static norma_status call(fz_case *k) {
  const ctx *c = k->ctx;
  fz_arg *a = k->a;
  return norma_bn_fold(c->c, a[GAMMA].p, a[BETA].p, a[MEAN].p, a[VAR].p, c->eps, a[SCALE].p,
                       a[SHIFT].p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz r = {data, size};
  ctx c;
  c.c = fz_size(&r, 9);
  c.eps = fz_eps(&r);
  const int valid = c.c >= 1 && c.c <= NORMA_MAX_TENSOR_BYTES / 4 && c.eps >= 0 && isfinite(c.eps);
  const int sizes_ok = valid && c.c <= FZ_CAP_ELEMS;
  const int64_t n = valid ? c.c : 64;
  /* float arrays; the in-place rule is that of tensors (k.dt = F32) */
  fz_arg a[NARGS] = {
      {"gamma", FZ_IN, FZ_TENSOR, FZ_OPT, 0, n, 0, 0, 0},
      {"beta", FZ_IN, FZ_TENSOR, FZ_OPT, 0, n, 0, 0, 0},
      {"mean", FZ_IN, FZ_TENSOR, FZ_REQ, 0, n, 0, 0, 0},
      {"var", FZ_IN, FZ_TENSOR, FZ_REQ, 0, n, 0, 0, 0},
      {"scale", FZ_OUT, FZ_TENSOR, FZ_REQ, 0, n, 0, 0, 0},
      {"shift", FZ_OUT, FZ_TENSOR, FZ_REQ, 0, n, 0, 0, 0},
  };
  fz_case k = {.ctx = &c};
  if (!fz_setup(&r, &k, a, NARGS, NORMA_F32, sizes_ok)) return 0;
  const int force_null = valid && !sizes_ok;
  if (force_null) a[MEAN].p = NULL;
  int bad_var = 0;
  if (sizes_ok && a[VAR].p)
    for (int64_t j = 0; j < c.c; j++) bad_var |= !((double)((const float *)a[VAR].p)[j] + c.eps > 0.0);
  const norma_status want = fz_expect(&k, !valid || force_null || bad_var, 0);
  fz_check(&k, call(&k), want, call);
  fz_free(&k);
  return 0;
}
