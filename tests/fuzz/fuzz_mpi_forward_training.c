/* fuzz_mpi_forward_training.c - norma_bn_forward_training_mpi on one rank (MPI_COMM_SELF)
   against norma_mpi.h (fuzz_common.h): n may be 0; the global count must be >= 2. */
#include "fuzz_mpi_common.h"

typedef struct ctx {
  fz_bn b;
  double momentum;
  MPI_Comm comm;
} ctx;

enum { X, RES, GAMMA, BETA, Y, SMEAN, SINV, RMEAN, RVAR, NARGS };

static norma_status call(fz_case *k) {
  const ctx *c = k->ctx;
  fz_arg *a = k->a;
  return norma_bn_forward_training_mpi(c->comm, fz_bn_ptr(&c->b), a[X].p, a[RES].p, a[GAMMA].p,
                                       a[BETA].p, a[Y].p, a[SMEAN].p, a[SINV].p, a[RMEAN].p,
                                       a[RVAR].p, c->momentum);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz r = {data, size};
  fz_settings(&r);
  ctx c;
  int bad_comm, bad_env;
  c.comm = fz_mpi_setup(&r, &bad_comm, &bad_env);
  fz_bn_make(&r, &c.b, 0, FZ_TRAIN_NO, 8);
  c.momentum = fz_momentum(&r);
  const fz_bn *b = &c.b;
  /* one rank: the global count is this rank's n * spatial */
  const int too_few = b->valid && b->d.n * b->d.spatial < 2;
  const int big_c = b->valid && b->d.c > FZ_MPI_MAX_C;
  const int has = b->d.n > 0, add = (b->d.flags & NORMA_BN_ADD_RELU) != 0;
  fz_arg a[NARGS] = {
      {"x", FZ_IN, FZ_TENSOR, has ? FZ_REQ : FZ_IGN, 1, b->T, 0, 0, 0},
      {"residual", FZ_IN, FZ_TENSOR, has && add ? FZ_REQ : FZ_IGN, 1, b->T, 0, 0, 0},
      {"gamma", FZ_IN, FZ_PARAM, FZ_OPT, 1, b->C, 0, 0, 0},
      {"beta", FZ_IN, FZ_PARAM, FZ_OPT, 1, b->C, 0, 0, 0},
      {"y", FZ_OUT, FZ_TENSOR, has ? FZ_REQ : FZ_IGN, 0, b->T, 0, 0, 0},
      {"save_mean", FZ_OUT, FZ_PARAM, FZ_OPT, 0, b->C, 0, 0, 0},
      {"save_invstd", FZ_OUT, FZ_PARAM, FZ_OPT, 0, b->C, 0, 0, 0},
      {"running_mean", FZ_INOUT, FZ_PARAM, FZ_OPT, 1, b->C, 0, 0, 0},
      {"running_var", FZ_INOUT, FZ_PARAM, FZ_OPT, 1, b->C, 0, 0, 0},
  };
  fz_case k = {.ctx = &c};
  if (!fz_setup(&r, &k, a, NARGS, b->d.dtype, b->sizes_ok)) return 0;
  int forced = 0;
  if (b->force_null) { /* too large to allocate: stop at a NULL that the call must reject */
    if (has) a[X].p = NULL;
    else forced = 1, c.b.present = 0;
  }
  const int bad_momentum = (a[RMEAN].p || a[RVAR].p) && !(c.momentum >= 0 && c.momentum <= 1);
  /* the local checks first (a local error is every rank's verdict), then the global count */
  norma_status want = fz_expect(&k, !b->valid || forced || b->force_null || big_c || bad_comm ||
                                        bad_env || bad_momentum ||
                                        fz_counted_without_count(b, a[RMEAN].p, a[RVAR].p),
                                (b->d.flags & NORMA_CHECK_FINITE) != 0);
  if (want == NORMA_OK && too_few) want = NORMA_ERR_INVALID_ARGUMENT;
  fz_check(&k, call(&k), want, call);
  fz_free(&k);
  return 0;
}
