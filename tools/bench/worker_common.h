/* worker_common.h - what the C workers of norma-bench (norma-bench-norma, norma-bench-dnnl)
 * share: the case syntax, the command line, buffers, the timing loop, the JSON lines they
 * print, and the memory-bandwidth probe.
 *
 * A worker reads cases (from --case arguments, or one per line on stdin with --stdin) and
 * prints one JSON line per case on stdout, flushed at once, so that the driver
 * (tools/norma-bench) can interleave the libraries case by case.
 *
 * Case syntax:  "<op> <layout> <dtype> <D0>,<D1>[,<D2>[,<D3>]] [key=value]..."
 *   op      BatchNorm: fwd | infer | bwd | relu_fwd | relu_infer | relu_bwd |
 *                      add_relu_fwd | add_relu_infer | add_relu_bwd
 *           LayerNorm: ln_fwd | ln_bwd | ln_res_fwd | ln_res_bwd  (res: h = x + r, y = LN(h))
 *           RMSNorm:   rms_fwd | rms_bwd
 *           GroupNorm: gn_fwd | gn_bwd | gn_silu_fwd | gn_silu_bwd  (silu: SiLU fused after)
 *           InstanceNorm (affine, statistics of each instance): in_fwd | in_bwd
 *   layout  nchw (channels-first) | nhwc (channels-last) | nc (2-D [N, C], BatchNorm) |
 *           rows (LayerNorm / RMSNorm: the last dimension is normalized, the others are rows)
 *   dtype   f32 | bf16 | f16
 *   dims    BatchNorm / GroupNorm / InstanceNorm: N,C[,H[,W]]; rows: [B,]...,D
 *   keys    groups=G (GroupNorm; default 32), reps=R and warmup=W (this case only)
 *
 * Methodology (identical in every worker, including bench/peer_torch.py): inputs are filled
 * (so touched) and outputs allocated and zeroed before timing; `warmup` untimed runs; then
 * `reps` timed runs, each timed on its own with CLOCK_MONOTONIC; min / median / max reported.
 */
#ifndef NORMA_BENCH_WORKER_COMMON_H
#define NORMA_BENCH_WORKER_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum bench_dir { BENCH_FWD = 0, BENCH_INFER = 1, BENCH_BWD = 2 } bench_dir;
typedef enum bench_act {
  BENCH_ACT_NONE = 0, BENCH_ACT_RELU = 1, BENCH_ACT_ADD_RELU = 2, BENCH_ACT_SILU = 3
} bench_act;
typedef enum bench_layout {
  BENCH_NCHW = 0,
  BENCH_NHWC = 1,
  BENCH_NC = 2,
  BENCH_ROWS = 3
} bench_layout;
typedef enum bench_dtype { BENCH_F32 = 0, BENCH_BF16 = 1, BENCH_F16 = 2 } bench_dtype;
/* the operator: BatchNorm, LayerNorm, RMSNorm, GroupNorm, InstanceNorm */
typedef enum bench_family {
  BENCH_BN = 0, BENCH_LN = 1, BENCH_RMS = 2, BENCH_GN = 3, BENCH_IN = 4
} bench_family;

typedef struct bench_case {
  char op[32];          /* as given, e.g. "relu_bwd", "gn_silu_fwd" */
  bench_family family;
  bench_dir dir;        /* BENCH_FWD or BENCH_BWD for the norm family */
  bench_act act;        /* SILU: GroupNorm only */
  int residual;         /* LayerNorm: h = x + residual, y = LN(h) (forward also writes h);
                           its backward adds dsum (the residual stream's gradient) to dx */
  bench_layout layout;
  bench_dtype dtype;
  int ndim;             /* 2 or 4 (N, C, H, W; rows: rank of the shape as given) */
  int rank;             /* number of dimensions as given (2..4) */
  int64_t dims[4];      /* the dimensions as given */
  int64_t n, c, h, w;   /* h = w = 1 when ndim == 2; rows: n = rows, c = D, h = w = 1 */
  int64_t groups;       /* GroupNorm (default 32); InstanceNorm: c; else 0 */
  int reps, warmup;     /* this case's counts, or -1: the worker's */
} bench_case;

static inline int64_t bench_case_spatial(const bench_case *k) { return k->h * k->w; }
static inline int64_t bench_case_elems(const bench_case *k) {
  return k->n * k->c * k->h * k->w;
}
static inline size_t bench_dtype_size(bench_dtype t) { return t == BENCH_F32 ? 4 : 2; }
static inline const char *bench_dtype_name(bench_dtype t) {
  return t == BENCH_F32 ? "f32" : t == BENCH_BF16 ? "bf16" : "f16";
}

/* Timing result of one case: the timed runs' min, median, max and their 10th / 90th
   percentiles (nearest rank: sorted index floor / ceil of 0.1 / 0.9 x (runs - 1); min and max
   for 10 runs or fewer), whose ratio judges the spread of many runs of a short call, where
   one interrupt sets the max. */
typedef struct bench_timing {
  double min_ms, median_ms, max_ms, p10_ms, p90_ms;
  int reps, warmup;
} bench_timing;

/* One run of the operation under test; returns 0 on success, else writes a message to err. */
typedef int (*bench_run_fn)(void *ctx, char *err, size_t errlen);

/* Runs fn `warmup` times untimed, then `reps` times timed; fills t. Returns 0, or the first
   non-zero return of fn (err then holds its message).  With the worker's --budget-s, fewer
   runs when they take too long (t->reps, t->warmup say how many ran). */
int bench_time(bench_run_fn fn, void *ctx, int warmup, int reps, bench_timing *t, char *err,
               size_t errlen);

/* A result of one case, as the worker reports it. */
typedef enum bench_status { BENCH_OK = 0, BENCH_NA = 1, BENCH_ERROR = 2 } bench_status;

/* A worker: the library-specific part. run_case fills t (status OK) or writes a reason
   (status NA: the library has no such operation / dtype / layout; ERROR: it failed);
   impl receives a short name of the implementation that ran ("" if unknown); extra may
   receive more members of the result's JSON object, each written as ',"key":value'. */
typedef struct bench_worker {
  const char *lib;  /* "norma", "dnnl" */
  /* prints extra key/values of the info line, each starting with ',' (JSON). */
  void (*print_info)(FILE *f);
  void (*set_threads)(int threads);
  bench_status (*run_case)(const bench_case *k, int warmup, int reps, bench_timing *t,
                           char *impl, size_t impllen, char *extra, size_t extralen,
                           char *reason, size_t reasonlen);
  /* --max-isa VALUE (may be NULL: the option is then rejected); returns 0 or writes a
     message to err */
  int (*set_max_isa)(const char *value, char *err, size_t errlen);
} bench_worker;

/* The whole command line of a worker: options, --info, --probe, cases. */
int bench_worker_main(int argc, char **argv, const bench_worker *w);

/* Parses a case; returns 0 or writes a message to err. */
int bench_parse_case(const char *text, bench_case *k, char *err, size_t errlen);

/* 64-byte aligned allocation of `bytes`, zeroed (so every page is touched), or NULL. */
void *bench_alloc(size_t bytes);
void bench_free(void *p);

/* Fills `count` elements of dtype with reproducible pseudo-random values in [lo, hi): a block
   of 65521 values (a prime) repeated over the tensor, so that set-up runs at memcpy speed. */
void bench_fill(void *p, int64_t count, bench_dtype dtype, uint64_t seed, float lo, float hi);
void bench_fill_f32(float *p, int64_t count, uint64_t seed, float lo, float hi);

/* float -> bfloat16 bits, round to nearest even (NaN kept quiet). */
uint16_t bench_f32_to_bf16(float f);
/* float -> IEEE half bits, round to nearest even (overflow to Inf, subnormals kept). */
uint16_t bench_f32_to_f16(float f);

/* Memory-bandwidth probe (bw_probe.c): streaming copy with non-temporal stores (counted as
   read + write), copy with ordinary stores, and a read-only sum, over arrays of `bytes` each,
   with `threads` OpenMP threads; `passes` timed passes after one untimed pass, best and median
   reported in GB/s (1e9 bytes / s). */
typedef struct bench_probe_result {
  double copy_nt_best, copy_nt_median;
  double copy_best, copy_median;
  double read_best, read_median;
  size_t bytes;
  int threads, passes, nt_stores; /* nt_stores: 1 if the AVX streaming stores were used */
} bench_probe_result;
int bench_probe(size_t bytes, int threads, int passes, bench_probe_result *r);

/* JSON string escaping of s into f (with the quotes). */
void bench_json_string(FILE *f, const char *s);

#endif
