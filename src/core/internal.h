/* internal.h - what the pieces of the library share: the checked problem description, error
   reporting, dtype helpers, the global settings.  Never included by users. */
#ifndef NORMA_INTERNAL_H
#define NORMA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "norma.h"

/* ---- errors (status.c) ------------------------------------------------------------------ */

/* Records a printf-style message as this thread's last error and returns st. */
norma_status norma__fail(norma_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Sets this thread's last error to msg (exported for norma's own modules, e.g. libnorma_mpi;
   not part of the public API). */
NORMA_API void norma__record_error(const char *msg);

/* ---- settings (settings.c, cpu.c) ------------------------------------------------------- */

int norma__threads(void);     /* threads the next call may use, >= 1 */
int norma__use_reference(void);
norma_isa norma__isa(void);   /* the ISA the kernels use now */
/* the range of norma_set_streaming_stores: *min_bytes < 0 means the default (the engine's) */
void norma__streaming_range(int64_t *min_bytes, int64_t *max_bytes);
/* 1 when the avx512 level is served by the 16-lane emulation on AVX2 (NORMA_EMULATE_AVX512=1
   on a CPU without AVX-512: a testing aid) */
int norma__avx512_emulated(void);
int64_t norma__l2_bytes(void);/* per-core L2 size, read once (a default when unknown) */

/* ---- dtypes ----------------------------------------------------------------------------- */

static inline size_t norma__dtype_size(norma_dtype t) {
  return t == NORMA_F64 ? 8 : t == NORMA_F32 ? 4 : 2;
}
/* per-channel parameter type: double for F64, float otherwise */
static inline size_t norma__param_size(norma_dtype t) { return t == NORMA_F64 ? 8 : 4; }

/* Reads / writes one element of a tensor of dtype t (scalar helpers; see convert.h). */
double norma__load(norma_dtype t, const void *p, int64_t i);
void norma__store(norma_dtype t, void *p, int64_t i, double v);

/* Per-channel parameter of type double (F64) or float (others); NULL gives dflt. */
static inline double norma__param(norma_dtype t, const void *p, int64_t i, double dflt) {
  if (!p) return dflt;
  return t == NORMA_F64 ? ((const double *)p)[i] : (double)((const float *)p)[i];
}
static inline void norma__param_store(norma_dtype t, void *p, int64_t i, double v) {
  if (t == NORMA_F64) ((double *)p)[i] = v;
  else ((float *)p)[i] = (float)v;
}

/* ---- the problem, after checking ---------------------------------------------------------- */

typedef struct bn_problem {
  int64_t n, c, s;    /* batch, channels, spatial */
  int64_t m;          /* values per channel: n * s */
  int64_t total;      /* n * c * s */
  norma_layout layout;
  norma_dtype dt;
  size_t esize;       /* bytes per tensor element */
  double eps;
  unsigned flags;
  int act;            /* BN_ACT_* */
} bn_problem;

enum { BN_ACT_NONE = 0, BN_ACT_RELU = 1, BN_ACT_ADD_RELU = 2, BN_ACT_SILU = 3 };

/* Offset (in elements) of value (n, channel, s) of the tensor. */
static inline int64_t bn_index(const bn_problem *p, int64_t n, int64_t ch, int64_t s) {
  return p->layout == NORMA_CHANNELS_FIRST ? (n * p->c + ch) * p->s + s
                                           : (n * p->s + s) * p->c + ch;
}

#endif
