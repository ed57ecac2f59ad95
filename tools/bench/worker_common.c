/* worker_common.c - command line, case parsing, buffers and timing shared by the C workers of
   norma-bench.  See worker_common.h. */
#define _POSIX_C_SOURCE 200809L
#include "worker_common.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---------------------------------------------------------------------------------------- */
/* cases                                                                                    */
/* ---------------------------------------------------------------------------------------- */

static int set_err(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (err && errlen) vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return 1;
}

static int parse_count(const char *v, int64_t lo, int64_t *out) {
  char *end;
  errno = 0;
  long long x = strtoll(v, &end, 10);
  if (end == v || *end || errno || x < lo) return 1;
  *out = x;
  return 0;
}

int bench_parse_case(const char *text, bench_case *k, char *err, size_t errlen) {
  char op[32], layout[16], dtype[16], dims[128];
  int used = 0;
  memset(k, 0, sizeof *k);
  k->reps = k->warmup = -1;
  if (sscanf(text, " %31s %15s %15s %127s%n", op, layout, dtype, dims, &used) != 4)
    return set_err(err, errlen, "case '%s': expected '<op> <layout> <dtype> N,C[,H[,W]]'", text);

  static const struct {
    const char *name;
    bench_family fam;
    bench_dir dir;
    bench_act act;
    int res;
  } ops[] = {
    {"fwd", BENCH_BN, BENCH_FWD, BENCH_ACT_NONE, 0},
    {"infer", BENCH_BN, BENCH_INFER, BENCH_ACT_NONE, 0},
    {"bwd", BENCH_BN, BENCH_BWD, BENCH_ACT_NONE, 0},
    {"relu_fwd", BENCH_BN, BENCH_FWD, BENCH_ACT_RELU, 0},
    {"relu_infer", BENCH_BN, BENCH_INFER, BENCH_ACT_RELU, 0},
    {"relu_bwd", BENCH_BN, BENCH_BWD, BENCH_ACT_RELU, 0},
    {"add_relu_fwd", BENCH_BN, BENCH_FWD, BENCH_ACT_ADD_RELU, 0},
    {"add_relu_infer", BENCH_BN, BENCH_INFER, BENCH_ACT_ADD_RELU, 0},
    {"add_relu_bwd", BENCH_BN, BENCH_BWD, BENCH_ACT_ADD_RELU, 0},
    {"ln_fwd", BENCH_LN, BENCH_FWD, BENCH_ACT_NONE, 0},
    {"ln_bwd", BENCH_LN, BENCH_BWD, BENCH_ACT_NONE, 0},
    {"ln_res_fwd", BENCH_LN, BENCH_FWD, BENCH_ACT_NONE, 1},
    {"ln_res_bwd", BENCH_LN, BENCH_BWD, BENCH_ACT_NONE, 1},
    {"rms_fwd", BENCH_RMS, BENCH_FWD, BENCH_ACT_NONE, 0},
    {"rms_bwd", BENCH_RMS, BENCH_BWD, BENCH_ACT_NONE, 0},
    {"gn_fwd", BENCH_GN, BENCH_FWD, BENCH_ACT_NONE, 0},
    {"gn_bwd", BENCH_GN, BENCH_BWD, BENCH_ACT_NONE, 0},
    {"gn_silu_fwd", BENCH_GN, BENCH_FWD, BENCH_ACT_SILU, 0},
    {"gn_silu_bwd", BENCH_GN, BENCH_BWD, BENCH_ACT_SILU, 0},
    {"in_fwd", BENCH_IN, BENCH_FWD, BENCH_ACT_NONE, 0},
    {"in_bwd", BENCH_IN, BENCH_BWD, BENCH_ACT_NONE, 0},
  };
  size_t i;
  for (i = 0; i < sizeof ops / sizeof ops[0]; ++i)
    if (strcmp(op, ops[i].name) == 0) break;
  if (i == sizeof ops / sizeof ops[0]) return set_err(err, errlen, "unknown op '%s'", op);
  snprintf(k->op, sizeof k->op, "%s", op);
  k->family = ops[i].fam;
  k->dir = ops[i].dir;
  k->act = ops[i].act;
  k->residual = ops[i].res;
  const int rowwise = k->family == BENCH_LN || k->family == BENCH_RMS;

  if (strcmp(layout, "nchw") == 0) k->layout = BENCH_NCHW;
  else if (strcmp(layout, "nhwc") == 0) k->layout = BENCH_NHWC;
  else if (strcmp(layout, "nc") == 0) k->layout = BENCH_NC;
  else if (strcmp(layout, "rows") == 0) k->layout = BENCH_ROWS;
  else return set_err(err, errlen, "unknown layout '%s' (nchw, nhwc, nc, rows)", layout);
  if (rowwise != (k->layout == BENCH_ROWS))
    return set_err(err, errlen, rowwise ? "op '%s' takes layout 'rows'"
                                        : "layout 'rows' is for LayerNorm / RMSNorm ops, not '%s'",
                   op);

  if (strcmp(dtype, "f32") == 0) k->dtype = BENCH_F32;
  else if (strcmp(dtype, "bf16") == 0) k->dtype = BENCH_BF16;
  else if (strcmp(dtype, "f16") == 0) k->dtype = BENCH_F16;
  else return set_err(err, errlen, "unknown dtype '%s' (f32, bf16, f16)", dtype);

  int64_t d[4] = {1, 1, 1, 1};
  int nd = 0;
  char *p = dims;
  while (*p) {
    if (nd == 4) return set_err(err, errlen, "shape '%s': at most 4 dimensions", dims);
    char *end;
    errno = 0;
    long long v = strtoll(p, &end, 10);
    if (end == p || errno || v < 1) return set_err(err, errlen, "shape '%s': bad dimension", dims);
    d[nd++] = v;
    p = end;
    if (*p == ',' || *p == 'x') ++p;
    else if (*p) return set_err(err, errlen, "shape '%s': bad separator", dims);
  }
  if (nd < 2) return set_err(err, errlen, "shape '%s': need at least 2 dimensions", dims);
  k->rank = nd;
  memcpy(k->dims, d, sizeof d);
  if (rowwise) {
    /* [..., D]: every dimension but the last is a row */
    k->n = 1;
    for (int j = 0; j < nd - 1; ++j) k->n *= d[j];
    k->c = d[nd - 1];
    k->h = k->w = 1;
    k->ndim = nd;
  } else {
    k->n = d[0]; k->c = d[1]; k->h = d[2]; k->w = d[3];
    k->ndim = nd <= 2 ? 2 : 4;
    if (k->family == BENCH_BN) {
      if (k->ndim == 2 && k->layout != BENCH_NC) k->layout = BENCH_NC; /* [N, C]: one layout */
      if (k->ndim == 4 && k->layout == BENCH_NC)
        return set_err(err, errlen, "layout nc needs a 2-D shape N,C");
    } else if (k->ndim != 4 || k->layout == BENCH_NC) {
      return set_err(err, errlen, "op '%s' needs N,C,H[,W] and layout nchw or nhwc", op);
    }
  }
  if (k->family == BENCH_GN) k->groups = 32;
  if (k->family == BENCH_IN) k->groups = k->c;

  /* key=value options */
  const char *q = text + used;
  char tok[64];
  int tl = 0;
  while (sscanf(q, " %63s%n", tok, &tl) == 1) {
    q += tl;
    char *eq = strchr(tok, '=');
    int64_t v;
    if (!eq) return set_err(err, errlen, "case '%s': unexpected '%s' (key=value)", text, tok);
    *eq = 0;
    if (strcmp(tok, "groups") == 0) {
      if (parse_count(eq + 1, 1, &v)) return set_err(err, errlen, "groups must be >= 1");
      if (k->family != BENCH_GN) return set_err(err, errlen, "groups= is for GroupNorm ops");
      k->groups = v;
    } else if (strcmp(tok, "reps") == 0) {
      if (parse_count(eq + 1, 1, &v) || v > 1000000)
        return set_err(err, errlen, "reps must be >= 1");
      k->reps = (int)v;
    } else if (strcmp(tok, "warmup") == 0) {
      if (parse_count(eq + 1, 0, &v) || v > 1000000)
        return set_err(err, errlen, "warmup must be >= 0");
      k->warmup = (int)v;
    } else {
      return set_err(err, errlen, "case '%s': unknown key '%s' (groups, reps, warmup)", text, tok);
    }
  }
  if (k->family == BENCH_GN && k->c % k->groups != 0)
    return set_err(err, errlen, "groups (%lld) must divide C (%lld)", (long long)k->groups,
                   (long long)k->c);
  return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* buffers                                                                                  */
/* ---------------------------------------------------------------------------------------- */

void *bench_alloc(size_t bytes) {
  size_t sz = (bytes + 63) / 64 * 64;
  if (sz == 0) sz = 64;
  void *p = NULL;
  if (posix_memalign(&p, 64, sz) != 0) return NULL;
  memset(p, 0, sz); /* touches every page: no page fault is timed */
  return p;
}

void bench_free(void *p) { free(p); }

uint16_t bench_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

uint16_t bench_f32_to_f16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0u));
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: Inf */
  if (a < 0x38800000u) {                                    /* below 2^-14: subnormal or 0 */
    if (a < 0x33000000u) return (uint16_t)sign;             /* below 2^-25 (2^-25 ties to 0) */
    const uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, sh = 126 - e;
    uint32_t r = m >> sh;
    const uint32_t rem = m & ((1u << sh) - 1u), half = 1u << (sh - 1u);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return (uint16_t)(sign | r);
  }
  const uint32_t r = a - 0x38000000u; /* exponent rebiased from 127 to 15 */
  uint32_t h = r >> 13;
  const uint32_t rem = r & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return (uint16_t)(sign | h);
}

static inline uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Values are drawn for a block of FILL_BLOCK elements (a prime, so that the pattern does not
   line up with channels or rows), which is then repeated over the tensor: filling stays at
   memcpy speed for big tensors (the benchmark's set-up time), and the data still look random
   to every kernel. */
#define FILL_BLOCK 65521

static void fill_block_f32(float *p, int64_t count, uint64_t seed, float lo, float hi) {
  uint64_t s = seed;
  for (int64_t i = 0; i < count; ++i) {
    float u = (float)(splitmix64(&s) >> 40) * (1.0f / 16777216.0f);
    p[i] = lo + (hi - lo) * u;
  }
}

static void tile(void *p, int64_t count, size_t esize) {
  char *b = (char *)p;
  size_t done = FILL_BLOCK * esize, total = (size_t)count * esize;
  while (done < total) {
    size_t n = total - done < done ? total - done : done; /* doubling copies */
    memcpy(b + done, b, n);
    done += n;
  }
}

void bench_fill_f32(float *p, int64_t count, uint64_t seed, float lo, float hi) {
  fill_block_f32(p, count < FILL_BLOCK ? count : FILL_BLOCK, seed, lo, hi);
  if (count > FILL_BLOCK) tile(p, count, sizeof(float));
}

void bench_fill(void *p, int64_t count, bench_dtype dtype, uint64_t seed, float lo, float hi) {
  if (dtype == BENCH_F32) {
    bench_fill_f32((float *)p, count, seed, lo, hi);
    return;
  }
  int64_t m = count < FILL_BLOCK ? count : FILL_BLOCK;
  float *tmp = (float *)malloc(sizeof(float) * (size_t)m);
  uint16_t *q = (uint16_t *)p;
  if (tmp) {
    fill_block_f32(tmp, m, seed, lo, hi);
    for (int64_t i = 0; i < m; ++i)
      q[i] = dtype == BENCH_F16 ? bench_f32_to_f16(tmp[i]) : bench_f32_to_bf16(tmp[i]);
    free(tmp);
  } else {
    for (int64_t i = 0; i < m; ++i)
      q[i] = dtype == BENCH_F16 ? bench_f32_to_f16(lo) : bench_f32_to_bf16(lo);
  }
  if (count > FILL_BLOCK) tile(p, count, sizeof(uint16_t));
}

/* ---------------------------------------------------------------------------------------- */
/* timing                                                                                   */
/* ---------------------------------------------------------------------------------------- */

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Time budget of one case (--budget-s; 0: none): warm-ups stop once they have taken a quarter
   of it (at least one runs), timed runs once they have taken all of it (at least one runs),
   so that a pathologically slow case does not hold the benchmark for minutes.  The result
   says how many runs were made. */
static double g_budget_ms = 0.0;
/* Time floors (--min-warmup-ms, --min-time-ms; 0: none): warm-ups go on past --warmup runs
   until they have taken g_min_warm_ms, timed runs past --reps until g_min_time_ms, so that a
   call of a few microseconds is timed after the CPUs have come up to speed and over more than
   a millisecond of runs (norma's backward of NHWC 64x896x2x2, 24 measurements 0.15 s apart:
   their 90th percentile 0.070 ms after 3 warm-ups and 10 runs, 0.049 ms with floors of 20
   and 10 ms; docs/performance.md).  BENCH_MAX_REPS bounds either count. */
static double g_min_warm_ms = 0.0, g_min_time_ms = 0.0;
#define BENCH_MAX_REPS 100000

int bench_time(bench_run_fn fn, void *ctx, int warmup, int reps, bench_timing *t, char *err,
               size_t errlen) {
  double spent = 0.0;
  int warm = 0;
  while (warm < warmup || (spent < g_min_warm_ms && warm < BENCH_MAX_REPS)) {
    double t0 = now_ms();
    int rc = fn(ctx, err, errlen);
    spent += now_ms() - t0;
    if (rc) return rc;
    ++warm;
    if (g_budget_ms > 0.0 && spent > 0.25 * g_budget_ms) break;
  }
  if (reps < 1) reps = 1;
  int cap = reps;
  double *ms = (double *)malloc(sizeof(double) * (size_t)cap);
  if (!ms) return set_err(err, errlen, "out of memory");
  int done = 0;
  spent = 0.0;
  while (done < reps || (spent < g_min_time_ms && done < BENCH_MAX_REPS)) {
    if (done == cap) { /* more runs than --reps, to fill the time floor */
      double *grown = (double *)realloc(ms, sizeof(double) * (size_t)(2 * cap));
      if (!grown) break; /* the runs so far stand */
      ms = grown, cap *= 2;
    }
    double t0 = now_ms();
    int rc = fn(ctx, err, errlen);
    double t1 = now_ms();
    if (rc) {
      free(ms);
      return rc;
    }
    ms[done++] = t1 - t0;
    spent += t1 - t0;
    if (g_budget_ms > 0.0 && spent > g_budget_ms) break;
  }
  qsort(ms, (size_t)done, sizeof(double), cmp_double);
  t->min_ms = ms[0];
  t->max_ms = ms[done - 1];
  t->median_ms = (done % 2) ? ms[done / 2] : 0.5 * (ms[done / 2 - 1] + ms[done / 2]);
  t->p10_ms = ms[(done - 1) / 10];
  t->p90_ms = ms[done - 1 - (done - 1) / 10];
  t->reps = done;
  t->warmup = warm;
  free(ms);
  return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* JSON output                                                                              */
/* ---------------------------------------------------------------------------------------- */

void bench_json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; s && *s; ++s) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
    else if (ch == '\n') fputs("\\n", f);
    else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
    else fputc(ch, f);
  }
  fputc('"', f);
}

static const char *layout_name(bench_layout l) {
  return l == BENCH_NCHW ? "nchw" : l == BENCH_NHWC ? "nhwc" : l == BENCH_ROWS ? "rows" : "nc";
}

static void print_case_head(FILE *f, const char *lib, const bench_case *k) {
  fprintf(f, "{\"type\":\"result\",\"lib\":");
  bench_json_string(f, lib);
  fprintf(f, ",\"op\":\"%s\",\"layout\":\"%s\",\"dtype\":\"%s\",\"shape\":[", k->op,
          layout_name(k->layout), bench_dtype_name(k->dtype));
  if (k->layout == BENCH_ROWS) {
    for (int j = 0; j < k->rank; ++j) fprintf(f, "%s%lld", j ? "," : "", (long long)k->dims[j]);
    fputc(']', f);
  } else if (k->ndim == 2) {
    fprintf(f, "%lld,%lld]", (long long)k->n, (long long)k->c);
  } else {
    fprintf(f, "%lld,%lld,%lld,%lld]", (long long)k->n, (long long)k->c, (long long)k->h,
            (long long)k->w);
  }
  if (k->family == BENCH_GN) fprintf(f, ",\"groups\":%lld", (long long)k->groups);
}

static void run_one(const bench_worker *w, const char *text, int warmup, int reps) {
  bench_case k;
  char err[512] = "", impl[128] = "", extra[512] = "";
  if (bench_parse_case(text, &k, err, sizeof err)) {
    printf("{\"type\":\"result\",\"lib\":");
    bench_json_string(stdout, w->lib);
    printf(",\"case\":");
    bench_json_string(stdout, text);
    printf(",\"status\":\"error\",\"reason\":");
    bench_json_string(stdout, err);
    printf("}\n");
    fflush(stdout);
    return;
  }
  bench_timing t;
  memset(&t, 0, sizeof t);
  if (k.warmup >= 0) warmup = k.warmup;
  if (k.reps >= 1) reps = k.reps;
  bench_status st = w->run_case(&k, warmup, reps, &t, impl, sizeof impl, extra, sizeof extra,
                                err, sizeof err);
  print_case_head(stdout, w->lib, &k);
  if (st == BENCH_OK) {
    printf(",\"status\":\"ok\",\"min_ms\":%.6f,\"median_ms\":%.6f,\"max_ms\":%.6f,"
           "\"p10_ms\":%.6f,\"p90_ms\":%.6f,\"reps\":%d,\"warmup\":%d,\"impl\":",
           t.min_ms, t.median_ms, t.max_ms, t.p10_ms, t.p90_ms, t.reps, t.warmup);
    bench_json_string(stdout, impl);
    fputs(extra, stdout);
  } else {
    printf(",\"status\":\"%s\",\"reason\":", st == BENCH_NA ? "n/a" : "error");
    bench_json_string(stdout, err);
  }
  printf("}\n");
  fflush(stdout);
}

/* ---------------------------------------------------------------------------------------- */
/* command line                                                                             */
/* ---------------------------------------------------------------------------------------- */

static void usage(FILE *f, const char *argv0) {
  fprintf(f,
          "usage: %s [--threads N] [--warmup W] [--reps R] [--budget-s S] [--max-isa ISA]\n"
          "          [--min-warmup-ms MS] [--min-time-ms MS] [--info]\n"
          "          [--probe [--probe-mb MB] [--probe-passes P]]\n"
          "          [--case 'OP LAYOUT DTYPE DIMS [key=value]...']... [--stdin]\n"
          "A norma-bench worker: prints one JSON line per case (see tools/norma-bench).\n"
          "  OP      fwd infer bwd relu_fwd relu_infer relu_bwd add_relu_fwd add_relu_infer\n"
          "          add_relu_bwd ln_fwd ln_bwd ln_res_fwd ln_res_bwd rms_fwd rms_bwd gn_fwd\n"
          "          gn_bwd gn_silu_fwd gn_silu_bwd in_fwd in_bwd\n"
          "  LAYOUT  nchw nhwc nc rows      DTYPE f32 bf16 f16\n"
          "  keys    groups=G (GroupNorm, default 32), reps=R, warmup=W (this case)\n"
          "  --max-isa caps the library's instruction set (norma: scalar, avx2, avx512)\n"
          "  --budget-s: a case's warm-ups stop after S/4 seconds, its timed runs after S\n"
          "          (at least one of each; 0: no limit)\n"
          "  --min-warmup-ms, --min-time-ms: warm-ups, timed runs go on past W, R runs until\n"
          "          they have taken MS milliseconds (default 0: W and R runs)\n"
          "  --stdin reads one case per line from stdin until EOF or 'quit'.\n",
          argv0);
}

static int parse_int(const char *s, int lo, int *out) {
  char *end;
  long v = strtol(s, &end, 10);
  if (end == s || *end || v < lo || v > 1000000) return 1;
  *out = (int)v;
  return 0;
}

int bench_worker_main(int argc, char **argv, const bench_worker *w) {
  int threads = 0, warmup = 3, reps = 10, info = 0, probe = 0, use_stdin = 0;
  int probe_mb = 256, probe_passes = 5, budget_s = 0, min_warm_ms = 0, min_time_ms = 0;
  const char *max_isa = NULL;
  /* first pass: options; cases run after in order */
  for (int i = 1; i < argc; ++i) {
    const char *a = argv[i];
    int *target = NULL;
    int lo = 0;
    if (strcmp(a, "--threads") == 0) { target = &threads; lo = 1; }
    else if (strcmp(a, "--warmup") == 0) { target = &warmup; lo = 0; }
    else if (strcmp(a, "--reps") == 0) { target = &reps; lo = 1; }
    else if (strcmp(a, "--probe-mb") == 0) { target = &probe_mb; lo = 1; }
    else if (strcmp(a, "--probe-passes") == 0) { target = &probe_passes; lo = 1; }
    else if (strcmp(a, "--budget-s") == 0) { target = &budget_s; lo = 0; }
    else if (strcmp(a, "--min-warmup-ms") == 0) { target = &min_warm_ms; lo = 0; }
    else if (strcmp(a, "--min-time-ms") == 0) { target = &min_time_ms; lo = 0; }
    else if (strcmp(a, "--info") == 0) { info = 1; continue; }
    else if (strcmp(a, "--probe") == 0) { probe = 1; continue; }
    else if (strcmp(a, "--stdin") == 0) { use_stdin = 1; continue; }
    else if (strcmp(a, "--max-isa") == 0) {
      if (i + 1 >= argc || !w->set_max_isa) {
        fprintf(stderr, "%s: --max-isa %s\n", argv[0],
                w->set_max_isa ? "needs a value" : "is not supported by this worker");
        return 2;
      }
      max_isa = argv[++i];
      continue;
    } else if (strcmp(a, "--case") == 0) {
      if (i + 1 >= argc) { usage(stderr, argv[0]); return 2; }
      ++i;
      continue;
    } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      usage(stdout, argv[0]);
      return 0;
    } else {
      fprintf(stderr, "%s: unknown argument '%s'\n", argv[0], a);
      usage(stderr, argv[0]);
      return 2;
    }
    if (i + 1 >= argc || parse_int(argv[i + 1], lo, target)) {
      fprintf(stderr, "%s: %s needs an integer >= %d\n", argv[0], a, lo);
      return 2;
    }
    ++i;
  }
  if (threads > 0) w->set_threads(threads);
  g_budget_ms = 1e3 * budget_s;
  g_min_warm_ms = min_warm_ms, g_min_time_ms = min_time_ms;
  if (max_isa) {
    char err[256] = "";
    if (w->set_max_isa(max_isa, err, sizeof err)) {
      fprintf(stderr, "%s: --max-isa %s: %s\n", argv[0], max_isa, err);
      return 2;
    }
  }

  if (info) {
    printf("{\"type\":\"info\",\"lib\":");
    bench_json_string(stdout, w->lib);
    printf(",\"threads\":%d,\"warmup\":%d,\"reps\":%d,\"min_warmup_ms\":%d,\"min_time_ms\":%d",
           threads, warmup, reps, min_warm_ms, min_time_ms);
    if (w->print_info) w->print_info(stdout);
    printf("}\n");
    fflush(stdout);
  }
  if (probe) {
    bench_probe_result r;
    if (bench_probe((size_t)probe_mb << 20, threads > 0 ? threads : 0, probe_passes, &r)) {
      printf("{\"type\":\"probe\",\"status\":\"error\",\"reason\":\"out of memory\"}\n");
    } else {
      printf("{\"type\":\"probe\",\"status\":\"ok\",\"threads\":%d,\"bytes\":%zu,\"passes\":%d,"
             "\"nt_stores\":%s,\"copy_nt_GBps\":%.3f,\"copy_nt_median_GBps\":%.3f,"
             "\"copy_GBps\":%.3f,\"copy_median_GBps\":%.3f,\"read_GBps\":%.3f,"
             "\"read_median_GBps\":%.3f}\n",
             r.threads, r.bytes, r.passes, r.nt_stores ? "true" : "false", r.copy_nt_best,
             r.copy_nt_median, r.copy_best, r.copy_median, r.read_best, r.read_median);
    }
    fflush(stdout);
  }
  for (int i = 1; i < argc; ++i)
    if (strcmp(argv[i], "--case") == 0) run_one(w, argv[++i], warmup, reps);
  if (use_stdin) {
    char line[2048];
    while (fgets(line, sizeof line, stdin)) {
      char *p = line;
      while (*p == ' ' || *p == '\t') ++p;
      size_t len = strlen(p);
      while (len && (p[len - 1] == '\n' || p[len - 1] == '\r' || p[len - 1] == ' ')) p[--len] = 0;
      if (!*p || *p == '#') continue;
      if (strcmp(p, "quit") == 0) break;
      run_one(w, p, warmup, reps);
    }
  }
  return 0;
}
