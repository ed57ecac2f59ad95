/* test_util.h - helpers shared by norma's C tests: a pass/fail counter, a deterministic RNG,
   element access and fills for every dtype, poison patterns, and comparisons.

   Every test program counts its checks with TU_CHECK (or the compare helpers, one check per
   array), prints "<name>: N passed, M failed" last and returns non-zero when anything failed.
   The helpers are static so that each test program is one translation unit plus the library. */
#ifndef NORMA_TEST_UTIL_H
#define NORMA_TEST_UTIL_H

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert.h"
#include "norma.h"

#if defined(__GNUC__)
#define TU_UNUSED __attribute__((unused))
#define TU_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define TU_UNUSED
#define TU_PRINTF(a, b)
#endif

/* ---- pass / fail counter ------------------------------------------------------------------ */

static long tu_passed = 0, tu_failed = 0;
static int tu_max_reports = 40; /* failure messages printed before going quiet */

static TU_UNUSED TU_PRINTF(3, 4) int tu_check_at(int ok, int line, const char *fmt, ...) {
  if (ok) {
    tu_passed++;
    return 1;
  }
  tu_failed++;
  if (tu_failed == 1) { /* NORMA_TEST_MAX_REPORTS=n prints more (or fewer) failures */
    const char *e = getenv("NORMA_TEST_MAX_REPORTS");
    if (e && *e) tu_max_reports = atoi(e);
  }
  if (tu_failed <= tu_max_reports) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL (line %d): ", line);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
  } else if (tu_failed == tu_max_reports + 1) {
    fprintf(stderr, "... more failures, not printed\n");
  }
  return 0;
}
#define TU_CHECK(cond, ...) tu_check_at(!!(cond), __LINE__, __VA_ARGS__)

/* Context printed with each failure: what case is running. */
static char tu_ctx[512];
static TU_UNUSED TU_PRINTF(1, 2) void tu_set_ctx(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tu_ctx, sizeof tu_ctx, fmt, ap);
  va_end(ap);
}

static TU_UNUSED int tu_finish(const char *name) {
  printf("%s: %ld passed, %ld failed\n", name, tu_passed, tu_failed);
  fflush(stdout);
  return tu_failed ? 1 : 0;
}

/* NORMA_TEST_QUICK=1 (sanitizer runs) shrinks the grids. */
static TU_UNUSED int tu_quick(void) {
  const char *e = getenv("NORMA_TEST_QUICK");
  return e && *e && strcmp(e, "0") != 0;
}

/* ---- deterministic RNG (splitmix64) -------------------------------------------------------- */

typedef struct tu_rng {
  uint64_t s;
} tu_rng;

static TU_UNUSED tu_rng tu_rng_make(uint64_t seed) {
  tu_rng r;
  r.s = seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;
  return r;
}
static TU_UNUSED uint64_t tu_next(tu_rng *r) {
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
/* uniform in [0, 1) with 53 random bits */
static TU_UNUSED double tu_u01(tu_rng *r) { return (double)(tu_next(r) >> 11) * 0x1p-53; }
static TU_UNUSED double tu_uniform(tu_rng *r, double lo, double hi) {
  return lo + (hi - lo) * tu_u01(r);
}
/* integer in [0, k) */
static TU_UNUSED int64_t tu_below(tu_rng *r, int64_t k) {
  return (int64_t)(tu_next(r) % (uint64_t)k);
}
/* standard normal (Box-Muller, one value per call) */
static TU_UNUSED double tu_normal(tu_rng *r) {
  double u1 = tu_u01(r), u2 = tu_u01(r);
  if (u1 < 1e-300) u1 = 1e-300;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* ---- dtypes: sizes, element access --------------------------------------------------------- */

static TU_UNUSED const char *tu_dt_name(norma_dtype t) {
  switch (t) {
    case NORMA_F32: return "f32";
    case NORMA_F64: return "f64";
    case NORMA_F16: return "f16";
    case NORMA_BF16: return "bf16";
  }
  return "?";
}
static TU_UNUSED const char *tu_layout_name(norma_layout l) {
  return l == NORMA_CHANNELS_FIRST ? "CF" : l == NORMA_CHANNELS_LAST ? "CL" : "?";
}
static TU_UNUSED size_t tu_esize(norma_dtype t) {
  return t == NORMA_F64 ? 8 : t == NORMA_F32 ? 4 : 2;
}
/* the per-channel parameter type of a dtype: f64 for F64, f32 otherwise */
static TU_UNUSED norma_dtype tu_ptype(norma_dtype t) {
  return t == NORMA_F64 ? NORMA_F64 : NORMA_F32;
}
static TU_UNUSED size_t tu_psize(norma_dtype t) { return t == NORMA_F64 ? 8 : 4; }

static TU_UNUSED double tu_load(norma_dtype t, const void *p, int64_t i) {
  switch (t) {
    case NORMA_F32: return ((const float *)p)[i];
    case NORMA_F64: return ((const double *)p)[i];
    case NORMA_F16: return norma__f16_to_f32(((const uint16_t *)p)[i]);
    case NORMA_BF16: return norma__bf16_to_f32(((const uint16_t *)p)[i]);
  }
  return NAN;
}
/* stores v rounded to t (through f32 for the 16-bit types) */
static TU_UNUSED void tu_store(norma_dtype t, void *p, int64_t i, double v) {
  switch (t) {
    case NORMA_F32: ((float *)p)[i] = (float)v; break;
    case NORMA_F64: ((double *)p)[i] = v; break;
    case NORMA_F16: ((uint16_t *)p)[i] = norma__f32_to_f16((float)v); break;
    case NORMA_BF16: ((uint16_t *)p)[i] = norma__f32_to_bf16((float)v); break;
  }
}
/* v rounded to the precision of t */
static TU_UNUSED double tu_round(norma_dtype t, double v) {
  unsigned char tmp[8];
  tu_store(t, tmp, 0, v);
  return tu_load(t, tmp, 0);
}
/* per-channel parameter arrays */
static TU_UNUSED double tu_pload(norma_dtype t, const void *p, int64_t i) {
  return tu_load(tu_ptype(t), p, i);
}
static TU_UNUSED void tu_pstore(norma_dtype t, void *p, int64_t i, double v) {
  tu_store(tu_ptype(t), p, i, v);
}

/* Offset of value (i, ch, sp) of an [n, c, spatial] tensor in a layout. */
static TU_UNUSED int64_t tu_index(norma_layout l, int64_t c, int64_t s, int64_t i, int64_t ch,
                                  int64_t sp) {
  return l == NORMA_CHANNELS_FIRST ? (i * c + ch) * s + sp : (i * s + sp) * c + ch;
}

/* ---- buffers and poison --------------------------------------------------------------------- */

#define TU_POISON_BYTE 0xff /* all-ones: a NaN in f16, bf16, f32 and f64 */

static TU_UNUSED void *tu_alloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p) {
    fprintf(stderr, "out of memory (%zu bytes)\n", bytes);
    exit(2);
  }
  return p;
}
static TU_UNUSED void *tu_poisoned(size_t bytes) {
  void *p = tu_alloc(bytes);
  memset(p, TU_POISON_BYTE, bytes ? bytes : 1);
  return p;
}
static TU_UNUSED void tu_poison(void *p, size_t bytes) {
  if (p) memset(p, TU_POISON_BYTE, bytes);
}
static TU_UNUSED int tu_is_poison(const void *p, size_t bytes) {
  const unsigned char *b = (const unsigned char *)p;
  for (size_t i = 0; i < bytes; i++)
    if (b[i] != TU_POISON_BYTE) return 0;
  return 1;
}
static TU_UNUSED void *tu_dup(const void *p, size_t bytes) {
  void *q = tu_alloc(bytes);
  if (bytes) memcpy(q, p, bytes);
  return q;
}

/* ---- fills ---------------------------------------------------------------------------------- */

/* Fills c per-channel parameters with uniform values in [lo, hi). */
static TU_UNUSED void tu_fill_param(norma_dtype t, void *p, int64_t c, tu_rng *r, double lo,
                                    double hi) {
  for (int64_t i = 0; i < c; i++) tu_pstore(t, p, i, tu_uniform(r, lo, hi));
}
/* Fills count tensor elements with uniform values in [lo, hi), rounded to t. */
static TU_UNUSED void tu_fill_uniform(norma_dtype t, void *p, int64_t count, tu_rng *r, double lo,
                                      double hi) {
  for (int64_t i = 0; i < count; i++) tu_store(t, p, i, tu_uniform(r, lo, hi));
}
/* Tensor x[i, ch, sp] = mu[ch] + sd[ch] * u, u uniform with unit variance, in layout l. */
static TU_UNUSED void tu_fill_channels(norma_dtype t, norma_layout l, void *p, int64_t n,
                                       int64_t c, int64_t s, const double *mu, const double *sd,
                                       tu_rng *r) {
  const double a = 1.7320508075688772; /* uniform on [-a, a] has variance 1 */
  for (int64_t i = 0; i < n; i++)
    for (int64_t ch = 0; ch < c; ch++)
      for (int64_t sp = 0; sp < s; sp++)
        tu_store(t, p, tu_index(l, c, s, i, ch, sp), mu[ch] + sd[ch] * tu_uniform(r, -a, a));
}

/* ---- comparisons ------------------------------------------------------------------------------
 */

/* Compares count elements of got (type t) against ref (type rt, or double when rt < 0):
   each must satisfy |got - ref| <= tol * max(|ref|, floor); NaN matches NaN and an infinity
   matches the same infinity.  Counts one check; prints the first mismatches. */
static TU_UNUSED int tu_cmp_typed(const char *what, norma_dtype t, const void *got, int rt,
                                  const void *ref, int64_t count, double tol, double floor) {
  int64_t bad = 0, first = -1;
  double worst = 0.0;
  int64_t worst_i = -1;
  for (int64_t i = 0; i < count; i++) {
    double g = tu_load(t, got, i);
    double r = rt < 0 ? ((const double *)ref)[i] : tu_load((norma_dtype)rt, ref, i);
    int ok;
    double e = 0.0;
    if (isnan(r) || isnan(g)) ok = isnan(r) && isnan(g);
    else if (isinf(r) || isinf(g)) ok = g == r;
    else {
      double den = fabs(r) > floor ? fabs(r) : floor;
      e = fabs(g - r) / (den > 0 ? den : 1.0);
      ok = e <= tol;
    }
    if (!ok) {
      if (!isnan(e) && e == 0.0) e = INFINITY; /* NaN / Inf mismatch */
      if (first < 0) first = i;
      bad++;
      if (!(e <= worst)) {
        worst = e;
        worst_i = i;
      }
    }
  }
  if (bad == 0) {
    tu_passed++;
    return 1;
  }
  double gw = tu_load(t, got, worst_i);
  double rw = rt < 0 ? ((const double *)ref)[worst_i] : tu_load((norma_dtype)rt, ref, worst_i);
  double gf = tu_load(t, got, first);
  double rf = rt < 0 ? ((const double *)ref)[first] : tu_load((norma_dtype)rt, ref, first);
  tu_check_at(0, __LINE__,
              "[%s] %s: %lld of %lld elements off (tol %.3g, floor %.3g); first [%lld] got %.17g "
              "ref %.17g; worst [%lld] got %.17g ref %.17g (rel %.3g)",
              tu_ctx, what, (long long)bad, (long long)count, tol, floor, (long long)first, gf, rf,
              (long long)worst_i, gw, rw, worst);
  return 0;
}
/* both arrays of type t */
static TU_UNUSED int tu_cmp(const char *what, norma_dtype t, const void *got, const void *ref,
                            int64_t count, double tol, double floor) {
  return tu_cmp_typed(what, t, got, (int)t, ref, count, tol, floor);
}
/* got of type t against a double reference */
static TU_UNUSED int tu_cmp_d(const char *what, norma_dtype t, const void *got, const double *ref,
                              int64_t count, double tol, double floor) {
  return tu_cmp_typed(what, t, got, -1, ref, count, tol, floor);
}

/* Like tu_cmp, for a tensor [n, c, s] in layout l whose elements have a natural scale per
   channel: |got - ref| <= tol * max(|ref|, floor[channel]). */
static TU_UNUSED int tu_cmp_chan(const char *what, norma_dtype t, const void *got, const void *ref,
                                 norma_layout l, int64_t n, int64_t c, int64_t s, double tol,
                                 const double *floor) {
  const int64_t count = n * c * s;
  int64_t bad = 0, worst_i = -1;
  double worst = 0.0;
  for (int64_t i = 0; i < count; i++) {
    const int64_t ch = l == NORMA_CHANNELS_FIRST ? (i / s) % c : i % c;
    double g = tu_load(t, got, i), r = tu_load(t, ref, i);
    int ok;
    double e = INFINITY;
    if (isnan(r) || isnan(g)) ok = isnan(r) && isnan(g);
    else if (isinf(r) || isinf(g)) ok = g == r;
    else {
      double den = fabs(r) > floor[ch] ? fabs(r) : floor[ch];
      e = fabs(g - r) / (den > 0 ? den : 1.0);
      ok = e <= tol;
    }
    if (!ok) {
      bad++;
      if (worst_i < 0 || !(e <= worst)) worst = e, worst_i = i;
    }
  }
  if (bad == 0) {
    tu_passed++;
    return 1;
  }
  tu_check_at(0, __LINE__,
              "[%s] %s: %lld of %lld elements off (tol %.3g, per-channel floor); worst [%lld] "
              "(channel %lld, floor %.3g) got %.17g ref %.17g (rel %.3g)",
              tu_ctx, what, (long long)bad, (long long)count, tol, (long long)worst_i,
              (long long)(l == NORMA_CHANNELS_FIRST ? (worst_i / s) % c : worst_i % c),
              floor[l == NORMA_CHANNELS_FIRST ? (worst_i / s) % c : worst_i % c],
              tu_load(t, got, worst_i), tu_load(t, ref, worst_i), worst);
  return 0;
}

/* Bitwise equality of two buffers (one check). */
static TU_UNUSED int tu_same_bits(const char *what, const void *a, const void *b, size_t bytes) {
  if (bytes == 0 || memcmp(a, b, bytes) == 0) {
    tu_passed++;
    return 1;
  }
  const unsigned char *x = (const unsigned char *)a, *y = (const unsigned char *)b;
  size_t i = 0;
  while (x[i] == y[i]) i++;
  tu_check_at(0, __LINE__, "[%s] %s: bytes differ (first at byte %zu of %zu)", tu_ctx, what, i,
              bytes);
  return 0;
}
/* One check that a buffer still holds the poison pattern. */
static TU_UNUSED int tu_check_poison(const char *what, const void *p, size_t bytes) {
  return TU_CHECK(tu_is_poison(p, bytes), "[%s] %s was written (poison pattern changed)", tu_ctx,
                  what);
}

/* Normwise relative error ||got - ref||_2 / ||ref||_2 of got (type t) against a double ref. */
static TU_UNUSED double tu_normwise(norma_dtype t, const void *got, const double *ref,
                                    int64_t count) {
  long double num = 0, den = 0;
  for (int64_t i = 0; i < count; i++) {
    double g = tu_load(t, got, i);
    long double d = (long double)g - ref[i];
    num += d * d;
    den += (long double)ref[i] * ref[i];
  }
  if (den == 0) return num == 0 ? 0.0 : INFINITY;
  double e = (double)sqrtl(num / den);
  return isnan(e) ? INFINITY : e;
}

/* Units in the last place between two floats (same sign assumed; large when not). */
static TU_UNUSED int64_t tu_ulps_f32(float a, float b) {
  int32_t ia, ib;
  memcpy(&ia, &a, 4);
  memcpy(&ib, &b, 4);
  if (ia < 0) ia = (int32_t)(0x80000000u - (uint32_t)ia);
  if (ib < 0) ib = (int32_t)(0x80000000u - (uint32_t)ib);
  int64_t d = (int64_t)ia - (int64_t)ib;
  return d < 0 ? -d : d;
}
static TU_UNUSED int64_t tu_ulps_f64(double a, double b) {
  int64_t ia, ib;
  memcpy(&ia, &a, 8);
  memcpy(&ib, &b, 8);
  if (ia < 0) ia = (int64_t)(0x8000000000000000ull - (uint64_t)ia);
  if (ib < 0) ib = (int64_t)(0x8000000000000000ull - (uint64_t)ib);
  /* the difference fits for the values compared in the tests */
  int64_t d = ia - ib;
  return d < 0 ? -d : d;
}

/* Tolerance of a tensor element stored in t (relative to max(|ref|, 1)). */
static TU_UNUSED double tu_tol_tensor(norma_dtype t) {
  switch (t) {
    case NORMA_F32: return 1e-5;
    case NORMA_F64: return 1e-12;
    case NORMA_F16: return 2e-3;
    case NORMA_BF16: return 1.6e-2;
  }
  return 0;
}
/* Tolerance of a per-channel result (f32 for every dtype but F64) */
static TU_UNUSED double tu_tol_param(norma_dtype t) { return t == NORMA_F64 ? 1e-12 : 1e-5; }

/* ---- last error --------------------------------------------------------------------------- */

/* Sets this thread's last error to a known message, so that a test can tell that a later call
   replaced it. */
static TU_UNUSED void tu_reset_last_error(void) {
  (void)norma_set_max_isa((norma_isa)424242);
}
static TU_UNUSED int tu_is_word_char(char ch) {
  return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
         ch == '_';
}
/* Whether msg contains word as a whole token (not inside a longer identifier). */
static TU_UNUSED int tu_has_word(const char *msg, const char *word) {
  size_t wl = strlen(word);
  for (const char *p = strstr(msg, word); p; p = strstr(p + 1, word)) {
    int before_ok = p == msg || !tu_is_word_char(p[-1]) || !tu_is_word_char(word[0]);
    int after_ok = !tu_is_word_char(p[wl]) || !tu_is_word_char(word[wl - 1]);
    if (before_ok && after_ok) return 1;
  }
  return 0;
}

#endif
