/* test_mpi_failures.c - SyncBatchNorm when the ranks disagree or fail (issue 12, item 1).
 *
 * Every case runs the forward and the backward on MPI_COMM_WORLD with one rank (the last, or
 * rank 0) doing something different: another C (also one past the first message's channels),
 * dtype, layout, flags or eps; an invalid argument; d == NULL; c = 0; n = 0 (valid); every rank
 * empty.  After each call the ranks all-gather their statuses and check that
 *  - every rank returned a valid norma_status,
 *  - all returned the same one, the expected one,
 *  - on error nothing was written (poisoned outputs, running statistics unchanged),
 *  - on success the per-channel results are bitwise identical on every rank (and, for the
 *    two-message case c > 512, equal to the statistics of the whole batch).
 * A hang fails the test: alarm() here, and the ctest TIMEOUT.  Run with 2, 3 and 4 ranks.
 */
#define _POSIX_C_SOURCE 200809L /* setenv, alarm */
#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include "../c/test_util.h"
#include "norma_mpi.h"

static int g_rank, g_size;

typedef enum {
  M_NONE,        /* every rank the same: OK */
  M_C,           /* the odd rank has 2c channels */
  M_C_BIG,       /* the odd rank has 600 channels (past the first message) */
  M_DTYPE,       /* F64 instead of F32 */
  M_DTYPE_16,    /* BF16 instead of F16 (same parameter type) */
  M_LAYOUT,      /* channels-last instead of channels-first */
  M_FLAGS,       /* NORMA_BN_RELU */
  M_FLAGS_CHECK, /* NORMA_CHECK_FINITE only */
  M_EPS,         /* eps 1e-3 */
  M_X_NULL,      /* an invalid argument: x (forward) / dy (backward) NULL with n > 0 */
  M_D_NULL,      /* d == NULL */
  M_C_ZERO,      /* d->c == 0 */
  M_EMPTY_ONE,   /* n == 0 on the odd rank: valid */
  M_EMPTY_ALL,   /* n == 0 everywhere */
  M_COUNT
} mode;

static const char *mode_name[M_COUNT] = {"none", "c", "c-big", "dtype", "dtype-16", "layout",
                                         "flags", "flags-check", "eps", "x-null", "d-null",
                                         "c-zero", "empty-one", "empty-all"};

/* Which rank differs: the last one, or rank 0 (every other case), so that both the lowest and
   a later rank are exercised. */
static int odd_rank(int m) { return m % 2 ? g_size - 1 : 0; }

typedef struct layer {
  norma_bn_desc d;
  int64_t total;
  size_t tb, pb;
  void *x, *y, *dy, *dx, *sm, *sis, *rm, *rv, *dg, *db, *gamma;
} layer;

static void layer_make(layer *L, int64_t n, int64_t c, int64_t s, norma_layout lay,
                       norma_dtype dt, double eps, unsigned flags, uint64_t seed) {
  norma_bn_desc d = {n, c, s, lay, dt, eps, flags};
  L->d = d;
  L->total = n * c * s;
  L->tb = (size_t)L->total * tu_esize(dt) + 8;
  L->pb = (size_t)(c > 0 ? c : 1) * tu_psize(dt);
  tu_rng r = tu_rng_make(seed), same = tu_rng_make(42); /* data per rank, parameters shared */
  L->x = tu_alloc(L->tb), L->dy = tu_alloc(L->tb), L->gamma = tu_alloc(L->pb);
  tu_fill_uniform(dt, L->x, L->total, &r, -2, 3);
  tu_fill_uniform(dt, L->dy, L->total, &r, -1, 1);
  if (c > 0) tu_fill_param(dt, L->gamma, c, &same, 0.5, 1.5);
  L->y = tu_poisoned(L->tb), L->dx = tu_poisoned(L->tb);
  L->sm = tu_poisoned(L->pb), L->sis = tu_poisoned(L->pb);
  L->dg = tu_poisoned(L->pb), L->db = tu_poisoned(L->pb);
  L->rm = tu_alloc(L->pb), L->rv = tu_alloc(L->pb);
  if (c > 0) {
    tu_fill_param(dt, L->rm, c, &same, -0.1, 0.1);
    tu_fill_param(dt, L->rv, c, &same, 0.9, 1.1);
  }
}

static void layer_free(layer *L) {
  void *p[] = {L->x, L->y, L->dy, L->dx, L->sm, L->sis, L->rm, L->rv, L->dg, L->db, L->gamma};
  for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
}

/* Every rank's status; checks they are valid, equal and as expected.  Returns the status. */
static norma_status agree(const char *what, norma_status st, norma_status want) {
  int mine = (int)st, all[64];
  MPI_Allgather(&mine, 1, MPI_INT, all, 1, MPI_INT, MPI_COMM_WORLD);
  int same = 1, valid = 1;
  for (int r = 0; r < g_size; r++) {
    same &= all[r] == all[0];
    valid &= all[r] >= NORMA_OK && all[r] <= NORMA_ERR_COMMUNICATION;
  }
  TU_CHECK(valid, "[%s] %s: a rank returned %d, not a norma_status", tu_ctx, what,
           all[0] == mine ? all[g_size - 1] : all[0]);
  TU_CHECK(same, "[%s] %s: ranks disagree (rank 0 %s, this rank %s)", tu_ctx, what,
           norma_status_string((norma_status)all[0]), norma_status_string(st));
  TU_CHECK(st == want, "[%s] %s: got %s, expected %s (%s)", tu_ctx, what,
           norma_status_string(st), norma_status_string(want), norma_mpi_last_error());
  return st;
}

/* Bitwise identity of a per-channel array across ranks (ranks with another c skip). */
static void same_on_every_rank(const char *what, const void *p, size_t bytes) {
  unsigned char *all = tu_alloc(bytes * (size_t)g_size);
  MPI_Allgather(p, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, MPI_COMM_WORLD);
  int same = 1;
  for (int r = 1; r < g_size; r++) same &= !memcmp(all, all + (size_t)r * bytes, bytes);
  TU_CHECK(same, "[%s] %s differs between ranks", tu_ctx, what);
  free(all);
}

static void run_mode(int m, const char *exchange) {
  setenv("NORMA_MPI_EXCHANGE", exchange, 1);
  const int me = g_rank == odd_rank(m);
  tu_set_ctx("%d ranks, rank %d, %s, case %s%s", g_size, g_rank, exchange, mode_name[m],
             me ? " (the odd rank)" : "");
  int64_t n = 3, c = 6, s = 5;
  norma_layout lay = NORMA_CHANNELS_FIRST;
  norma_dtype dt = m == M_DTYPE_16 ? NORMA_F16 : NORMA_F32;
  double eps = 1e-5;
  unsigned flags = 0;
  if (me) {
    switch (m) {
      case M_C: c = 2 * c; break;
      case M_C_BIG: c = 600; break;
      case M_DTYPE: dt = NORMA_F64; break;
      case M_DTYPE_16: dt = NORMA_BF16; break;
      case M_LAYOUT: lay = NORMA_CHANNELS_LAST; break;
      case M_FLAGS: flags = NORMA_BN_RELU; break;
      case M_FLAGS_CHECK: flags = NORMA_CHECK_FINITE; break;
      case M_EPS: eps = 1e-3; break;
      case M_C_ZERO: c = 0; break;
      case M_EMPTY_ONE: n = 0; break;
      default: break;
    }
  }
  if (m == M_EMPTY_ALL) n = 0;
  layer L;
  layer_make(&L, n, c, s, lay, dt, eps, flags, 100 + (uint64_t)g_rank);
  void *rm0 = tu_dup(L.rm, L.pb), *rv0 = tu_dup(L.rv, L.pb);
  const norma_bn_desc *dp = (m == M_D_NULL && me) ? NULL : &L.d;
  const void *xp = (m == M_X_NULL && me) ? NULL : L.x;

  /* forward */
  norma_status want = NORMA_ERR_INVALID_ARGUMENT;
  if (m == M_NONE || m == M_EMPTY_ONE) want = NORMA_OK;
  norma_status st = norma_bn_forward_training_mpi(MPI_COMM_WORLD, dp, xp, NULL, L.gamma, NULL,
                                                  L.y, L.sm, L.sis, L.rm, L.rv, 0.1);
  st = agree("forward", st, want);
  if (st != NORMA_OK) {
    tu_check_poison("y", L.y, L.tb);
    tu_check_poison("save_mean", L.sm, L.pb);
    tu_check_poison("save_invstd", L.sis, L.pb);
    TU_CHECK(!memcmp(L.rm, rm0, L.pb) && !memcmp(L.rv, rv0, L.pb),
             "[%s] running statistics written on error", tu_ctx);
    if (m != M_X_NULL && m != M_D_NULL && m != M_C_ZERO && m != M_EMPTY_ALL)
      TU_CHECK(strstr(norma_mpi_last_error(), "differs") != NULL, "[%s] message: %s", tu_ctx,
               norma_mpi_last_error());
  } else {
    same_on_every_rank("save_mean", L.sm, L.pb);
    same_on_every_rank("save_invstd", L.sis, L.pb);
    same_on_every_rank("running_var", L.rv, L.pb);
  }

  /* backward, with the statistics of the forward where it succeeded (else made up) */
  if (st != NORMA_OK && L.d.c > 0) {
    tu_rng r = tu_rng_make(7);
    tu_fill_param(dt, L.sm, L.d.c, &r, -0.1, 0.1);
    tu_fill_param(dt, L.sis, L.d.c, &r, 0.5, 1.5);
  }
  tu_poison(L.dx, L.tb);
  const void *dyp = (m == M_X_NULL && me) ? NULL : L.dy;
  want = (m == M_NONE || m == M_EMPTY_ONE) ? NORMA_OK : NORMA_ERR_INVALID_ARGUMENT;
  st = norma_bn_backward_mpi(MPI_COMM_WORLD, dp, L.x, L.y, dyp, L.gamma, NULL, L.sm, L.sis, L.dx,
                             NULL, L.dg, L.db);
  st = agree("backward", st, want);
  if (st != NORMA_OK) {
    tu_check_poison("dx", L.dx, L.tb);
    tu_check_poison("dgamma", L.dg, L.pb);
    tu_check_poison("dbeta", L.db, L.pb);
  } else {
    same_on_every_rank("dgamma", L.dg, L.pb);
    same_on_every_rank("dbeta", L.db, L.pb);
  }
  /* frozen statistics with every rank empty: valid (dgamma = dbeta = 0) */
  if (m == M_EMPTY_ALL) {
    L.d.flags = NORMA_BN_GLOBAL_STATS;
    st = norma_bn_backward_mpi(MPI_COMM_WORLD, &L.d, NULL, NULL, NULL, L.gamma, NULL, L.sm,
                               L.sis, NULL, NULL, L.dg, L.db);
    agree("backward, GLOBAL_STATS, every rank empty", st, NORMA_OK);
    TU_CHECK(tu_load(tu_ptype(dt), L.db, 0) == 0.0, "[%s] dbeta %g", tu_ctx,
             tu_load(tu_ptype(dt), L.db, 0));
  }
  free(rm0), free(rv0);
  layer_free(&L);
}

/* c = 1000 on every rank: two messages (512 channels in the first).  The statistics equal
   those of the whole batch, computed here in double from every rank's data. */
static void two_segments(const char *exchange) {
  setenv("NORMA_MPI_EXCHANGE", exchange, 1);
  tu_set_ctx("%d ranks, rank %d, %s, c = 1000", g_size, g_rank, exchange);
  const int64_t n = 2, c = 1000, s = 3;
  layer L[4];
  for (int r = 0; r < g_size && r < 4; r++)
    layer_make(&L[r], n, c, s, NORMA_CHANNELS_LAST, NORMA_F32, 1e-5, 0, 500 + (uint64_t)r);
  layer *me = &L[g_rank];
  norma_status st = norma_bn_forward_training_mpi(MPI_COMM_WORLD, &me->d, me->x, NULL, NULL,
                                                  NULL, me->y, me->sm, me->sis, NULL, NULL, 0);
  agree("forward c = 1000", st, NORMA_OK);
  same_on_every_rank("save_mean", me->sm, me->pb);
  int bad = 0;
  for (int64_t ch = 0; ch < c; ch++) {
    double sum = 0, cnt = 0;
    for (int r = 0; r < g_size; r++)
      for (int64_t i = 0; i < n * s; i++) sum += ((const float *)L[r].x)[i * c + ch], cnt++;
    const double want = sum / cnt, got = ((const float *)me->sm)[ch];
    bad += fabs(got - want) > 1e-5 * (1 + fabs(want));
  }
  TU_CHECK(bad == 0, "[%s] %d channels' save_mean differ from the whole batch's mean", tu_ctx, bad);
  st = norma_bn_backward_mpi(MPI_COMM_WORLD, &me->d, me->x, NULL, me->dy, NULL, NULL, me->sm,
                             me->sis, me->dx, NULL, me->dg, me->db);
  agree("backward c = 1000", st, NORMA_OK);
  same_on_every_rank("dbeta", me->db, me->pb);
  bad = 0;
  for (int64_t ch = 0; ch < c; ch++) {
    double sum = 0;
    for (int r = 0; r < g_size; r++)
      for (int64_t i = 0; i < n * s; i++) sum += ((const float *)L[r].dy)[i * c + ch];
    bad += fabs(((const float *)me->db)[ch] - sum) > 1e-4 * (1 + fabs(sum));
  }
  TU_CHECK(bad == 0, "[%s] %d channels' dbeta differ from the sum of dy", tu_ctx, bad);
  for (int r = 0; r < g_size && r < 4; r++) layer_free(&L[r]);
}

static void on_alarm(int sig) {
  (void)sig;
  static const char msg[] = "test_mpi_failures: timed out (a rank hangs)\n";
  if (write(2, msg, sizeof msg - 1) < 0) _exit(3);
  _exit(3);
}

int main(int argc, char **argv) {
  signal(SIGALRM, on_alarm);
  alarm(90);
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  norma_set_num_threads(1);
  if (g_size < 2 || g_size > 4) {
    if (g_rank == 0) fprintf(stderr, "test_mpi_failures: run with 2 to 4 ranks\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  static const char *modes[] = {"allgather", "allreduce"};
  for (int e = 0; e < 2; e++) {
    for (int m = 0; m < M_COUNT; m++) run_mode(m, modes[e]);
    two_segments(modes[e]);
  }
  unsetenv("NORMA_MPI_EXCHANGE");
  long counts[2] = {tu_passed, tu_failed}, sums[2];
  MPI_Allreduce(counts, sums, 2, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (g_rank == 0) {
    printf("test_mpi_failures (%d ranks): %ld passed, %ld failed\n", g_size, sums[0], sums[1]);
    fflush(stdout);
  }
  MPI_Finalize();
  return sums[1] ? 1 : 0;
}
