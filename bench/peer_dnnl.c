/* peer_dnnl.c - norma-bench-dnnl: times oneDNN's batch normalization (C API, oneDNN 2.x) on
 * the cases it is given, with the methodology of tools/bench/worker_common.h.
 *
 * oneDNN picks its best implementation for the memory format it is given: the user tensors
 * are plain nchw (channels-first), nhwc (channels-last) or nc (2-D), and the primitive is
 * created on exactly that format (no reorder is timed).  Flags: use_scale | use_shift
 * (gamma, beta); inference adds use_global_stats; the ReLU variants add fuse_norm_relu
 * (training keeps the ReLU mask in oneDNN's workspace, which its backward reads).  oneDNN has
 * no fused residual-add + ReLU for batch normalization: add_relu_* cases report n/a.
 * Scale, shift, mean and variance are f32 for every data type, as oneDNN requires.
 */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include <dnnl.h>

#include "worker_common.h"

#define MAX_ARGS 12

typedef struct dnnl_ctx {
  dnnl_engine_t eng;
  dnnl_stream_t strm;
  dnnl_primitive_t prim;
  int nargs;
  dnnl_exec_arg_t args[MAX_ARGS];
} dnnl_ctx;

static dnnl_engine_t g_eng;
static dnnl_stream_t g_strm;

static const char *st_name(dnnl_status_t s) {
  switch (s) {
    case dnnl_success: return "success";
    case dnnl_out_of_memory: return "out_of_memory";
    case dnnl_invalid_arguments: return "invalid_arguments";
    case dnnl_unimplemented: return "unimplemented";
    case dnnl_iterator_ends: return "iterator_ends";
    case dnnl_runtime_error: return "runtime_error";
    case dnnl_not_required: return "not_required";
    default: return "unknown";
  }
}

static int run_prim(void *p, char *err, size_t errlen) {
  dnnl_ctx *c = (dnnl_ctx *)p;
  dnnl_status_t s = dnnl_primitive_execute(c->prim, c->strm, c->nargs, c->args);
  if (s == dnnl_success) s = dnnl_stream_wait(c->strm);
  if (s != dnnl_success) {
    snprintf(err, errlen, "dnnl_primitive_execute: %s", st_name(s));
    return 1;
  }
  return 0;
}

/* Resources of one case, released together. */
typedef struct res_list {
  void *ptr[16];
  int nptr;
  dnnl_memory_t mem[16];
  int nmem;
  dnnl_primitive_desc_t pd[2];
  dnnl_primitive_t prim[2];
} res_list;

static void res_free(res_list *r) {
  for (int i = 0; i < r->nmem; ++i) dnnl_memory_destroy(r->mem[i]);
  for (int i = 0; i < 2; ++i) {
    if (r->prim[i]) dnnl_primitive_destroy(r->prim[i]);
    if (r->pd[i]) dnnl_primitive_desc_destroy(r->pd[i]);
  }
  for (int i = 0; i < r->nptr; ++i) bench_free(r->ptr[i]);
}

/* A buffer of `bytes`, touched, wrapped in a dnnl memory of md; NULL on failure. */
static dnnl_memory_t make_mem(res_list *r, const dnnl_memory_desc_t *md, void **out_ptr) {
  size_t bytes = dnnl_memory_desc_get_size(md);
  void *p = bench_alloc(bytes);
  if (!p) return NULL;
  r->ptr[r->nptr++] = p;
  dnnl_memory_t m = NULL;
  if (dnnl_memory_create(&m, md, g_eng, p) != dnnl_success) return NULL;
  r->mem[r->nmem++] = m;
  if (out_ptr) *out_ptr = p;
  return m;
}

#define FAIL(status_, ...)                                \
  do {                                                    \
    snprintf(reason, reasonlen, __VA_ARGS__);             \
    res_free(&r);                                         \
    return (status_);                                     \
  } while (0)

static bench_status run_case(const bench_case *k, int warmup, int reps, bench_timing *t,
                             char *impl, size_t impllen, char *extra, size_t extralen,
                             char *reason, size_t reasonlen) {
  (void)extra;
  (void)extralen;
  res_list r;
  memset(&r, 0, sizeof r);
  if (k->act == BENCH_ACT_ADD_RELU) {
    snprintf(reason, reasonlen, "oneDNN has no fused residual-add + ReLU for batch norm");
    return BENCH_NA;
  }
  dnnl_data_type_t dt = k->dtype == BENCH_BF16 ? dnnl_bf16 : dnnl_f32;
  dnnl_memory_desc_t md, pmd;
  dnnl_dims_t dims = {k->n, k->c, k->h, k->w};
  dnnl_format_tag_t tag = k->layout == BENCH_NCHW ? dnnl_nchw
                          : k->layout == BENCH_NHWC ? dnnl_nhwc : dnnl_nc;
  int nd = k->layout == BENCH_NC ? 2 : 4;
  if (dnnl_memory_desc_init_by_tag(&md, nd, dims, dt, tag) != dnnl_success)
    FAIL(BENCH_ERROR, "dnnl_memory_desc_init_by_tag failed");
  dnnl_dims_t pdims = {k->c};
  if (dnnl_memory_desc_init_by_tag(&pmd, 1, pdims, dnnl_f32, dnnl_a) != dnnl_success)
    FAIL(BENCH_ERROR, "dnnl_memory_desc_init_by_tag (params) failed");

  unsigned flags = dnnl_use_scale | dnnl_use_shift;
  if (k->act == BENCH_ACT_RELU) flags |= dnnl_fuse_norm_relu;
  const float eps = 1e-5f;
  dnnl_status_t s;

  /* forward primitive: training for fwd and bwd (the backward needs its pd as a hint, and its
     mean / variance / workspace), inference for infer. */
  dnnl_batch_normalization_desc_t fd;
  int infer = k->dir == BENCH_INFER;
  s = dnnl_batch_normalization_forward_desc_init(
      &fd, infer ? dnnl_forward_inference : dnnl_forward_training, &md, eps,
      infer ? (flags | dnnl_use_global_stats) : flags);
  if (s != dnnl_success) FAIL(BENCH_NA, "forward desc: %s", st_name(s));
  s = dnnl_primitive_desc_create(&r.pd[0], &fd, NULL, g_eng, NULL);
  if (s != dnnl_success)
    FAIL(BENCH_NA, "oneDNN has no forward implementation for this case (%s)", st_name(s));
  s = dnnl_primitive_create(&r.prim[0], r.pd[0]);
  if (s != dnnl_success) FAIL(BENCH_ERROR, "dnnl_primitive_create: %s", st_name(s));

  void *px = NULL, *pdy = NULL;
  float *pgamma = NULL, *pbeta = NULL, *pmean = NULL, *pvar = NULL;
  dnnl_memory_t mx = make_mem(&r, &md, &px), my = make_mem(&r, &md, NULL);
  dnnl_memory_t mscale = make_mem(&r, &pmd, (void **)&pgamma);
  dnnl_memory_t mshift = make_mem(&r, &pmd, (void **)&pbeta);
  dnnl_memory_t mmean = make_mem(&r, &pmd, (void **)&pmean);
  dnnl_memory_t mvar = make_mem(&r, &pmd, (void **)&pvar);
  if (!mx || !my || !mscale || !mshift || !mmean || !mvar) FAIL(BENCH_ERROR, "out of memory");
  int64_t count = bench_case_elems(k);
  bench_fill(px, count, k->dtype, 1, -1.0f, 1.0f);
  bench_fill_f32(pgamma, k->c, 4, 0.5f, 1.5f);
  bench_fill_f32(pbeta, k->c, 5, -0.5f, 0.5f);
  bench_fill_f32(pmean, k->c, 6, -0.1f, 0.1f);
  bench_fill_f32(pvar, k->c, 7, 0.25f, 0.5f);

  dnnl_memory_t mws = NULL;
  const dnnl_memory_desc_t *wsmd = dnnl_primitive_desc_query_md(r.pd[0], dnnl_query_workspace_md, 0);
  if (wsmd && dnnl_memory_desc_get_size(wsmd) > 0) {
    mws = make_mem(&r, wsmd, NULL);
    if (!mws) FAIL(BENCH_ERROR, "out of memory (workspace)");
  }

  dnnl_ctx fc = {g_eng, g_strm, r.prim[0], 0, {{0, NULL}}};
  dnnl_exec_arg_t fargs[] = {{DNNL_ARG_SRC, mx},        {DNNL_ARG_DST, my},
                             {DNNL_ARG_SCALE, mscale},  {DNNL_ARG_SHIFT, mshift},
                             {DNNL_ARG_MEAN, mmean},    {DNNL_ARG_VARIANCE, mvar},
                             {DNNL_ARG_WORKSPACE, mws}};
  fc.nargs = mws ? 7 : 6;
  memcpy(fc.args, fargs, sizeof fargs);

  const char *impl_str = NULL;
  dnnl_ctx bc;
  dnnl_ctx *timed = &fc;
  if (k->dir == BENCH_BWD) {
    dnnl_batch_normalization_desc_t bd;
    s = dnnl_batch_normalization_backward_desc_init(&bd, dnnl_backward, &md, &md, eps, flags);
    if (s != dnnl_success) FAIL(BENCH_NA, "backward desc: %s", st_name(s));
    s = dnnl_primitive_desc_create(&r.pd[1], &bd, NULL, g_eng, r.pd[0]);
    if (s != dnnl_success)
      FAIL(BENCH_NA, "oneDNN has no backward implementation for this case (%s)", st_name(s));
    s = dnnl_primitive_create(&r.prim[1], r.pd[1]);
    if (s != dnnl_success) FAIL(BENCH_ERROR, "dnnl_primitive_create: %s", st_name(s));
    dnnl_memory_t mdy = make_mem(&r, &md, &pdy), mdx = make_mem(&r, &md, NULL);
    dnnl_memory_t mdscale = make_mem(&r, &pmd, NULL), mdshift = make_mem(&r, &pmd, NULL);
    if (!mdy || !mdx || !mdscale || !mdshift) FAIL(BENCH_ERROR, "out of memory");
    bench_fill(pdy, count, k->dtype, 3, -1.0f, 1.0f);
    /* one untimed training forward: batch mean / variance and the ReLU workspace */
    char err[256];
    if (run_prim(&fc, err, sizeof err)) FAIL(BENCH_ERROR, "%s", err);
    dnnl_exec_arg_t bargs[] = {{DNNL_ARG_SRC, mx},          {DNNL_ARG_MEAN, mmean},
                               {DNNL_ARG_VARIANCE, mvar},   {DNNL_ARG_DIFF_DST, mdy},
                               {DNNL_ARG_SCALE, mscale},    {DNNL_ARG_SHIFT, mshift},
                               {DNNL_ARG_DIFF_SRC, mdx},    {DNNL_ARG_DIFF_SCALE, mdscale},
                               {DNNL_ARG_DIFF_SHIFT, mdshift}, {DNNL_ARG_WORKSPACE, mws}};
    bc = (dnnl_ctx){g_eng, g_strm, r.prim[1], mws ? 10 : 9, {{0, NULL}}};
    memcpy(bc.args, bargs, sizeof bargs);
    timed = &bc;
    dnnl_primitive_desc_query(r.pd[1], dnnl_query_impl_info_str, 0, &impl_str);
  } else {
    dnnl_primitive_desc_query(r.pd[0], dnnl_query_impl_info_str, 0, &impl_str);
  }
  snprintf(impl, impllen, "%s", impl_str ? impl_str : "");

  int rc = bench_time(run_prim, timed, warmup, reps, t, reason, reasonlen);
  res_free(&r);
  return rc ? BENCH_ERROR : BENCH_OK;
}

static void print_info(FILE *f) {
  const dnnl_version_t *v = dnnl_version();
  fprintf(f, ",\"version\":\"%d.%d.%d\",\"hash\":", v->major, v->minor, v->patch);
  bench_json_string(f, v->hash ? v->hash : "");
  int isa = (int)dnnl_get_effective_cpu_isa();
  const char *name = isa == dnnl_cpu_isa_avx512_core_amx ? "avx512_core_amx"
                     : isa == dnnl_cpu_isa_avx512_core_bf16 ? "avx512_core_bf16"
                     : isa == dnnl_cpu_isa_avx512_core_vnni ? "avx512_core_vnni"
                     : isa == dnnl_cpu_isa_avx512_core ? "avx512_core"
                     : isa == dnnl_cpu_isa_avx2_vnni ? "avx2_vnni"
                     : isa == dnnl_cpu_isa_avx2 ? "avx2"
                     : isa == dnnl_cpu_isa_avx ? "avx"
                     : isa == dnnl_cpu_isa_sse41 ? "sse41" : "other";
  fprintf(f, ",\"isa\":\"%s\",\"omp_max_threads\":%d", name, omp_get_max_threads());
}

static void set_threads(int n) { omp_set_num_threads(n); }

int main(int argc, char **argv) {
  if (dnnl_engine_create(&g_eng, dnnl_cpu, 0) != dnnl_success ||
      dnnl_stream_create(&g_strm, g_eng, dnnl_stream_default_flags) != dnnl_success) {
    fprintf(stderr, "norma-bench-dnnl: cannot create the oneDNN CPU engine\n");
    return 1;
  }
  static const bench_worker w = {"dnnl", print_info, set_threads, run_case};
  int rc = bench_worker_main(argc, argv, &w);
  dnnl_stream_destroy(g_strm);
  dnnl_engine_destroy(g_eng);
  return rc;
}
