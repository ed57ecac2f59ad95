/* test_concurrency.c - many threads call the API while other threads change the thread count
 * (norma_set_num_threads) and read the settings.  Every result must equal, bit for bit, the
 * result of the same call made first with one thread (results do not depend on the thread
 * count, and a call reads the count once).  Shapes are large enough for the OpenMP split
 * (more than the library's serial threshold), both layouts, f32 and bf16, the training forward,
 * the backward, inference and the split API's moments.
 *
 * Run by ctest in every build, also under ASan/UBSan; it has no timing assertion.
 */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "test_util.h"

enum { CALLERS = 4, SETTERS = 2 };

typedef struct shape {
  int64_t n, c, s;
  norma_layout lay;
  norma_dtype dt;
  unsigned flags;
} shape;

static const shape SHAPES[] = {
    {4, 16, 4096, NORMA_CHANNELS_FIRST, NORMA_F32, 0},
    {8, 64, 400, NORMA_CHANNELS_LAST, NORMA_F32, NORMA_BN_RELU},
    {2, 24, 6000, NORMA_CHANNELS_LAST, NORMA_BF16, 0},
    {16, 40, 256, NORMA_CHANNELS_FIRST, NORMA_BF16, NORMA_BN_RELU},
};
enum { NSHAPES = sizeof SHAPES / sizeof SHAPES[0] };

/* inputs and the one-thread results of every shape */
typedef struct expected {
  size_t tb, pb;
  void *x, *dy, *gamma, *beta;
  void *y, *sm, *sis, *rm, *rv; /* training forward (running stats start at rm0/rv0) */
  void *dx, *dg, *db;           /* backward */
  void *yi;                     /* inference with the running statistics */
  int64_t *cnt;
  double *mean, *m2;            /* moments */
  void *rm0, *rv0;
} expected;
static expected E[NSHAPES];

static norma_bn_desc desc_of(const shape *s) {
  norma_bn_desc d = {s->n, s->c, s->s, s->lay, s->dt, 1e-5, s->flags};
  return d;
}

/* All four calls on buffers of the caller; returns the first failing status. */
static norma_status run_all(const shape *s, const expected *e, void *y, void *sm, void *sis,
                            void *rm, void *rv, void *dx, void *dg, void *db, void *yi,
                            int64_t *cnt, double *mean, double *m2) {
  norma_bn_desc d = desc_of(s);
  memcpy(rm, e->rm0, e->pb);
  memcpy(rv, e->rv0, e->pb);
  norma_status st = norma_bn_forward_training(&d, e->x, NULL, e->gamma, e->beta, y, sm, sis, rm,
                                              rv, 0.1);
  if (st) return st;
  st = norma_bn_backward(&d, e->x, y, e->dy, e->gamma, e->beta, sm, sis, dx, NULL, dg, db);
  if (st) return st;
  st = norma_bn_forward_inference(&d, e->x, NULL, e->gamma, e->beta, rm, rv, yi);
  if (st) return st;
  return norma_bn_moments(&d, e->x, cnt, mean, m2);
}

static atomic_int g_stop;
static atomic_long g_calls, g_mismatch, g_errors, g_sets;

static void *caller(void *arg) {
  const int id = (int)(intptr_t)arg;
  const int rounds = tu_quick() ? 10 : 60;
  for (int r = 0; r < rounds; r++) {
    const int k = (id + r) % NSHAPES;
    const shape *s = &SHAPES[k];
    const expected *e = &E[k];
    void *y = tu_poisoned(e->tb), *dx = tu_poisoned(e->tb), *yi = tu_poisoned(e->tb);
    void *sm = tu_poisoned(e->pb), *sis = tu_poisoned(e->pb), *rm = tu_alloc(e->pb);
    void *rv = tu_alloc(e->pb), *dg = tu_poisoned(e->pb), *db = tu_poisoned(e->pb);
    int64_t *cnt = tu_alloc((size_t)s->c * 8);
    double *mean = tu_alloc((size_t)s->c * 8), *m2 = tu_alloc((size_t)s->c * 8);
    norma_status st = run_all(s, e, y, sm, sis, rm, rv, dx, dg, db, yi, cnt, mean, m2);
    atomic_fetch_add(&g_calls, 4);
    if (st != NORMA_OK) {
      atomic_fetch_add(&g_errors, 1);
    } else {
      const size_t c8 = (size_t)s->c * 8;
      int same = !memcmp(y, e->y, e->tb) && !memcmp(dx, e->dx, e->tb) &&
                 !memcmp(yi, e->yi, e->tb) && !memcmp(sm, e->sm, e->pb) &&
                 !memcmp(sis, e->sis, e->pb) && !memcmp(rm, e->rm, e->pb) &&
                 !memcmp(rv, e->rv, e->pb) && !memcmp(dg, e->dg, e->pb) &&
                 !memcmp(db, e->db, e->pb) && !memcmp(cnt, e->cnt, c8) &&
                 !memcmp(mean, e->mean, c8) && !memcmp(m2, e->m2, c8);
      if (!same) atomic_fetch_add(&g_mismatch, 1);
    }
    free(y), free(dx), free(yi), free(sm), free(sis), free(rm), free(rv), free(dg), free(db);
    free(cnt), free(mean), free(m2);
  }
  return NULL;
}

static void *setter(void *arg) {
  tu_rng r = tu_rng_make(1000 + (uint64_t)(intptr_t)arg);
  while (!atomic_load(&g_stop)) {
    int n = (int)tu_below(&r, 5); /* 0 (library default) .. 4 */
    norma_set_num_threads(n);
    int got = norma_get_num_threads();
    /* another setter may have changed it in between: any value it may set is fine */
    if (!(got >= 1)) atomic_fetch_add(&g_errors, 1);
    (void)norma_get_isa();
    (void)norma_get_use_reference();
    atomic_fetch_add(&g_sets, 1);
    struct timespec ts = {0, 200000}; /* 0.2 ms: many changes during each call */
    nanosleep(&ts, NULL);
  }
  return NULL;
}

int main(void) {
  /* one-thread results */
  norma_set_num_threads(1);
  for (int k = 0; k < NSHAPES; k++) {
    const shape *s = &SHAPES[k];
    expected *e = &E[k];
    const int64_t total = s->n * s->c * s->s;
    e->tb = (size_t)total * tu_esize(s->dt);
    e->pb = (size_t)s->c * tu_psize(s->dt);
    tu_rng r = tu_rng_make(31 + (uint64_t)k);
    e->x = tu_alloc(e->tb), e->dy = tu_alloc(e->tb);
    tu_fill_uniform(s->dt, e->x, total, &r, -3, 5);
    tu_fill_uniform(s->dt, e->dy, total, &r, -1, 1);
    e->gamma = tu_alloc(e->pb), e->beta = tu_alloc(e->pb);
    tu_fill_param(s->dt, e->gamma, s->c, &r, 0.5, 1.5);
    tu_fill_param(s->dt, e->beta, s->c, &r, -0.5, 0.5);
    e->rm0 = tu_alloc(e->pb), e->rv0 = tu_alloc(e->pb);
    tu_fill_param(s->dt, e->rm0, s->c, &r, -0.1, 0.1);
    tu_fill_param(s->dt, e->rv0, s->c, &r, 0.9, 1.1);
    e->y = tu_alloc(e->tb), e->dx = tu_alloc(e->tb), e->yi = tu_alloc(e->tb);
    e->sm = tu_alloc(e->pb), e->sis = tu_alloc(e->pb), e->rm = tu_alloc(e->pb);
    e->rv = tu_alloc(e->pb), e->dg = tu_alloc(e->pb), e->db = tu_alloc(e->pb);
    e->cnt = tu_alloc((size_t)s->c * 8);
    e->mean = tu_alloc((size_t)s->c * 8), e->m2 = tu_alloc((size_t)s->c * 8);
    norma_status st = run_all(s, e, e->y, e->sm, e->sis, e->rm, e->rv, e->dx, e->dg, e->db,
                              e->yi, e->cnt, e->mean, e->m2);
    TU_CHECK(st == NORMA_OK, "one-thread run of shape %d: %s", k, norma_last_error());
    /* the same with 3 threads, before any concurrency: the determinism this test relies on */
    norma_set_num_threads(3);
    void *y3 = tu_alloc(e->tb), *sm = tu_alloc(e->pb), *sis = tu_alloc(e->pb);
    void *rm = tu_alloc(e->pb), *rv = tu_alloc(e->pb), *dx = tu_alloc(e->tb);
    void *dg = tu_alloc(e->pb), *db = tu_alloc(e->pb), *yi = tu_alloc(e->tb);
    int64_t *cnt = tu_alloc((size_t)s->c * 8);
    double *mean = tu_alloc((size_t)s->c * 8), *m2 = tu_alloc((size_t)s->c * 8);
    st = run_all(s, e, y3, sm, sis, rm, rv, dx, dg, db, yi, cnt, mean, m2);
    TU_CHECK(st == NORMA_OK && !memcmp(y3, e->y, e->tb) && !memcmp(dx, e->dx, e->tb),
             "shape %d: 3 threads differ from 1 before any concurrency", k);
    norma_bn_plan plan;
    norma_bn_desc d = desc_of(s);
    TU_CHECK(norma_bn_query_plan(&d, NORMA_BN_OP_FORWARD_TRAINING, &plan) == NORMA_OK &&
                 plan.threads == 3,
             "shape %d is meant to run threaded (plan.threads %d)", k, plan.threads);
    free(y3), free(sm), free(sis), free(rm), free(rv), free(dx), free(dg), free(db), free(yi);
    free(cnt), free(mean), free(m2);
    norma_set_num_threads(1);
  }

  pthread_t setters[SETTERS], callers[CALLERS];
  for (int i = 0; i < SETTERS; i++) pthread_create(&setters[i], NULL, setter, (void *)(intptr_t)i);
  for (int i = 0; i < CALLERS; i++) pthread_create(&callers[i], NULL, caller, (void *)(intptr_t)i);
  for (int i = 0; i < CALLERS; i++) pthread_join(callers[i], NULL);
  atomic_store(&g_stop, 1);
  for (int i = 0; i < SETTERS; i++) pthread_join(setters[i], NULL);

  long calls = atomic_load(&g_calls), sets = atomic_load(&g_sets);
  TU_CHECK(atomic_load(&g_errors) == 0, "%ld calls failed", atomic_load(&g_errors));
  TU_CHECK(atomic_load(&g_mismatch) == 0, "%ld of %ld call groups differ from one thread",
           atomic_load(&g_mismatch), calls / 4);
  TU_CHECK(sets > 0, "the setters never ran");
  printf("test_concurrency: %ld calls on %d threads, %ld thread-count changes\n", calls, CALLERS,
         sets);
  norma_set_num_threads(0);
  for (int k = 0; k < NSHAPES; k++) {
    expected *e = &E[k];
    void *ps[] = {e->x, e->dy, e->gamma, e->beta, e->y, e->sm, e->sis, e->rm, e->rv, e->dx,
                  e->dg, e->db, e->yi, e->cnt, e->mean, e->m2, e->rm0, e->rv0};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) free(ps[i]);
  }
  return tu_finish("test_concurrency");
}
