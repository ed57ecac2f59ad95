/* fuzz_mpi_common.h - what the libnorma_mpi targets add to fuzz_common.h: MPI initialized
   once (a singleton: no mpirun), finalized at exit; the communicator (MPI_COMM_SELF, or
   MPI_COMM_NULL) and the exchange (NORMA_MPI_EXCHANGE) from the bytes. */
#ifndef NORMA_FUZZ_MPI_COMMON_H
#define NORMA_FUZZ_MPI_COMMON_H

#define _POSIX_C_SOURCE 200809L /* setenv */
#include <mpi.h>
#include <stdlib.h>

#include "fuzz_common.h"
#include "norma_mpi.h"

/* the largest c libnorma_mpi's second message can carry (norma_mpi.h: "d->c out of range") */
#define FZ_MPI_MAX_C ((2147483647LL - 72) / 24)

static void fz_mpi_finalize(void) {
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) MPI_Finalize();
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  int provided;
  MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
  atexit(fz_mpi_finalize);
  return 0;
}

/* Returns the communicator; *bad_comm when it is MPI_COMM_NULL, *bad_env for an unknown
   NORMA_MPI_EXCHANGE. */
static FZ_UNUSED MPI_Comm fz_mpi_setup(fz *r, int *bad_comm, int *bad_env) {
  const unsigned v = fz_u8(r);
  static const char *const modes[] = {"auto", "allgather", "allreduce", "bogus"};
  const unsigned m = v % 4 == 3 && (v & 0x30) != 0x30 ? 0 : v % 4; /* "bogus" rarely */
  setenv("NORMA_MPI_EXCHANGE", modes[m], 1);
  *bad_env = m == 3;
  *bad_comm = v >= 250;
  return *bad_comm ? MPI_COMM_NULL : MPI_COMM_SELF;
}

#endif
