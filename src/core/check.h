/* check.h - argument checking for every public entry point, in one place.  Each function
   returns NORMA_OK or records a message naming the argument and its value.  Exported (not in
   norma.h) so that norma's own modules built as separate libraries (libnorma_mpi) apply the
   same rules with the same messages. */
#ifndef NORMA_CHECK_H
#define NORMA_CHECK_H

#include "internal.h"

/* Checks the descriptor and fills p.  min_n: smallest n allowed (0 for the split API, else 1).
   training: n * spatial must be >= 2 when n > 0. */
NORMA_API norma_status bn_check_desc(const char *fn, const norma_bn_desc *d, int64_t min_n,
                                     int training, bn_problem *p);

enum { REGION_TENSOR_IN, REGION_TENSOR_OUT, REGION_PARAM_IN, REGION_PARAM_OUT };
typedef struct bn_region {
  const char *name;
  const void *ptr; /* NULL: absent, skipped */
  size_t bytes;
  int kind;
} bn_region;

/* Rejects an output that overlaps another argument, except an output tensor that exactly
   aliases an input tensor (in-place use; the kernels read an element's inputs before they
   write its outputs). */
NORMA_API norma_status bn_check_overlaps(const char *fn, const bn_region *r, int count);

/* NORMA_ERR_NONFINITE naming `name` and the first bad index when a NaN / Inf is present. */
NORMA_API norma_status bn_check_finite(const char *fn, const char *name, norma_dtype t,
                                       const void *ptr, int64_t count);
NORMA_API norma_status bn_check_finite_param(const char *fn, const char *name, norma_dtype t,
                                   const void *ptr, int64_t c);

/* INVALID_ARGUMENT "fn: name must not be NULL" when ptr is NULL. */
NORMA_API norma_status bn_require(const char *fn, const char *name, const void *ptr);

#endif
