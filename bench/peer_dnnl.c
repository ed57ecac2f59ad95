/* peer_dnnl.c - norma-bench-dnnl: times oneDNN's batch and layer normalization (C API,
 * oneDNN 2.x) on the cases it is given, with the methodology of tools/bench/worker_common.h.
 *
 * BatchNorm: oneDNN picks its best implementation for the memory format it is given: the user
 * tensors are plain nchw (channels-first), nhwc (channels-last) or nc (2-D), and the primitive
 * is created on exactly that format (no reorder is timed).  Flags: use_scale | use_shift
 * (gamma, beta); inference adds use_global_stats; the ReLU variants add fuse_norm_relu
 * (training keeps the ReLU mask in oneDNN's workspace, which its backward reads).  oneDNN has
 * no fused residual-add + ReLU for batch normalization: add_relu_* cases report n/a.
 * Scale, shift, mean and variance are f32 for every data type, as oneDNN requires.
 *
 * LayerNorm: the layer normalization primitive on [rows, D] (format ab, statistics [rows]),
 * use_scale | use_shift; forward_training (writes mean and variance), backward (dnnl_backward:
 * diff_src, diff_scale, diff_shift).  The residual form (h = x + r, y = LN(h)) has no fused
 * primitive: a binary add (x + r -> h) then the layer normalization, as a oneDNN user writes
 * it; its backward is the layer normalization's, then a binary add of dsum into diff_src (in
 * place).
 *
 * InstanceNorm is batch normalization of each sample alone, so it is expressed with the batch
 * normalization primitive: channels-first as one call on the tensor viewed as [1, N*C, H, W]
 * (nchw memory is exactly that), with gamma / beta repeated N times (what PyTorch's
 * instance_norm does); channels-last as one call per sample on [1, C, H, W] nhwc (each sample
 * is a contiguous block; N*C cannot be one dimension of nhwc memory).  The backward's
 * diff_scale / diff_shift are then per (sample, channel) and are summed over the samples into
 * dgamma / dbeta inside the timed call (N*C adds).
 *
 * oneDNN 2.6 has no RMS normalization (its layer normalization always subtracts the mean) and
 * no group normalization: those cases report n/a.
 */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include <dnnl.h>

#include "worker_common.h"

#define MAX_ARGS 12

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

/* One primitive execution. */
typedef struct dnnl_step {
  dnnl_primitive_t prim;
  int nargs;
  dnnl_exec_arg_t args[MAX_ARGS];
} dnnl_step;

/* What one timed call runs: steps in order, then an optional sum of `nsum` per-sample arrays
   of `sum_len` floats (InstanceNorm's diff_scale / diff_shift -> dgamma / dbeta). */
typedef struct dnnl_run {
  dnnl_step *steps;
  int nsteps;
  float **sum_src; /* [2 * nsum]: diff_scale of every sample, then diff_shift */
  int nsum;
  int64_t sum_len;
  float *sum_dst[2];
} dnnl_run;

static int run_steps(void *p, char *err, size_t errlen) {
  dnnl_run *c = (dnnl_run *)p;
  for (int i = 0; i < c->nsteps; ++i) {
    dnnl_status_t s = dnnl_primitive_execute(c->steps[i].prim, g_strm, c->steps[i].nargs,
                                             c->steps[i].args);
    if (s == dnnl_success) s = dnnl_stream_wait(g_strm);
    if (s != dnnl_success) {
      snprintf(err, errlen, "dnnl_primitive_execute: %s", st_name(s));
      return 1;
    }
  }
  for (int k = 0; k < 2 && c->nsum > 0; ++k) {
    float *dst = c->sum_dst[k];
    float **src = c->sum_src + k * c->nsum;
    for (int64_t j = 0; j < c->sum_len; ++j) {
      float acc = 0.0f;
      for (int i = 0; i < c->nsum; ++i) acc += src[i][j];
      dst[j] = acc;
    }
  }
  return 0;
}

/* Resources of one case, released together (grown as needed). */
typedef struct res_list {
  void **ptr;
  int nptr, captr;
  dnnl_memory_t *mem;
  int nmem, capmem;
  dnnl_primitive_desc_t *pd;
  dnnl_primitive_t *prim;
  int nprim, capprim;
} res_list;

static void res_free(res_list *r) {
  for (int i = 0; i < r->nmem; ++i) dnnl_memory_destroy(r->mem[i]);
  for (int i = 0; i < r->nprim; ++i) {
    if (r->prim[i]) dnnl_primitive_destroy(r->prim[i]);
    if (r->pd[i]) dnnl_primitive_desc_destroy(r->pd[i]);
  }
  for (int i = 0; i < r->nptr; ++i) bench_free(r->ptr[i]);
  free(r->ptr);
  free(r->mem);
  free(r->pd);
  free(r->prim);
  memset(r, 0, sizeof *r);
}

static int grow(void **arr, int *cap, int need, size_t elem) {
  if (need <= *cap) return 0;
  int nc = *cap ? *cap * 2 : 16;
  while (nc < need) nc *= 2;
  void *p = realloc(*arr, (size_t)nc * elem);
  if (!p) return 1;
  memset((char *)p + (size_t)*cap * elem, 0, (size_t)(nc - *cap) * elem);
  *arr = p;
  *cap = nc;
  return 0;
}

/* A buffer of `bytes`, touched and owned by r. */
static void *res_alloc(res_list *r, size_t bytes) {
  if (grow((void **)&r->ptr, &r->captr, r->nptr + 1, sizeof(void *))) return NULL;
  void *p = bench_alloc(bytes);
  if (p) r->ptr[r->nptr++] = p;
  return p;
}

/* A dnnl memory of md over `handle` (NULL: a new buffer, returned in *out_ptr). */
static dnnl_memory_t res_mem(res_list *r, const dnnl_memory_desc_t *md, void *handle,
                             void **out_ptr) {
  void *p = handle ? handle : res_alloc(r, dnnl_memory_desc_get_size(md));
  if (!p) return NULL;
  if (grow((void **)&r->mem, &r->capmem, r->nmem + 1, sizeof(dnnl_memory_t))) return NULL;
  dnnl_memory_t m = NULL;
  if (dnnl_memory_create(&m, md, g_eng, p) != dnnl_success) return NULL;
  r->mem[r->nmem++] = m;
  if (out_ptr) *out_ptr = p;
  return m;
}

/* Creates the primitive of op_desc (hint: a forward pd for a backward); returns its index in
   r, or -1 with *st set. */
static int res_prim(res_list *r, const void *op_desc, const_dnnl_primitive_desc_t hint,
                    dnnl_status_t *st) {
  if (r->nprim == r->capprim) { /* pd and prim share one capacity */
    const int nc = r->capprim ? 2 * r->capprim : 8;
    void *a = realloc(r->pd, (size_t)nc * sizeof(dnnl_primitive_desc_t));
    if (a) r->pd = (dnnl_primitive_desc_t *)a;
    void *b = a ? realloc(r->prim, (size_t)nc * sizeof(dnnl_primitive_t)) : NULL;
    if (b) r->prim = (dnnl_primitive_t *)b;
    if (!a || !b) {
      *st = dnnl_out_of_memory;
      return -1;
    }
    r->capprim = nc;
  }
  const int i = r->nprim;
  r->pd[i] = NULL;
  r->prim[i] = NULL;
  *st = dnnl_primitive_desc_create(&r->pd[i], op_desc, NULL, g_eng, hint);
  if (*st != dnnl_success) return -1;
  r->nprim++;
  *st = dnnl_primitive_create(&r->prim[i], r->pd[i]);
  return *st == dnnl_success ? i : -1;
}

static const char *impl_of(const res_list *r, int i) {
  const char *s = NULL;
  if (i >= 0 && i < r->nprim && r->pd[i])
    dnnl_primitive_desc_query(r->pd[i], dnnl_query_impl_info_str, 0, &s);
  return s ? s : "";
}

static void set_step(dnnl_step *s, dnnl_primitive_t prim, int nargs, const dnnl_exec_arg_t *args) {
  s->prim = prim;
  s->nargs = 0;
  for (int i = 0; i < nargs; ++i)
    if (args[i].memory) s->args[s->nargs++] = args[i];
}

#define FAIL(status_, ...)                                \
  do {                                                    \
    snprintf(reason, reasonlen, __VA_ARGS__);             \
    res_free(&r);                                         \
    free(steps);                                          \
    free(sums);                                           \
    return (status_);                                     \
  } while (0)

static dnnl_data_type_t to_dnnl_dtype(bench_dtype t) {
  return t == BENCH_BF16 ? dnnl_bf16 : t == BENCH_F16 ? dnnl_f16 : dnnl_f32;
}

/* ---- BatchNorm ------------------------------------------------------------------------- */

static bench_status run_bn(const bench_case *k, int warmup, int reps, bench_timing *t,
                           char *impl, size_t impllen, char *reason, size_t reasonlen) {
  res_list r;
  memset(&r, 0, sizeof r);
  dnnl_step *steps = (dnnl_step *)calloc(1, sizeof(dnnl_step));
  float **sums = NULL;
  if (!steps) FAIL(BENCH_ERROR, "out of memory");
  if (k->act == BENCH_ACT_ADD_RELU)
    FAIL(BENCH_NA, "oneDNN has no fused residual-add + ReLU for batch norm");
  dnnl_data_type_t dt = to_dnnl_dtype(k->dtype);
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
  int pf = res_prim(&r, &fd, NULL, &s);
  if (pf < 0)
    FAIL(s == dnnl_unimplemented ? BENCH_NA : BENCH_ERROR,
         "oneDNN has no forward implementation for this case (%s)", st_name(s));

  void *px = NULL, *pdy = NULL;
  float *pgamma = NULL, *pbeta = NULL, *pmean = NULL, *pvar = NULL;
  dnnl_memory_t mx = res_mem(&r, &md, NULL, &px), my = res_mem(&r, &md, NULL, NULL);
  dnnl_memory_t mscale = res_mem(&r, &pmd, NULL, (void **)&pgamma);
  dnnl_memory_t mshift = res_mem(&r, &pmd, NULL, (void **)&pbeta);
  dnnl_memory_t mmean = res_mem(&r, &pmd, NULL, (void **)&pmean);
  dnnl_memory_t mvar = res_mem(&r, &pmd, NULL, (void **)&pvar);
  if (!mx || !my || !mscale || !mshift || !mmean || !mvar) FAIL(BENCH_ERROR, "out of memory");
  int64_t count = bench_case_elems(k);
  bench_fill(px, count, k->dtype, 1, -1.0f, 1.0f);
  bench_fill_f32(pgamma, k->c, 4, 0.5f, 1.5f);
  bench_fill_f32(pbeta, k->c, 5, -0.5f, 0.5f);
  bench_fill_f32(pmean, k->c, 6, -0.1f, 0.1f);
  bench_fill_f32(pvar, k->c, 7, 0.25f, 0.5f);

  dnnl_memory_t mws = NULL;
  const dnnl_memory_desc_t *wsmd =
      dnnl_primitive_desc_query_md(r.pd[pf], dnnl_query_workspace_md, 0);
  if (wsmd && dnnl_memory_desc_get_size(wsmd) > 0) {
    mws = res_mem(&r, wsmd, NULL, NULL);
    if (!mws) FAIL(BENCH_ERROR, "out of memory (workspace)");
  }
  dnnl_exec_arg_t fargs[] = {{DNNL_ARG_SRC, mx},       {DNNL_ARG_DST, my},
                             {DNNL_ARG_SCALE, mscale}, {DNNL_ARG_SHIFT, mshift},
                             {DNNL_ARG_MEAN, mmean},   {DNNL_ARG_VARIANCE, mvar},
                             {DNNL_ARG_WORKSPACE, mws}};
  dnnl_run run = {steps, 1, NULL, 0, 0, {NULL, NULL}};
  set_step(&steps[0], r.prim[pf], 7, fargs);
  int pimpl = pf;
  if (k->dir == BENCH_BWD) {
    dnnl_batch_normalization_desc_t bd;
    s = dnnl_batch_normalization_backward_desc_init(&bd, dnnl_backward, &md, &md, eps, flags);
    if (s != dnnl_success) FAIL(BENCH_NA, "backward desc: %s", st_name(s));
    int pb = res_prim(&r, &bd, r.pd[pf], &s);
    if (pb < 0)
      FAIL(s == dnnl_unimplemented ? BENCH_NA : BENCH_ERROR,
           "oneDNN has no backward implementation for this case (%s)", st_name(s));
    dnnl_memory_t mdy = res_mem(&r, &md, NULL, &pdy), mdx = res_mem(&r, &md, NULL, NULL);
    dnnl_memory_t mdscale = res_mem(&r, &pmd, NULL, NULL), mdshift = res_mem(&r, &pmd, NULL, NULL);
    if (!mdy || !mdx || !mdscale || !mdshift) FAIL(BENCH_ERROR, "out of memory");
    bench_fill(pdy, count, k->dtype, 3, -1.0f, 1.0f);
    /* one untimed training forward: batch mean / variance and the ReLU workspace */
    char err[256];
    if (run_steps(&run, err, sizeof err)) FAIL(BENCH_ERROR, "%s", err);
    dnnl_exec_arg_t bargs[] = {{DNNL_ARG_SRC, mx},          {DNNL_ARG_MEAN, mmean},
                               {DNNL_ARG_VARIANCE, mvar},   {DNNL_ARG_DIFF_DST, mdy},
                               {DNNL_ARG_SCALE, mscale},    {DNNL_ARG_SHIFT, mshift},
                               {DNNL_ARG_DIFF_SRC, mdx},    {DNNL_ARG_DIFF_SCALE, mdscale},
                               {DNNL_ARG_DIFF_SHIFT, mdshift}, {DNNL_ARG_WORKSPACE, mws}};
    set_step(&steps[0], r.prim[pb], 10, bargs);
    pimpl = pb;
  }
  snprintf(impl, impllen, "%s", impl_of(&r, pimpl));

  int rc = bench_time(run_steps, &run, warmup, reps, t, reason, reasonlen);
  res_free(&r);
  free(steps);
  return rc ? BENCH_ERROR : BENCH_OK;
}

/* ---- LayerNorm ------------------------------------------------------------------------- */

static bench_status run_ln(const bench_case *k, int warmup, int reps, bench_timing *t,
                           char *impl, size_t impllen, char *reason, size_t reasonlen) {
  res_list r;
  memset(&r, 0, sizeof r);
  dnnl_step *steps = (dnnl_step *)calloc(2, sizeof(dnnl_step));
  float **sums = NULL;
  if (!steps) FAIL(BENCH_ERROR, "out of memory");
  dnnl_memory_desc_t md, smd, pmd;
  dnnl_dims_t dims = {k->n, k->c}, sdims = {k->n}, pdims = {k->c};
  if (dnnl_memory_desc_init_by_tag(&md, 2, dims, to_dnnl_dtype(k->dtype), dnnl_ab) !=
          dnnl_success ||
      dnnl_memory_desc_init_by_tag(&smd, 1, sdims, dnnl_f32, dnnl_a) != dnnl_success ||
      dnnl_memory_desc_init_by_tag(&pmd, 1, pdims, dnnl_f32, dnnl_a) != dnnl_success)
    FAIL(BENCH_ERROR, "dnnl_memory_desc_init_by_tag failed");
  const unsigned flags = dnnl_use_scale | dnnl_use_shift;
  const float eps = 1e-5f;
  dnnl_status_t s;
  dnnl_layer_normalization_desc_t fd;
  s = dnnl_layer_normalization_forward_desc_init(&fd, dnnl_forward_training, &md, &smd, eps, flags);
  if (s != dnnl_success) FAIL(BENCH_NA, "layer normalization forward desc: %s", st_name(s));
  int pf = res_prim(&r, &fd, NULL, &s);
  if (pf < 0)
    FAIL(s == dnnl_unimplemented ? BENCH_NA : BENCH_ERROR,
         "oneDNN has no layer normalization forward for this case (%s)", st_name(s));
  int padd = -1;
  if (k->residual) {
    dnnl_binary_desc_t ad;
    s = dnnl_binary_desc_init(&ad, dnnl_binary_add, &md, &md, &md);
    if (s != dnnl_success) FAIL(BENCH_NA, "binary add desc: %s", st_name(s));
    padd = res_prim(&r, &ad, NULL, &s);
    if (padd < 0)
      FAIL(s == dnnl_unimplemented ? BENCH_NA : BENCH_ERROR, "binary add: %s", st_name(s));
  }
  const int64_t count = bench_case_elems(k);
  void *px = NULL, *pres = NULL, *pdy = NULL, *pdsum = NULL;
  float *pgamma = NULL, *pbeta = NULL;
  dnnl_memory_t mx = res_mem(&r, &md, NULL, &px), my = res_mem(&r, &md, NULL, NULL);
  dnnl_memory_t mres = k->residual ? res_mem(&r, &md, NULL, &pres) : NULL;
  dnnl_memory_t mh = k->residual ? res_mem(&r, &md, NULL, NULL) : NULL; /* h = x + r */
  dnnl_memory_t mmean = res_mem(&r, &smd, NULL, NULL), mvar = res_mem(&r, &smd, NULL, NULL);
  dnnl_memory_t mscale = res_mem(&r, &pmd, NULL, (void **)&pgamma);
  dnnl_memory_t mshift = res_mem(&r, &pmd, NULL, (void **)&pbeta);
  if (!mx || !my || (k->residual && (!mres || !mh)) || !mmean || !mvar || !mscale || !mshift)
    FAIL(BENCH_ERROR, "out of memory");
  bench_fill(px, count, k->dtype, 1, -1.0f, 1.0f);
  if (k->residual) bench_fill(pres, count, k->dtype, 2, -1.0f, 1.0f);
  bench_fill_f32(pgamma, k->c, 4, 0.5f, 1.5f);
  bench_fill_f32(pbeta, k->c, 5, -0.5f, 0.5f);
  dnnl_memory_t min = k->residual ? mh : mx; /* the normalized input */
  dnnl_exec_arg_t aargs[] = {{DNNL_ARG_SRC_0, mx}, {DNNL_ARG_SRC_1, mres}, {DNNL_ARG_DST, mh}};
  dnnl_exec_arg_t fargs[] = {{DNNL_ARG_SRC, min},      {DNNL_ARG_DST, my},
                             {DNNL_ARG_MEAN, mmean},   {DNNL_ARG_VARIANCE, mvar},
                             {DNNL_ARG_SCALE, mscale}, {DNNL_ARG_SHIFT, mshift}};
  dnnl_run run = {steps, 0, NULL, 0, 0, {NULL, NULL}};
  if (k->residual) set_step(&steps[run.nsteps++], r.prim[padd], 3, aargs);
  set_step(&steps[run.nsteps++], r.prim[pf], 6, fargs);
  char impl_s[160];
  snprintf(impl_s, sizeof impl_s, "%s%s", k->residual ? "binary_add + " : "", impl_of(&r, pf));
  if (k->dir == BENCH_BWD) {
    dnnl_layer_normalization_desc_t bd;
    s = dnnl_layer_normalization_backward_desc_init(&bd, dnnl_backward, &md, &md, &smd, eps,
                                                    flags);
    if (s != dnnl_success) FAIL(BENCH_NA, "layer normalization backward desc: %s", st_name(s));
    int pb = res_prim(&r, &bd, r.pd[pf], &s);
    if (pb < 0)
      FAIL(s == dnnl_unimplemented ? BENCH_NA : BENCH_ERROR,
           "oneDNN has no layer normalization backward for this case (%s)", st_name(s));
    dnnl_memory_t mdy = res_mem(&r, &md, NULL, &pdy), mdx = res_mem(&r, &md, NULL, NULL);
    dnnl_memory_t mdsum = k->residual ? res_mem(&r, &md, NULL, &pdsum) : NULL;
    dnnl_memory_t mdscale = res_mem(&r, &pmd, NULL, NULL), mdshift = res_mem(&r, &pmd, NULL, NULL);
    if (!mdy || !mdx || (k->residual && !mdsum) || !mdscale || !mdshift)
      FAIL(BENCH_ERROR, "out of memory");
    bench_fill(pdy, count, k->dtype, 3, -1.0f, 1.0f);
    if (k->residual) bench_fill(pdsum, count, k->dtype, 9, -1.0f, 1.0f);
    char err[256];
    if (run_steps(&run, err, sizeof err)) FAIL(BENCH_ERROR, "%s", err); /* untimed forward */
    dnnl_exec_arg_t bargs[] = {{DNNL_ARG_SRC, min},         {DNNL_ARG_MEAN, mmean},
                               {DNNL_ARG_VARIANCE, mvar},   {DNNL_ARG_DIFF_DST, mdy},
                               {DNNL_ARG_SCALE, mscale},    {DNNL_ARG_SHIFT, mshift},
                               {DNNL_ARG_DIFF_SRC, mdx},    {DNNL_ARG_DIFF_SCALE, mdscale},
                               {DNNL_ARG_DIFF_SHIFT, mdshift}};
    /* dx += dsum: the residual stream's gradient, in place */
    dnnl_exec_arg_t dargs[] = {{DNNL_ARG_SRC_0, mdx}, {DNNL_ARG_SRC_1, mdsum}, {DNNL_ARG_DST, mdx}};
    run.nsteps = 0;
    set_step(&steps[run.nsteps++], r.prim[pb], 9, bargs);
    if (k->residual) set_step(&steps[run.nsteps++], r.prim[padd], 3, dargs);
    snprintf(impl_s, sizeof impl_s, "%s%s", impl_of(&r, pb), k->residual ? " + binary_add" : "");
  }
  snprintf(impl, impllen, "%s", impl_s);
  int rc = bench_time(run_steps, &run, warmup, reps, t, reason, reasonlen);
  res_free(&r);
  free(steps);
  return rc ? BENCH_ERROR : BENCH_OK;
}

/* ---- InstanceNorm through batch normalization ------------------------------------------ */

static bench_status run_in(const bench_case *k, int warmup, int reps, bench_timing *t,
                           char *impl, size_t impllen, char *reason, size_t reasonlen) {
  res_list r;
  memset(&r, 0, sizeof r);
  const int nhwc = k->layout == BENCH_NHWC;
  const int64_t n = k->n, c = k->c;
  /* channels-first: one call over [1, N*C, H, W]; channels-last: N calls over [1, C, H, W] */
  const int64_t calls = nhwc ? n : 1, pc = nhwc ? c : n * c;
  dnnl_step *steps = (dnnl_step *)calloc((size_t)calls, sizeof(dnnl_step));
  float **sums = (float **)calloc((size_t)(2 * n), sizeof(float *));
  if (!steps || !sums) FAIL(BENCH_ERROR, "out of memory");
  dnnl_memory_desc_t md, pmd;
  dnnl_dims_t dims = {1, pc, k->h, k->w}, pdims = {pc};
  if (dnnl_memory_desc_init_by_tag(&md, 4, dims, to_dnnl_dtype(k->dtype),
                                   nhwc ? dnnl_nhwc : dnnl_nchw) != dnnl_success ||
      dnnl_memory_desc_init_by_tag(&pmd, 1, pdims, dnnl_f32, dnnl_a) != dnnl_success)
    FAIL(BENCH_ERROR, "dnnl_memory_desc_init_by_tag failed");
  const unsigned flags = dnnl_use_scale | dnnl_use_shift;
  const float eps = 1e-5f;
  dnnl_status_t s;
  dnnl_batch_normalization_desc_t fd;
  s = dnnl_batch_normalization_forward_desc_init(&fd, dnnl_forward_training, &md, eps, flags);
  if (s != dnnl_success) FAIL(BENCH_NA, "forward desc: %s", st_name(s));
  int pf = res_prim(&r, &fd, NULL, &s);
  if (pf < 0)
    FAIL(s == dnnl_unimplemented ? BENCH_NA : BENCH_ERROR,
         "oneDNN has no batch normalization forward for this case (%s)", st_name(s));
  int pb = -1;
  const int bwd = k->dir == BENCH_BWD;
  if (bwd) {
    dnnl_batch_normalization_desc_t bd;
    s = dnnl_batch_normalization_backward_desc_init(&bd, dnnl_backward, &md, &md, eps, flags);
    if (s != dnnl_success) FAIL(BENCH_NA, "backward desc: %s", st_name(s));
    pb = res_prim(&r, &bd, r.pd[pf], &s);
    if (pb < 0)
      FAIL(s == dnnl_unimplemented ? BENCH_NA : BENCH_ERROR,
           "oneDNN has no batch normalization backward for this case (%s)", st_name(s));
  }
  const int64_t count = bench_case_elems(k);
  const size_t tb = (size_t)count * bench_dtype_size(k->dtype);
  const size_t sb = tb / (size_t)calls; /* bytes of one call's slice */
  char *x = (char *)res_alloc(&r, tb), *y = (char *)res_alloc(&r, tb);
  char *dy = bwd ? (char *)res_alloc(&r, tb) : NULL, *dx = bwd ? (char *)res_alloc(&r, tb) : NULL;
  float *gam = (float *)res_alloc(&r, (size_t)pc * sizeof(float));
  float *bet = (float *)res_alloc(&r, (size_t)pc * sizeof(float));
  float *mean = (float *)res_alloc(&r, (size_t)(n * c) * sizeof(float));
  float *var = (float *)res_alloc(&r, (size_t)(n * c) * sizeof(float));
  float *dsc = bwd ? (float *)res_alloc(&r, (size_t)(n * c) * sizeof(float)) : NULL;
  float *dsh = bwd ? (float *)res_alloc(&r, (size_t)(n * c) * sizeof(float)) : NULL;
  float *dgamma = bwd ? (float *)res_alloc(&r, (size_t)c * sizeof(float)) : NULL;
  float *dbeta = bwd ? (float *)res_alloc(&r, (size_t)c * sizeof(float)) : NULL;
  if (!x || !y || !gam || !bet || !mean || !var ||
      (bwd && (!dy || !dx || !dsc || !dsh || !dgamma || !dbeta)))
    FAIL(BENCH_ERROR, "out of memory");
  bench_fill(x, count, k->dtype, 1, -1.0f, 1.0f);
  if (bwd) bench_fill(dy, count, k->dtype, 3, -1.0f, 1.0f);
  bench_fill_f32(gam, c, 4, 0.5f, 1.5f);
  bench_fill_f32(bet, c, 5, -0.5f, 0.5f);
  for (int64_t i = 1; i < pc / c; ++i) { /* channels-first: gamma / beta repeated N times */
    memcpy(gam + i * c, gam, (size_t)c * sizeof(float));
    memcpy(bet + i * c, bet, (size_t)c * sizeof(float));
  }
  dnnl_memory_t mscale = res_mem(&r, &pmd, gam, NULL), mshift = res_mem(&r, &pmd, bet, NULL);
  if (!mscale || !mshift) FAIL(BENCH_ERROR, "out of memory");
  dnnl_run run = {steps, (int)calls, NULL, 0, 0, {NULL, NULL}};
  for (int64_t i = 0; i < calls; ++i) {
    dnnl_memory_t mx = res_mem(&r, &md, x + i * sb, NULL), my = res_mem(&r, &md, y + i * sb, NULL);
    dnnl_memory_t mm = res_mem(&r, &pmd, mean + i * pc, NULL);
    dnnl_memory_t mv = res_mem(&r, &pmd, var + i * pc, NULL);
    if (!mx || !my || !mm || !mv) FAIL(BENCH_ERROR, "out of memory");
    dnnl_exec_arg_t fargs[] = {{DNNL_ARG_SRC, mx},       {DNNL_ARG_DST, my},
                               {DNNL_ARG_SCALE, mscale}, {DNNL_ARG_SHIFT, mshift},
                               {DNNL_ARG_MEAN, mm},      {DNNL_ARG_VARIANCE, mv}};
    set_step(&steps[i], r.prim[pf], 6, fargs);
  }
  if (bwd) {
    char err[256];
    if (run_steps(&run, err, sizeof err)) FAIL(BENCH_ERROR, "%s", err); /* untimed forward */
    for (int64_t i = 0; i < calls; ++i) {
      dnnl_memory_t mx = res_mem(&r, &md, x + i * sb, NULL);
      dnnl_memory_t mdy = res_mem(&r, &md, dy + i * sb, NULL);
      dnnl_memory_t mdx = res_mem(&r, &md, dx + i * sb, NULL);
      dnnl_memory_t mm = res_mem(&r, &pmd, mean + i * pc, NULL);
      dnnl_memory_t mv = res_mem(&r, &pmd, var + i * pc, NULL);
      dnnl_memory_t mds = res_mem(&r, &pmd, dsc + i * pc, NULL);
      dnnl_memory_t mdh = res_mem(&r, &pmd, dsh + i * pc, NULL);
      if (!mx || !mdy || !mdx || !mm || !mv || !mds || !mdh) FAIL(BENCH_ERROR, "out of memory");
      dnnl_exec_arg_t bargs[] = {{DNNL_ARG_SRC, mx},        {DNNL_ARG_MEAN, mm},
                                 {DNNL_ARG_VARIANCE, mv},   {DNNL_ARG_DIFF_DST, mdy},
                                 {DNNL_ARG_SCALE, mscale},  {DNNL_ARG_SHIFT, mshift},
                                 {DNNL_ARG_DIFF_SRC, mdx},  {DNNL_ARG_DIFF_SCALE, mds},
                                 {DNNL_ARG_DIFF_SHIFT, mdh}};
      set_step(&steps[i], r.prim[pb], 9, bargs);
    }
    /* dgamma / dbeta: the per-(sample, channel) diff_scale / diff_shift summed over samples */
    for (int64_t i = 0; i < n; ++i) {
      sums[i] = dsc + i * c;
      sums[n + i] = dsh + i * c;
    }
    run.sum_src = sums;
    run.nsum = (int)n;
    run.sum_len = c;
    run.sum_dst[0] = dgamma;
    run.sum_dst[1] = dbeta;
  }
  snprintf(impl, impllen, "%s %s", impl_of(&r, bwd ? pb : pf),
           nhwc ? "(bnorm per sample)" : "(bnorm on [1, N*C, H, W])");
  int rc = bench_time(run_steps, &run, warmup, reps, t, reason, reasonlen);
  res_free(&r);
  free(steps);
  free(sums);
  return rc ? BENCH_ERROR : BENCH_OK;
}

static bench_status run_case(const bench_case *k, int warmup, int reps, bench_timing *t,
                             char *impl, size_t impllen, char *extra, size_t extralen,
                             char *reason, size_t reasonlen) {
  (void)extra;
  (void)extralen;
  switch (k->family) {
    case BENCH_BN: return run_bn(k, warmup, reps, t, impl, impllen, reason, reasonlen);
    case BENCH_LN: return run_ln(k, warmup, reps, t, impl, impllen, reason, reasonlen);
    case BENCH_IN: return run_in(k, warmup, reps, t, impl, impllen, reason, reasonlen);
    case BENCH_RMS:
      snprintf(reason, reasonlen, "oneDNN 2.6 has no RMS normalization (its layer "
                                  "normalization always subtracts the mean)");
      return BENCH_NA;
    default:
      snprintf(reason, reasonlen, "oneDNN 2.6 has no group normalization primitive");
      return BENCH_NA;
  }
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
  static const bench_worker w = {"dnnl", print_info, set_threads, run_case, NULL};
  int rc = bench_worker_main(argc, argv, &w);
  dnnl_stream_destroy(g_strm);
  dnnl_engine_destroy(g_eng);
  return rc;
}
