/* fuzz_mpi_backward.c - norma_bn_backward_mpi on one rank (MPI_COMM_SELF) against
   norma_mpi.h (fuzz_common.h): n may be 0; without GLOBAL_STATS the count must be >= 2. */
#include "fuzz_mpi_common.h"

typedef struct ctx {
  fz_bn b;
  MPI_Comm comm;
} ctx;

enum { X, Y, DY, GAMMA, BETA, SMEAN, SINV, DX, DRES, DGAMMA, DBETA, NARGS };

static norma_status call(fz_case *k) {
  const ctx *c = k->ctx;
  fz_arg *a = k->a;
  return norma_bn_backward_mpi(c->comm, fz_bn_ptr(&c->b), a[X].p, a[Y].p, a[DY].p, a[GAMMA].p,
                               a[BETA].p, a[SMEAN].p, a[SINV].p, a[DX].p, a[DRES].p,
                               a[DGAMMA].p, a[DBETA].p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz r = {data, size};
  fz_settings(&r);
  ctx c;
  int bad_comm, bad_env;
  c.comm = fz_mpi_setup(&r, &bad_comm, &bad_env);
  fz_bn_make(&r, &c.b, 0, FZ_TRAIN_NO, 8);
  const fz_bn *b = &c.b;
  const int global = (b->d.flags & NORMA_BN_GLOBAL_STATS) != 0;
  const int too_few = b->valid && !global && b->d.n * b->d.spatial < 2;
  const int big_c = b->valid && b->d.c > FZ_MPI_MAX_C;
  const int has = b->d.n > 0, act = fz_act(b), add = (b->d.flags & NORMA_BN_ADD_RELU) != 0;
  const int x_absent = has && !act && fz_u8(&r) >= 192;
  fz_arg a[NARGS] = {
      {"x", FZ_IN, FZ_TENSOR, !has ? FZ_OPT : x_absent ? FZ_IGN : act ? FZ_REQ : FZ_KEEP, 1,
       b->T, 0, 0, 0},
      {"y", FZ_IN, FZ_TENSOR, has && (act || x_absent) ? FZ_REQ : FZ_IGN, 1, b->T, 0, 0, 0},
      {"dy", FZ_IN, FZ_TENSOR, has ? FZ_REQ : FZ_OPT, 1, b->T, 0, 0, 0},
      {"gamma", FZ_IN, FZ_PARAM, FZ_OPT, 1, b->C, 0, 0, 0},
      {"beta", FZ_IN, FZ_PARAM, FZ_OPT, 1, b->C, 0, 0, 0},
      {"save_mean", FZ_IN, FZ_PARAM, FZ_REQ, 1, b->C, 0, 0, 0},
      {"save_invstd", FZ_IN, FZ_PARAM, FZ_REQ, 1, b->C, 0, 0, 0},
      {"dx", FZ_OUT, FZ_TENSOR, has ? FZ_REQ : FZ_OPT, 0, b->T, 0, 0, 0},
      {"dresidual", FZ_OUT, FZ_TENSOR, add ? FZ_OPT : FZ_IGN, 0, b->T, 0, 0, 0},
      {"dgamma", FZ_OUT, FZ_PARAM, FZ_OPT, 0, b->C, 0, 0, 0},
      {"dbeta", FZ_OUT, FZ_PARAM, FZ_OPT, 0, b->C, 0, 0, 0},
  };
  fz_case k = {.ctx = &c};
  if (!fz_setup(&r, &k, a, NARGS, b->d.dtype, b->sizes_ok)) return 0;
  if (x_absent) a[X].p = NULL;
  if (b->force_null) a[SMEAN].p = NULL;
  const int zero_gamma = b->valid && b->sizes_ok && x_absent && a[Y].p &&
                         fz_any_zero_param(b->d.dtype, a[GAMMA].p, b->C);
  /* the local checks first (a local error is every rank's verdict), then the global count */
  norma_status want = fz_expect(&k, !b->valid || !a[SMEAN].p || big_c || bad_comm || bad_env ||
                                        zero_gamma,
                                (b->d.flags & NORMA_CHECK_FINITE) != 0);
  if (want == NORMA_OK && too_few) want = NORMA_ERR_INVALID_ARGUMENT;
  fz_check(&k, call(&k), want, call);
  fz_free(&k);
  return 0;
}
