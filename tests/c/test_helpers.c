/* test_helpers.c - the double-precision helpers of the finalize (src/cpu/ukernels.h).
 * norm_fwd_consts: each ISA version the CPU runs must give the bits of the scalar loop, on
 * every length up to 40 (every tail of 4 and 8 lanes) and on the values that take the special
 * branches: a mean whose low part is 0, NaN or an infinity (shift = beta, or beta - lo *
 * scale), scales and shifts finite in double but not in float (the slow flag), NaN and
 * infinite parameters.  The scalar loop itself is checked against the formula written out
 * here.  NaNs compare equal whatever their sign and payload.
 *
 * Likewise the per-channel ops of chan_vec.inc (norm_chan_ops): the AVX2 and AVX-512 copies
 * against the baseline copy, and the baseline copy against the formulas written out here, on
 * zeros of both signs, subnormals, huge values, infinities and NaNs in every input.
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
static int same_d(double a, double b) {
  return memcmp(&a, &b, sizeof a) == 0 || (a != a && b != b);
}
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
static void fill(int seed, double *mean, double *mlo, double *sc, double *beta) {
  static const double means[] = {0.0, 1.0, -3.25, 1e-3, 0.1, 1e30, -1e-40, HUGE_VAL, -HUGE_VAL,
                                 NAN, 3.0000001, 7e5};
  static const double los[] = {0.0, 0.0, 1e-12, -1e-9, 0.0, NAN, 0.0, 1e-20};
  static const double scs[] = {1.0, 0.5, -2.0, 1e39, -1e300, HUGE_VAL, NAN, 3.5e38, 0.0, 1e-45};
  static const double betas[] = {0.0, 1.0, -0.5, 1e39, NAN, -HUGE_VAL, 2.0, -3.4e38};
  for (int k = 0; k < N; k++) {
    const int i = k + seed;
    mean[k] = means[i % 12], mlo[k] = los[(i / 2) % 8], sc[k] = scs[(i * 7) % 10];
    beta[k] = betas[(i * 3) % 8];
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

static void check_isa(const char *isa, consts_fn fc) {
  double mean[N], mlo[N], sc[N], beta[N];
  for (int seed = 0; seed < 48; seed++) {
    fill(seed, mean, mlo, sc, beta);
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
      const norm_fwd_block ba = block_of(mean, mlo, sc, beta, &a),
                           bb = block_of(mean, mlo, sc, beta, &b);
      const int sa = norm_fwd_consts_scalar(&ba, 0, n);
      if (!fc) check_scalar_formula(mean, mlo, sc, beta, n, &a, sa);
      if (!fc) continue;
      const int sb = fc(&bb, n);
      TU_CHECK(same_outs(&a, &b), "%s: norm_fwd_consts differs from scalar (seed %d, n %d)",
               isa, seed, n);
      TU_CHECK(!sa == !sb, "%s: slow flag %d, scalar %d (seed %d, n %d)", isa, sb, sa, seed, n);
    }
  }
}

/* ---- chan_vec.inc ------------------------------------------------------------------------ */

static const double DV[] = {0.0, -0.0, 1.0, -3.25, 1e-300, 4.9e-324, 1e300, HUGE_VAL, -HUGE_VAL,
                            NAN, 1e-3, 7e5, 3.0000001, -1e-9, 2.0, 0.0625, -0.07, 1e39};
static const float FV[] = {0.0f, -0.0f, 1.0f, -3.25f, 1e-45f, 1e-38f, 3e38f, INFINITY, -INFINITY,
                           NAN, 1e-3f, 7e5f, 0.5f, -2.0f, 1.5f};
enum { ND = sizeof DV / sizeof DV[0], NF = sizeof FV / sizeof FV[0] };

typedef struct chan_io {
  double d[8][N]; /* inputs (0-3) and double outputs (4-7) */
  float f[16][N]; /* float inputs (0-3) and outputs (4-15) */
} chan_io;

/* seed 0-2: the special values in every column, shifted per input; 3+: ordinary values */
static void chan_fill(chan_io *io, int seed) {
  memset(io, 0x5a, sizeof *io);
  for (int k = 0; k < N; k++)
    for (int a = 0; a < 4; a++) {
      const int i = k * (a + 1) + seed * 5 + a;
      io->d[a][k] = seed < 3 ? DV[i % ND] : 0.37 * (i % 11) - 1.2 + 1e-9 * a;
      io->f[a][k] = seed < 3 ? FV[i % NF] : 0.25f * (float)(i % 7) + 0.5f;
    }
}

static int same_io(const chan_io *a, const chan_io *b) {
  int ok = 1;
  for (int r = 0; r < 8; r++)
    for (int k = 0; k < N; k++) ok &= same_d(a->d[r][k], b->d[r][k]);
  for (int r = 0; r < 16; r++)
    for (int k = 0; k < N; k++) ok &= same_f(a->f[r][k], b->f[r][k]);
  return ok;
}

/* runs op `which` of ops on io (n channels) */
static void chan_run(const norm_chan_ops *o, int which, chan_io *io, int n, double m, double eps) {
  double(*d)[N] = io->d;
  float(*f)[N] = io->f;
  switch (which) {
    case 0: /* fwd_final; gamma and beta missing (ones, zeros) when m is 3, biased when eps
               is 0; the slow flag in d[7][0] */
    {
      static float ones[N], zeros[N];
      for (int k = 0; k < N; k++) ones[k] = 1.0f, zeros[k] = 0.0f;
      const int null = m == 3.0;
      for (int k = 0; k < N; k++) f[6][k] = f[2][k], f[7][k] = f[3][k];
      const norm_fwd_final ff = {d[0],  d[1],  d[2],  m,     eps,  0.9,  0.1,  null ? ones : f[0],
                                 null ? zeros : f[1], f[4], f[5], f[6], f[7], f[8], f[9], f[10],
                                 d[4], d[5], d[6], eps == 0.0};
      d[7][0] = (double)o->fwd_final(&ff, n);
      break;
    }
    case 1: o->xhat_consts(d[0], d[1], f[4], f[5], f[6], n); break;
    case 2:
      o->bwd_consts(d[0], d[1], d[2], d[3], m, eps != 0.0, f[4], f[5], f[6], f[7], f[8], f[9],
                    n);
      break;
    case 8: /* bwd_scale: a float invstd when m is 49, a double one when 3 */
      o->bwd_scale(f[0], m == 3.0 ? NULL : f[1], d[1], d[4], n);
      break;
    case 10: o->xhat_consts_f(f[0], f[1], f[4], f[5], f[6], n); break;
    case 11: o->set_d(d[4], d[0], n); break;
    case 3: o->lower_x(f[0], f[1], f[2], f[4], f[5], f[6], f[7], n); break;
    case 4: /* o: [C_COUNT][cs] with cs = N, the four backward rows at C_GM .. C_DD */
    {
      static float ko[C_COUNT][N], kk[C_COUNT][N];
      for (int r = 0; r < C_COUNT; r++)
        for (int k = 0; k < N; k++) ko[r][k] = f[r % 4][(k + r) % N], kk[r][k] = -9.0f;
      o->lower_bwd(&ko[0][0], f[1], f[2], &kk[0][0], N, n);
      for (int k = 0; k < N; k++)
        f[4][k] = kk[C_GM][k], f[5][k] = kk[C_DA][k], f[6][k] = kk[C_DB][k], f[7][k] = kk[C_DD][k];
      break;
    }
    case 5: o->convert_sums(f[0], f[1], d[0], d[1], d[2], m, n); break;
    case 9: /* infer_prep from float inputs; all NULL on odd seeds */
    {
      const int null = m == 3.0;
      o->infer_prep(null ? NULL : f[0], null ? NULL : f[1], null ? NULL : f[2],
                    null ? NULL : f[3], eps, d[4], d[5], d[6], n);
      break;
    }
    default: /* absorb (6: the statistics' merge, 7: the backward's sums) into totals d[4..6] */
      for (int k = 0; k < N; k++)
        d[4][k] = d[3][k], d[5][k] = d[0][k] * 0.5, d[6][k] = d[1][k] + 1.0;
      o->absorb(which == 6, d[4], d[5], d[6], d[0], d[1], d[2], m, n);
      break;
  }
}

/* the baseline copy against the formulas of the engine and op_bn.c, written out */
static void chan_formula(int which, const chan_io *in, const chan_io *o, int n, double m,
                         double eps) {
  for (int k = 0; k < n; k++) {
    const double *d0 = in->d[0], *d1 = in->d[1], *d2 = in->d[2], *d3 = in->d[3];
    const float *f0 = in->f[0], *f1 = in->f[1], *f2 = in->f[2];
    if (which == 0) {
      const int null = m == 3.0;
      const double a = d0[k], v0 = (d1[k] - a * (a * (1.0 / m))) / m, v = v0 < 0.0 ? 0.0 : v0;
      const double s = d2[k] + a * (1.0 / m), bb = s - d2[k];
      const double lo0 = (d2[k] - (s - bb)) + (a * (1.0 / m) - bb);
      const double is = (v == 0.0 && eps == 0.0) ? 0.0 : 1.0 / sqrt(v + eps);
      const double sc = null ? is : (double)f0[k] * is, be = null ? 0.0 : (double)f1[k];
      const double vr = eps == 0.0 ? v : v * m / (m - 1.0);
      const float mf = (float)s;
      const double lo = (s - (double)mf) + lo0, sh = lo == 0.0 ? be : be - lo * sc;
      TU_CHECK(same_f(o->f[4][k], (float)s) && same_f(o->f[5][k], (float)is) &&
                   same_f(o->f[8][k], mf) && same_f(o->f[9][k], (float)sc) &&
                   same_f(o->f[10][k], (float)sh),
               "fwd_final formula, channel %d", k);
      TU_CHECK(same_f(o->f[6][k], (float)(0.9 * (double)f2[k] + 0.1 * s)) &&
                   same_f(o->f[7][k], (float)(0.9 * (double)in->f[3][k] + 0.1 * vr)),
               "fwd_final running statistics, channel %d", k);
      TU_CHECK(same_d(o->d[4][k], (double)mf) && same_d(o->d[5][k], sc) && same_d(o->d[6][k], sh),
               "fwd_final doubles, channel %d", k);
    } else if (which == 1) {
      const float af = (float)d0[k];
      const double lo = d0[k] - (double)af;
      TU_CHECK(same_f(o->f[4][k], af) && same_f(o->f[5][k], (float)d1[k]) &&
                   same_f(o->f[6][k], (float)(lo == 0.0 ? 0.0 : -lo * d1[k])),
               "xhat_consts formula, channel %d", k);
    } else if (which == 2) {
      const double sx = d2[k] / m;
      const double s = eps != 0.0 && sx <= 0.0625 && sx >= -0.0625 ? sx : 0.0,
                   S = d1[k] - s * d0[k];
      const double kk = d3[k], mg = d0[k] / m, soc = S / m;
      const float gmf = (float)mg;
      TU_CHECK(same_f(o->f[4][k], gmf) && same_f(o->f[5][k], (float)kk) &&
                   same_f(o->f[6][k], (float)(-kk * soc)) &&
                   same_f(o->f[7][k], (float)(kk * s * soc + kk * ((double)gmf - mg))) &&
                   same_f(o->f[8][k], (float)S) && same_f(o->f[9][k], (float)d0[k]),
               "bwd_consts formula, channel %d", k);
    } else if (which == 10) {
      const double mean = (double)f0[k], is = (double)f1[k];
      const float af = (float)mean;
      const double lo = mean - (double)af;
      TU_CHECK(same_f(o->f[4][k], af) && same_f(o->f[5][k], (float)is) &&
                   same_f(o->f[6][k], (float)(lo == 0.0 ? 0.0 : -lo * is)),
               "xhat_consts_f formula, channel %d", k);
    } else if (which == 11) {
      TU_CHECK(same_d(o->d[4][k], d0[k] + 0.0), "set_d formula, channel %d", k);
    } else if (which == 8) {
      const double want = (double)f0[k] * (m == 3.0 ? d1[k] : (double)f1[k]);
      TU_CHECK(same_d(o->d[4][k], want), "bwd_scale formula, channel %d", k);
    } else if (which == 5) {
      const double c = f1[k];
      TU_CHECK(same_d(o->d[1][k], (double)f0[k] * d1[k] + (c != 0.0 ? c * d0[k] : 0.0)) &&
                   same_d(o->d[2][k], (double)f0[k] * d2[k] + c * m),
               "convert_sums formula, channel %d", k);
    } else if (which == 9) {
      const int null = m == 3.0;
      const double is = 1.0 / sqrt((null ? 0.0 : (double)f1[k]) + eps);
      TU_CHECK(same_d(o->d[4][k], null ? 0.0 : (double)f0[k]) &&
                   same_d(o->d[5][k], null ? is : (double)f2[k] * is) &&
                   same_d(o->d[6][k], null ? 0.0 : (double)in->f[3][k]),
               "infer_prep formula, channel %d", k);
    } else if (which >= 6) {
      const double T1 = d3[k], T2 = d0[k] * 0.5, T3 = d1[k] + 1.0, delta = d2[k] - T3,
                   ld = m * delta;
      const double w1 = which == 6 ? T1 + (d0[k] + ld) : T1 + d0[k];
      const double w2 = which == 6 ? T2 + (d1[k] + 2.0 * delta * d0[k] + ld * delta) : T2 + d1[k];
      const double w3 = which == 6 ? T3 : T3 + d2[k];
      TU_CHECK(same_d(o->d[4][k], w1) && same_d(o->d[5][k], w2) && same_d(o->d[6][k], w3),
               "absorb formula (%s), channel %d", which == 6 ? "stats" : "sums", k);
    } else if (which == 3) {
      uint32_t ub;
      memcpy(&ub, &f1[k], sizeof ub);
      const uint32_t e = (ub >> 23) & 0xffu, us = e - 1u < 254u ? e << 23 : 0x3f800000u;
      float S;
      memcpy(&S, &us, sizeof S);
      if (!(fabsf(f0[k]) * S <= 0x1p126f)) S = 1.0f;
      TU_CHECK(same_f(o->f[4][k], S) && same_f(o->f[5][k], -f0[k] * S) &&
                   same_f(o->f[6][k], f1[k] / S) && same_f(o->f[7][k], f2[k]),
               "lower_x formula, channel %d", k);
    }
  }
  if (which == 0) { /* the slow flag: a scale or shift finite only in double */
    int want = 0;
    for (int k = 0; k < n; k++) {
      const double sc = fabs(o->d[5][k]), sh = fabs(o->d[6][k]);
      want |= (sc > FLT_MAX && sc < HUGE_VAL) || (sh > FLT_MAX && sh < HUGE_VAL);
    }
    TU_CHECK(!o->d[7][0] == !want, "fwd_final slow flag %g, expected %d (n %d)",
             o->d[7][0], want, n);
  }
}

static void check_chan(const char *isa, const norm_chan_ops *ops) {
  for (int which = 0; which < 12; which++)
    for (int seed = 0; seed < 6; seed++)
      for (int n = 0; n <= N; n++) {
        /* m: values per channel; eps (0 or 1e-5; bwd_consts: x given or not) */
        const double m = seed % 2 ? 3.0 : 49.0, eps = seed % 3 == 1 ? 0.0 : 1e-5;
        chan_io a, b;
        chan_fill(&a, seed), chan_fill(&b, seed);
        const chan_io in = a;
        chan_run(&norm_chan_ops_base, which, &a, n, m, eps);
        if (!ops) {
          chan_formula(which, &in, &a, n, m, eps);
          continue;
        }
        chan_run(ops, which, &b, n, m, eps);
        TU_CHECK(same_io(&a, &b), "%s: chan op %d differs from the baseline copy (seed %d, n %d)",
                 isa, which, seed, n);
      }
}

int main(void) {
  check_isa("scalar", NULL);
  check_chan("baseline", NULL);
  int ran = 1;
#if defined(__x86_64__) || defined(_M_X64)
  const norma_cpu_features *f = norma__cpu_features();
#ifdef NORMA_TEST_HAVE_AVX2
  if (norma__cpu_has_avx2_kernels(f))
    check_isa("avx2", norm_fwd_consts_avx2),
        check_chan("avx2", &norm_chan_ops_avx2), ran++;
#endif
#ifdef NORMA_TEST_HAVE_AVX512
  if (norma__cpu_has_avx512_kernels(f))
    check_isa("avx512", norm_fwd_consts_avx512),
        check_chan("avx512", &norm_chan_ops_avx512), ran++;
#endif
  (void)f;
#endif
  printf("test_helpers: %d ISA version(s) checked\n", ran);
  return tu_finish("test_helpers");
}
