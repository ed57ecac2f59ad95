/* check.c - argument checking shared by all entry points. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "convert.h"

norma_status bn_require(const char *fn, const char *name, const void *ptr) {
  if (ptr) return NORMA_OK;
  return norma__fail(NORMA_ERR_INVALID_ARGUMENT, "%s: %s must not be NULL", fn, name);
}

#define ALL_FLAGS                                                                   \
  (NORMA_BN_RELU | NORMA_BN_ADD_RELU | NORMA_BN_BIASED_RUNNING_VAR |                 \
   NORMA_CHECK_FINITE | NORMA_BN_GLOBAL_STATS | NORMA_BN_COUNT_WEIGHTED)

norma_status bn_check_desc(const char *fn, const norma_bn_desc *d, int64_t min_n, int training,
                           bn_problem *p) {
  const norma_status bad = NORMA_ERR_INVALID_ARGUMENT;
  if (!d) return norma__fail(bad, "%s: d (the descriptor) must not be NULL", fn);
  if (d->n < min_n)
    return norma__fail(bad, "%s: d->n must be >= %lld (got %lld)", fn, (long long)min_n,
                       (long long)d->n);
  if (d->c <= 0) return norma__fail(bad, "%s: d->c must be > 0 (got %lld)", fn, (long long)d->c);
  if (d->spatial <= 0)
    return norma__fail(bad, "%s: d->spatial must be > 0 (got %lld)", fn, (long long)d->spatial);
  if (d->layout != NORMA_CHANNELS_FIRST && d->layout != NORMA_CHANNELS_LAST)
    return norma__fail(bad, "%s: d->layout must be NORMA_CHANNELS_FIRST or NORMA_CHANNELS_LAST "
                       "(got %d)", fn, (int)d->layout);
  if (d->dtype != NORMA_F32 && d->dtype != NORMA_F64 && d->dtype != NORMA_F16 &&
      d->dtype != NORMA_BF16)
    return norma__fail(bad, "%s: d->dtype must be NORMA_F32, NORMA_F64, NORMA_F16 or NORMA_BF16 "
                       "(got %d)", fn, (int)d->dtype);
  if (!(d->eps >= 0.0) || !isfinite(d->eps))
    return norma__fail(bad, "%s: d->eps must be finite and >= 0 (got %g)", fn, d->eps);
  if (d->flags & ~(unsigned)ALL_FLAGS)
    return norma__fail(bad, "%s: d->flags has unknown bits 0x%x", fn,
                       d->flags & ~(unsigned)ALL_FLAGS);
  if ((d->flags & NORMA_BN_RELU) && (d->flags & NORMA_BN_ADD_RELU))
    return norma__fail(bad, "%s: d->flags sets both NORMA_BN_RELU and NORMA_BN_ADD_RELU", fn);

  int64_t m, total, bytes;
  size_t es = norma__dtype_size(d->dtype);
  /* every product is checked before it is formed; the bound keeps the products the
     implementation forms from these sizes (blocks, units, bytes times a few tensors) in range */
  if (__builtin_mul_overflow(d->n, d->spatial, &m) || __builtin_mul_overflow(m, d->c, &total) ||
      __builtin_mul_overflow(total, (int64_t)es, &bytes))
    return norma__fail(bad, "%s: tensor size overflows (n = %lld, c = %lld, spatial = %lld)", fn,
                       (long long)d->n, (long long)d->c, (long long)d->spatial);
  if (bytes > NORMA_MAX_TENSOR_BYTES || (uint64_t)bytes > (uint64_t)SIZE_MAX)
    return norma__fail(bad, "%s: the tensor would have %lld bytes, more than "
                       "NORMA_MAX_TENSOR_BYTES (2^48) (n = %lld, c = %lld, spatial = %lld)", fn,
                       (long long)bytes, (long long)d->n, (long long)d->c,
                       (long long)d->spatial);
  /* the per-channel arrays (doubles in the split API) too: with n == 0 the tensor is empty
     whatever c is, but c values are still written */
  if (d->c > NORMA_MAX_TENSOR_BYTES / 8)
    return norma__fail(bad, "%s: d->c = %lld: per-channel arrays would exceed "
                       "NORMA_MAX_TENSOR_BYTES (2^48)", fn, (long long)d->c);
  if (training && d->n > 0 && m < 2)
    return norma__fail(bad, "%s: expected more than 1 value per channel when training, got "
                       "n * spatial = %lld (n = %lld, spatial = %lld)", fn, (long long)m,
                       (long long)d->n, (long long)d->spatial);

  p->n = d->n;
  p->c = d->c;
  p->s = d->spatial;
  p->m = m;
  p->total = total;
  p->layout = d->layout;
  p->dt = d->dtype;
  p->esize = es;
  p->eps = d->eps;
  p->flags = d->flags;
  p->act = (d->flags & NORMA_BN_ADD_RELU) ? BN_ACT_ADD_RELU
           : (d->flags & NORMA_BN_RELU)   ? BN_ACT_RELU
                                          : BN_ACT_NONE;
  return NORMA_OK;
}

static int is_output(int kind) { return kind == REGION_TENSOR_OUT || kind == REGION_PARAM_OUT; }

norma_status bn_check_overlaps(const char *fn, const bn_region *r, int count) {
  for (int i = 0; i < count; i++) {
    if (!r[i].ptr || !r[i].bytes) continue;
    for (int j = i + 1; j < count; j++) {
      if (!r[j].ptr || !r[j].bytes) continue;
      if (!is_output(r[i].kind) && !is_output(r[j].kind)) continue;
      uintptr_t a0 = (uintptr_t)r[i].ptr, a1 = a0 + r[i].bytes;
      uintptr_t b0 = (uintptr_t)r[j].ptr, b1 = b0 + r[j].bytes;
      if (a1 <= b0 || b1 <= a0) continue;
      int in_place = a0 == b0 && a1 == b1 &&
                     ((r[i].kind == REGION_TENSOR_OUT && r[j].kind == REGION_TENSOR_IN) ||
                      (r[i].kind == REGION_TENSOR_IN && r[j].kind == REGION_TENSOR_OUT));
      if (in_place) continue;
      return norma__fail(NORMA_ERR_INVALID_ARGUMENT,
                         "%s: %s (%p) overlaps %s (%p); an output may only alias an input "
                         "tensor exactly (in place)",
                         fn, r[i].name, r[i].ptr, r[j].name, r[j].ptr);
    }
  }
  return NORMA_OK;
}

static int64_t first_nonfinite(norma_dtype t, const void *ptr, int64_t count) {
  switch (t) {
    case NORMA_F32: {
      const uint32_t *u = ptr;
      uint32_t any = 0; /* branch-free scan in chunks, exact position found afterwards */
      for (int64_t i0 = 0; i0 < count; i0 += 4096) {
        int64_t i1 = i0 + 4096 < count ? i0 + 4096 : count;
        for (int64_t i = i0; i < i1; i++) any |= ((u[i] & 0x7f800000u) == 0x7f800000u);
        if (any)
          for (int64_t i = i0; i < i1; i++)
            if ((u[i] & 0x7f800000u) == 0x7f800000u) return i;
      }
      return -1;
    }
    case NORMA_F64: {
      const uint64_t *u = ptr;
      for (int64_t i = 0; i < count; i++)
        if ((u[i] & 0x7ff0000000000000ull) == 0x7ff0000000000000ull) return i;
      return -1;
    }
    case NORMA_F16: {
      const uint16_t *u = ptr;
      for (int64_t i = 0; i < count; i++)
        if ((u[i] & 0x7c00u) == 0x7c00u) return i;
      return -1;
    }
    case NORMA_BF16: {
      const uint16_t *u = ptr;
      for (int64_t i = 0; i < count; i++)
        if ((u[i] & 0x7f80u) == 0x7f80u) return i;
      return -1;
    }
  }
  return -1;
}

norma_status bn_check_finite(const char *fn, const char *name, norma_dtype t, const void *ptr,
                             int64_t count) {
  if (!ptr) return NORMA_OK;
  int64_t i = first_nonfinite(t, ptr, count);
  if (i < 0) return NORMA_OK;
  return norma__fail(NORMA_ERR_NONFINITE, "%s: %s[%lld] is not finite (%g)", fn, name,
                     (long long)i, norma__load(t, ptr, i));
}

norma_status bn_check_finite_param(const char *fn, const char *name, norma_dtype t,
                                   const void *ptr, int64_t c) {
  return bn_check_finite(fn, name, t == NORMA_F64 ? NORMA_F64 : NORMA_F32, ptr, c);
}
