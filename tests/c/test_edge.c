/* test_edge.c - edge numerics: spreads at the ends of f32's range.
 *
 * The rule (docs/api.md): the statistics are exact whatever the scale of the data (deviations
 * are summed scaled by a power of two), and y is right whenever the exact y is finite; where
 * gamma * invstd does not fit the compute type (a spread below ~1e-38 with eps = 0) the
 * channel is applied in double and save_invstd holds +inf.
 *
 * Checked on every op whose statistics come from the kernels (BatchNorm both layouts and both
 * schedules' shapes, LayerNorm, RMSNorm, GroupNorm both layouts), for data 1e-42..8e-42
 * (subnormal) and 1e30..8e30 (squares overflow f32), against the exact y computed here; and
 * one such channel among ordinary ones in tensors the threads share, at 1-4 threads.
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

/* channel j of rows of c values (channels-last), against the exact y of that channel */
static void expect_y_channel(const char *what, const float *x, const float *y, int64_t rows,
                             int64_t c, int64_t j) {
  double m = 0.0, v = 0.0;
  for (int64_t r = 0; r < rows; r++) m += x[r * c + j];
  m /= (double)rows;
  for (int64_t r = 0; r < rows; r++) v += (x[r * c + j] - m) * (x[r * c + j] - m);
  v /= (double)rows;
  int bad = 0;
  for (int64_t r = 0; r < rows; r++) {
    const double e = (x[r * c + j] - m) / sqrt(v), o = y[r * c + j];
    bad += !(isfinite(o) && fabs(o - e) <= 2e-6 * (1.0 + fabs(e)));
  }
  TU_CHECK(bad == 0, "%s: channel %lld, %d of %lld values wrong", what, (long long)j, bad,
           (long long)rows);
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
  /* one channel whose gamma * invstd overflows f32 among ordinary ones, in channels-last
     tensors the threads share (in the caches: the split schedule in one region, each thread
     finalizing its share of the channels), the second wider than a block of the finalize (128
     channels): every thread must take the double apply whichever thread's channels and
     whichever block hold the overflow, at 1-4 threads */
  const int64_t shapes[2][3] = {{2048, 48, 40}, {256, 272, 260}}; /* rows, channels, slow one */
  for (int sh = 0; sh < 2; sh++) {
    const int64_t nr = shapes[sh][0], nc = shapes[sh][1], slow = shapes[sh][2];
    const size_t bytes = sizeof(float) * (size_t)(nr * nc);
    float *x = malloc(bytes), *y = malloc(bytes);
    float *sm = malloc(sizeof(float) * (size_t)nc), *is = malloc(sizeof(float) * (size_t)nc);
    TU_CHECK(x && y && sm && is, "out of memory");
    if (!x || !y || !sm || !is) break;
    for (int64_t r = 0; r < nr; r++)
      for (int64_t j = 0; j < nc; j++)
        x[r * nc + j] = j == slow ? (float)(1e-42 * (double)(1 + (r * 7) % 8))
                                  : (float)(0.25 * (double)((r * 13 + j * 5) % 17) + (double)j);
    for (int th = 1; th <= 4; th++) {
      norma_set_num_threads(th);
      norma_bn_desc d = {4, nc, nr / 4, NORMA_CHANNELS_LAST, NORMA_F32, 0.0, 0};
      memset(y, 0, bytes);
      TU_CHECK(norma_bn_forward_training(&d, x, NULL, NULL, NULL, y, sm, is, NULL, NULL, 0.1) ==
                   NORMA_OK, "%s", norma_last_error());
      snprintf(what, sizeof what, "bn NHWC 4x%lldx%lld, channel %lld slow, %d threads",
               (long long)nc, (long long)(nr / 4), (long long)slow, th);
      for (int64_t j = 0; j < nc; j++) expect_y_channel(what, x, y, nr, nc, j);
    }
    norma_set_num_threads(0);
    free(x), free(y), free(sm), free(is);
  }
  return tu_finish("test_edge");
}
