/* fuzz_bn_moments_accumulate.c - norma_bn_moments_accumulate against norma.h: strided tiles,
   running moments whose counts are negative or would overflow (fuzz_common.h). */
#include "fuzz_common.h"

typedef struct ctx {
  norma_dtype dt;
  int64_t rows, channels, rs, cs;
} ctx;

enum { X, COUNT, MEAN, M2, NARGS };

static norma_status call(fz_case *k) {
  const ctx *c = k->ctx;
  fz_arg *a = k->a;
  return norma_bn_moments_accumulate(c->dt, c->rows, c->channels, a[X].p, c->rs, c->cs,
                                     a[COUNT].p, a[MEAN].p, a[M2].p);
}

static int64_t stride(fz *r) {
  const unsigned v = fz_u8(r);
  if (v < 230) return (int64_t)(v % 12);
  return v < 240 ? -1 - (int64_t)(v % 3) : fz_size(r, 12);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz r = {data, size};
  fz_settings(&r);
  ctx c;
  const unsigned dv = fz_u8(&r);
  c.dt = dv < 250 ? (norma_dtype)(dv & 3) : (norma_dtype)(4 + dv % 5);
  c.rows = fz_u8(&r) < 20 ? 0 : fz_size(&r, 9);
  c.channels = fz_size(&r, 9);
  c.rs = stride(&r);
  c.cs = stride(&r);
  /* the rules of norma.h, in 128-bit arithmetic */
  int valid = fz_dtype_ok(c.dt) && c.rows >= 0 && c.channels >= 1 && c.rs >= 0 && c.cs >= 0;
  fz_i128 last = 0;
  if (valid && c.rows > 0) {
    last = (fz_i128)(c.rows - 1) * c.rs + (fz_i128)(c.channels - 1) * c.cs;
    if (last > (fz_i128)(PTRDIFF_MAX / 8)) valid = 0;
  }
  if (valid && (fz_i128)c.channels > (fz_i128)(PTRDIFF_MAX / 8)) valid = 0;
  const int64_t xcount = valid && c.rows > 0 ? (int64_t)last + 1 : 0;
  /* small enough to run: the tile, the arrays and the work */
  const int sizes_ok = valid && xcount <= FZ_CAP_ELEMS && c.channels <= FZ_CAP_ELEMS &&
                       (fz_i128)c.rows * c.channels <= ((fz_i128)1 << 18);
  fz_arg a[NARGS] = {
      {"x", FZ_IN, FZ_TENSOR, c.rows > 0 ? FZ_REQ : FZ_IGN, 0, xcount, 0, 0, 0},
      {"count", FZ_INOUT, FZ_I64, FZ_REQ, 0, valid ? c.channels : 64, 0, 0, 0},
      {"mean", FZ_INOUT, FZ_F64, FZ_REQ, 0, valid ? c.channels : 64, 0, 0, 0},
      {"m2", FZ_INOUT, FZ_F64, FZ_REQ, 0, valid ? c.channels : 64, 0, 0, 0},
  };
  fz_case k = {.ctx = &c};
  if (!fz_setup(&r, &k, a, NARGS, fz_dtype_ok(c.dt) ? c.dt : NORMA_F32, sizes_ok)) return 0;
  int force_null = valid && !sizes_ok;
  if (force_null) {
    if (c.rows > 0) a[X].p = NULL;
    else a[COUNT].p = NULL;
  }
  /* counts: negative, or count + rows past INT64_MAX */
  int bad_count = 0;
  if (valid && sizes_ok && a[COUNT].p && !k.invalid)
    for (int64_t j = 0; j < c.channels; j++) {
      const int64_t v = ((const int64_t *)a[COUNT].p)[j];
      if (v < 0 || (fz_i128)v + c.rows > (fz_i128)INT64_MAX) bad_count = 1;
    }
  const norma_status want = fz_expect(&k, !valid || force_null || bad_count, 0);
  fz_check(&k, call(&k), want, call);
  fz_free(&k);
  return 0;
}
