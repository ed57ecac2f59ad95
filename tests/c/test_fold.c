/* test_fold.c - inference folding:
 *  - norma_bn_fold against scale = gamma / sqrt(var + eps), shift = beta - mean * scale
 *    (double, rounded once), with gamma / beta given and NULL, and with scale / shift aliasing
 *    the inputs;
 *  - norma_bn_fold_into_weights: a 3x3 convolution (OIHW) on a small image and a linear layer
 *    (OI) with the folded weights and bias give what the original layer followed by inference
 *    BN gives (computed here in double, and by norma_bn_forward_inference on the f32 output).
 */
#include "test_util.h"

static int64_t fulps(float a, double b) { return tu_ulps_f32(a, (float)b); }

static void test_fold_formula(void) {
  const int64_t c = 37;
  tu_rng r = tu_rng_make(17);
  float gamma[37], beta[37], mean[37], var[37], scale[37], shift[37];
  for (int64_t j = 0; j < c; j++) {
    gamma[j] = (float)tu_uniform(&r, -2, 2);
    beta[j] = (float)tu_uniform(&r, -1, 1);
    mean[j] = (float)tu_uniform(&r, -5, 5);
    var[j] = (float)tu_uniform(&r, 0, 3);
  }
  var[3] = 0.0f; /* fine with eps > 0 */
  for (int variant = 0; variant < 4; variant++) {
    const int gnull = variant & 1, bnull = variant & 2;
    const double eps = variant == 3 ? 0.0 : 1e-3;
    if (eps == 0.0) var[3] = 0.5f;
    tu_set_ctx("fold gamma %s beta %s eps %g", gnull ? "NULL" : "given", bnull ? "NULL" : "given",
               eps);
    norma_status st = norma_bn_fold(c, gnull ? NULL : gamma, bnull ? NULL : beta, mean, var, eps,
                                    scale, shift);
    TU_CHECK(st == NORMA_OK, "[%s] norma_bn_fold: %s", tu_ctx, norma_last_error());
    int64_t worst = 0;
    for (int64_t j = 0; j < c; j++) {
      double g = gnull ? 1.0 : gamma[j], b = bnull ? 0.0 : beta[j];
      double s = g / sqrt((double)var[j] + eps), t = b - (double)mean[j] * s;
      int64_t u = fulps(scale[j], s), v = fulps(shift[j], t);
      if (u > worst) worst = u;
      if (v > worst) worst = v;
    }
    TU_CHECK(worst <= 1, "[%s] scale / shift off by %lld ulp", tu_ctx, (long long)worst);
  }
  var[3] = 0.0f;
  /* aliasing: scale == gamma, shift == beta; scale == var, shift == mean */
  tu_set_ctx("fold in place");
  float g2[37], b2[37], m2[37], v2[37];
  memcpy(g2, gamma, sizeof g2), memcpy(b2, beta, sizeof b2);
  norma_status st = norma_bn_fold(c, gamma, beta, mean, var, 1e-3, scale, shift);
  TU_CHECK(st == NORMA_OK, "fold");
  st = norma_bn_fold(c, g2, b2, mean, var, 1e-3, g2, b2);
  TU_CHECK(st == NORMA_OK, "fold in place (gamma, beta): %s", norma_last_error());
  tu_same_bits("fold scale == gamma", g2, scale, sizeof g2);
  tu_same_bits("fold shift == beta", b2, shift, sizeof b2);
  memcpy(m2, mean, sizeof m2), memcpy(v2, var, sizeof v2);
  st = norma_bn_fold(c, gamma, beta, m2, v2, 1e-3, v2, m2);
  TU_CHECK(st == NORMA_OK, "fold in place (var, mean): %s", norma_last_error());
  tu_same_bits("fold scale == var", v2, scale, sizeof v2);
  tu_same_bits("fold shift == mean", m2, shift, sizeof m2);
}

/* out[o][p] = bias[o] + sum_{i,kh,kw} w[o][i][kh][kw] * in[i][ph+kh][pw+kw] (valid conv) */
static void conv3x3(int co, int ci, int h, int w, const float *in, const float *wt,
                    const float *bias, double *out) {
  const int oh = h - 2, ow = w - 2;
  for (int o = 0; o < co; o++)
    for (int y = 0; y < oh; y++)
      for (int x = 0; x < ow; x++) {
        double acc = bias ? bias[o] : 0.0;
        for (int i = 0; i < ci; i++)
          for (int kh = 0; kh < 3; kh++)
            for (int kw = 0; kw < 3; kw++)
              acc +=
                  (double)wt[((o * ci + i) * 3 + kh) * 3 + kw] * in[(i * h + y + kh) * w + x + kw];
        out[(o * oh + y) * ow + x] = acc;
      }
}

static void test_fold_conv(void) {
  enum { CO = 5, CI = 3, H = 7, W = 6, OH = H - 2, OW = W - 2, P = OH * OW, K = CI * 9 };
  tu_rng r = tu_rng_make(23);
  float in[CI * H * W], wt[CO * K], bias[CO], gamma[CO], beta[CO], mean[CO], var[CO];
  for (int i = 0; i < CI * H * W; i++) in[i] = (float)tu_uniform(&r, -1, 1);
  for (int i = 0; i < CO * K; i++) wt[i] = (float)tu_uniform(&r, -0.5, 0.5);
  for (int o = 0; o < CO; o++) {
    bias[o] = (float)tu_uniform(&r, -0.3, 0.3);
    gamma[o] = (float)tu_uniform(&r, -1.5, 1.5);
    beta[o] = (float)tu_uniform(&r, -0.5, 0.5);
    mean[o] = (float)tu_uniform(&r, -0.5, 0.5);
    var[o] = (float)tu_uniform(&r, 0.1, 2);
  }
  const double eps = 1e-5;
  for (int variant = 0; variant < 2; variant++) {
    const int with_params = variant == 0;
    tu_set_ctx("fold into conv3x3, gamma/beta %s", with_params ? "given" : "NULL");
    double z[CO * P], ey[CO * P], fy[CO * P];
    conv3x3(CO, CI, H, W, in, wt, bias, z);
    for (int o = 0; o < CO; o++)
      for (int p = 0; p < P; p++) {
        double g = with_params ? gamma[o] : 1.0, b = with_params ? beta[o] : 0.0;
        ey[o * P + p] = (z[o * P + p] - mean[o]) / sqrt((double)var[o] + eps) * g + b;
      }
    float wf[CO * K], bf[CO];
    memcpy(wf, wt, sizeof wf), memcpy(bf, bias, sizeof bf);
    norma_status st = norma_bn_fold_into_weights(CO, K, wf, bf, with_params ? gamma : NULL,
                                                 with_params ? beta : NULL, mean, var, eps);
    TU_CHECK(st == NORMA_OK, "[%s] fold_into_weights: %s", tu_ctx, norma_last_error());
    conv3x3(CO, CI, H, W, in, wf, bf, fy);
    tu_cmp_d("folded conv vs conv + BN (double)", NORMA_F64, fy, ey, CO * P, 1e-6, 1.0);
    /* the library's own inference on the f32 conv output, [1, CO, OH*OW] */
    float zf[CO * P], yf[CO * P], fyf[CO * P];
    for (int i = 0; i < CO * P; i++) zf[i] = (float)z[i], fyf[i] = (float)fy[i];
    norma_bn_desc d = {1, CO, P, NORMA_CHANNELS_FIRST, NORMA_F32, eps, 0};
    st = norma_bn_forward_inference(&d, zf, NULL, with_params ? gamma : NULL,
                                    with_params ? beta : NULL, mean, var, yf);
    TU_CHECK(st == NORMA_OK, "[%s] forward_inference: %s", tu_ctx, norma_last_error());
    tu_cmp("folded conv vs conv + norma inference", NORMA_F32, fyf, yf, CO * P, 1e-5, 1.0);
    /* and the scale / shift of norma_bn_fold applied to the conv output */
    float sc[CO], sh[CO];
    st = norma_bn_fold(CO, with_params ? gamma : NULL, with_params ? beta : NULL, mean, var, eps,
                       sc, sh);
    TU_CHECK(st == NORMA_OK, "[%s] fold: %s", tu_ctx, norma_last_error());
    double sy[CO * P];
    for (int o = 0; o < CO; o++)
      for (int p = 0; p < P; p++) sy[o * P + p] = z[o * P + p] * sc[o] + sh[o];
    tu_cmp_d("conv * scale + shift vs conv + BN", NORMA_F64, sy, ey, CO * P, 1e-6, 1.0);
  }
}

static void test_fold_linear(void) {
  enum { CO = 4, CI = 7, B = 3 };
  tu_rng r = tu_rng_make(29);
  float x[B * CI], wt[CO * CI], zero_bias[CO] = {0}, gamma[CO], beta[CO], mean[CO], var[CO];
  for (int i = 0; i < B * CI; i++) x[i] = (float)tu_uniform(&r, -2, 2);
  for (int i = 0; i < CO * CI; i++) wt[i] = (float)tu_uniform(&r, -1, 1);
  for (int o = 0; o < CO; o++) {
    gamma[o] = (float)tu_uniform(&r, 0.5, 1.5), beta[o] = (float)tu_uniform(&r, -1, 1);
    mean[o] = (float)tu_uniform(&r, -1, 1), var[o] = (float)tu_uniform(&r, 0.2, 3);
  }
  tu_set_ctx("fold into linear (no bias)");
  const double eps = 1e-3;
  double ey[B * CO], fy[B * CO];
  float wf[CO * CI], bf[CO];
  memcpy(wf, wt, sizeof wf), memcpy(bf, zero_bias, sizeof bf);
  norma_status st = norma_bn_fold_into_weights(CO, CI, wf, bf, gamma, beta, mean, var, eps);
  TU_CHECK(st == NORMA_OK, "[%s] fold_into_weights: %s", tu_ctx, norma_last_error());
  for (int b = 0; b < B; b++)
    for (int o = 0; o < CO; o++) {
      double z = 0, f = bf[o];
      for (int i = 0; i < CI; i++) {
        z += (double)wt[o * CI + i] * x[b * CI + i];
        f += (double)wf[o * CI + i] * x[b * CI + i];
      }
      ey[b * CO + o] = (z - mean[o]) / sqrt((double)var[o] + eps) * gamma[o] + beta[o];
      fy[b * CO + o] = f;
    }
  tu_cmp_d("folded linear vs linear + BN", NORMA_F64, fy, ey, B * CO, 1e-6, 1.0);
  /* the weights: w * scale, rounded once */
  int64_t worst = 0;
  for (int o = 0; o < CO; o++) {
    double s = gamma[o] / sqrt((double)var[o] + eps);
    for (int i = 0; i < CI; i++) {
      int64_t u = fulps(wf[o * CI + i], (double)wt[o * CI + i] * s);
      if (u > worst) worst = u;
    }
    int64_t u = fulps(bf[o], (0.0 - mean[o]) * s + beta[o]);
    if (u > worst) worst = u;
  }
  TU_CHECK(worst <= 1, "[%s] folded weight / bias off by %lld ulp", tu_ctx, (long long)worst);
}

int main(void) {
  test_fold_formula();
  test_fold_conv();
  test_fold_linear();
  return tu_finish("test_fold");
}
