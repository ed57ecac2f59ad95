/* test_syncbn_faults.c - MPI failures give NORMA_ERR_COMMUNICATION, never an abort, and write
   nothing.

   A collective that fails on demand: this program defines MPI_Allgather and MPI_Allreduce
   itself (the MPI profiling interface: the library's calls resolve to these, which call the
   real PMPI_ functions).  When a failure is armed, the wrapper lets the real collective
   complete (so that no rank is left waiting), then raises MPI_ERR_OTHER on the communicator
   through its error handler, as MPI does for a real failure, and returns it.  Had libnorma_mpi
   left the default MPI_ERRORS_ARE_FATAL on the communicator it uses, the job would abort here.

   Also: calls before MPI_Init and after MPI_Finalize return NORMA_ERR_COMMUNICATION; the
   caller's communicator keeps its own error handler.

   Counts are summed over the ranks before MPI_Finalize (rank 0 prints them); the checks after
   MPI_Finalize are printed by each rank; every rank exits non-zero on any failure. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../c/test_util.h"
#include "norma_mpi.h"

static int g_rank, g_size;

/* -1: no failure; -2: fail on every rank; r >= 0: fail on rank r only */
static int g_fail_on = -1;
static int g_calls;    /* collectives that went through the wrappers */

static int inject(MPI_Comm comm, int rc) {
  g_calls++;
  if (rc != MPI_SUCCESS || g_fail_on == -1) return rc;
  if (g_fail_on != -2 && g_fail_on != g_rank) return rc;
  MPI_Comm_call_errhandler(comm, MPI_ERR_OTHER); /* aborts unless errors are returned */
  return MPI_ERR_OTHER;
}

int MPI_Allgather(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
                  int recvcount, MPI_Datatype recvtype, MPI_Comm comm) {
  return inject(comm, PMPI_Allgather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype,
                                     comm));
}

int MPI_Allreduce(const void *sendbuf, void *recvbuf, int count, MPI_Datatype datatype, MPI_Op op,
                  MPI_Comm comm) {
  return inject(comm, PMPI_Allreduce(sendbuf, recvbuf, count, datatype, op, comm));
}

enum { C = 5, S = 4, NL = 3 };

/* One forward and one backward with a failure armed on `fail_on`; checks what each rank must
   see: COMMUNICATION and nothing written where MPI failed, success elsewhere. */
static void armed(const char *mode, int fail_on) {
  tu_set_ctx("rank %d/%d %s fail_on %d", g_rank, g_size, mode, fail_on);
  setenv("NORMA_MPI_EXCHANGE", mode, 1);
  const int64_t total = (int64_t)NL * C * S;
  float x[NL * C * S], y[NL * C * S], dx[NL * C * S];
  tu_rng rng = tu_rng_make(5 + (uint64_t)g_rank);
  tu_fill_uniform(NORMA_F32, x, total, &rng, -2, 2);
  float sm[C], sis[C], rm[C] = {0}, rv[C] = {1, 1, 1, 1, 1}, dg[C], db[C];
  tu_poison(y, sizeof y);
  tu_poison(sm, sizeof sm);
  tu_poison(sis, sizeof sis);
  norma_bn_desc d = {NL, C, S, NORMA_CHANNELS_FIRST, NORMA_F32, 1e-5, NORMA_BN_RELU};
  const int fails_here = fail_on == -2 || fail_on == g_rank;

  int calls0 = g_calls;
  g_fail_on = fail_on;
  norma_status st = norma_bn_forward_training_mpi(MPI_COMM_WORLD, &d, x, NULL, NULL, NULL, y, sm,
                                                  sis, rm, rv, 0.1);
  g_fail_on = -1;
  TU_CHECK(g_calls - calls0 == 1, "[%s] forward made %d collective calls, expected 1", tu_ctx,
           g_calls - calls0);
  if (fails_here) {
    TU_CHECK(st == NORMA_ERR_COMMUNICATION, "[%s] forward: %s (%s)", tu_ctx,
             norma_status_string(st), norma_mpi_last_error());
    const char *msg = norma_mpi_last_error();
    TU_CHECK(strstr(msg, "norma_bn_forward_training_mpi") && strstr(msg, strcmp(mode, "allgather") ? "MPI_Allreduce" : "MPI_Allgather"),
             "[%s] message: %s", tu_ctx, msg);
    tu_check_poison("y", y, sizeof y);
    tu_check_poison("save_mean", sm, sizeof sm);
    tu_check_poison("save_invstd", sis, sizeof sis);
    TU_CHECK(rm[0] == 0 && rv[0] == 1, "[%s] running statistics written", tu_ctx);
  } else {
    /* a failure is local to the ranks where MPI reports it: one collective cannot also agree
       on its own success; see docs/distributed.md */
    TU_CHECK(st == NORMA_OK, "[%s] forward on a healthy rank: %s (%s)", tu_ctx,
             norma_status_string(st), norma_mpi_last_error());
  }

  /* backward, from statistics every rank has (the forward may have failed here) */
  float fm[C] = {0}, fis[C] = {1, 1, 1, 1, 1}, dy[NL * C * S];
  tu_fill_uniform(NORMA_F32, dy, total, &rng, -1, 1);
  float yy[NL * C * S];
  for (int64_t i = 0; i < total; i++) yy[i] = x[i] > 0 ? x[i] : 0;
  tu_poison(dx, sizeof dx);
  tu_poison(dg, sizeof dg);
  tu_poison(db, sizeof db);
  calls0 = g_calls;
  g_fail_on = fail_on;
  st = norma_bn_backward_mpi(MPI_COMM_WORLD, &d, x, yy, dy, NULL, NULL, fm, fis, dx, NULL, dg, db);
  g_fail_on = -1;
  TU_CHECK(g_calls - calls0 == 1, "[%s] backward made %d collective calls, expected 1", tu_ctx,
           g_calls - calls0);
  if (fails_here) {
    TU_CHECK(st == NORMA_ERR_COMMUNICATION, "[%s] backward: %s (%s)", tu_ctx,
             norma_status_string(st), norma_mpi_last_error());
    tu_check_poison("dx", dx, sizeof dx);
    tu_check_poison("dgamma", dg, sizeof dg);
    tu_check_poison("dbeta", db, sizeof db);
  } else {
    TU_CHECK(st == NORMA_OK, "[%s] backward on a healthy rank: %s (%s)", tu_ctx,
             norma_status_string(st), norma_mpi_last_error());
  }
  unsetenv("NORMA_MPI_EXCHANGE");
}

static void outside_mpi(const char *when) {
  tu_set_ctx("rank %d %s", g_rank, when);
  norma_bn_desc d = {2, 2, 2, NORMA_CHANNELS_FIRST, NORMA_F32, 1e-5, 0};
  float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8];
  tu_poison(y, sizeof y);
  norma_status st = norma_bn_forward_training_mpi(MPI_COMM_WORLD, &d, x, NULL, NULL, NULL, y, NULL,
                                                  NULL, NULL, NULL, 0.1);
  TU_CHECK(st == NORMA_ERR_COMMUNICATION && strstr(norma_mpi_last_error(), when),
           "[%s] forward: %s (%s)", tu_ctx, norma_status_string(st), norma_mpi_last_error());
  tu_check_poison("y", y, sizeof y);
  float sm[2] = {0, 0}, sis[2] = {1, 1}, dx[8];
  st = norma_bn_backward_mpi(MPI_COMM_WORLD, &d, x, NULL, x, NULL, NULL, sm, sis, dx, NULL, NULL,
                             NULL);
  TU_CHECK(st == NORMA_ERR_COMMUNICATION, "[%s] backward: %s (%s)", tu_ctx,
           norma_status_string(st), norma_mpi_last_error());
}

int main(int argc, char **argv) {
  outside_mpi("not initialized");
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  norma_set_num_threads(1);

  static const char *modes[] = {"allgather", "allreduce"};
  for (int mi = 0; mi < 2; mi++) {
    armed(modes[mi], -1);          /* no failure: it works, one collective per call */
    armed(modes[mi], -2);          /* every rank */
    armed(modes[mi], g_size - 1);  /* the last rank only */
    armed(modes[mi], -1);          /* and then it works again */
  }

  /* the caller's communicator keeps its error handler */
  tu_set_ctx("rank %d errhandler", g_rank);
  MPI_Errhandler eh;
  MPI_Comm_get_errhandler(MPI_COMM_WORLD, &eh);
  TU_CHECK(eh == MPI_ERRORS_ARE_FATAL, "[%s] MPI_COMM_WORLD's error handler was changed", tu_ctx);
  MPI_Errhandler_free(&eh);

  long counts[2] = {tu_passed, tu_failed}, sums[2];
  MPI_Allreduce(counts, sums, 2, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (g_rank == 0) {
    printf("test_syncbn_faults (%d ranks): %ld passed, %ld failed\n", g_size, sums[0], sums[1]);
    fflush(stdout);
  }
  MPI_Finalize();

  long before = tu_failed;
  tu_passed = tu_failed = 0;
  outside_mpi("already finalized");
  if (tu_failed)
    printf("test_syncbn_faults rank %d after MPI_Finalize: %ld passed, %ld failed\n", g_rank,
           tu_passed, tu_failed);
  return (sums[1] || tu_failed || before) ? 1 : 0;
}
