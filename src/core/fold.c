/* fold.c - folding inference BatchNorm into scale/shift or into the producer's weights. */
#include <math.h>
#include <stdlib.h>

#include "check.h"

static norma_status check_fold(const char *fn, const char *cname, int64_t c, const float *mean,
                               const float *var, double eps) {
  if (c <= 0)
    return norma__fail(NORMA_ERR_INVALID_ARGUMENT, "%s: %s must be > 0 (got %lld)", fn, cname,
                       (long long)c);
  /* the byte counts below are c * sizeof(float): bounded as every tensor is */
  if (c > NORMA_MAX_TENSOR_BYTES / (int64_t)sizeof(float))
    return norma__fail(NORMA_ERR_INVALID_ARGUMENT, "%s: %s = %lld is more than "
                       "NORMA_MAX_TENSOR_BYTES / 4", fn, cname, (long long)c);
  if (!(eps >= 0.0) || !isfinite(eps))
    return norma__fail(NORMA_ERR_INVALID_ARGUMENT, "%s: eps must be finite and >= 0 (got %g)", fn,
                       eps);
  norma_status st;
  if ((st = bn_require(fn, "mean", mean)) || (st = bn_require(fn, "var", var))) return st;
  for (int64_t j = 0; j < c; j++)
    if (!((double)var[j] + eps > 0.0))
      return norma__fail(NORMA_ERR_INVALID_ARGUMENT, "%s: var[%lld] + eps must be > 0 (got %g)",
                         fn, (long long)j, (double)var[j] + eps);
  return NORMA_OK;
}

norma_status norma_bn_fold(int64_t c, const float *gamma, const float *beta, const float *mean,
                           const float *var, double eps, float *scale, float *shift) {
  static const char fn[] = "norma_bn_fold";
  norma_status st;
  if ((st = check_fold(fn, "c", c, mean, var, eps))) return st;
  if ((st = bn_require(fn, "scale", scale)) || (st = bn_require(fn, "shift", shift))) return st;
  /* scale / shift may alias an input exactly (each channel is read before it is written), but
     not each other, nor overlap anything partially */
  const size_t cb = (size_t)c * sizeof(float);
  const bn_region r[] = {
      {"scale", scale, cb, REGION_TENSOR_OUT}, {"shift", shift, cb, REGION_TENSOR_OUT},
      {"gamma", gamma, cb, REGION_TENSOR_IN},  {"beta", beta, cb, REGION_TENSOR_IN},
      {"mean", mean, cb, REGION_TENSOR_IN},    {"var", var, cb, REGION_TENSOR_IN},
  };
  if ((st = bn_check_overlaps(fn, r, 6))) return st;
  /* scale/shift may alias inputs: read channel j completely before writing it */
  for (int64_t j = 0; j < c; j++) {
    double g = gamma ? gamma[j] : 1.0, b = beta ? beta[j] : 0.0;
    double s = g / sqrt((double)var[j] + eps);
    double t = b - (double)mean[j] * s;
    scale[j] = (float)s;
    shift[j] = (float)t;
  }
  return NORMA_OK;
}

norma_status norma_bn_fold_into_weights(int64_t c_out, int64_t per_out, float *weight,
                                        float *bias, const float *gamma, const float *beta,
                                        const float *mean, const float *var, double eps) {
  static const char fn[] = "norma_bn_fold_into_weights";
  norma_status st;
  if ((st = check_fold(fn, "c_out", c_out, mean, var, eps))) return st;
  int64_t total;
  if (per_out <= 0)
    return norma__fail(NORMA_ERR_INVALID_ARGUMENT, "%s: per_out must be > 0 (got %lld)", fn,
                       (long long)per_out);
  if (__builtin_mul_overflow(c_out, per_out, &total) ||
      total > NORMA_MAX_TENSOR_BYTES / (int64_t)sizeof(float))
    return norma__fail(NORMA_ERR_INVALID_ARGUMENT, "%s: c_out * per_out overflows or is more "
                       "than NORMA_MAX_TENSOR_BYTES / 4", fn);
  if ((st = bn_require(fn, "weight", weight)) || (st = bn_require(fn, "bias", bias))) return st;
  const bn_region r[] = {
      {"weight", weight, (size_t)total * 4, REGION_PARAM_OUT},
      {"bias", bias, (size_t)c_out * 4, REGION_PARAM_OUT},
      {"gamma", gamma, (size_t)c_out * 4, REGION_PARAM_IN},
      {"beta", beta, (size_t)c_out * 4, REGION_PARAM_IN},
      {"mean", mean, (size_t)c_out * 4, REGION_PARAM_IN},
      {"var", var, (size_t)c_out * 4, REGION_PARAM_IN},
  };
  if ((st = bn_check_overlaps(fn, r, 6))) return st;
  for (int64_t o = 0; o < c_out; o++) {
    double g = gamma ? gamma[o] : 1.0, b = beta ? beta[o] : 0.0;
    double s = g / sqrt((double)var[o] + eps);
    float *w = weight + o * per_out;
    for (int64_t k = 0; k < per_out; k++) w[k] = (float)((double)w[k] * s);
    bias[o] = (float)(((double)bias[o] - (double)mean[o]) * s + b);
  }
  return NORMA_OK;
}
