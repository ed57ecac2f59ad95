/* worker_norma.c - norma-bench-norma: times libnorma's BatchNorm and the norm family
   (LayerNorm, RMSNorm, GroupNorm, InstanceNorm) on the cases it is given (see worker_common.h
   for the case syntax and the methodology), and runs the bandwidth probe with --probe.
   --max-isa caps the library's instruction set (norma_set_max_isa); every result says which
   one ran ("isa"). */
#include <stdlib.h>
#include <string.h>

#include "norma.h"
#include "worker_common.h"

typedef struct norma_ctx {
  const bench_case *k;
  norma_bn_desc d;
  void *x, *y, *res, *dy, *dx, *dres;
  float *gamma, *beta, *mean, *var, *save_mean, *save_invstd, *run_mean, *run_var, *dgamma,
      *dbeta;
} norma_ctx;

static int check(norma_status s, char *err, size_t errlen) {
  if (s == NORMA_OK) return 0;
  snprintf(err, errlen, "%s: %s", norma_status_string(s), norma_last_error());
  return 1;
}

static int run_fwd(void *p, char *err, size_t errlen) {
  norma_ctx *c = (norma_ctx *)p;
  return check(norma_bn_forward_training(&c->d, c->x, c->res, c->gamma, c->beta, c->y,
                                         c->save_mean, c->save_invstd, c->run_mean, c->run_var,
                                         0.1),
               err, errlen);
}

static int run_infer(void *p, char *err, size_t errlen) {
  norma_ctx *c = (norma_ctx *)p;
  return check(norma_bn_forward_inference(&c->d, c->x, c->res, c->gamma, c->beta, c->mean,
                                          c->var, c->y),
               err, errlen);
}

static int run_bwd(void *p, char *err, size_t errlen) {
  norma_ctx *c = (norma_ctx *)p;
  /* y is passed only where the API needs it (the ReLU mask); otherwise x gives x_hat. */
  const void *y = c->k->act != BENCH_ACT_NONE ? c->y : NULL;
  return check(norma_bn_backward(&c->d, c->x, y, c->dy, c->gamma, c->beta, c->save_mean,
                                 c->save_invstd, c->dx, c->dres, c->dgamma, c->dbeta),
               err, errlen);
}

static void ctx_free(norma_ctx *c) {
  void *bufs[] = {c->x, c->y, c->res, c->dy, c->dx, c->dres, c->gamma, c->beta, c->mean, c->var,
                  c->save_mean, c->save_invstd, c->run_mean, c->run_var, c->dgamma, c->dbeta};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; ++i) bench_free(bufs[i]);
}

static norma_dtype to_norma_dtype(bench_dtype t) {
  return t == BENCH_BF16 ? NORMA_BF16 : t == BENCH_F16 ? NORMA_F16 : NORMA_F32;
}

static const char *impl_name(void) {
  return norma_get_use_reference() ? "reference" : norma_isa_name(norma_get_isa());
}

/* ---- the norm family ------------------------------------------------------------------- */

typedef struct fam_ctx {
  const bench_case *k;
  norma_ln_desc ld;
  norma_gn_desc gd;
  norma_in_desc id;
  void *x, *y, *res, *sum, *dy, *dx, *dsum;
  float *gamma, *beta, *save_mean, *save_invstd, *dgamma, *dbeta;
} fam_ctx;

static int fam_fwd(void *p, char *err, size_t errlen) {
  fam_ctx *c = (fam_ctx *)p;
  norma_status s;
  switch (c->k->family) {
    case BENCH_LN:
      s = norma_ln_forward(&c->ld, c->x, c->res, c->gamma, c->beta, c->y, c->sum, c->save_mean,
                           c->save_invstd);
      break;
    case BENCH_RMS:
      s = norma_rms_forward(&c->ld, c->x, c->res, c->gamma, c->y, c->sum, c->save_invstd);
      break;
    case BENCH_GN:
      s = norma_gn_forward(&c->gd, c->x, c->gamma, c->beta, c->y, c->save_mean, c->save_invstd);
      break;
    default:
      s = norma_in_forward_training(&c->id, c->x, c->gamma, c->beta, c->y, c->save_mean,
                                    c->save_invstd, NULL, NULL, 0.1);
      break;
  }
  return check(s, err, errlen);
}

static int fam_bwd(void *p, char *err, size_t errlen) {
  fam_ctx *c = (fam_ctx *)p;
  /* the input of the normalization: h (written by the forward) with a residual, else x */
  const void *xin = c->k->residual ? c->sum : c->x;
  norma_status s;
  switch (c->k->family) {
    case BENCH_LN:
      s = norma_ln_backward(&c->ld, xin, c->dy, c->dsum, c->gamma, c->save_mean, c->save_invstd,
                            c->dx, c->dgamma, c->dbeta);
      break;
    case BENCH_RMS:
      s = norma_rms_backward(&c->ld, xin, c->dy, c->dsum, c->gamma, c->save_invstd, c->dx,
                             c->dgamma);
      break;
    case BENCH_GN: /* y is needed only for a ReLU mask; SiLU recomputes z from x */
      s = norma_gn_backward(&c->gd, c->x, NULL, c->dy, c->gamma, c->beta, c->save_mean,
                            c->save_invstd, c->dx, c->dgamma, c->dbeta);
      break;
    default:
      s = norma_in_backward(&c->id, c->x, NULL, c->dy, c->gamma, c->beta, c->save_mean,
                            c->save_invstd, c->dx, c->dgamma, c->dbeta);
      break;
  }
  return check(s, err, errlen);
}

static void fam_free(fam_ctx *c) {
  void *bufs[] = {c->x, c->y, c->res, c->sum, c->dy, c->dx, c->dsum, c->gamma, c->beta,
                  c->save_mean, c->save_invstd, c->dgamma, c->dbeta};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; ++i) bench_free(bufs[i]);
}

static bench_status run_family(const bench_case *k, int warmup, int reps, bench_timing *t,
                               char *impl, size_t impllen, char *extra, size_t extralen,
                               char *reason, size_t reasonlen) {
  fam_ctx c;
  memset(&c, 0, sizeof c);
  c.k = k;
  const norma_dtype dt = to_norma_dtype(k->dtype);
  const norma_layout lay = k->layout == BENCH_NHWC ? NORMA_CHANNELS_LAST : NORMA_CHANNELS_FIRST;
  int64_t nparam, nstat; /* affine length, statistics count */
  if (k->family == BENCH_LN || k->family == BENCH_RMS) {
    c.ld = (norma_ln_desc){k->n, k->c, dt, 1e-5, 0u};
    nparam = k->c;
    nstat = k->n;
  } else if (k->family == BENCH_GN) {
    c.gd = (norma_gn_desc){k->n, k->c, bench_case_spatial(k), k->groups, lay, dt, 1e-5,
                           k->act == BENCH_ACT_SILU ? (unsigned)NORMA_SILU : 0u};
    nparam = k->c;
    nstat = k->n * k->groups;
  } else {
    c.id = (norma_in_desc){k->n, k->c, bench_case_spatial(k), lay, dt, 1e-5, 0u};
    nparam = k->c;
    nstat = k->n * k->c;
  }
  const int64_t count = bench_case_elems(k);
  const size_t tb = (size_t)count * bench_dtype_size(k->dtype);
  const size_t pb = (size_t)nparam * sizeof(float), sb = (size_t)nstat * sizeof(float);
  const int bwd = k->dir == BENCH_BWD, res = k->residual;
  /* the backward's untimed forward writes y, save_* and (with a residual) h into sum */
  c.x = bench_alloc(tb);
  c.y = bench_alloc(tb);
  c.res = res ? bench_alloc(tb) : NULL;
  c.sum = res ? bench_alloc(tb) : NULL;
  c.dy = bwd ? bench_alloc(tb) : NULL;
  c.dx = bwd ? bench_alloc(tb) : NULL;
  c.dsum = bwd && res ? bench_alloc(tb) : NULL;
  c.gamma = (float *)bench_alloc(pb);
  c.beta = (float *)bench_alloc(pb);
  c.dgamma = (float *)bench_alloc(pb);
  c.dbeta = (float *)bench_alloc(pb);
  c.save_mean = (float *)bench_alloc(sb);
  c.save_invstd = (float *)bench_alloc(sb);
  if (!c.x || !c.y || (res && (!c.res || !c.sum)) || (bwd && (!c.dy || !c.dx)) ||
      (bwd && res && !c.dsum) || !c.gamma || !c.beta || !c.dgamma || !c.dbeta ||
      !c.save_mean || !c.save_invstd) {
    fam_free(&c);
    snprintf(reason, reasonlen, "out of memory");
    return BENCH_ERROR;
  }
  bench_fill(c.x, count, k->dtype, 1, -1.0f, 1.0f);
  if (res) bench_fill(c.res, count, k->dtype, 2, -1.0f, 1.0f);
  if (bwd) bench_fill(c.dy, count, k->dtype, 3, -1.0f, 1.0f);
  if (bwd && res) bench_fill(c.dsum, count, k->dtype, 9, -1.0f, 1.0f);
  bench_fill_f32(c.gamma, nparam, 4, 0.5f, 1.5f);
  bench_fill_f32(c.beta, nparam, 5, -0.5f, 0.5f);

  int rc = 0;
  if (bwd) rc = fam_fwd(&c, reason, reasonlen); /* save_mean / save_invstd / h, untimed */
  if (!rc) rc = bench_time(bwd ? fam_bwd : fam_fwd, &c, warmup, reps, t, reason, reasonlen);
  fam_free(&c);
  if (rc) return strncmp(reason, "NORMA_ERR_UNSUPPORTED", 21) == 0 ? BENCH_NA : BENCH_ERROR;
  snprintf(impl, impllen, "%s", impl_name());
  snprintf(extra, extralen, ",\"isa\":\"%s\"", norma_isa_name(norma_get_isa()));
  return BENCH_OK;
}

/* ---- BatchNorm ------------------------------------------------------------------------- */

static bench_status run_case(const bench_case *k, int warmup, int reps, bench_timing *t,
                             char *impl, size_t impllen, char *extra, size_t extralen,
                             char *reason, size_t reasonlen) {
  if (k->family != BENCH_BN)
    return run_family(k, warmup, reps, t, impl, impllen, extra, extralen, reason, reasonlen);
  norma_ctx c;
  memset(&c, 0, sizeof c);
  c.k = k;
  c.d.n = k->n;
  c.d.c = k->c;
  c.d.spatial = bench_case_spatial(k);
  c.d.layout = k->layout == BENCH_NHWC ? NORMA_CHANNELS_LAST : NORMA_CHANNELS_FIRST;
  c.d.dtype = to_norma_dtype(k->dtype);
  c.d.eps = 1e-5;
  c.d.flags = k->act == BENCH_ACT_RELU ? NORMA_BN_RELU
              : k->act == BENCH_ACT_ADD_RELU ? NORMA_BN_ADD_RELU : 0u;

  int64_t count = bench_case_elems(k);
  size_t tb = (size_t)count * bench_dtype_size(k->dtype), pb = (size_t)k->c * sizeof(float);
  int add = k->act == BENCH_ACT_ADD_RELU;
  int bwd = k->dir == BENCH_BWD;
  /* y is the output of fwd / infer; for bwd, the untimed training forward that produces
     save_mean / save_invstd writes it (and it is the ReLU mask of relu_bwd / add_relu_bwd). */
  c.x = bench_alloc(tb);
  c.y = bench_alloc(tb);
  c.res = add ? bench_alloc(tb) : NULL;
  c.dy = bwd ? bench_alloc(tb) : NULL;
  c.dx = bwd ? bench_alloc(tb) : NULL;
  c.dres = bwd && add ? bench_alloc(tb) : NULL;
  c.gamma = (float *)bench_alloc(pb);
  c.beta = (float *)bench_alloc(pb);
  c.mean = (float *)bench_alloc(pb);
  c.var = (float *)bench_alloc(pb);
  c.save_mean = (float *)bench_alloc(pb);
  c.save_invstd = (float *)bench_alloc(pb);
  c.run_mean = (float *)bench_alloc(pb);
  c.run_var = (float *)bench_alloc(pb);
  c.dgamma = (float *)bench_alloc(pb);
  c.dbeta = (float *)bench_alloc(pb);
  if (!c.x || !c.y || (add && !c.res) || (bwd && (!c.dy || !c.dx)) ||
      (bwd && add && !c.dres) || !c.gamma || !c.beta || !c.mean || !c.var || !c.save_mean ||
      !c.save_invstd || !c.run_mean || !c.run_var || !c.dgamma || !c.dbeta) {
    ctx_free(&c);
    snprintf(reason, reasonlen, "out of memory");
    return BENCH_ERROR;
  }
  bench_fill(c.x, count, k->dtype, 1, -1.0f, 1.0f);
  if (add) bench_fill(c.res, count, k->dtype, 2, -1.0f, 1.0f);
  if (bwd) bench_fill(c.dy, count, k->dtype, 3, -1.0f, 1.0f);
  bench_fill_f32(c.gamma, k->c, 4, 0.5f, 1.5f);
  bench_fill_f32(c.beta, k->c, 5, -0.5f, 0.5f);
  bench_fill_f32(c.mean, k->c, 6, -0.1f, 0.1f);
  bench_fill_f32(c.var, k->c, 7, 0.25f, 0.5f);
  bench_fill_f32(c.run_var, k->c, 8, 1.0f, 1.0f);

  int rc = 0;
  if (bwd) rc = run_fwd(&c, reason, reasonlen); /* save_mean / save_invstd / y, untimed */
  if (!rc) {
    bench_run_fn fn = k->dir == BENCH_FWD ? run_fwd : k->dir == BENCH_INFER ? run_infer : run_bwd;
    rc = bench_time(fn, &c, warmup, reps, t, reason, reasonlen);
  }
  ctx_free(&c);
  if (rc) {
    /* NORMA_ERR_UNSUPPORTED means the library has no such kernel: report n/a */
    return strncmp(reason, "NORMA_ERR_UNSUPPORTED", 21) == 0 ? BENCH_NA : BENCH_ERROR;
  }
  snprintf(impl, impllen, "%s", impl_name());
  /* how the library ran it: the traffic model the driver reports */
  norma_bn_plan plan;
  norma_bn_op op = k->dir == BENCH_FWD ? NORMA_BN_OP_FORWARD_TRAINING
                   : k->dir == BENCH_INFER ? NORMA_BN_OP_FORWARD_INFERENCE
                                           : NORMA_BN_OP_BACKWARD;
  if (norma_bn_query_plan(&c.d, op, &plan) == NORMA_OK) {
    snprintf(extra, extralen,
             ",\"isa\":\"%s\",\"model\":\"%d-pass\",\"plan\":{\"dram_passes\":%d,\"fused\":%d,"
             "\"unit\":%lld,\"threads\":%d,\"isa\":\"%s\",\"streaming_stores\":%d,"
             "\"reference\":%d}",
             norma_isa_name(plan.isa), plan.dram_passes, plan.dram_passes, plan.fused,
             (long long)plan.unit, plan.threads, norma_isa_name(plan.isa), plan.streaming_stores,
             plan.reference);
  }
  return BENCH_OK;
}

static void print_info(FILE *f) {
  fprintf(f, ",\"version\":");
  bench_json_string(f, norma_version());
  fprintf(f, ",\"isa\":");
  bench_json_string(f, norma_isa_name(norma_get_isa()));
  fprintf(f, ",\"use_reference\":%s,\"lib_threads\":%d",
          norma_get_use_reference() ? "true" : "false", norma_get_num_threads());
}

static void set_threads(int n) { norma_set_num_threads(n); }

static int set_max_isa(const char *v, char *err, size_t errlen) {
  norma_isa isa;
  if (strcmp(v, "scalar") == 0) isa = NORMA_ISA_SCALAR;
  else if (strcmp(v, "avx2") == 0) isa = NORMA_ISA_AVX2;
  else if (strcmp(v, "avx512") == 0) isa = NORMA_ISA_AVX512;
  else {
    snprintf(err, errlen, "unknown ISA (scalar, avx2, avx512)");
    return 1;
  }
  norma_status s = norma_set_max_isa(isa);
  if (s != NORMA_OK) {
    snprintf(err, errlen, "%s: %s", norma_status_string(s), norma_last_error());
    return 1;
  }
  return 0;
}

int main(int argc, char **argv) {
  static const bench_worker w = {"norma", print_info, set_threads, run_case, set_max_isa};
  return bench_worker_main(argc, argv, &w);
}
