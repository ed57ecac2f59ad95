/* test_running.c - the running-statistics rules: PyTorch's exponential average and the
   count-weighted one (NORMA_BN_COUNT_WEIGHTED), through norma_bn_running_update and the
   training forward, against the formulas of norma.h evaluated here in double. */
#include "test_util.h"

#define C 3

/* the batch statistics of channel j of a [n, C, s] f64 tensor, in double */
static void batch_stats(const double *x, int64_t n, int64_t s, int64_t j, double *mean,
                        double *var) {
  double sum = 0.0, m = (double)(n * s);
  for (int64_t i = 0; i < n; i++)
    for (int64_t k = 0; k < s; k++) sum += x[(i * C + j) * s + k];
  *mean = sum / m;
  double q = 0.0;
  for (int64_t i = 0; i < n; i++)
    for (int64_t k = 0; k < s; k++) {
      double d = x[(i * C + j) * s + k] - *mean;
      q += d * d;
    }
  *var = q / m;
}

static int close_to(double a, double b) { return fabs(a - b) <= 1e-12 * (1.0 + fabs(b)); }

/* a sequence of uneven batches through forward_training_counted: running stats and count
   follow the count-weighted formula; the plain call ignores the count */
static void test_counted_forward(void) {
  const int64_t sizes[] = {4, 1, 7, 2};
  const double mom = 0.25;
  double rm[C] = {0.5, -1.0, 2.0}, rv[C] = {1.0, 2.0, 0.5}, N = 0.0;
  double em[C], ev[C], eN = 0.0;
  memcpy(em, rm, sizeof rm), memcpy(ev, rv, sizeof rv);
  tu_rng seed = tu_rng_make(7);
  for (int b = 0; b < 4; b++) {
    const int64_t n = sizes[b], s = 3, total = n * C * s;
    double *x = malloc(sizeof(double) * (size_t)total), *y = malloc(sizeof(double) * (size_t)total);
    for (int64_t i = 0; i < total; i++) x[i] = tu_uniform(&seed, -1.0, 3.0) + (double)b;
    norma_bn_desc d = {n, C, s, NORMA_CHANNELS_FIRST, NORMA_F64, 1e-5, NORMA_BN_COUNT_WEIGHTED};
    const double B = (double)(n * s);
    const double N1 = (1.0 - mom) * eN + mom * B;
    for (int j = 0; j < C; j++) {
      double mu, v;
      batch_stats(x, n, s, j, &mu, &v);
      em[j] = ((1.0 - mom) * eN * em[j] + mom * B * mu) / N1;
      ev[j] = ((1.0 - mom) * eN * ev[j] + mom * B * v * B / (B - 1.0)) / N1;
    }
    eN = N1;
    norma_status st = norma_bn_forward_training_counted(&d, x, NULL, NULL, NULL, y, NULL, NULL, rm,
                                                        rv, &N, mom);
    TU_CHECK(st == NORMA_OK, "batch %d: status %d (%s)", b, (int)st, norma_last_error());
    TU_CHECK(close_to(N, eN), "batch %d: running count %.17g, expected %.17g", b, N, eN);
    for (int j = 0; j < C; j++) {
      TU_CHECK(close_to(rm[j], em[j]), "batch %d ch %d: running_mean %.17g, expected %.17g", b, j,
               rm[j], em[j]);
      TU_CHECK(close_to(rv[j], ev[j]), "batch %d ch %d: running_var %.17g, expected %.17g", b, j,
               rv[j], ev[j]);
    }
    if (b == 0) /* the first batch (N = 0) sets the statistics */
      for (int j = 0; j < C; j++) {
        double mu, v;
        batch_stats(x, n, s, j, &mu, &v);
        TU_CHECK(close_to(rm[j], mu), "first batch sets running_mean[%d]", j);
      }
    free(x), free(y);
  }
}

/* norma_bn_running_update: both rules, biased flag, the f32 parameter type, errors */
static void test_running_update(void) {
  const double mean[C] = {1.0, 2.0, -3.0}, var[C] = {0.5, 4.0, 1.0};
  /* PyTorch's rule */
  float rm[C] = {0.f, 1.f, 2.f}, rv[C] = {1.f, 1.f, 1.f};
  norma_bn_desc d = {1, C, 1, NORMA_CHANNELS_FIRST, NORMA_F32, 1e-5, 0};
  TU_CHECK(norma_bn_running_update(&d, 10, mean, var, rm, rv, NULL, 0.1) == NORMA_OK, "plain");
  for (int j = 0; j < C; j++) {
    const float e_m = (float)(0.9 * (double)j + 0.1 * mean[j]);
    const float e_v = (float)(0.9 * 1.0 + 0.1 * var[j] * 10.0 / 9.0);
    TU_CHECK(rm[j] == e_m && rv[j] == e_v, "plain rule ch %d: %g %g expected %g %g", j,
             (double)rm[j], (double)rv[j], (double)e_m, (double)e_v);
  }
  /* biased, count-weighted, starting from a count */
  double rmd[C] = {0.0, 0.0, 0.0}, rvd[C] = {2.0, 2.0, 2.0}, N = 30.0;
  norma_bn_desc dd = {1, C, 1, NORMA_CHANNELS_LAST, NORMA_F64, 0.0,
                      NORMA_BN_COUNT_WEIGHTED | NORMA_BN_BIASED_RUNNING_VAR};
  TU_CHECK(norma_bn_running_update(&dd, 10, mean, var, rmd, rvd, &N, 0.5) == NORMA_OK,
           "counted: %s", norma_last_error());
  const double N1 = 0.5 * 30.0 + 0.5 * 10.0;
  TU_CHECK(close_to(N, N1), "count %g expected %g", N, N1);
  for (int j = 0; j < C; j++) {
    TU_CHECK(close_to(rmd[j], (0.5 * 30.0 * 0.0 + 0.5 * 10.0 * mean[j]) / N1), "counted mean %d",
             j);
    TU_CHECK(close_to(rvd[j], (0.5 * 30.0 * 2.0 + 0.5 * 10.0 * var[j]) / N1), "counted var %d", j);
  }
  /* momentum 0 and an empty history: nothing learned, nothing divided by zero */
  double z[C] = {5.0, 5.0, 5.0}, N0 = 0.0;
  TU_CHECK(norma_bn_running_update(&dd, 10, mean, var, z, NULL, &N0, 0.0) == NORMA_OK, "mom 0");
  TU_CHECK(z[0] == 5.0 && z[2] == 5.0 && N0 == 0.0, "momentum 0 leaves the statistics");

  /* errors: nothing written */
  double keep[C] = {9.0, 9.0, 9.0}, kN = 3.0;
  TU_CHECK(norma_bn_running_update(&dd, 10, mean, var, keep, NULL, NULL, 0.1) ==
               NORMA_ERR_INVALID_ARGUMENT, "counted without a running count is rejected");
  TU_CHECK(norma_bn_running_update(&dd, 1, mean, var, keep, NULL, &kN, 0.1) ==
               NORMA_ERR_INVALID_ARGUMENT, "count 1 is rejected");
  TU_CHECK(norma_bn_running_update(&dd, 10, mean, var, keep, NULL, &kN, 1.5) ==
               NORMA_ERR_INVALID_ARGUMENT, "momentum 1.5 is rejected");
  kN = -1.0;
  TU_CHECK(norma_bn_running_update(&dd, 10, mean, var, keep, NULL, &kN, 0.1) ==
               NORMA_ERR_INVALID_ARGUMENT, "a negative running count is rejected");
  TU_CHECK(norma_bn_running_update(&dd, 10, mean, var, keep, keep, &kN, 0.1) ==
               NORMA_ERR_INVALID_ARGUMENT, "running_mean == running_var is rejected");
  TU_CHECK(keep[0] == 9.0 && keep[1] == 9.0 && keep[2] == 9.0 && kN == -1.0, "nothing written");

  /* the plain training call rejects the flag with running statistics, accepts it without */
  double x[C * 2] = {1, 2, 3, 4, 5, 6}, y[C * 2];
  norma_bn_desc dt = {2, C, 1, NORMA_CHANNELS_LAST, NORMA_F64, 1e-5, NORMA_BN_COUNT_WEIGHTED};
  TU_CHECK(norma_bn_forward_training(&dt, x, NULL, NULL, NULL, y, NULL, NULL, keep, NULL, 0.1) ==
               NORMA_ERR_INVALID_ARGUMENT, "plain forward + COUNT_WEIGHTED + running stats");
  TU_CHECK(keep[0] == 9.0, "nothing written");
  TU_CHECK(norma_bn_forward_training(&dt, x, NULL, NULL, NULL, y, NULL, NULL, NULL, NULL, 0.1) ==
               NORMA_OK, "plain forward + COUNT_WEIGHTED without running stats");
}

/* norma_bn_running_update reads d->c, d->dtype and d->flags only (norma.h): a descriptor made
   for the update alone, with n, spatial, layout and eps left at anything, is accepted
   (regression: the fuzz target bn_running_update found the whole descriptor checked) */
static void test_running_update_desc_fields(void) {
  const double mean[C] = {1.0, 2.0, -3.0}, var[C] = {0.5, 4.0, 1.0};
  double rm[C] = {0.0, 0.0, 0.0}, rv[C] = {1.0, 1.0, 1.0}, ref_m[C], ref_v[C];
  memcpy(ref_m, rm, sizeof rm), memcpy(ref_v, rv, sizeof rv);
  const norma_bn_desc good = {4, C, 5, NORMA_CHANNELS_FIRST, NORMA_F64, 1e-5, 0};
  TU_CHECK(norma_bn_running_update(&good, 10, mean, var, ref_m, ref_v, NULL, 0.1) == NORMA_OK,
           "reference update: %s", norma_last_error());
  const norma_bn_desc odd[] = {
      {0, C, 0, NORMA_CHANNELS_FIRST, NORMA_F64, 0.0, 0},             /* n = spatial = 0 */
      {-1, C, -7, NORMA_CHANNELS_LAST, NORMA_F64, 0.0, 0},            /* negative */
      {1, C, 1, (norma_layout)7, NORMA_F64, 0.0, 0},                  /* unknown layout */
      {1, C, 1, NORMA_CHANNELS_FIRST, NORMA_F64, -1.0, 0},            /* eps < 0 */
      {1, C, 1, NORMA_CHANNELS_FIRST, NORMA_F64, NAN, 0},             /* eps NaN */
      {INT64_MAX, C, INT64_MAX, NORMA_CHANNELS_FIRST, NORMA_F64, 0.0, 0}, /* n * c overflows */
  };
  for (int i = 0; i < (int)(sizeof odd / sizeof odd[0]); i++) {
    double m[C] = {0.0, 0.0, 0.0}, v[C] = {1.0, 1.0, 1.0};
    const norma_status st = norma_bn_running_update(&odd[i], 10, mean, var, m, v, NULL, 0.1);
    TU_CHECK(st == NORMA_OK, "descriptor %d: %s (%s)", i, norma_status_string(st),
             norma_last_error());
    TU_CHECK(memcmp(m, ref_m, sizeof m) == 0 && memcmp(v, ref_v, sizeof v) == 0,
             "descriptor %d: the same update", i);
  }
  /* the fields it reads are still checked */
  double keep[C] = {9.0, 9.0, 9.0};
  norma_bn_desc bad = good;
  bad.c = 0;
  TU_CHECK(norma_bn_running_update(&bad, 10, mean, var, keep, NULL, NULL, 0.1) ==
               NORMA_ERR_INVALID_ARGUMENT, "c = 0");
  bad = good, bad.dtype = (norma_dtype)9;
  TU_CHECK(norma_bn_running_update(&bad, 10, mean, var, keep, NULL, NULL, 0.1) ==
               NORMA_ERR_INVALID_ARGUMENT, "dtype 9");
  bad = good, bad.flags = 1u << 20;
  TU_CHECK(norma_bn_running_update(&bad, 10, mean, var, keep, NULL, NULL, 0.1) ==
               NORMA_ERR_INVALID_ARGUMENT, "unknown flag bit");
  bad = good, bad.c = NORMA_MAX_TENSOR_BYTES;
  TU_CHECK(norma_bn_running_update(&bad, 10, mean, var, keep, NULL, NULL, 0.1) ==
               NORMA_ERR_INVALID_ARGUMENT, "c past the per-channel bound");
  TU_CHECK(norma_bn_running_update(NULL, 10, mean, var, keep, NULL, NULL, 0.1) ==
               NORMA_ERR_INVALID_ARGUMENT, "d NULL");
  TU_CHECK(keep[0] == 9.0 && keep[1] == 9.0 && keep[2] == 9.0, "nothing written");
}

int main(void) {
  test_counted_forward();
  test_running_update();
  test_running_update_desc_fields();
  return tu_finish("test_running");
}
