/* fuzz_bn_moments.c - norma_bn_moments against norma.h (fuzz_common.h). */
#include "fuzz_common.h"

enum { X, COUNT, MEAN, M2, NARGS };

static norma_status call(fz_case *k) {
  const fz_bn *b = k->ctx;
  fz_arg *a = k->a;
  return norma_bn_moments(fz_bn_ptr(b), a[X].p, a[COUNT].p, a[MEAN].p, a[M2].p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz r = {data, size};
  fz_settings(&r);
  fz_bn b;
  fz_bn_make(&r, &b, 0, FZ_TRAIN_NO, 8);
  const int has_data = b.d.n > 0;
  fz_arg a[NARGS] = {
      {"x", FZ_IN, FZ_TENSOR, has_data ? FZ_REQ : FZ_IGN, 1, b.T, 0, 0, 0},
      {"count", FZ_OUT, FZ_I64, FZ_REQ, 0, b.C, 0, 0, 0},
      {"mean", FZ_OUT, FZ_F64, FZ_REQ, 0, b.C, 0, 0, 0},
      {"m2", FZ_OUT, FZ_F64, FZ_REQ, 0, b.C, 0, 0, 0},
  };
  fz_case k = {.ctx = &b};
  if (!fz_setup(&r, &k, a, NARGS, b.d.dtype, b.sizes_ok)) return 0;
  if (b.force_null) a[COUNT].p = NULL;
  const norma_status want = fz_expect(&k, !b.valid || !a[COUNT].p,
                                      (b.d.flags & NORMA_CHECK_FINITE) != 0);
  fz_check(&k, call(&k), want, call);
  fz_free(&k);
  return 0;
}
