/* test_determinism.c - bitwise identical results for 1, 2, 3 and 4 threads (and 6 and 8 on a
 * large channels-last tensor) on one ISA path
 * (ctest runs it with NORMA_MAX_ISA=scalar and =avx2): training forward (y, save_mean,
 * save_invstd, running statistics), inference, backward (x given and x NULL, dx, dresidual,
 * dgamma, dbeta) and the split API (moments, forward_apply, backward_reduce, backward_apply),
 * every dtype, both layouts, on shapes with few channels and long reductions as well as many
 * channels.  A second run at one thread count must also repeat itself exactly.  Also: calls
 * made concurrently from four application threads on disjoint data give the results of the
 * same calls made one after the other.
 */
#include <pthread.h>

#include "test_util.h"

#define EXPECT_OK(st, what)                                                                    \
  TU_CHECK((st) == NORMA_OK, "[%s] %s returned %s: %s", tu_ctx, what, norma_status_string(st), \
           norma_last_error())

enum { O_Y, O_SM, O_SI, O_RM, O_RV, O_YI, O_DX, O_DR, O_DG, O_DB, O_DX2, O_DG2,
       O_CNT, O_MEAN, O_M2, O_YA, O_SDY, O_SDX, O_SX, O_DXA, O_N };
static const char *ONAMES[O_N] = {"y", "save_mean", "save_invstd", "running_mean", "running_var",
                                  "inference y", "dx", "dresidual", "dgamma", "dbeta",
                                  "dx (x NULL)", "dgamma (x NULL)", "moments count",
                                  "moments mean", "moments m2", "forward_apply y", "sum_dy",
                                  "sum_dy_xhat", "sum_xhat", "backward_apply dx"};

typedef struct outs {
  void *p[O_N];
  size_t bytes[O_N];
} outs;

/* Runs every operation into freshly poisoned outputs; returns the number of calls that did not
   return NORMA_OK (no TU_CHECK here: it also runs on several threads at once). */
static int run_all(const norma_bn_desc *d, const void *x, const void *res, const void *dy,
                   const void *gamma, const void *beta, const void *rm0, const void *rv0,
                   outs *o) {
  int bad = 0;
  const int64_t total = d->n * d->c * d->spatial, c = d->c;
  const size_t tb = total * tu_esize(d->dtype), pb = c * tu_psize(d->dtype), db = c * 8;
  const size_t sizes[O_N] = {tb, pb, pb, pb, pb, tb, tb, tb, pb, pb, tb, pb,
                             c * 8, db, db, tb, db, db, db, tb};
  for (int i = 0; i < O_N; i++) {
    o->bytes[i] = sizes[i];
    o->p[i] = tu_poisoned(sizes[i]);
  }
  memcpy(o->p[O_RM], rm0, pb);
  memcpy(o->p[O_RV], rv0, pb);
  const int act = (d->flags & NORMA_BN_ADD_RELU) ? 2 : (d->flags & NORMA_BN_RELU) ? 1 : 0;
  norma_status st;
  st = norma_bn_forward_training(d, x, res, gamma, beta, o->p[O_Y], o->p[O_SM], o->p[O_SI],
                                 o->p[O_RM], o->p[O_RV], 0.25);
  bad += st != NORMA_OK;
  st = norma_bn_forward_inference(d, x, res, gamma, beta, rm0, rv0, o->p[O_YI]);
  bad += st != NORMA_OK;
  st = norma_bn_backward(d, x, o->p[O_Y], dy, gamma, beta, o->p[O_SM], o->p[O_SI], o->p[O_DX],
                         o->p[O_DR], o->p[O_DG], o->p[O_DB]);
  bad += st != NORMA_OK;
  if (!act) {
    st = norma_bn_backward(d, NULL, o->p[O_Y], dy, gamma, beta, o->p[O_SM], o->p[O_SI],
                           o->p[O_DX2], NULL, o->p[O_DG2], NULL);
    bad += st != NORMA_OK;
  }
  st = norma_bn_moments(d, x, o->p[O_CNT], o->p[O_MEAN], o->p[O_M2]);
  bad += st != NORMA_OK;
  double *mean = o->p[O_MEAN], *m2 = o->p[O_M2], *inv = tu_alloc(db);
  for (int64_t j = 0; j < c; j++) inv[j] = 1.0 / sqrt(m2[j] / (double)(d->n * d->spatial) + d->eps);
  st = norma_bn_forward_apply(d, x, res, gamma, beta, mean, inv, o->p[O_YA]);
  bad += st != NORMA_OK;
  st = norma_bn_backward_reduce(d, x, o->p[O_YA], dy, gamma, beta, mean, inv, o->p[O_SDY],
                                o->p[O_SDX], o->p[O_SX]);
  bad += st != NORMA_OK;
  st = norma_bn_backward_apply(d, x, o->p[O_YA], dy, gamma, beta, mean, inv, o->p[O_SDY],
                               o->p[O_SDX], o->p[O_SX], d->n * d->spatial, o->p[O_DXA], NULL);
  bad += st != NORMA_OK;
  free(inv);
  return bad;
}

static void free_outs(outs *o) {
  for (int i = 0; i < O_N; i++) free(o->p[i]);
}

static int multi[3], sched[3][2]; /* per op: cases with >= 2 threads; by schedule */
/* also 6 and 8 threads: where the channels-last segments of a large tensor share out evenly
   among 2 to 4 threads but not among more, whose reduction then splits the channels */
static int det_more_threads;

/* step != 0: channel 5 of samples 2 and 6 jumps by step (mean + step), inside a segment of
   rows: the one-pass statistics of a channels-last block refuse such a drift and read that
   channel twice, and the channels beside it must not notice (the threads split channels
   differently at different thread counts) */
static void det_case(int64_t n, int64_t c, int64_t s, norma_layout lay, norma_dtype dt,
                     unsigned flags, uint64_t seed, double step) {
  const int64_t total = n * c * s;
  const size_t tb = total * tu_esize(dt), pb = c * tu_psize(dt);
  tu_set_ctx("determinism n=%lld c=%lld s=%lld %s %s flags 0x%x step %g", (long long)n,
             (long long)c, (long long)s, tu_dt_name(dt), tu_layout_name(lay), flags, step);
  tu_rng r = tu_rng_make(seed);
  void *x = tu_alloc(tb), *res = tu_alloc(tb), *dy = tu_alloc(tb), *gamma = tu_alloc(pb),
       *beta = tu_alloc(pb), *rm0 = tu_alloc(pb), *rv0 = tu_alloc(pb);
  double *mu = tu_alloc(c * 8), *sd = tu_alloc(c * 8);
  for (int64_t j = 0; j < c; j++) mu[j] = tu_uniform(&r, -50, 50), sd[j] = tu_uniform(&r, 0.1, 3);
  tu_fill_channels(dt, lay, x, n, c, s, mu, sd, &r);
  if (step != 0.0 && c > 5)
    for (int64_t i = 2; i < n; i += 4)
      for (int64_t q = 0; q < s; q++) {
        const int64_t e = tu_index(lay, c, s, i, 5, q);
        tu_store(dt, x, e, tu_load(dt, x, e) + step);
      }
  tu_fill_uniform(dt, res, total, &r, -1, 1);
  tu_fill_uniform(dt, dy, total, &r, -1, 1.2);
  tu_fill_param(dt, gamma, c, &r, 0.5, 1.5);
  tu_fill_param(dt, beta, c, &r, -0.5, 0.5);
  tu_fill_param(dt, rm0, c, &r, -1, 1);
  tu_fill_param(dt, rv0, c, &r, 0.5, 2);
  norma_bn_desc d = {n, c, s, lay, dt, 1e-5, flags};
  /* the plans at 4 threads: the test is only worth something where threads share the work */
  norma_set_num_threads(4);
  for (int op = 0; op < 3; op++) {
    norma_bn_plan p;
    if (norma_bn_query_plan(&d, (norma_bn_op)op, &p) != NORMA_OK) {
      TU_CHECK(0, "[%s] query_plan failed: %s", tu_ctx, norma_last_error());
      continue;
    }
    if (p.threads >= 2) multi[op]++;
    sched[op][p.fused ? 1 : 0]++;
    if (getenv("NORMA_TEST_VERBOSE"))
      printf("  %s op %d: threads %d fused %d unit %lld dram_passes %d streaming %d\n", tu_ctx, op,
             p.threads, p.fused, (long long)p.unit, p.dram_passes, p.streaming_stores);
  }
  outs base;
  norma_set_num_threads(1);
  TU_CHECK(run_all(&d, x, res, dy, gamma, beta, rm0, rv0, &base) == 0, "[%s] a call failed: %s",
           tu_ctx, norma_last_error());
  static const int threads[] = {2, 3, 4, 1, 6, 8};
  for (int ti = 0; ti < (det_more_threads ? 6 : 4); ti++) {
    norma_set_num_threads(threads[ti]);
    outs o;
    TU_CHECK(run_all(&d, x, res, dy, gamma, beta, rm0, rv0, &o) == 0, "[%s] a call failed: %s",
             tu_ctx, norma_last_error());
    int bad = 0;
    for (int i = 0; i < O_N; i++)
      if (memcmp(o.p[i], base.p[i], o.bytes[i]) != 0) {
        bad++;
        TU_CHECK(0, "[%s] %s differs between 1 and %d threads", tu_ctx, ONAMES[i], threads[ti]);
      }
    if (!bad) tu_passed++;
    free_outs(&o);
  }
  norma_set_num_threads(0);
  free_outs(&base);
  free(x), free(res), free(dy), free(gamma), free(beta), free(rm0), free(rv0), free(mu), free(sd);
}

/* ---- concurrent calls from several application threads, on disjoint data ---- */
typedef struct job {
  norma_bn_desc d;
  void *x, *res, *dy, *gamma, *beta, *rm0, *rv0;
  outs seq, conc[3];
  int bad;
} job;

static void *worker(void *arg) {
  job *j = arg;
  for (int rep = 0; rep < 3; rep++)
    j->bad += run_all(&j->d, j->x, j->res, j->dy, j->gamma, j->beta, j->rm0, j->rv0, &j->conc[rep]);
  return NULL;
}

static void test_concurrent(void) {
  enum { NJ = 4 };
  job jobs[NJ];
  for (int k = 0; k < NJ; k++) {
    job *j = &jobs[k];
    const int64_t n = 3, c = 37 + 30 * k, s = 401;
    const norma_dtype dt = (norma_dtype)k;
    const size_t tb = n * c * s * tu_esize(dt), pb = c * tu_psize(dt);
    j->d =
        (norma_bn_desc){n, c, s, (norma_layout)(k % 2), dt, 1e-5, k == 2 ? NORMA_BN_ADD_RELU : 0u};
    tu_rng r = tu_rng_make(77 + k);
    j->x = tu_alloc(tb), j->res = tu_alloc(tb), j->dy = tu_alloc(tb);
    j->gamma = tu_alloc(pb), j->beta = tu_alloc(pb), j->rm0 = tu_alloc(pb), j->rv0 = tu_alloc(pb);
    tu_fill_uniform(dt, j->x, n * c * s, &r, -3, 5);
    tu_fill_uniform(dt, j->res, n * c * s, &r, -1, 1);
    tu_fill_uniform(dt, j->dy, n * c * s, &r, -1, 1);
    tu_fill_param(dt, j->gamma, c, &r, 0.5, 1.5);
    tu_fill_param(dt, j->beta, c, &r, -1, 1);
    tu_fill_param(dt, j->rm0, c, &r, -1, 1);
    tu_fill_param(dt, j->rv0, c, &r, 0.5, 2);
    j->bad = 0;
  }
  norma_set_num_threads(2);
  for (int k = 0; k < NJ; k++) {
    job *j = &jobs[k];
    j->bad += run_all(&j->d, j->x, j->res, j->dy, j->gamma, j->beta, j->rm0, j->rv0, &j->seq);
  }
  pthread_t th[NJ];
  for (int k = 0; k < NJ; k++)
    TU_CHECK(pthread_create(&th[k], NULL, worker, &jobs[k]) == 0, "pthread_create");
  for (int k = 0; k < NJ; k++) pthread_join(th[k], NULL);
  norma_set_num_threads(0);
  for (int k = 0; k < NJ; k++) {
    job *j = &jobs[k];
    tu_set_ctx("concurrent calls: job %d (%s %s)", k, tu_dt_name(j->d.dtype),
               tu_layout_name(j->d.layout));
    TU_CHECK(j->bad == 0, "[%s] %d calls failed", tu_ctx, j->bad);
    for (int rep = 0; rep < 3; rep++) {
      int diff = 0;
      for (int i = 0; i < O_N; i++)
        if (memcmp(j->conc[rep].p[i], j->seq.p[i], j->seq.bytes[i]) != 0) {
          diff++;
          TU_CHECK(0, "[%s] %s differs from the sequential run (repetition %d)", tu_ctx, ONAMES[i],
                   rep);
        }
      if (!diff) tu_passed++;
      free_outs(&j->conc[rep]);
    }
    free_outs(&j->seq);
    free(j->x), free(j->res), free(j->dy), free(j->gamma), free(j->beta), free(j->rm0),
        free(j->rv0);
  }
}

int main(void) {
  const int quick = tu_quick();
  printf("test_determinism: ISA %s\n", norma_isa_name(norma_get_isa()));
  norma_set_use_reference(0);
  typedef struct { int64_t n, c, s; } shape;
  /* {1, 1024, 49} and {8, 256, 49}: the smallest calls that share their work (bn_threads in
     engine.c: channels-first training with many channels, the channels-last backward);
     {2, 1344, 8}: a small call of many short channels-first runs, which shares its work too
     (cf_short_runs_parallel) */
  static const shape full[] = {{2, 1, 100000}, {2, 3, 100000}, {8, 300, 196}, {128, 1000, 1},
                               {5, 17, 3001}, {1, 2, 262147}, {1, 1024, 49}, {8, 256, 49},
                               {2, 1344, 8}};
  static const shape small[] = {{2, 1, 100000}, {2, 3, 30001}, {4, 300, 49}, {64, 257, 1},
                                {1, 1024, 49}, {8, 256, 49}, {2, 1344, 8}};
  const shape *shapes = quick ? small : full;
  const int ns = quick ? (int)(sizeof small / sizeof *small) : (int)(sizeof full / sizeof *full);
  static const unsigned flag_list[] = {0, NORMA_BN_RELU, NORMA_BN_ADD_RELU};
  int k = 0;
  for (int si = 0; si < ns; si++)
    for (int t = 0; t < 4; t++)
      for (int l = 0; l < 2; l++, k++)
        det_case(shapes[si].n, shapes[si].c, shapes[si].s, (norma_layout)l, (norma_dtype)t,
                 flag_list[k % 3], 4242 + k, 0.0);
  /* a channel the one-pass statistics refuse, among channels they serve: 1568 rows are two
     segments, whole rows at 1 and 2 threads, blocks of channels at 3 and 4 */
  for (int t = 0; t < 4; t++)
    det_case(8, 300, 196, NORMA_CHANNELS_LAST, (norma_dtype)t, 0, 99 + t, 3e4);
  /* few rows of many channels: the backward's unit per thread (688 + 672 channels on 2
     threads; units of 512 on 1 thread, the split schedule on 3 and 4) */
  det_case(1, 1360, 90, NORMA_CHANNELS_LAST, NORMA_F32, 0, 66, 0.0);
  /* and the training forward's (at most NORM_FEW_ROWS rows, engine.c): 768 channels a thread on 2
     threads with the residual; bf16 rows of 4 KiB, 1024 channels a thread (f32 rows of 4 KiB
     keep the split schedule) */
  det_case(1, 1536, 25, NORMA_CHANNELS_LAST, NORMA_F32, NORMA_BN_ADD_RELU, 67, 0.0);
  det_case(1, 2048, 25, NORMA_CHANNELS_LAST, NORMA_BF16, NORMA_BN_RELU, 68, 0.0);
  /* channels-first runs of 2 values: the blocked wide view */
  for (int t = 0; t < 4; t++)
    det_case(128, 600, 2, NORMA_CHANNELS_FIRST, (norma_dtype)t, t == 1 ? NORMA_BN_ADD_RELU : 0,
             55 + t, 0.0);
  /* and runs of 4 and 9 values from enough samples (wide_cf_runs): 692 and 1557 columns */
  for (int t = 0; t < 4; t++)
    det_case(t < 2 ? 64 : 48, 173, t < 2 ? 4 : 9, NORMA_CHANNELS_FIRST, (norma_dtype)t,
             t == 2 ? NORMA_BN_RELU : 0, 59 + t, 0.0);
  /* runs of 8 from 16 samples (both directions' second bounds): 1384 columns */
  for (int t = 0; t < 4; t++)
    det_case(16, 173, 8, NORMA_CHANNELS_FIRST, (norma_dtype)t, t == 3 ? NORMA_BN_ADD_RELU : 0,
             63 + t, 0.0);
  /* few rows of many channels: inference in units of channels, one per thread */
  for (int t = 0; t < 4; t++)
    det_case(16, 9000, 1, NORMA_CHANNELS_LAST, (norma_dtype)t, 0, 77 + t, 0.0);
  /* tensors beyond NORM_CACHED_BYTES whose 1024-row segments two threads would share
     unevenly, in equal segments (norm_cl_seg_len in engine.h): f32 16x1344x14x14 (3136 rows,
     four segments of 784), bf16 16x2048x19x19 (5776 rows, eight of 724) */
  if (!quick) {
    det_case(16, 1344, 196, NORMA_CHANNELS_LAST, NORMA_F32, 0, 31, 0.0);
    det_case(16, 2048, 361, NORMA_CHANNELS_LAST, NORMA_BF16, NORMA_BN_RELU, 32, 0.0);
    /* and beyond NORM_SEQ_BYTES (50 MB): the backward's sums of rows of 720 channels a row
       at a time in address order, and its apply too (BN_ROWS_ONE, rows of up to 896 f32
       channels); 20 segments of 868 rows, whose channels 6 and 8 threads split (a block a
       thread) */
    det_more_threads = 1;
    det_case(12, 720, 1444, NORMA_CHANNELS_LAST, NORMA_F32, 0, 33, 0.0);
    /* rows of 256 channels a row at a time too: 33 segments of 1024 rows (34.6 MB), whose
       channels 8 threads split in two blocks of 128 (split_cblock in engine.c) */
    det_case(33, 256, 1024, NORMA_CHANNELS_LAST, NORMA_F32, NORMA_BN_RELU, 36, 0.0);
    /* and of 64 (AVX-512: one strip, its sums in registers): 132 segments (34.6 MB) */
    det_case(33, 64, 4096, NORMA_CHANNELS_LAST, NORMA_F32, NORMA_BN_ADD_RELU, 37, 0.0);
    det_more_threads = 0;
    /* channels-first runs of 144 f32 values that stream (4.9 MB): two samples a segment in
       the reductions (cf_spr_sums), three in the apply, an odd sample last */
    det_case(33, 256, 144, NORMA_CHANNELS_FIRST, NORMA_F32, 0, 34, 0.0);
    det_case(33, 256, 144, NORMA_CHANNELS_FIRST, NORMA_F32, NORMA_BN_ADD_RELU, 35, 0.0);
  }
  test_concurrent();
  static const char *opn[3] = {"forward_training", "forward_inference", "backward"};
  for (int op = 0; op < 3; op++) {
    printf("test_determinism: %s: %d cases on >= 2 threads; schedules: %d split, %d fused\n",
           opn[op], multi[op], sched[op][0], sched[op][1]);
    TU_CHECK(multi[op] > 0, "%s never ran on more than one thread: the test proves nothing",
             opn[op]);
  }
  return tu_finish("test_determinism");
}
