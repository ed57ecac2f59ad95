/* test_helpers.c - the double-precision helpers of the finalize (src/cpu/ukernels.h):
 * norm_invsqrt and norm_fwd_consts.  Each ISA version the CPU runs must give the bits of the
 * scalar loop, on every length up to 40 (every tail of 4 and 8 lanes) and on the values that
 * take the special branches: a mean whose low part is 0, NaN or an infinity (shift = beta, or
 * beta - lo * scale), scales and shifts finite in double but not in float (the slow flag), NaN
 * and infinite parameters, and subnormal and huge variances.  The scalar loop itself is checked
 * against the formula written out here.  NaNs compare equal whatever their sign and payload.
 */
#include <float.h>
#include <math.h>

#include "cpu.h"
#include "cpu/ukernels.h"
#include "test_util.h"

enum { N = 40 };

typedef struct outs {
  float cm[N], csc[N], csh[N];
  double dm[N], dsc[N], dsh[N];
} outs;

/* the same bits, or both NaN (C leaves a NaN's sign and payload to the compiler, which may swap
   the operands of a commutative operation) */
static int same_f(float a, float b) { return memcmp(&a, &b, sizeof a) == 0 || (a != a && b != b); }
static int same_d(double a, double b) { return memcmp(&a, &b, sizeof a) == 0 || (a != a && b != b); }
static int same_outs(const outs *a, const outs *b) {
  int ok = 1;
  for (int k = 0; k < N; k++)
    ok &= same_f(a->cm[k], b->cm[k]) & same_f(a->csc[k], b->csc[k]) & same_f(a->csh[k], b->csh[k]) &
          same_d(a->dm[k], b->dm[k]) & same_d(a->dsc[k], b->dsc[k]) & same_d(a->dsh[k], b->dsh[k]);
  return ok;
}

static norm_fwd_block block_of(const double *mean, const double *mlo, const double *sc,
                               const double *beta, outs *o) {
  const norm_fwd_block b = {mean, mlo, sc, beta, o->cm, o->csc, o->csh, o->dm, o->dsc, o->dsh};
  return b;
}

/* case k of the input columns: cycles through the special values */
static void fill(int seed, double *mean, double *mlo, double *sc, double *beta, double *var) {
  static const double means[] = {0.0, 1.0, -3.25, 1e-3, 0.1, 1e30, -1e-40, HUGE_VAL, -HUGE_VAL,
                                 NAN, 3.0000001, 7e5};
  static const double los[] = {0.0, 0.0, 1e-12, -1e-9, 0.0, NAN, 0.0, 1e-20};
  static const double scs[] = {1.0, 0.5, -2.0, 1e39, -1e300, HUGE_VAL, NAN, 3.5e38, 0.0, 1e-45};
  static const double betas[] = {0.0, 1.0, -0.5, 1e39, NAN, -HUGE_VAL, 2.0, -3.4e38};
  static const double vars[] = {1.0, 0.0, 1e-300, 4.9e-324, 1e300, 2.0, 0.25, HUGE_VAL, NAN, 1e-5};
  for (int k = 0; k < N; k++) {
    const int i = k + seed;
    mean[k] = means[i % 12], mlo[k] = los[(i / 2) % 8], sc[k] = scs[(i * 7) % 10];
    beta[k] = betas[(i * 3) % 8], var[k] = vars[(i * 5) % 10];
  }
}

static void check_scalar_formula(const double *mean, const double *mlo, const double *sc,
                                 const double *beta, int n, const outs *o, int slow) {
  int want_slow = 0;
  for (int k = 0; k < n; k++) {
    const float mf = (float)mean[k];
    const double mhi = mf, lo = (mean[k] - mhi) + mlo[k];
    const double sh = lo == 0.0 ? beta[k] : beta[k] - lo * sc[k];
    TU_CHECK(same_f(o->cm[k], mf) && same_d(o->dm[k], mhi), "scalar mean %d", k);
    TU_CHECK(same_f(o->csc[k], (float)sc[k]) && same_d(o->dsc[k], sc[k]), "scalar scale %d", k);
    TU_CHECK(same_f(o->csh[k], (float)sh) && same_d(o->dsh[k], sh), "scalar shift %d", k);
    want_slow |= (fabs(sc[k]) > FLT_MAX && fabs(sc[k]) < HUGE_VAL) ||
                 (fabs(sh) > FLT_MAX && fabs(sh) < HUGE_VAL);
  }
  TU_CHECK(!slow == !want_slow, "scalar slow flag %d, expected %d (n %d)", slow, want_slow, n);
}

typedef int (*consts_fn)(const norm_fwd_block *, int64_t);
typedef void (*invsqrt_fn)(const double *, double *, int64_t);

static void check_isa(const char *isa, consts_fn fc, invsqrt_fn fi) {
  double mean[N], mlo[N], sc[N], beta[N], var[N], r[N];
  for (int seed = 0; seed < 48; seed++) {
    fill(seed, mean, mlo, sc, beta, var);
    /* seeds past 12: ordinary values but one lane, which is slow (kinds 0, 3) or not */
    if (seed >= 12) {
      for (int k = 0; k < N; k++) sc[k] = 1.0 + k, beta[k] = 0.5, mlo[k] = 0.0, mean[k] = k;
      const int lane = (seed * 7) % N, kind = (seed - 12) % 6;
      if (kind == 0) sc[lane] = 1e39;
      if (kind == 1) sc[lane] = HUGE_VAL;
      if (kind == 2) beta[lane] = -HUGE_VAL;
      if (kind == 3) beta[lane] = 3.5e38, mlo[lane] = 1e-3; /* shift = beta - 1e-3 * scale */
      if (kind == 4) sc[lane] = NAN;
      if (kind == 5) mean[lane] = -HUGE_VAL; /* lo NaN: shift NaN */
    }
    for (int n = 0; n <= N; n++) {
      outs a, b;
      memset(&a, 0x5a, sizeof a), memset(&b, 0x5a, sizeof b);
      const norm_fwd_block ba = block_of(mean, mlo, sc, beta, &a), bb = block_of(mean, mlo, sc, beta, &b);
      const int sa = norm_fwd_consts_scalar(&ba, 0, n);
      if (!fc) check_scalar_formula(mean, mlo, sc, beta, n, &a, sa);
      if (!fc) continue;
      const int sb = fc(&bb, n);
      TU_CHECK(same_outs(&a, &b), "%s: norm_fwd_consts differs from scalar (seed %d, n %d)",
               isa, seed, n);
      TU_CHECK(!sa == !sb, "%s: slow flag %d, scalar %d (seed %d, n %d)", isa, sb, sa, seed, n);
    }
    for (int n = 0; n <= N; n++) {
      for (int k = 0; k < N; k++) r[k] = -7.0;
      if (fi) fi(var, r, n);
      else norm_invsqrt(var, r, n);
      for (int k = 0; k < N; k++)
        TU_CHECK(same_d(r[k], k < n ? 1.0 / sqrt(var[k]) : -7.0), "%s: invsqrt[%d] of %g (n %d)",
                 isa, k, var[k], n);
    }
  }
}

int main(void) {
  check_isa("scalar", NULL, NULL);
  int ran = 1;
#if defined(__x86_64__) || defined(_M_X64)
  const norma_cpu_features *f = norma__cpu_features();
#ifdef NORMA_TEST_HAVE_AVX2
  if (norma__cpu_has_avx2_kernels(f)) check_isa("avx2", norm_fwd_consts_avx2, norm_invsqrt_avx2), ran++;
#endif
#ifdef NORMA_TEST_HAVE_AVX512
  if (norma__cpu_has_avx512_kernels(f))
    check_isa("avx512", norm_fwd_consts_avx512, norm_invsqrt_avx512), ran++;
#endif
  (void)f;
#endif
  printf("test_helpers: %d ISA version(s) checked\n", ran);
  return tu_finish("test_helpers");
}
