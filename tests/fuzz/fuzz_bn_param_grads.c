/* fuzz_bn_param_grads.c - norma_bn_param_grads against norma.h: only c, dtype and flags of d
   are read (fuzz_common.h). */
#include "fuzz_common.h"

typedef struct ctx {
  fz_bn b;
  int64_t count;
} ctx;

enum { SDY, SDYX, SX, DGAMMA, DBETA, NARGS };

static norma_status call(fz_case *k) {
  const ctx *c = k->ctx;
  fz_arg *a = k->a;
  return norma_bn_param_grads(fz_bn_ptr(&c->b), a[SDY].p, a[SDYX].p, a[SX].p, c->count,
                              a[DGAMMA].p, a[DBETA].p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz r = {data, size};
  fz_settings(&r);
  ctx c;
  fz_bn_make(&r, &c.b, 0, FZ_TRAIN_NO, 8);
  c.count = fz_u8(&r) < 32 ? (int64_t)fz_pick(&r, 3) - 1 : fz_size(&r, 200);
  norma_bn_desc one = c.b.d;
  one.n = 1, one.spatial = 1, one.layout = NORMA_CHANNELS_FIRST;
  const int valid = fz_desc_valid(&one, c.b.present, 1, 0);
  const int sizes_ok = valid && one.c <= FZ_CAP_ELEMS;
  const int64_t n = valid ? one.c : 64;
  fz_arg a[NARGS] = {
      {"sum_dy", FZ_IN, FZ_F64, FZ_REQ, 0, n, 0, 0, 0},
      {"sum_dy_xhat", FZ_IN, FZ_F64, FZ_REQ, 0, n, 0, 0, 0},
      {"sum_xhat", FZ_IN, FZ_F64, FZ_OPT, 0, n, 0, 0, 0},
      {"dgamma", FZ_OUT, FZ_PARAM, FZ_OPT, 0, n, 0, 0, 0},
      {"dbeta", FZ_OUT, FZ_PARAM, FZ_OPT, 0, n, 0, 0, 0},
  };
  fz_case k = {.ctx = &c};
  if (!fz_setup(&r, &k, a, NARGS, c.b.d.dtype, sizes_ok)) return 0;
  const int force_null = valid && !sizes_ok;
  if (force_null) a[SDY].p = NULL;
  const int bad_count =
      a[SX].p && !(c.b.d.flags & NORMA_BN_GLOBAL_STATS) && c.count < 1;
  const norma_status want = fz_expect(&k, !valid || force_null || bad_count, 0);
  fz_check(&k, call(&k), want, call);
  fz_free(&k);
  return 0;
}
