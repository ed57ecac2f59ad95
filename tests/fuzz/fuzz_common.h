/* fuzz_common.h - what every fuzz target of norma shares (tests/fuzz/README.md).
 *
 * A target turns the input bytes into one call of one entry point and checks the contract of
 * norma.h on it:
 *  - the verdict: a call that must be rejected returns NORMA_ERR_INVALID_ARGUMENT, a call with
 *    NORMA_CHECK_FINITE and a NaN/Inf in a scanned input NORMA_ERR_NONFINITE, any other call
 *    NORMA_OK.  The expectation is computed here, independently of check.c: descriptor rules
 *    with 128-bit products, NULLs, overlaps between arguments (an output may only alias an
 *    input tensor exactly), and the target's data-dependent rules;
 *  - on error nothing is written: every argument lives in one arena, snapshotted before the
 *    call and compared byte for byte after;
 *  - inputs are never modified (compared against the snapshot after a successful call, except
 *    where an output aliases them in place);
 *  - in-place results equal separate-buffer results bit for bit (the call is repeated with
 *    every output in its own buffer).
 * Any violation aborts with a message (libFuzzer reports it with the input that caused it).
 *
 * A target is one small file: an argument table (fz_arg: name, role, element type, whether
 * required, element count), a function that makes the call from the table, and its
 * data-dependent rules.  fz_run does the rest.  Sizes are capped so that one execution stays
 * fast; descriptors whose products overflow are built, but their tensors are never allocated
 * at that size (the call must reject them before touching memory: ASan would report it).
 */
#ifndef NORMA_FUZZ_COMMON_H
#define NORMA_FUZZ_COMMON_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "norma.h"

#if defined(__GNUC__)
#define FZ_UNUSED __attribute__((unused))
#else
#define FZ_UNUSED
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* ---- reading the input ----------------------------------------------------------------------- */

typedef struct fz {
  const uint8_t *p;
  size_t n;
} fz;

static FZ_UNUSED uint8_t fz_u8(fz *r) {
  if (!r->n) return 0;
  r->n--;
  return *r->p++;
}
static FZ_UNUSED uint32_t fz_u32(fz *r) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v = v << 8 | fz_u8(r);
  return v;
}
static FZ_UNUSED uint64_t fz_u64(fz *r) { return (uint64_t)fz_u32(r) << 32 | fz_u32(r); }
/* an integer in [0, k) */
static FZ_UNUSED unsigned fz_pick(fz *r, unsigned k) { return k ? fz_u8(r) % k : 0; }

/* A size: mostly small, sometimes medium (the vector kernels' tails and blocks), sometimes a
   value that is invalid or whose products overflow. */
static FZ_UNUSED int64_t fz_size(fz *r, int64_t small_max) {
  static const int64_t special[] = {0,
                                    -1,
                                    INT64_MIN,
                                    INT64_MAX,
                                    (int64_t)1 << 31,
                                    ((int64_t)1 << 32) + 1,
                                    (int64_t)1 << 46,
                                    (int64_t)1 << 58,
                                    (int64_t)1 << 62,
                                    INT64_MAX / 3,
                                    3037000500 /* ~sqrt(2^63) */};
  const unsigned sel = fz_u8(r);
  if (sel < 200) return 1 + (int64_t)(fz_u8(r) % (unsigned)small_max);
  if (sel < 236) return 1 + (int64_t)(fz_u32(r) % 300u);
  return special[fz_pick(r, sizeof special / sizeof special[0])];
}

static FZ_UNUSED double fz_eps(fz *r) {
  static const double v[] = {1e-5, 0.0, 1e-3, 1.0, 1e-30, 1e300, -0.0, -1e-9, NAN, INFINITY};
  return fz_u8(r) < 200 ? v[fz_pick(r, 4)] : v[fz_pick(r, sizeof v / sizeof v[0])];
}

/* ---- the descriptor and its oracle ------------------------------------------------------------- */

#define FZ_BN_FLAGS 0x5fu /* the flags BatchNorm accepts (norma.h): bits 0-4 and
                             NORMA_BN_COUNT_WEIGHTED (bit 6) */

/* A descriptor from the bytes: sometimes NULL (*present = 0), with bad enums, bad eps, unknown
   flag bits and sizes whose products overflow. */
static FZ_UNUSED void fz_desc(fz *r, norma_bn_desc *d, int *present, int64_t small_max) {
  *present = fz_u8(r) != 0xff;
  d->n = fz_u8(r) < 24 ? (int64_t)fz_pick(r, 2) : fz_size(r, small_max);
  d->c = fz_size(r, small_max);
  d->spatial = fz_size(r, small_max);
  const unsigned lay = fz_u8(r);
  d->layout = (norma_layout)(lay < 250 ? (int)(lay & 1) : lay == 250 ? -1 : 2 + (int)(lay % 3));
  const unsigned dt = fz_u8(r);
  d->dtype = (norma_dtype)(dt < 250 ? (int)(dt & 3) : dt == 250 ? -1 : 4 + (int)(dt % 3));
  d->eps = fz_eps(r);
  unsigned f = fz_u8(r) & FZ_BN_FLAGS;
  if ((f & 3) == 3 && fz_u8(r) < 200) f &= ~1u; /* both activations: sometimes */
  if (fz_u8(r) >= 240) {
    const unsigned bit = 5 + fz_pick(r, 27);
    if (bit != 6) f |= 1u << bit; /* an unknown bit */
  }
  d->flags = f;
}

static FZ_UNUSED int fz_dtype_ok(norma_dtype t) {
  return t == NORMA_F32 || t == NORMA_F64 || t == NORMA_F16 || t == NORMA_BF16;
}
static FZ_UNUSED size_t fz_dsize(norma_dtype t) {
  return t == NORMA_F64 ? 8 : t == NORMA_F16 || t == NORMA_BF16 ? 2 : 4;
}
static FZ_UNUSED size_t fz_psize(norma_dtype t) { return t == NORMA_F64 ? 8 : 4; }

__extension__ typedef __int128 fz_i128;

/* Whether norma.h accepts the descriptor (min_n: 0 for the split API and the MPI calls, else
   1; training: n * spatial >= 2 when n > 0).  Written from norma.h, not from check.c. */
static FZ_UNUSED int fz_desc_valid(const norma_bn_desc *d, int present, int64_t min_n,
                                   int training) {
  if (!present) return 0;
  if (d->n < min_n || d->c < 1 || d->spatial < 1) return 0;
  if (d->layout != NORMA_CHANNELS_FIRST && d->layout != NORMA_CHANNELS_LAST) return 0;
  if (!fz_dtype_ok(d->dtype)) return 0;
  if (!(d->eps >= 0) || !isfinite(d->eps)) return 0;
  if (d->flags & ~FZ_BN_FLAGS) return 0;
  if ((d->flags & NORMA_BN_RELU) && (d->flags & NORMA_BN_ADD_RELU)) return 0;
  const fz_i128 m = (fz_i128)d->n * d->spatial; /* < 2^126 */
  if (m > (fz_i128)NORMA_MAX_TENSOR_BYTES) return 0;
  const fz_i128 bytes = m * d->c * (fz_i128)fz_dsize(d->dtype); /* < 2^48 * 2^63 * 8 */
  if (bytes > (fz_i128)NORMA_MAX_TENSOR_BYTES) return 0;
  if (d->c > NORMA_MAX_TENSOR_BYTES / 8) return 0; /* the per-channel (double) arrays too */
  if (training && d->n > 0 && m < 2) return 0;
  return 1;
}

/* ---- arguments ------------------------------------------------------------------------------- */

enum { FZ_IN, FZ_OUT, FZ_INOUT };                      /* role */
enum { FZ_TENSOR, FZ_PARAM, FZ_F64, FZ_I64, FZ_F32 };  /* element type: dtype, parameter type of
                                                          the dtype, double, int64, float */
enum { FZ_REQ, FZ_OPT, FZ_IGN, FZ_KEEP }; /* required, may be NULL, not read, given (may be
                                             NULL by the contract, but this case passes it) */

typedef struct fz_arg {
  const char *name;
  int role, type, need;
  int scanned;   /* NORMA_CHECK_FINITE scans it (when the call has the flag) */
  int64_t count; /* elements (meaningful when the sizes are valid) */
  /* set by fz_setup */
  void *p;
  size_t bytes;
  size_t region; /* offset of its own region in the arena */
} fz_arg;

#define FZ_MAX_ARGS 16
#define FZ_CAP_ELEMS ((int64_t)1 << 16) /* the largest argument allocated */

typedef struct fz_case {
  fz_arg *a;
  int na;
  norma_dtype dt;     /* the dtype that sizes FZ_TENSOR / FZ_PARAM */
  int sizes_ok;       /* counts are real (else capped: the call must reject before reading) */
  int invalid;        /* an argument error was made (NULL where required, bad overlap) */
  int nonfinite;      /* a scanned input holds NaN / Inf */
  int in_place;       /* an output exactly aliases an input (rerun with separate buffers) */
  unsigned char *arena, *snap;
  size_t arena_bytes;
  void *ctx;          /* the target's own state (descriptor, scalars) */
  const int (*pairs)[2]; /* optional: (output, input) tensor pairs that the contract lets alias */
  int npairs;            /* exactly; fz_setup aliases each with probability 3/8 (every one
                            when the input is exhausted: the rerun covers separate buffers) */
} fz_case;
#define FZ_NPAIRS(p) ((int)(sizeof(p) / sizeof((p)[0])))

static FZ_UNUSED void fz_fail(const fz_case *k, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3), noreturn))
#endif
    ;
#include <stdarg.h>
static void fz_fail(const fz_case *k, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "norma fuzz contract violation: ");
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\n  last error: %s\n", norma_last_error());
  if (k)
    for (int i = 0; i < k->na; i++)
      fprintf(stderr, "  %-14s %p bytes %zu count %lld need %d role %d\n", k->a[i].name,
              k->a[i].p, k->a[i].bytes, (long long)k->a[i].count, k->a[i].need, k->a[i].role);
  abort();
}

static FZ_UNUSED size_t fz_esize(const fz_case *k, const fz_arg *a) {
  norma_dtype t = fz_dtype_ok(k->dt) ? k->dt : NORMA_F32;
  switch (a->type) {
    case FZ_TENSOR: return fz_dsize(t);
    case FZ_PARAM: return fz_psize(t);
    case FZ_F32: return 4;
    default: return 8;
  }
}

/* one element of an input, from the bytes: mostly ordinary values, sometimes raw bits (NaN,
   Inf, subnormals, huge) */
static FZ_UNUSED void fz_fill_elem(fz *r, int type, norma_dtype dt, void *p, int64_t i) {
  const unsigned sel = fz_u8(r);
  if (type == FZ_I64) {
    int64_t v = sel < 220 ? (int64_t)(sel % 9)
              : sel < 250 ? (int64_t)fz_u64(r)
                          : (sel & 1 ? INT64_MAX : (int64_t)-1);
    ((int64_t *)p)[i] = v;
    return;
  }
  double v = (double)((int)(sel % 17) - 8) * 0.25 + (double)(sel / 17) * 1e-3;
  int raw = sel >= 240;
  if (type == FZ_F64 || (type == FZ_PARAM && dt == NORMA_F64) ||
      (type == FZ_TENSOR && dt == NORMA_F64)) {
    double d = v;
    if (raw) {
      uint64_t u = fz_u64(r);
      memcpy(&d, &u, 8);
    }
    ((double *)p)[i] = d;
  } else if (type == FZ_F32 || type == FZ_PARAM || dt == NORMA_F32 || !fz_dtype_ok(dt)) {
    float f = (float)v;
    if (raw) {
      uint32_t u = fz_u32(r);
      memcpy(&f, &u, 4);
    }
    ((float *)p)[i] = f;
  } else { /* f16 / bf16: raw 16-bit patterns or a value's top bits */
    uint16_t h;
    if (raw) {
      h = (uint16_t)(fz_u8(r) << 8 | fz_u8(r));
    } else {
      static const uint16_t f16[] = {0x0000, 0x3c00, 0xbc00, 0x4000, 0x3800, 0x4200, 0xc400,
                                     0x3555, 0x0001, 0x7bff};
      static const uint16_t bf16[] = {0x0000, 0x3f80, 0xbf80, 0x4000, 0x3f00, 0x4040, 0xc080,
                                      0x3eab, 0x0001, 0x7f7f};
      h = dt == NORMA_F16 ? f16[sel % 10] : bf16[sel % 10];
    }
    ((uint16_t *)p)[i] = h;
  }
}

static FZ_UNUSED int fz_elem_nonfinite(int type, norma_dtype dt, const void *p, int64_t i) {
  if (type == FZ_I64) return 0;
  if (type == FZ_F64 || ((type == FZ_PARAM || type == FZ_TENSOR) && dt == NORMA_F64))
    return !isfinite(((const double *)p)[i]);
  if (type == FZ_F32 || type == FZ_PARAM || dt == NORMA_F32) return !isfinite(((const float *)p)[i]);
  const uint16_t h = ((const uint16_t *)p)[i];
  return dt == NORMA_F16 ? (h & 0x7c00) == 0x7c00 : (h & 0x7f80) == 0x7f80;
}

static FZ_UNUSED int fz_is_out(const fz_arg *a) { return a->role != FZ_IN; }

/* Overlap verdict of norma.h: an output that overlaps another argument is an error unless the
   two are the same tensor range, one an output tensor and the other an input tensor. */
static FZ_UNUSED int fz_overlap_invalid(const fz_case *k, int *in_place) {
  int bad = 0;
  *in_place = 0;
  for (int i = 0; i < k->na; i++)
    for (int j = i + 1; j < k->na; j++) {
      const fz_arg *x = &k->a[i], *y = &k->a[j];
      if (x->need == FZ_IGN || y->need == FZ_IGN || !x->p || !y->p || !x->bytes || !y->bytes)
        continue;
      if (!fz_is_out(x) && !fz_is_out(y)) continue;
      const uintptr_t a0 = (uintptr_t)x->p, a1 = a0 + x->bytes;
      const uintptr_t b0 = (uintptr_t)y->p, b1 = b0 + y->bytes;
      if (a1 <= b0 || b1 <= a0) continue;
      const int exact = a0 == b0 && a1 == b1 && x->type == FZ_TENSOR && y->type == FZ_TENSOR &&
                        x->role != y->role && (x->role == FZ_IN || y->role == FZ_IN) &&
                        (x->role == FZ_OUT || y->role == FZ_OUT);
      if (exact) *in_place = 1;
      else bad = 1;
    }
  return bad;
}

/* Lays out the arguments, fills inputs from the bytes, poisons outputs, applies NULL and
   aliasing mutations, computes the verdict parts (invalid, nonfinite, in_place) and snapshots
   the arena.  Returns 0 when the case cannot be run (nothing allocated). */
static FZ_UNUSED int fz_setup(fz *r, fz_case *k, fz_arg *a, int na, norma_dtype dt,
                              int sizes_ok) {
  k->a = a, k->na = na, k->dt = dt, k->sizes_ok = sizes_ok;
  k->invalid = k->nonfinite = k->in_place = 0;
  size_t off = 64, maxb = 0;
  for (int i = 0; i < na; i++) {
    int64_t cnt = a[i].count;
    if (cnt < 0) cnt = 0;
    if (!sizes_ok && cnt > 64) cnt = 64; /* the call must reject without reading */
    if (cnt > FZ_CAP_ELEMS) return 0;
    a[i].bytes = (size_t)cnt * fz_esize(k, &a[i]);
    a[i].region = off;
    off += (a[i].bytes + 63) / 64 * 64 + 64; /* a guard gap between regions */
    if (a[i].bytes > maxb) maxb = a[i].bytes;
  }
  k->arena_bytes = off + (maxb + 63) / 64 * 64 + 64; /* slack: an aliased pointer stays inside */
  k->arena = malloc(k->arena_bytes);
  k->snap = malloc(k->arena_bytes);
  if (!k->arena || !k->snap) abort();
  memset(k->arena, 0xa5, k->arena_bytes);
  for (int i = 0; i < na; i++) {
    a[i].p = k->arena + a[i].region;
    const int64_t cnt = (int64_t)(a[i].bytes / fz_esize(k, &a[i]));
    if (a[i].role == FZ_OUT) memset(a[i].p, 0xff, a[i].bytes); /* poison: NaN in every type */
    else
      for (int64_t e = 0; e < cnt; e++) fz_fill_elem(r, a[i].type, dt, a[i].p, e);
  }
  /* NULLs: an ignored argument is NULL, a buffer of its own, or a pointer into another
     argument (at an 8-byte offset: the call must neither touch it nor count it in its overlap
     check; were it written, the input it points into would change) */
  for (int i = 0; i < na; i++) {
    const unsigned v = fz_u8(r);
    if (a[i].need == FZ_IGN) {
      if (v & 1) {
        a[i].p = NULL;
      } else if (v >= 192) {
        const int j = (int)fz_pick(r, (unsigned)na);
        const size_t np = a[j].region + 8 * fz_pick(r, 8);
        if (j != i && np + a[i].bytes <= k->arena_bytes) a[i].p = k->arena + np;
      }
    } else if (v >= 244 && a[i].need != FZ_KEEP) {
      a[i].p = NULL;
      if (a[i].need == FZ_REQ) k->invalid = 1;
    }
  }
  /* the in-place pairs the target names (then the random moves below may add to them) */
  for (int t = 0; t < k->npairs; t++) {
    const int o = k->pairs[t][0], s = k->pairs[t][1];
    if (fz_u8(r) >= 96 || !a[o].p || !a[s].p || a[o].need == FZ_IGN || a[s].need == FZ_IGN ||
        a[o].bytes != a[s].bytes)
      continue;
    a[o].p = a[s].p;
  }
  /* aliasing: an output moved onto another argument, exactly or at an offset */
  const unsigned nalias = fz_u8(r) >= 200 ? 1 + fz_pick(r, 2) : 0;
  for (unsigned t = 0; t < nalias; t++) {
    int o = (int)fz_pick(r, (unsigned)na), s = (int)fz_pick(r, (unsigned)na);
    const int exact = fz_u8(r) < 128;
    const int64_t shift = ((int64_t)fz_pick(r, 33) - 16) * 8; /* 8-byte steps: stays aligned */
    if (o == s || a[o].need == FZ_IGN || a[s].need == FZ_IGN || !a[o].p || !a[s].p ||
        !fz_is_out(&a[o]))
      continue;
    int64_t np = (int64_t)((unsigned char *)a[s].p - k->arena) + (exact ? 0 : shift);
    if (np < 0) np = 0;
    if ((size_t)np + a[o].bytes > k->arena_bytes) continue;
    a[o].p = k->arena + np;
  }
  k->invalid |= fz_overlap_invalid(k, &k->in_place);
  for (int i = 0; i < na; i++) {
    if (!a[i].p || a[i].role == FZ_OUT || !a[i].scanned || a[i].need == FZ_IGN) continue;
    const int64_t cnt = (int64_t)(a[i].bytes / fz_esize(k, &a[i]));
    for (int64_t e = 0; e < cnt && !k->nonfinite; e++)
      k->nonfinite = fz_elem_nonfinite(a[i].type, dt, a[i].p, e);
  }
  memcpy(k->snap, k->arena, k->arena_bytes);
  return 1;
}

static FZ_UNUSED void fz_free(fz_case *k) {
  free(k->arena);
  free(k->snap);
  k->arena = k->snap = NULL;
}

/* The expected status from the verdict parts. */
static FZ_UNUSED norma_status fz_expect(const fz_case *k, int extra_invalid, int finite_flag) {
  if (k->invalid || extra_invalid) return NORMA_ERR_INVALID_ARGUMENT;
  if (finite_flag && k->nonfinite) return NORMA_ERR_NONFINITE;
  return NORMA_OK;
}

typedef norma_status (*fz_call_fn)(fz_case *k);

static FZ_UNUSED int fz_overlaps_any_output(const fz_case *k, int i) {
  const fz_arg *x = &k->a[i];
  for (int j = 0; j < k->na; j++) {
    const fz_arg *y = &k->a[j];
    if (j == i || !y->p || !fz_is_out(y) || y->need == FZ_IGN) continue;
    const uintptr_t a0 = (uintptr_t)x->p, a1 = a0 + x->bytes;
    const uintptr_t b0 = (uintptr_t)y->p, b1 = b0 + y->bytes;
    if (a0 < b1 && b0 < a1) return 1;
  }
  return 0;
}

/* Checks the call's status and the contract on memory; repeats an in-place call with separate
   outputs and compares.  `want` from fz_expect. */
static FZ_UNUSED void fz_check(fz_case *k, norma_status st, norma_status want, fz_call_fn call) {
  if (st != want)
    fz_fail(k, "status %s, expected %s", norma_status_string(st), norma_status_string(want));
  if (st != NORMA_OK) {
    if (memcmp(k->arena, k->snap, k->arena_bytes) != 0) {
      size_t b = 0;
      while (k->arena[b] == k->snap[b]) b++;
      fz_fail(k, "memory written on error (arena byte %zu)", b);
    }
    if (!strlen(norma_last_error())) fz_fail(k, "no message for the error");
    return;
  }
  for (int i = 0; i < k->na; i++) {
    const fz_arg *x = &k->a[i];
    if (!x->p || x->role != FZ_IN || x->need == FZ_IGN || !x->bytes ||
        fz_overlaps_any_output(k, i))
      continue;
    const size_t o = (size_t)((unsigned char *)x->p - k->arena);
    if (memcmp(k->arena + o, k->snap + o, x->bytes) != 0) fz_fail(k, "input %s modified", x->name);
  }
  if (!k->in_place) return;
  /* again, every output in a buffer of its own (inputs as before the call) */
  unsigned char *saved_arena = k->arena;
  fz_arg saved[FZ_MAX_ARGS];
  memcpy(saved, k->a, sizeof(fz_arg) * (size_t)k->na);
  size_t extra = 0;
  for (int i = 0; i < k->na; i++)
    if (k->a[i].p && fz_is_out(&k->a[i])) extra += (k->a[i].bytes + 63) / 64 * 64 + 64;
  unsigned char *fresh = malloc(k->arena_bytes + extra);
  if (!fresh) abort();
  memcpy(fresh, k->snap, k->arena_bytes);
  size_t off = k->arena_bytes;
  for (int i = 0; i < k->na; i++) {
    fz_arg *x = &k->a[i];
    if (!x->p) continue;
    const size_t o = (size_t)((unsigned char *)x->p - saved_arena);
    if (!fz_is_out(x)) {
      x->p = fresh + o;
      continue;
    }
    /* its initial contents: what it aliased (INOUT) or poison */
    memcpy(fresh + off, k->snap + o, x->bytes);
    x->p = fresh + off;
    off += (x->bytes + 63) / 64 * 64 + 64;
  }
  k->arena = fresh;
  norma_status st2 = call(k);
  if (st2 != NORMA_OK) fz_fail(k, "separate buffers: %s", norma_status_string(st2));
  for (int i = 0; i < k->na; i++) {
    if (!saved[i].p || !fz_is_out(&saved[i]) || saved[i].need == FZ_IGN) continue;
    if (memcmp(saved[i].p, k->a[i].p, saved[i].bytes) != 0)
      fz_fail(k, "in place: output %s differs from a separate buffer's", saved[i].name);
  }
  free(fresh);
  k->arena = saved_arena;
  memcpy(k->a, saved, sizeof(fz_arg) * (size_t)k->na);
}

/* Global settings from the bytes: ISA cap, reference kernels, threads. */
static FZ_UNUSED void fz_settings(fz *r) {
  const unsigned v = fz_u8(r);
  (void)norma_set_max_isa(v & 1 ? NORMA_ISA_SCALAR : NORMA_ISA_AVX512);
  norma_set_use_reference((v >> 1 & 3) == 3);
  norma_set_num_threads(1 + (int)(v >> 3 & 1));
}
/* ---- a BatchNorm descriptor with its sizes ------------------------------------------------------ */

enum { FZ_TRAIN_NO, FZ_TRAIN_YES, FZ_TRAIN_UNLESS_GLOBAL };

typedef struct fz_bn {
  norma_bn_desc d;
  int present;    /* 0: the call gets d == NULL */
  int valid;      /* norma.h accepts the descriptor */
  int sizes_ok;   /* T and C are the real sizes and small enough to allocate */
  int force_null; /* valid but too large to allocate: the target passes NULL for a required
                     tensor, so the call must stop at that check */
  int64_t T, C;   /* tensor elements, channels */
} fz_bn;

static FZ_UNUSED void fz_bn_make(fz *r, fz_bn *b, int64_t min_n, int training, int64_t small) {
  fz_desc(r, &b->d, &b->present, small);
  const int tr = training == FZ_TRAIN_YES ||
                 (training == FZ_TRAIN_UNLESS_GLOBAL && !(b->d.flags & NORMA_BN_GLOBAL_STATS));
  b->valid = fz_desc_valid(&b->d, b->present, min_n, tr);
  b->force_null = 0;
  if (b->valid) {
    b->T = b->d.n * b->d.c * b->d.spatial;
    b->C = b->d.c;
    b->sizes_ok = b->T <= FZ_CAP_ELEMS && b->C <= FZ_CAP_ELEMS;
    b->force_null = !b->sizes_ok;
  } else {
    b->T = 64, b->C = 64, b->sizes_ok = 0;
  }
}
static FZ_UNUSED const norma_bn_desc *fz_bn_ptr(const fz_bn *b) { return b->present ? &b->d : NULL; }
static FZ_UNUSED int fz_act(const fz_bn *b) { return b->d.flags & (NORMA_BN_RELU | NORMA_BN_ADD_RELU); }

static FZ_UNUSED double fz_momentum(fz *r) {
  static const double v[] = {0.1, 0.0, 1.0, 0.5, -0.1, 1.5, NAN, INFINITY};
  return fz_u8(r) < 220 ? v[fz_pick(r, 4)] : v[fz_pick(r, 8)];
}

/* The uncounted training calls reject NORMA_BN_COUNT_WEIGHTED together with running
   statistics: the running count has no place in their signature (norma.h). */
static FZ_UNUSED int fz_counted_without_count(const fz_bn *b, const void *rmean, const void *rvar) {
  return (b->d.flags & NORMA_BN_COUNT_WEIGHTED) && (rmean || rvar);
}

/* *running_count, required (with NORMA_BN_COUNT_WEIGHTED and a running statistic) and then
   finite and >= 0 (norma_bn_running_update) */
static FZ_UNUSED int fz_bad_running_count(const void *p) {
  if (!p) return 1;
  double v;
  memcpy(&v, p, sizeof v);
  return !(v >= 0 && isfinite(v));
}

/* any per-channel parameter (parameter type of dt) equal to 0 */
static FZ_UNUSED int fz_any_zero_param(norma_dtype dt, const void *p, int64_t c) {
  if (!p) return 0;
  for (int64_t j = 0; j < c; j++)
    if (dt == NORMA_F64 ? ((const double *)p)[j] == 0.0 : ((const float *)p)[j] == 0.0f) return 1;
  return 0;
}

#endif
