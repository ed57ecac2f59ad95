/* test_edge.c - edge numerics: spreads at the ends of f32's range.
 *
 * The rule (docs/api.md): the statistics are exact whatever the scale of the data (deviations
 * are summed scaled by a power of two), and y is right whenever the exact y is finite; where
 * gamma * invstd does not fit the compute type (a spread below ~1e-38 with eps = 0) the
 * channel is applied in double and save_invstd holds +inf.
 *
 * Checked on every op whose statistics come from the kernels (BatchNorm both layouts and both
 * schedules' shapes, LayerNorm, RMSNorm, GroupNorm both layouts), for data 1e-42..8e-42
 * (subnormal) and 1e30..8e30 (squares overflow f32), against the exact y computed here.
 */
#include "test_util.h"

static void expect_y(const char *what, const float *x, const float *y, int64_t n) {
  double m = 0.0, v = 0.0;
  for (int64_t i = 0; i < n; i++) m += x[i];
  m /= (double)n;
  for (int64_t i = 0; i < n; i++) v += (x[i] - m) * (x[i] - m);
  v /= (double)n;
  for (int64_t i = 0; i < n; i++) {
    const double e = (x[i] - m) / sqrt(v);
    TU_CHECK(isfinite(y[i]) && fabs(y[i] - e) <= 2e-6 * (1.0 + fabs(e)),
             "%s: y[%lld] = %.9g, exact %.9g", what, (long long)i, (double)y[i], e);
  }
}

static void expect_rms(const char *what, const float *x, const float *y, int64_t n) {
  double q = 0.0;
  for (int64_t i = 0; i < n; i++) q += (double)x[i] * x[i];
  const double r = sqrt(q / (double)n);
  for (int64_t i = 0; i < n; i++)
    TU_CHECK(isfinite(y[i]) && fabs(y[i] - x[i] / r) <= 2e-6 * (1.0 + fabs(x[i] / r)),
             "%s: y[%lld] = %.9g, exact %.9g", what, (long long)i, (double)y[i], x[i] / r);
}

int main(void) {
  const double scales[] = {1e-42, 1e30};
  char what[160];
  for (int si = 0; si < 2; si++) {
    const double sc = scales[si];
    enum { N = 40 };
    float x[N], y[N], sm[N], is[N];
    for (int i = 0; i < N; i++) x[i] = (float)(sc * (1 + (i * 7) % 8)); /* eight levels */
    /* BatchNorm, one channel of 40 values: [40, 1] rows; [2, 1, 20] runs; [20, 1, 2] runs of
       two, which take the wide view (op_bn.c: a column per position, the constants repeated
       onto the columns, here those applied in double) */
    for (int lay = 0; lay < 2; lay++) {
      norma_bn_desc a = {N, 1, 1, (norma_layout)lay, NORMA_F32, 0.0, 0};
      norma_bn_desc b = {2, 1, N / 2, (norma_layout)lay, NORMA_F32, 0.0, 0};
      norma_bn_desc c = {N / 2, 1, 2, (norma_layout)lay, NORMA_F32, 0.0, 0};
      norma_bn_desc *ds[] = {&a, &b, &c};
      for (int k = 0; k < 3; k++) {
        snprintf(what, sizeof what, "bn scale %g %s n=%lld", sc, tu_layout_name(ds[k]->layout),
                 (long long)ds[k]->n);
        TU_CHECK(norma_bn_forward_training(ds[k], x, NULL, NULL, NULL, y, sm, is, NULL, NULL,
                                           0.1) == NORMA_OK, "%s: %s", what, norma_last_error());
        expect_y(what, x, y, N);
      }
      /* GroupNorm, one group of 2 channels x 20 positions */
      norma_gn_desc g = {1, 2, N / 2, 1, (norma_layout)lay, NORMA_F32, 0.0, 0};
      snprintf(what, sizeof what, "gn scale %g %s", sc, tu_layout_name(g.layout));
      TU_CHECK(norma_gn_forward(&g, x, NULL, NULL, y, sm, is) == NORMA_OK, "%s", what);
      expect_y(what, x, y, N);
    }
    norma_ln_desc l = {1, N, NORMA_F32, 0.0, 0};
    snprintf(what, sizeof what, "ln scale %g", sc);
    TU_CHECK(norma_ln_forward(&l, x, NULL, NULL, NULL, y, NULL, sm, is) == NORMA_OK, "%s", what);
    expect_y(what, x, y, N);
    snprintf(what, sizeof what, "rms scale %g", sc);
    TU_CHECK(norma_rms_forward(&l, x, NULL, NULL, y, NULL, is) == NORMA_OK, "%s", what);
    expect_rms(what, x, y, N);
  }
  return tu_finish("test_edge");
}
