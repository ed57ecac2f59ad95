/* test_syncbn.c - libnorma_mpi against the single-process library, under mpirun with any
   number of ranks (ctest runs 1, 2, 3 and 4).

   Every rank builds the whole global batch from the same deterministic generator and computes
   the single-process reference on it (norma_bn_forward_training / norma_bn_backward); then it
   runs the synchronized calls on its own slice (uneven: rank 1 has an empty batch when there
   are 2 ranks or more, and passes NULL tensors) and compares.  Per-channel results must be
   bitwise identical on every rank (all-gathered and compared).  Both exchanges (allgather,
   allreduce) are exercised.  Error consistency: one rank's bad argument fails every rank, with
   nothing written anywhere.  Counts are summed over the ranks; rank 0 prints
   "test_syncbn: N passed, M failed"; every rank exits non-zero on any failure. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <mpi.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../c/test_util.h"
#include "norma_mpi.h"

static int g_rank, g_size;

#define MAXP 64

/* Local batch sizes: uneven, rank 1 empty when size >= 2. */
static void split(int size, int64_t base, int64_t *n, int64_t *off, int64_t *total) {
  int64_t o = 0;
  for (int r = 0; r < size; r++) {
    n[r] = (r == 1) ? 0 : base + r;
    off[r] = o;
    o += n[r];
  }
  *total = o;
}

/* Checks that `bytes` bytes at buf are the same on every rank of comm (one check per rank). */
static void same_on_all_ranks(MPI_Comm comm, const char *what, const void *buf, size_t bytes) {
  int size;
  MPI_Comm_size(comm, &size);
  unsigned char *all = tu_alloc(bytes * (size_t)size);
  MPI_Allgather(buf, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, comm);
  for (int r = 1; r < size; r++) {
    char w[160];
    snprintf(w, sizeof w, "%s: rank %d vs rank 0", what, r);
    tu_same_bits(w, all + (size_t)r * bytes, all, bytes);
  }
  free(all);
}

static double max_abs(norma_dtype t, const void *p, int64_t count) {
  double m = 0.0;
  for (int64_t i = 0; i < count; i++) {
    double v = fabs(tu_load(t, p, i));
    if (v > m) m = v;
  }
  return m;
}

/* got vs ref, elementwise within tol relative to the largest |ref| (dx and y have elements near
   0 whose relative error means nothing). */
static void cmp_norm(const char *what, norma_dtype t, const void *got, const void *ref,
                     int64_t count, double tol) {
  double m = max_abs(t, ref, count);
  tu_cmp(what, t, got, ref, count, tol, m > 0 ? m : 1.0);
}

typedef struct problem {
  norma_layout layout;
  norma_dtype dt;
  unsigned flags;
  int64_t c, s, base;  /* channels, spatial, batch base of the split */
  int x_null;          /* backward without x on odd ranks (no activation only) */
  int in_place;        /* y == x in the forward, dx == dy in the backward */
  double shift;        /* added to every channel mean (large-mean data) */
} problem;

/* One forward + backward on comm, compared with the single-process calls on the global batch. */
static void run_case(MPI_Comm comm, const problem *pr, const char *mode) {
  int rank, size;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const norma_dtype dt = pr->dt;
  const int64_t c = pr->c, s = pr->s;
  int64_t n[MAXP], off[MAXP], N;
  split(size, pr->base, n, off, &N);
  tu_set_ctx("rank %d/%d %s %s %s flags 0x%x c %lld s %lld N %lld%s%s shift %g", rank, size, mode,
             tu_layout_name(pr->layout), tu_dt_name(dt), pr->flags, (long long)c, (long long)s,
             (long long)N, pr->x_null ? " x=NULL" : "", pr->in_place ? " in-place" : "",
             pr->shift);
  const size_t es = tu_esize(dt), ps = tu_psize(dt);
  const int64_t gtotal = N * c * s, ltotal = n[rank] * c * s;
  const size_t gbytes = (size_t)gtotal * es, lbytes = (size_t)ltotal * es, pbytes = (size_t)c * ps;
  const size_t loff = (size_t)(off[rank] * c * s) * es;

  /* the global batch and parameters, the same on every rank */
  tu_rng rng = tu_rng_make(1000 + (uint64_t)c * 7 + (uint64_t)s * 13 + (uint64_t)N + dt);
  double mu[64] = {0}, sd[64] = {0}; /* c <= 64 */
  for (int64_t ch = 0; ch < c; ch++) {
    mu[ch] = pr->shift + tu_uniform(&rng, -3, 3);
    sd[ch] = tu_uniform(&rng, 0.5, 2.0);
  }
  void *x = tu_alloc(gbytes), *res = tu_alloc(gbytes), *dy = tu_alloc(gbytes);
  tu_fill_channels(dt, pr->layout, x, N, c, s, mu, sd, &rng);
  tu_fill_uniform(dt, res, gtotal, &rng, -1, 1);
  tu_fill_uniform(dt, dy, gtotal, &rng, -0.7, 1.3); /* mean != 0: the rounding correction matters */
  void *gamma = tu_alloc(pbytes), *beta = tu_alloc(pbytes), *rm0 = tu_alloc(pbytes),
       *rv0 = tu_alloc(pbytes);
  for (int64_t ch = 0; ch < c; ch++)
    tu_pstore(dt, gamma, ch, tu_uniform(&rng, 0.5, 1.5) * (ch % 3 == 2 ? -1 : 1));
  tu_fill_param(dt, beta, c, &rng, -0.5, 0.5);
  tu_fill_param(dt, rm0, c, &rng, -1, 1);
  tu_fill_param(dt, rv0, c, &rng, 0.5, 2);
  const double momentum = 0.1;
  const unsigned bwd_flags = pr->flags & ~(unsigned)NORMA_BN_BIASED_RUNNING_VAR;

  /* reference: one process, the whole batch */
  norma_bn_desc gd = {N, c, s, pr->layout, dt, 1e-5, pr->flags};
  void *yref = tu_alloc(gbytes), *smref = tu_alloc(pbytes), *sisref = tu_alloc(pbytes);
  void *rmref = tu_dup(rm0, pbytes), *rvref = tu_dup(rv0, pbytes);
  norma_status st = norma_bn_forward_training(&gd, x, res, gamma, beta, yref, smref, sisref, rmref,
                                              rvref, momentum);
  TU_CHECK(st == NORMA_OK, "[%s] reference forward: %s", tu_ctx, norma_last_error());
  gd.flags = bwd_flags;
  void *dxref = tu_alloc(gbytes), *drref = tu_alloc(gbytes), *dgref = tu_alloc(pbytes),
       *dbref = tu_alloc(pbytes);
  st = norma_bn_backward(&gd, x, yref, dy, gamma, beta, smref, sisref, dxref, drref, dgref, dbref);
  TU_CHECK(st == NORMA_OK, "[%s] reference backward: %s", tu_ctx, norma_last_error());

  /* this rank: its slice; NULL tensors when its batch is empty */
  const int empty = n[rank] == 0;
  const char *xl = empty ? NULL : (const char *)x + loff;
  const char *rl = empty ? NULL : (const char *)res + loff;
  const char *dyl = empty ? NULL : (const char *)dy + loff;
  const char *yrl = empty ? NULL : (const char *)yref + loff;
  void *y = empty ? NULL : tu_poisoned(lbytes);
  if (pr->in_place && !empty) memcpy(y, xl, lbytes);
  void *sm = tu_poisoned(pbytes), *sis = tu_poisoned(pbytes);
  void *rm = tu_dup(rm0, pbytes), *rv = tu_dup(rv0, pbytes);
  norma_bn_desc d = {n[rank], c, s, pr->layout, dt, 1e-5, pr->flags};
  st = norma_bn_forward_training_mpi(comm, &d, pr->in_place ? y : xl, rl, gamma, beta, y, sm, sis,
                                     rm, rv, momentum);
  if (TU_CHECK(st == NORMA_OK, "[%s] forward_mpi: %s: %s", tu_ctx, norma_status_string(st),
               norma_mpi_last_error())) {
    const double tt = tu_tol_tensor(dt), tp = tu_tol_param(dt);
    if (!empty) cmp_norm("y", dt, y, yrl, ltotal, tt);
    norma_dtype pt = tu_ptype(dt);
    tu_cmp("save_mean", pt, sm, smref, c, tp, 1.0 + fabs(pr->shift)); /* data are O(1) */
    tu_cmp("save_invstd", pt, sis, sisref, c, tp, 1e-3);
    tu_cmp("running_mean", pt, rm, rmref, c, tp, 1.0 + fabs(pr->shift));
    tu_cmp("running_var", pt, rv, rvref, c, tp, 1e-3);
    same_on_all_ranks(comm, "save_mean", sm, pbytes);
    same_on_all_ranks(comm, "save_invstd", sis, pbytes);
    same_on_all_ranks(comm, "running_mean", rm, pbytes);
    same_on_all_ranks(comm, "running_var", rv, pbytes);
  }

  /* backward: the reference's y gives the same ReLU mask; save_* are this call's */
  d.flags = bwd_flags;
  const int drop_x = pr->x_null && (rank % 2 == 1) && !(bwd_flags & (NORMA_BN_RELU | NORMA_BN_ADD_RELU));
  void *dx = empty ? NULL : tu_poisoned(lbytes);
  if (pr->in_place && !empty) memcpy(dx, dyl, lbytes);
  void *dr = empty ? NULL : tu_poisoned(lbytes);
  void *dg = tu_poisoned(pbytes), *db = tu_poisoned(pbytes);
  st = norma_bn_backward_mpi(comm, &d, drop_x ? NULL : xl, yrl, pr->in_place ? dx : dyl, gamma,
                             beta, sm, sis, dx, dr, dg, db);
  if (TU_CHECK(st == NORMA_OK, "[%s] backward_mpi: %s: %s", tu_ctx, norma_status_string(st),
               norma_mpi_last_error())) {
    const double tt = tu_tol_tensor(dt);
    if (!empty) {
      cmp_norm("dx", dt, dx, (const char *)dxref + loff, ltotal, tt);
      if (bwd_flags & NORMA_BN_ADD_RELU)
        tu_same_bits("dresidual", dr, (const char *)drref + loff, lbytes);
      else
        tu_check_poison("dresidual (no ADD_RELU)", dr, lbytes);
    }
    /* sums of many terms in f32 or double: relative to the largest.  x_hat recovered from a
       16-bit y (x == NULL) carries y's rounding, 2^-9 relative. */
    const double tg = dt == NORMA_F64 ? 1e-10
                      : pr->x_null && (dt == NORMA_BF16 || dt == NORMA_F16) ? tu_tol_tensor(dt)
                                                                            : 1e-4;
    cmp_norm("dgamma", tu_ptype(dt), dg, dgref, c, tg);
    cmp_norm("dbeta", tu_ptype(dt), db, dbref, c, tg);
    same_on_all_ranks(comm, "dgamma", dg, pbytes);
    same_on_all_ranks(comm, "dbeta", db, pbytes);
  }

  /* frozen statistics: dx local, dgamma / dbeta still global sums (the condition must be the
     same on every rank: the call is collective) */
  if (!pr->in_place && !pr->x_null) {
    d.flags = gd.flags = bwd_flags | NORMA_BN_GLOBAL_STATS;
    void *fsis = tu_alloc(pbytes);
    for (int64_t ch = 0; ch < c; ch++)
      tu_pstore(dt, fsis, ch, 1.0 / sqrt(tu_pload(dt, rv0, ch) + 1e-5));
    st = norma_bn_backward(&gd, x, yref, dy, gamma, beta, rm0, fsis, dxref, drref, dgref, dbref);
    TU_CHECK(st == NORMA_OK, "[%s] reference backward GLOBAL_STATS: %s", tu_ctx, norma_last_error());
    st = norma_bn_backward_mpi(comm, &d, xl, yrl, dyl, gamma, beta, rm0, fsis, dx, dr, dg, db);
    if (TU_CHECK(st == NORMA_OK, "[%s] backward_mpi GLOBAL_STATS: %s", tu_ctx,
                 norma_mpi_last_error())) {
      if (!empty) cmp_norm("dx (GLOBAL_STATS)", dt, dx, (const char *)dxref + loff, ltotal, 1e-12 + tu_tol_tensor(dt));
      const double tg = dt == NORMA_F64 ? 1e-10 : 1e-4;
      cmp_norm("dgamma (GLOBAL_STATS)", tu_ptype(dt), dg, dgref, c, tg);
      cmp_norm("dbeta (GLOBAL_STATS)", tu_ptype(dt), db, dbref, c, tg);
      same_on_all_ranks(comm, "dgamma (GLOBAL_STATS)", dg, pbytes);
    }
    free(fsis);
  }

  void *bufs[] = {x, res, dy, gamma, beta, rm0, rv0, yref, smref, sisref, rmref, rvref, dxref,
                  drref, dgref, dbref, y, sm, sis, rm, rv, dx, dr, dg, db};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
}

/* ---- large mean: the variance and dgamma of x = 1e4 + noise keep their accuracy ------------ */

static void large_mean(MPI_Comm comm, norma_layout layout) {
  int rank, size;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const int64_t c = 3, s = 50;
  int64_t n[MAXP], off[MAXP], N;
  split(size, 3, n, off, &N);
  tu_set_ctx("rank %d/%d large mean %s N %lld", rank, size, tu_layout_name(layout), (long long)N);
  const int64_t gtotal = N * c * s, lt = n[rank] * c * s;
  float *x = tu_alloc((size_t)gtotal * 4), *dy = tu_alloc((size_t)gtotal * 4);
  tu_rng rng = tu_rng_make(77);
  double mu[3] = {1e4, -3e4 + 0.3, 5e3 + 0.7}, sd[3] = {1.0, 0.05, 0.1}; /* mean / sd <= 6e5 */
  tu_fill_channels(NORMA_F32, layout, x, N, c, s, mu, sd, &rng);
  for (int64_t i = 0; i < gtotal; i++) dy[i] = (float)(1.0 + 0.2 * tu_uniform(&rng, -1, 1));
  /* exact statistics of the stored values, in double, two passes */
  double mean[3] = {0}, var[3] = {0}, is[3], dgx[3] = {0};
  const int64_t m = N * s;
  for (int64_t i = 0; i < N; i++)
    for (int64_t ch = 0; ch < c; ch++)
      for (int64_t sp = 0; sp < s; sp++) mean[ch] += x[tu_index(layout, c, s, i, ch, sp)];
  for (int64_t ch = 0; ch < c; ch++) mean[ch] /= (double)m;
  for (int64_t i = 0; i < N; i++)
    for (int64_t ch = 0; ch < c; ch++)
      for (int64_t sp = 0; sp < s; sp++) {
        double v = x[tu_index(layout, c, s, i, ch, sp)] - mean[ch];
        var[ch] += v * v;
      }
  for (int64_t ch = 0; ch < c; ch++) {
    var[ch] /= (double)m;
    is[ch] = 1.0 / sqrt(var[ch] + 1e-5);
  }
  for (int64_t i = 0; i < N; i++)
    for (int64_t ch = 0; ch < c; ch++)
      for (int64_t sp = 0; sp < s; sp++) {
        int64_t k = tu_index(layout, c, s, i, ch, sp);
        dgx[ch] += dy[k] * (x[k] - mean[ch]) * is[ch];
      }
  norma_bn_desc d = {n[rank], c, s, layout, NORMA_F32, 1e-5, 0};
  const int empty = n[rank] == 0;
  const float *xl = empty ? NULL : x + off[rank] * c * s, *dyl = empty ? NULL : dy + off[rank] * c * s;
  float *y = empty ? NULL : tu_alloc((size_t)lt * 4), *dx = empty ? NULL : tu_alloc((size_t)lt * 4);
  float sm[3], sis[3], dg[3], db[3];
  norma_status st = norma_bn_forward_training_mpi(comm, &d, xl, NULL, NULL, NULL, y, sm, sis, NULL,
                                                  NULL, 0.0);
  if (TU_CHECK(st == NORMA_OK, "[%s] forward: %s", tu_ctx, norma_mpi_last_error())) {
    for (int64_t ch = 0; ch < c; ch++) {
      TU_CHECK(fabs(sm[ch] - mean[ch]) <= 1e-7 * fabs(mean[ch]) + 1e-6,
               "[%s] mean[%lld] %.9g vs %.9g", tu_ctx, (long long)ch, sm[ch], mean[ch]);
      TU_CHECK(fabs(sis[ch] - is[ch]) <= 1e-5 * is[ch], "[%s] invstd[%lld] %.9g vs %.9g", tu_ctx,
               (long long)ch, sis[ch], is[ch]);
    }
    st = norma_bn_backward_mpi(comm, &d, xl, NULL, dyl, NULL, NULL, sm, sis, dx, NULL, dg, db);
    if (TU_CHECK(st == NORMA_OK, "[%s] backward: %s", tu_ctx, norma_mpi_last_error())) {
      for (int64_t ch = 0; ch < c; ch++) {
        /* without the sum_xhat correction the float save_mean's rounding (up to 1e-3 at 3e4)
           times invstd times sum dy would show here, orders of magnitude above this bound */
        double bound = 1e-5 * (double)m;
        TU_CHECK(fabs(dg[ch] - dgx[ch]) <= bound, "[%s] dgamma[%lld] %.9g vs exact %.9g (bound %g)",
                 tu_ctx, (long long)ch, dg[ch], dgx[ch], bound);
      }
    }
    /* x_hat recovered from y on every rank: y was made with the mean in double, no offset */
    st = norma_bn_backward_mpi(comm, &d, NULL, y, dyl, NULL, NULL, sm, sis, dx, NULL, dg, db);
    if (TU_CHECK(st == NORMA_OK, "[%s] backward from y: %s", tu_ctx, norma_mpi_last_error())) {
      for (int64_t ch = 0; ch < c; ch++) {
        double bound = 1e-5 * (double)m;
        TU_CHECK(fabs(dg[ch] - dgx[ch]) <= bound,
                 "[%s] dgamma[%lld] from y %.9g vs exact %.9g (bound %g)", tu_ctx, (long long)ch,
                 dg[ch], dgx[ch], bound);
      }
    }
  }
  free(x);
  free(dy);
  free(y);
  free(dx);
}

/* ---- errors: every rank fails, nothing is written anywhere ---------------------------------- */

typedef enum {
  E_X_NULL,        /* the last rank: x NULL with n > 0 */
  E_MOMENTUM,      /* rank 0: momentum 2 */
  E_NONFINITE,     /* the last rank: NaN in x with CHECK_FINITE */
  E_EPS_MISMATCH,  /* the last rank: another eps (2 ranks or more) */
  E_TOO_FEW,       /* one value per channel in the whole batch */
  E_ALL_EMPTY,     /* every rank n = 0 */
  E_BAD_FLAGS,     /* the last rank: unknown flag bit */
  E_OVERLAP,       /* rank 0: save_mean overlaps y */
  E_COUNT
} fwd_error;

static void forward_error(MPI_Comm comm, fwd_error e) {
  int rank, size;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const int last = size - 1;
  tu_set_ctx("rank %d/%d forward error case %d", rank, size, (int)e);
  const int64_t c = 4, s = 3;
  int64_t nl = 2;
  if (e == E_TOO_FEW) nl = rank == 0 ? 1 : 0;
  if (e == E_ALL_EMPTY) nl = 0;
  norma_bn_desc d = {nl, c, e == E_TOO_FEW ? 1 : s, NORMA_CHANNELS_FIRST, NORMA_F32, 1e-5, 0};
  const int64_t total = nl * c * d.spatial;
  float *x = tu_alloc((size_t)(total ? total : 1) * 4 + 64), *y = tu_poisoned((size_t)(total ? total : 1) * 4 + 64);
  for (int64_t i = 0; i < total; i++) x[i] = (float)(i % 7) * 0.5f;
  float sm[4], sis[4], rm[4] = {1, 2, 3, 4}, rv[4] = {1, 1, 1, 1};
  tu_poison(sm, sizeof sm);
  tu_poison(sis, sizeof sis);
  float rm0[4], rv0[4];
  memcpy(rm0, rm, sizeof rm);
  memcpy(rv0, rv, sizeof rv);
  double momentum = 0.1;
  const float *xp = x;
  void *smp = sm;
  norma_status expect = NORMA_ERR_INVALID_ARGUMENT;
  switch (e) {
    case E_X_NULL: if (rank == last) xp = NULL; break;
    case E_MOMENTUM: if (rank == 0) momentum = 2.0; break;
    case E_NONFINITE:
      d.flags = NORMA_CHECK_FINITE;
      if (rank == last) x[total - 1] = NAN;
      expect = NORMA_ERR_NONFINITE;
      break;
    case E_EPS_MISMATCH: if (rank == last && size > 1) d.eps = 1e-3; break;
    case E_BAD_FLAGS: if (rank == last) d.flags = 1u << 20; break;
    case E_OVERLAP: if (rank == 0) smp = y; break;
    default: break;
  }
  if (e == E_EPS_MISMATCH && size == 1) expect = NORMA_OK;
  norma_status st = norma_bn_forward_training_mpi(comm, &d, xp, NULL, NULL, NULL, y, smp, sis, rm,
                                                  rv, momentum);
  TU_CHECK(st == expect, "[%s] got %s, expected %s (%s)", tu_ctx, norma_status_string(st),
           norma_status_string(expect), norma_mpi_last_error());
  if (expect != NORMA_OK) {
    tu_check_poison("y", y, (size_t)total * 4);
    if (smp == sm) tu_check_poison("save_mean", sm, sizeof sm);
    tu_check_poison("save_invstd", sis, sizeof sis);
    TU_CHECK(!memcmp(rm, rm0, sizeof rm) && !memcmp(rv, rv0, sizeof rv),
             "[%s] running statistics were written", tu_ctx);
    const char *msg = norma_mpi_last_error();
    TU_CHECK(strstr(msg, "norma_bn_forward_training_mpi") != NULL, "[%s] message: %s", tu_ctx, msg);
    if (e == E_TOO_FEW || e == E_ALL_EMPTY)
      TU_CHECK(strstr(msg, "more than 1 value per channel") != NULL, "[%s] message: %s", tu_ctx, msg);
    if (e == E_EPS_MISMATCH)
      TU_CHECK(strstr(msg, "differs") != NULL, "[%s] message: %s", tu_ctx, msg);
    if (e == E_X_NULL && rank != last) {
      char want[64];
      snprintf(want, sizeof want, "rank %d of %d failed", last, size);
      TU_CHECK(strstr(msg, want) != NULL, "[%s] message: %s", tu_ctx, msg);
    }
    if (e == E_X_NULL && rank == last)
      TU_CHECK(strstr(msg, "x must not be NULL") != NULL, "[%s] message: %s", tu_ctx, msg);
  }
  free(x);
  free(y);
}

typedef enum { B_DY_NULL, B_GS_MISMATCH, B_TOO_FEW, B_NONFINITE, B_COUNT } bwd_error;

static void backward_error(MPI_Comm comm, bwd_error e) {
  int rank, size;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const int last = size - 1;
  tu_set_ctx("rank %d/%d backward error case %d", rank, size, (int)e);
  const int64_t c = 4, s = 3;
  int64_t nl = e == B_TOO_FEW ? (rank == 0 ? 1 : 0) : 2;
  norma_bn_desc d = {nl, c, e == B_TOO_FEW ? 1 : s, NORMA_CHANNELS_LAST, NORMA_F64, 1e-5, 0};
  const int64_t total = nl * c * d.spatial;
  double *x = tu_alloc((size_t)total * 8 + 8), *dy = tu_alloc((size_t)total * 8 + 8);
  double *dx = tu_poisoned((size_t)total * 8 + 8);
  for (int64_t i = 0; i < total; i++) x[i] = (double)(i % 5), dy[i] = (double)(i % 3) - 1.0;
  double sm[4] = {1, 2, 2, 1}, sis[4] = {1, 1, 0.5, 2}, dg[4], db[4];
  tu_poison(dg, sizeof dg);
  tu_poison(db, sizeof db);
  const double *dyp = dy;
  norma_status expect = NORMA_ERR_INVALID_ARGUMENT;
  switch (e) {
    case B_DY_NULL: if (rank == last) dyp = NULL; break;
    case B_GS_MISMATCH:
      if (rank == last) d.flags = NORMA_BN_GLOBAL_STATS;
      if (size == 1) expect = NORMA_OK;
      break;
    case B_NONFINITE:
      d.flags = NORMA_CHECK_FINITE;
      if (rank == last) dy[0] = INFINITY;
      expect = NORMA_ERR_NONFINITE;
      break;
    default: break;
  }
  norma_status st = norma_bn_backward_mpi(comm, &d, x, NULL, dyp, NULL, NULL, sm, sis, dx, NULL,
                                          dg, db);
  TU_CHECK(st == expect, "[%s] got %s, expected %s (%s)", tu_ctx, norma_status_string(st),
           norma_status_string(expect), norma_mpi_last_error());
  if (expect != NORMA_OK) {
    tu_check_poison("dx", dx, (size_t)total * 8);
    tu_check_poison("dgamma", dg, sizeof dg);
    tu_check_poison("dbeta", db, sizeof db);
  }
  free(x);
  free(dy);
  free(dx);
}

/* Arguments refused before any exchange, on every rank alike. */
static void local_refusals(void) {
  tu_set_ctx("rank %d/%d local refusals", g_rank, g_size);
  norma_bn_desc d = {2, 3, 2, NORMA_CHANNELS_FIRST, NORMA_F32, 1e-5, 0};
  float x[12] = {0}, y[12];
  norma_status st = norma_bn_forward_training_mpi(MPI_COMM_NULL, &d, x, NULL, NULL, NULL, y, NULL,
                                                  NULL, NULL, NULL, 0.1);
  TU_CHECK(st == NORMA_ERR_INVALID_ARGUMENT && strstr(norma_mpi_last_error(), "MPI_COMM_NULL"),
           "[%s] MPI_COMM_NULL: %s (%s)", tu_ctx, norma_status_string(st), norma_mpi_last_error());
  st = norma_bn_backward_mpi(MPI_COMM_NULL, &d, x, NULL, x, NULL, NULL, x, x, y, NULL, NULL, NULL);
  TU_CHECK(st == NORMA_ERR_INVALID_ARGUMENT, "[%s] MPI_COMM_NULL backward: %s", tu_ctx,
           norma_status_string(st));
  d.c = 0; /* the same c everywhere: refused on every rank, no exchange */
  st = norma_bn_forward_training_mpi(MPI_COMM_WORLD, &d, x, NULL, NULL, NULL, y, NULL, NULL, NULL,
                                     NULL, 0.1);
  TU_CHECK(st == NORMA_ERR_INVALID_ARGUMENT && strstr(norma_mpi_last_error(), "d->c"),
           "[%s] c = 0: %s (%s)", tu_ctx, norma_status_string(st), norma_mpi_last_error());
  /* an unknown NORMA_MPI_EXCHANGE, the same on every rank: every rank refuses after the
     exchange (taken with the automatic choice) */
  d.c = 3;
  setenv("NORMA_MPI_EXCHANGE", "bogus", 1);
  st = norma_bn_forward_training_mpi(MPI_COMM_WORLD, &d, x, NULL, NULL, NULL, y, NULL, NULL, NULL,
                                     NULL, 0.1);
  TU_CHECK(st == NORMA_ERR_INVALID_ARGUMENT && strstr(norma_mpi_last_error(), "NORMA_MPI_EXCHANGE"),
           "[%s] bogus NORMA_MPI_EXCHANGE: %s (%s)", tu_ctx, norma_status_string(st),
           norma_mpi_last_error());
  unsetenv("NORMA_MPI_EXCHANGE");
}

/* Groups of ranks: even and odd ranks each synchronize over their own sub-communicator; and an
   intercommunicator between the two groups is refused. */
static void sub_communicators(void) {
  MPI_Comm sub;
  MPI_Comm_split(MPI_COMM_WORLD, g_rank % 2, g_rank, &sub);
  problem pr = {NORMA_CHANNELS_LAST, NORMA_F32, NORMA_BN_RELU, 5, 4, 2, 0, 0, 0.0};
  run_case(sub, &pr, "sub-communicator");
  pr.layout = NORMA_CHANNELS_FIRST;
  run_case(sub, &pr, "sub-communicator");
  if (g_size >= 2) {
    MPI_Comm inter;
    MPI_Intercomm_create(sub, 0, MPI_COMM_WORLD, g_rank % 2 == 0 ? 1 : 0, 99, &inter);
    tu_set_ctx("rank %d/%d intercommunicator", g_rank, g_size);
    norma_bn_desc d = {2, 3, 2, NORMA_CHANNELS_FIRST, NORMA_F32, 1e-5, 0};
    float x[12] = {0}, y[12];
    norma_status st = norma_bn_forward_training_mpi(inter, &d, x, NULL, NULL, NULL, y, NULL, NULL,
                                                    NULL, NULL, 0.1);
    TU_CHECK(st == NORMA_ERR_INVALID_ARGUMENT && strstr(norma_mpi_last_error(), "intercommunicator"),
             "[%s] %s (%s)", tu_ctx, norma_status_string(st), norma_mpi_last_error());
    MPI_Comm_free(&inter);
  }
  MPI_Comm_free(&sub); /* frees the cached duplicate through the attribute's delete callback */
}

/* NORMA_BN_COUNT_WEIGHTED with running statistics in the plain call is an argument error, and
   argument errors come before NORMA_ERR_NONFINITE (as in norma_bn_forward_training).
   Regression: found by fuzz_mpi_forward_training (NaN in beta with CHECK_FINITE gave
   NORMA_ERR_NONFINITE: the finite scan ran before the running-count check). */
static void counted_before_finite(MPI_Comm comm) {
  float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8], beta[2] = {NAN, 0.f};
  float rm[2] = {0.f, 0.f}, rv[2] = {1.f, 1.f};
  const norma_bn_desc d = {2, 2, 2, NORMA_CHANNELS_FIRST, NORMA_F32, 1e-5,
                           NORMA_BN_COUNT_WEIGHTED | NORMA_CHECK_FINITE};
  norma_status st = norma_bn_forward_training_mpi(comm, &d, x, NULL, NULL, beta, y, NULL, NULL,
                                                  rm, rv, 0.1);
  TU_CHECK(st == NORMA_ERR_INVALID_ARGUMENT, "counted flag in the plain call, NaN beta: %s (%s)",
           norma_status_string(st), norma_mpi_last_error());
  double N = -1.0; /* and a bad running count in the counted call */
  st = norma_bn_forward_training_counted_mpi(comm, &d, x, NULL, NULL, beta, y, NULL, NULL, rm,
                                             rv, &N, 0.1);
  TU_CHECK(st == NORMA_ERR_INVALID_ARGUMENT, "running_count -1, NaN beta: %s (%s)",
           norma_status_string(st), norma_mpi_last_error());
  TU_CHECK(rm[0] == 0.f && rv[0] == 1.f && N == -1.0, "nothing written");
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  if (g_size > MAXP) {
    if (g_rank == 0) fprintf(stderr, "test_syncbn: at most %d ranks\n", MAXP);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  norma_set_num_threads(1); /* ranks share the machine's cores */

  static const char *modes[] = {"allgather", "allreduce"};
  static const norma_dtype dts[] = {NORMA_F32, NORMA_BF16, NORMA_F64, NORMA_F16};
  static const unsigned flagsets[] = {0, NORMA_BN_RELU, NORMA_BN_ADD_RELU,
                                      NORMA_BN_BIASED_RUNNING_VAR};
  for (int mi = 0; mi < 2; mi++) {
    setenv("NORMA_MPI_EXCHANGE", modes[mi], 1);
    for (int li = 0; li < 2; li++)
      for (int di = 0; di < 4; di++)
        for (int fi = 0; fi < 4; fi++) {
          norma_layout l = li ? NORMA_CHANNELS_LAST : NORMA_CHANNELS_FIRST;
          problem pr = {l, dts[di], flagsets[fi], 7, 5, 2, fi == 0, 0, 0.0};
          run_case(MPI_COMM_WORLD, &pr, modes[mi]);
          problem nc = {l, dts[di], flagsets[fi], 33, 1, 2, fi == 3, 0, 0.0}; /* [N, C] */
          run_case(MPI_COMM_WORLD, &nc, modes[mi]);
        }
    problem ip = {NORMA_CHANNELS_LAST, NORMA_F32, NORMA_BN_RELU, 6, 3, 3, 0, 1, 0.0};
    run_case(MPI_COMM_WORLD, &ip, modes[mi]);
    ip.flags = NORMA_BN_ADD_RELU;
    ip.layout = NORMA_CHANNELS_FIRST;
    run_case(MPI_COMM_WORLD, &ip, modes[mi]);
    problem big = {NORMA_CHANNELS_FIRST, NORMA_F32, 0, 64, 2, 1, 0, 0, 100.0}; /* wider record */
    run_case(MPI_COMM_WORLD, &big, modes[mi]);
    large_mean(MPI_COMM_WORLD, NORMA_CHANNELS_FIRST);
    large_mean(MPI_COMM_WORLD, NORMA_CHANNELS_LAST);
    for (int e = 0; e < E_COUNT; e++) forward_error(MPI_COMM_WORLD, (fwd_error)e);
    counted_before_finite(MPI_COMM_WORLD);
    for (int e = 0; e < B_COUNT; e++) backward_error(MPI_COMM_WORLD, (bwd_error)e);
    /* after the errors, the communicator still works */
    problem again = {NORMA_CHANNELS_FIRST, NORMA_F64, NORMA_BN_RELU, 3, 2, 2, 0, 0, 0.0};
    run_case(MPI_COMM_WORLD, &again, modes[mi]);
  }
  unsetenv("NORMA_MPI_EXCHANGE");
  local_refusals();
  sub_communicators();

  long counts[2] = {tu_passed, tu_failed}, sums[2];
  MPI_Allreduce(counts, sums, 2, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (g_rank == 0) {
    printf("test_syncbn (%d ranks): %ld passed, %ld failed\n", g_size, sums[0], sums[1]);
    fflush(stdout);
  }
  MPI_Finalize();
  return sums[1] ? 1 : 0;
}
