/* worker_norma.c - norma-bench-norma: times libnorma's BatchNorm on the cases it is given
   (see worker_common.h for the case syntax and the methodology), and runs the bandwidth probe
   with --probe. */
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

static bench_status run_case(const bench_case *k, int warmup, int reps, bench_timing *t,
                             char *impl, size_t impllen, char *extra, size_t extralen,
                             char *reason, size_t reasonlen) {
  norma_ctx c;
  memset(&c, 0, sizeof c);
  c.k = k;
  c.d.n = k->n;
  c.d.c = k->c;
  c.d.spatial = bench_case_spatial(k);
  c.d.layout = k->layout == BENCH_NHWC ? NORMA_CHANNELS_LAST : NORMA_CHANNELS_FIRST;
  c.d.dtype = k->dtype == BENCH_BF16 ? NORMA_BF16 : NORMA_F32;
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
  snprintf(impl, impllen, "%s",
           norma_get_use_reference() ? "reference" : norma_isa_name(norma_get_isa()));
  /* how the library ran it: the traffic model the driver reports */
  norma_bn_plan plan;
  norma_bn_op op = k->dir == BENCH_FWD ? NORMA_BN_OP_FORWARD_TRAINING
                   : k->dir == BENCH_INFER ? NORMA_BN_OP_FORWARD_INFERENCE
                                           : NORMA_BN_OP_BACKWARD;
  if (norma_bn_query_plan(&c.d, op, &plan) == NORMA_OK) {
    snprintf(extra, extralen,
             ",\"model\":\"%d-pass\",\"plan\":{\"dram_passes\":%d,\"fused\":%d,"
             "\"unit\":%lld,\"threads\":%d,\"isa\":\"%s\",\"streaming_stores\":%d,"
             "\"reference\":%d}",
             plan.dram_passes, plan.dram_passes, plan.fused, (long long)plan.unit, plan.threads,
             norma_isa_name(plan.isa), plan.streaming_stores, plan.reference);
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

int main(int argc, char **argv) {
  static const bench_worker w = {"norma", print_info, set_threads, run_case};
  return bench_worker_main(argc, argv, &w);
}
