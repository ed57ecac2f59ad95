/* fuzz_bn_moments_merge.c - norma_bn_moments_merge against norma.h: overlapping arrays,
   negative counts, count sums past INT64_MAX (fuzz_common.h). */
#include "fuzz_common.h"

enum { CA, MA, QA, CB, MB, QB, NARGS };

static norma_status call(fz_case *k) {
  const int64_t *c = k->ctx;
  fz_arg *a = k->a;
  return norma_bn_moments_merge(*c, a[CA].p, a[MA].p, a[QA].p, a[CB].p, a[MB].p, a[QB].p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz r = {data, size};
  fz_settings(&r);
  int64_t c = fz_size(&r, 9);
  const int valid = c >= 1 && (uint64_t)c <= (uint64_t)PTRDIFF_MAX / 8;
  const int sizes_ok = valid && c <= FZ_CAP_ELEMS;
  const int64_t n = valid ? c : 64;
  fz_arg a[NARGS] = {
      {"count_a", FZ_INOUT, FZ_I64, FZ_REQ, 0, n, 0, 0, 0},
      {"mean_a", FZ_INOUT, FZ_F64, FZ_REQ, 0, n, 0, 0, 0},
      {"m2_a", FZ_INOUT, FZ_F64, FZ_REQ, 0, n, 0, 0, 0},
      {"count_b", FZ_IN, FZ_I64, FZ_REQ, 0, n, 0, 0, 0},
      {"mean_b", FZ_IN, FZ_F64, FZ_REQ, 0, n, 0, 0, 0},
      {"m2_b", FZ_IN, FZ_F64, FZ_REQ, 0, n, 0, 0, 0},
  };
  fz_case k = {.ctx = &c};
  if (!fz_setup(&r, &k, a, NARGS, NORMA_F64, sizes_ok)) return 0;
  const int force_null = valid && !sizes_ok;
  if (force_null) a[CB].p = NULL;
  int bad_count = 0;
  if (sizes_ok && !k.invalid)
    for (int64_t j = 0; j < c; j++) {
      const int64_t x = ((const int64_t *)a[CA].p)[j], y = ((const int64_t *)a[CB].p)[j];
      if (x < 0 || y < 0 || (fz_i128)x + y > (fz_i128)INT64_MAX) bad_count = 1;
    }
  const norma_status want = fz_expect(&k, !valid || force_null || bad_count, 0);
  fz_check(&k, call(&k), want, call);
  fz_free(&k);
  return 0;
}
