/* test_norm_determinism.c - the norm family (LayerNorm, RMSNorm, GroupNorm, InstanceNorm) gives
 * bitwise identical results for 1, 2, 3, 4 and 7 threads (norma_set_num_threads) on one ISA path
 * (ctest runs it on each: NORMA_MAX_ISA=scalar, avx2, avx512), and repeats itself exactly.
 *
 * Every op and every output: LayerNorm / RMSNorm forward with residual (y, sum, save_*) and
 * without, backward with dsum (dx, dgamma, dbeta); GroupNorm forward / backward with NONE /
 * RELU / SILU in both layouts; InstanceNorm training (with running statistics), inference and
 * backward in both layouts; every dtype.  The ops run serially below 24576-49152 values
 * (GroupNorm / InstanceNorm on the engine from 24576; LayerNorm / RMSNorm rows from 32768 and
 * 49152 forward, 40960 backward), so the shapes are mostly larger than that (LN 300 x 1024
 * and 301 x 1030, GN N=3 C=64 G=8 spatial 56*56, GN on [600, 64], IN N=2 C=32 spatial 33*33)
 * - where the thread count changes how the engine cuts the work (units, row ranges) - plus a
 * few small ones.  Also: the ops called
 * concurrently from four application threads on disjoint data give the results of the same
 * calls made one after the other.
 */
#include <pthread.h>

#include "test_norm_util.h"

enum { FAM_LN, FAM_RMS, FAM_GN, FAM_IN };
#define MAXO 16

typedef struct outs {
  int n;
  const char *name[MAXO];
  void *p[MAXO];
  size_t bytes[MAXO];
} outs;

static void *out(outs *o, const char *name, size_t bytes) {
  o->name[o->n] = name;
  o->bytes[o->n] = bytes;
  return o->p[o->n++] = tu_poisoned(bytes);
}
static void free_outs(outs *o) {
  for (int i = 0; i < o->n; i++) free(o->p[i]);
  o->n = 0;
}

typedef struct problem {
  int fam;
  int64_t n, c, s, groups;
  norma_layout lay;
  norma_dtype dt;
  unsigned flags;
  /* inputs */
  void *x, *res, *dy, *dsum, *gamma, *beta, *rm0, *rv0;
} problem;

/* runs every op of the problem's family into fresh outputs; returns the number of failed
   calls (no TU_CHECK here) */
static int run_all(const problem *p, outs *o) {
  int bad = 0;
  const int64_t total = p->n * p->c * p->s;
  const int64_t ng = p->fam <= FAM_RMS ? p->n : p->fam == FAM_GN ? p->n * p->groups : p->n * p->c;
  const size_t tb = total * tu_esize(p->dt), pb = p->c * tu_psize(p->dt), gb = ng * tu_psize(p->dt);
  o->n = 0;
  if (p->fam <= FAM_RMS) {
    const norma_ln_desc d = {p->n, p->c, p->dt, 1e-5, p->flags};
    void *y = out(o, "y", tb), *sum = out(o, "sum", tb), *sm = out(o, "save_mean", gb),
         *si = out(o, "save_invstd", gb), *y2 = out(o, "y (no residual)", tb),
         *si2 = out(o, "save_invstd (no residual)", gb), *dx = out(o, "dx", tb),
         *dg = out(o, "dgamma", pb), *db = out(o, "dbeta", pb), *dx2 = out(o, "dx (no dsum)", tb),
         *dg2 = out(o, "dgamma (no dsum)", pb);
    if (p->fam == FAM_LN) {
      bad += norma_ln_forward(&d, p->x, p->res, p->gamma, p->beta, y, sum, sm, si) != NORMA_OK;
      bad += norma_ln_forward(&d, p->x, NULL, p->gamma, p->beta, y2, NULL, NULL, si2) != NORMA_OK;
      bad += norma_ln_backward(&d, sum, p->dy, p->dsum, p->gamma, sm, si, dx, dg, db) != NORMA_OK;
      bad += norma_ln_backward(&d, sum, p->dy, NULL, NULL, sm, si, dx2, dg2, NULL) != NORMA_OK;
    } else {
      bad += norma_rms_forward(&d, p->x, p->res, p->gamma, y, sum, si) != NORMA_OK;
      bad += norma_rms_forward(&d, p->x, NULL, p->gamma, y2, NULL, si2) != NORMA_OK;
      bad += norma_rms_backward(&d, sum, p->dy, p->dsum, p->gamma, si, dx, dg) != NORMA_OK;
      bad += norma_rms_backward(&d, sum, p->dy, NULL, NULL, si, dx2, dg2) != NORMA_OK;
    }
  } else if (p->fam == FAM_GN) {
    const norma_gn_desc d = {p->n, p->c, p->s, p->groups, p->lay, p->dt, 1e-5, p->flags};
    void *y = out(o, "y", tb), *sm = out(o, "save_mean", gb), *si = out(o, "save_invstd", gb),
         *dx = out(o, "dx", tb), *dg = out(o, "dgamma", pb), *db = out(o, "dbeta", pb);
    bad += norma_gn_forward(&d, p->x, p->gamma, p->beta, y, sm, si) != NORMA_OK;
    bad += norma_gn_backward(&d, p->x, y, p->dy, p->gamma, p->beta, sm, si, dx, dg, db) != NORMA_OK;
  } else {
    const norma_in_desc d = {p->n, p->c, p->s, p->lay, p->dt, 1e-5, p->flags};
    void *y = out(o, "y", tb), *sm = out(o, "save_mean", gb), *si = out(o, "save_invstd", gb),
         *rm = out(o, "running_mean", pb), *rv = out(o, "running_var", pb),
         *yi = out(o, "inference y", tb), *dx = out(o, "dx", tb), *dg = out(o, "dgamma", pb),
         *db = out(o, "dbeta", pb);
    memcpy(rm, p->rm0, pb);
    memcpy(rv, p->rv0, pb);
    bad +=
        norma_in_forward_training(&d, p->x, p->gamma, p->beta, y, sm, si, rm, rv, 0.25) != NORMA_OK;
    bad += norma_in_forward_inference(&d, p->x, p->gamma, p->beta, p->rm0, p->rv0, yi) != NORMA_OK;
    bad += norma_in_backward(&d, p->x, y, p->dy, p->gamma, p->beta, sm, si, dx, dg, db) != NORMA_OK;
  }
  return bad;
}

static const char *FNAME[] = {"LN", "RMS", "GN", "IN"};
static int big_cases = 0;

static void det_case(int fam, int64_t n, int64_t c, int64_t s, int64_t groups, norma_layout lay,
                     norma_dtype dt, unsigned flags, uint64_t seed) {
  problem p = {.fam = fam, .n = n, .c = c, .s = s, .groups = fam == FAM_IN ? c : groups,
               .lay = lay, .dt = dt, .flags = flags};
  const int64_t total = n * c * s;
  const size_t tb = total * tu_esize(dt), pb = c * tu_psize(dt);
  tu_set_ctx("determinism %s n=%lld c=%lld s=%lld G=%lld %s %s flags 0x%x", FNAME[fam],
             (long long)n, (long long)c, (long long)s, (long long)p.groups, tu_dt_name(dt),
             tu_layout_name(lay), flags);
  if (total >= 32768) big_cases++;
  tu_rng r = tu_rng_make(seed);
  p.x = tu_alloc(tb), p.res = tu_alloc(tb), p.dy = tu_alloc(tb), p.dsum = tu_alloc(tb);
  p.gamma = tu_alloc(pb), p.beta = tu_alloc(pb), p.rm0 = tu_alloc(pb), p.rv0 = tu_alloc(pb);
  /* values with a large mean against their spread in some groups, around 0 in others */
  for (int64_t e = 0; e < total; e++) {
    const int64_t k = (e / 97) % 3;
    tu_store(dt, p.x, e, (k == 0 ? 50.0 : k == 1 ? -2.0 : 0.0) + tu_uniform(&r, -1.5, 1.5));
  }
  tu_fill_uniform(dt, p.res, total, &r, -1, 1);
  tu_fill_uniform(dt, p.dy, total, &r, -1, 1.2);
  tu_fill_uniform(dt, p.dsum, total, &r, -1, 1);
  tu_fill_param(dt, p.gamma, c, &r, 0.5, 1.5);
  tu_fill_param(dt, p.beta, c, &r, -0.5, 0.5);
  tu_fill_param(dt, p.rm0, c, &r, -1, 1);
  tu_fill_param(dt, p.rv0, c, &r, 0.5, 2);
  outs base = {0};
  norma_set_num_threads(1);
  TU_CHECK(run_all(&p, &base) == 0, "[%s] a call failed: %s", tu_ctx, norma_last_error());
  static const int threads[] = {2, 3, 4, 7, 1};
  for (int ti = 0; ti < 5; ti++) {
    norma_set_num_threads(threads[ti]);
    outs o = {0};
    TU_CHECK(run_all(&p, &o) == 0, "[%s] a call failed: %s", tu_ctx, norma_last_error());
    int bad = 0;
    for (int i = 0; i < o.n; i++)
      if (memcmp(o.p[i], base.p[i], o.bytes[i]) != 0) {
        bad++;
        TU_CHECK(0, "[%s] %s differs between 1 and %d threads", tu_ctx, o.name[i], threads[ti]);
      }
    if (!bad) tu_passed++;
    free_outs(&o);
  }
  norma_set_num_threads(0);
  free_outs(&base);
  free(p.x), free(p.res), free(p.dy), free(p.dsum), free(p.gamma), free(p.beta), free(p.rm0);
  free(p.rv0);
}

/* ---- concurrent calls from several application threads, on disjoint data ---- */

typedef struct job {
  problem p;
  outs seq, conc[3];
  int bad;
} job;

static void *worker(void *arg) {
  job *j = arg;
  for (int rep = 0; rep < 3; rep++) j->bad += run_all(&j->p, &j->conc[rep]);
  return NULL;
}

static void test_concurrent(void) {
  enum { NJ = 4 };
  job jobs[NJ];
  for (int k = 0; k < NJ; k++) {
    job *j = &jobs[k];
    memset(j, 0, sizeof *j);
    const int fam = k; /* LN, RMS, GN, IN */
    const norma_dtype dt = TN_DTS[(k + 1) % 4];
    const int64_t n = fam <= FAM_RMS ? 90 : 3, c = fam <= FAM_RMS ? 500 : 32,
                  s = fam <= FAM_RMS ? 1 : 401;
    j->p = (problem){.fam = fam, .n = n, .c = c, .s = s, .groups = fam == FAM_GN ? 4 : c,
                     .lay = (norma_layout)(k % 2), .dt = dt,
                     .flags = fam == FAM_GN ? NORMA_SILU : fam == FAM_IN ? NORMA_RELU : 0u};
    const int64_t total = n * c * s;
    const size_t tb = total * tu_esize(dt), pb = c * tu_psize(dt);
    tu_rng r = tu_rng_make(77 + k);
    j->p.x = tu_alloc(tb), j->p.res = tu_alloc(tb), j->p.dy = tu_alloc(tb),
    j->p.dsum = tu_alloc(tb);
    j->p.gamma = tu_alloc(pb), j->p.beta = tu_alloc(pb), j->p.rm0 = tu_alloc(pb),
    j->p.rv0 = tu_alloc(pb);
    tu_fill_uniform(dt, j->p.x, total, &r, -3, 5);
    tu_fill_uniform(dt, j->p.res, total, &r, -1, 1);
    tu_fill_uniform(dt, j->p.dy, total, &r, -1, 1);
    tu_fill_uniform(dt, j->p.dsum, total, &r, -1, 1);
    tu_fill_param(dt, j->p.gamma, c, &r, 0.5, 1.5);
    tu_fill_param(dt, j->p.beta, c, &r, -1, 1);
    tu_fill_param(dt, j->p.rm0, c, &r, -1, 1);
    tu_fill_param(dt, j->p.rv0, c, &r, 0.5, 2);
  }
  norma_set_num_threads(2);
  for (int k = 0; k < NJ; k++) jobs[k].bad += run_all(&jobs[k].p, &jobs[k].seq);
  pthread_t th[NJ];
  for (int k = 0; k < NJ; k++)
    TU_CHECK(pthread_create(&th[k], NULL, worker, &jobs[k]) == 0, "pthread_create");
  for (int k = 0; k < NJ; k++) pthread_join(th[k], NULL);
  norma_set_num_threads(0);
  for (int k = 0; k < NJ; k++) {
    job *j = &jobs[k];
    tu_set_ctx("concurrent calls: job %d (%s %s %s)", k, FNAME[j->p.fam], tu_dt_name(j->p.dt),
               tu_layout_name(j->p.lay));
    TU_CHECK(j->bad == 0, "[%s] %d calls failed", tu_ctx, j->bad);
    for (int rep = 0; rep < 3; rep++) {
      int diff = 0;
      for (int i = 0; i < j->seq.n; i++)
        if (memcmp(j->conc[rep].p[i], j->seq.p[i], j->seq.bytes[i]) != 0) {
          diff++;
          TU_CHECK(0, "[%s] %s differs from the sequential run (repetition %d)", tu_ctx,
                   j->seq.name[i], rep);
        }
      if (!diff) tu_passed++;
      free_outs(&j->conc[rep]);
    }
    free_outs(&j->seq);
    free(j->p.x), free(j->p.res), free(j->p.dy), free(j->p.dsum), free(j->p.gamma);
    free(j->p.beta), free(j->p.rm0), free(j->p.rv0);
  }
}

int main(void) {
  const int quick = tu_quick();
  printf("test_norm_determinism: ISA %s\n", norma_isa_name(norma_get_isa()));
  norma_set_use_reference(0);
  static const unsigned acts[] = {0, NORMA_RELU, NORMA_SILU};
  uint64_t seed = 9000;
  for (int t = 0; t < 4; t++) {
    const norma_dtype dt = TN_DTS[t];
    for (int fam = FAM_LN; fam <= FAM_RMS; fam++) {
      det_case(fam, 300, 1024, 1, 1, NORMA_CHANNELS_LAST, dt, 0, seed++);
      if (!quick)
        det_case(fam, 301, 1030, 1, 1, NORMA_CHANNELS_LAST, dt, NORMA_CHECK_FINITE, seed++);
      det_case(fam, 7, 8200, 1, 1, NORMA_CHANNELS_LAST, dt, 0, seed++); /* few rows, long */
      /* the backward's four units of 10 rows (the last 7), threaded from 16384 values */
      det_case(fam, 37, 769, 1, 1, NORMA_CHANNELS_LAST, dt, 0, seed++);
      det_case(fam, 5, 33, 1, 1, NORMA_CHANNELS_LAST, dt, 0, seed++);   /* serial */
    }
    for (int l = 0; l < 2; l++) {
      const norma_layout lay = (norma_layout)l;
      for (int a = 0; a < 3; a++) {
        if (quick && a != (t + l) % 3) continue;
        det_case(FAM_GN, 3, 64, 56 * 56, 8, lay, dt, acts[a], seed++);
      }
      det_case(FAM_GN, 2, 1030, 33, 2, lay, dt, acts[(t + l) % 3], seed++);
      det_case(FAM_GN, 600, 64, 1, 8, lay, dt, 0, seed++);          /* row path */
      det_case(FAM_GN, 600, 64, 1, 8, lay, dt, NORMA_RELU, seed++); /* [N, C] on the engine */
      det_case(FAM_GN, 2, 6, 49, 3, lay, dt, acts[(t + l + 1) % 3], seed++); /* serial */
      det_case(FAM_IN, 2, 32, 33 * 33, 32, lay, dt, acts[(t + 2 * l) % 3] |
               (l ? NORMA_BN_BIASED_RUNNING_VAR : 0u), seed++);
      det_case(FAM_IN, 1, 3, 20000, 3, lay, dt, 0, seed++); /* few instances, long */
      det_case(FAM_IN, 3, 5, 7, 5, lay, dt, NORMA_RELU, seed++); /* serial */
    }
  }
  test_concurrent();
  printf("test_norm_determinism: %d cases of >= 32768 values (the engine uses threads there)\n",
         big_cases);
  TU_CHECK(big_cases >= 40, "only %d cases large enough for threads", big_cases);
  return tu_finish("test_norm_determinism");
}
