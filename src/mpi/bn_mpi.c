/* bn_mpi.c - SyncBatchNorm over MPI, built only on the split API of norma.h plus MPI.

   One collective per call.  Each rank packs one record: a header (its status, its count, a
   fingerprint of the arguments that must agree) and its per-channel partials (forward: the
   moments mean, m2; backward: sum g, sum g * x_hat, sum x_hat).  The records are combined in
   rank order by one function, combine_records, either
     - after an MPI_Allgather, by every rank, left to right (bitwise identical on every rank by
       construction), or
     - inside MPI_Allreduce, as a non-commutative user-defined operation (MPI keeps the rank
       order of the operands; see docs/distributed.md for why every rank gets the same bits).
   The first moves P records to every rank, the second O(log P); the choice depends only on
   the communicator size and c (and NORMA_MPI_EXCHANGE), so every rank makes the same one.

   Errors: everything a rank can check locally is checked before the exchange; a failed check
   is sent as the record's status (with zero partials) instead of returning early, so the other
   ranks are not left waiting and every rank returns an error.  Outputs are written only after
   the exchange succeeded and every rank reported OK. */
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "impl.h"
#include "internal.h"
#include "norma_mpi.h"

/* ------------------------------------------------------------------------------------------ */
/* Errors                                                                                     */
/* ------------------------------------------------------------------------------------------ */

static _Thread_local char mpi_last_error[512];

const char *norma_mpi_last_error(void) { return mpi_last_error; }

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static norma_status fail(norma_status st, const char *fmt, ...) {
  char buf[sizeof mpi_last_error]; /* fmt's arguments may point into mpi_last_error */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  memcpy(mpi_last_error, buf, sizeof buf);
  norma__record_error(buf); /* norma_last_error() reports it as well */
  return st;
}

/* A norma call failed inside: keep its message, prefixed with ours. */
static norma_status fail_inner(const char *fn, norma_status st) {
  return fail(st, "%s: %s", fn, norma_last_error());
}

/* rank < 0: before this rank's place in the communicator is known */
static norma_status fail_mpi(const char *fn, const char *what, int rc, int rank, int size) {
  char es[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, es, &len) != MPI_SUCCESS) snprintf(es, sizeof es, "error %d", rc);
  if (rank < 0) return fail(NORMA_ERR_COMMUNICATION, "%s: %s failed: %s", fn, what, es);
  return fail(NORMA_ERR_COMMUNICATION, "%s: %s failed on rank %d of %d: %s", fn, what, rank, size,
              es);
}

#define TRY(expr)                          \
  do {                                     \
    norma_status st_ = (expr);             \
    if (st_ != NORMA_OK) return st_;       \
  } while (0)

/* ------------------------------------------------------------------------------------------ */
/* Local argument checks (the same rules and messages as the single-process calls, with n >= 0)*/
/* ------------------------------------------------------------------------------------------ */

typedef struct local_shape {
  int64_t total;      /* n * c * spatial */
  size_t tbytes;      /* bytes of a local tensor */
  size_t pbytes;      /* bytes of a per-channel parameter array */
  int act;            /* 0 none, 1 relu, 2 add+relu */
} local_shape;

/* The core's checks (check.h) record their message in norma_last_error(); keep it here too. */
static norma_status mirror(norma_status st) {
  if (st != NORMA_OK) snprintf(mpi_last_error, sizeof mpi_last_error, "%s", norma_last_error());
  return st;
}

static norma_status check_desc(const char *fn, const norma_bn_desc *d, local_shape *ls) {
  bn_problem p;
  TRY(mirror(bn_check_desc(fn, d, 0, 0, &p))); /* n == 0 allowed: an empty local batch */
  ls->total = p.total;
  ls->tbytes = (size_t)p.total * p.esize;
  ls->pbytes = (size_t)p.c * norma__param_size(p.dt);
  ls->act = p.act == BN_ACT_ADD_RELU ? 2 : p.act == BN_ACT_RELU ? 1 : 0;
  return NORMA_OK;
}

static norma_status require(const char *fn, const char *name, const void *p) {
  return mirror(bn_require(fn, name, p));
}

#define R_TENSOR_IN REGION_TENSOR_IN
#define R_TENSOR_OUT REGION_TENSOR_OUT
#define R_PARAM_IN REGION_PARAM_IN
#define R_PARAM_OUT REGION_PARAM_OUT
typedef bn_region region;

/* An output may only alias an input tensor exactly (in place); any other overlap is rejected. */
static norma_status check_overlaps(const char *fn, const region *r, int count) {
  return mirror(bn_check_overlaps(fn, r, count));
}

static norma_status check_finite(const char *fn, const char *name, norma_dtype t,
                                 const void *ptr, int64_t count) {
  return mirror(bn_check_finite(fn, name, t, ptr, count));
}

static norma_status check_finite_param(const char *fn, const char *name, norma_dtype t,
                                       const void *ptr, int64_t c) {
  return mirror(bn_check_finite_param(fn, name, t, ptr, c));
}

static double param_at(norma_dtype t, const void *p, int64_t i) {
  return t == NORMA_F64 ? ((const double *)p)[i] : (double)((const float *)p)[i];
}

/* ------------------------------------------------------------------------------------------ */
/* The record and its rank-order combination                                                  */
/* ------------------------------------------------------------------------------------------ */

typedef struct rec_hdr {
  int32_t status;        /* status of the lowest failing rank in the range (0: none failed) */
  int32_t err_rank;      /* that rank, -1 if none */
  int32_t first_rank;    /* lowest rank of the range the record covers */
  int32_t mismatch_rank; /* lowest rank whose fingerprint differs from first_rank's, -1 if none */
  int64_t count;         /* values per channel over the range */
  /* fingerprint: what every rank must agree on */
  int64_t c;
  double eps;            /* forward only (0 in the backward) */
  uint32_t fp_flags;     /* FP_* */
  uint32_t from_y;       /* backward: some rank of the range recovered x_hat from y (x NULL) */
} rec_hdr;
_Static_assert(sizeof(rec_hdr) == 48 && sizeof(rec_hdr) % sizeof(double) == 0,
               "the per-channel doubles follow the header aligned");

enum { FP_PARAM_F64 = 1u << 8 }; /* or-ed with the statistics flags (BIASED_RUNNING_VAR, GLOBAL_STATS) */
enum { KIND_FWD = 0, KIND_BWD = 1 };
static const int64_t per_channel[2] = {2, 3}; /* doubles per channel: mean, m2 | sdy, sdyx, sx */

/* The largest c a record can carry (its size must fit in an int). */
#define MAX_C (((int64_t)INT_MAX - (int64_t)sizeof(rec_hdr)) / 24)

static size_t rec_bytes(int kind, int64_t c) {
  return sizeof(rec_hdr) + (size_t)(per_channel[kind] * c) * sizeof(double);
}
static double *rec_data(void *rec) { return (double *)((char *)rec + sizeof(rec_hdr)); }
static const double *rec_cdata(const void *rec) {
  return (const double *)((const char *)rec + sizeof(rec_hdr));
}

static int fp_equal(const rec_hdr *a, const rec_hdr *b) {
  return a->c == b->c && a->eps == b->eps && a->fp_flags == b->fp_flags;
}

/* (count, mean, m2) of ranges a then b -> o, channel by channel, by norma_bn_moments_merge.
   o may alias a or b.  A range with count 0 is the identity (copied, not merged, so that a
   rank with an empty batch changes no bit). */
static void moments_combine(int64_t c, int64_t ca, const double *ma, const double *qa, int64_t cb,
                            const double *mb, const double *qb, double *mo, double *qo) {
  if (cb == 0 || ca == 0) {
    const double *m = cb == 0 ? ma : mb, *q = cb == 0 ? qa : qb;
    if (mo != m) memmove(mo, m, (size_t)c * sizeof(double));
    if (qo != q) memmove(qo, q, (size_t)c * sizeof(double));
    return;
  }
  enum { CHUNK = 128 };
  int64_t na[CHUNK], nb[CHUNK];
  double tm[CHUNK], tq[CHUNK];
  for (int64_t j0 = 0; j0 < c; j0 += CHUNK) {
    int64_t k = c - j0 < CHUNK ? c - j0 : CHUNK;
    for (int64_t j = 0; j < k; j++) {
      na[j] = ca;
      nb[j] = cb;
    }
    memcpy(tm, ma + j0, (size_t)k * sizeof(double));
    memcpy(tq, qa + j0, (size_t)k * sizeof(double));
    /* cannot fail: k >= 1 and no pointer is NULL */
    (void)norma_bn_moments_merge(k, na, tm, tq, nb, mb + j0, qb + j0);
    memcpy(mo + j0, tm, (size_t)k * sizeof(double));
    memcpy(qo + j0, tq, (size_t)k * sizeof(double));
  }
}

/* out = a (+) b, where a covers lower ranks than b.  out may alias a or b.  This one function
   combines records both after the allgather and inside the allreduce operation. */
static void combine_records(int kind, int64_t c, const void *a, const void *b, void *out) {
  const rec_hdr *ha = a, *hb = b;
  rec_hdr h = *ha;
  if (ha->status == 0 && hb->status != 0) {
    h.status = hb->status;
    h.err_rank = hb->err_rank;
  }
  if (ha->mismatch_rank < 0) h.mismatch_rank = fp_equal(ha, hb) ? hb->mismatch_rank : hb->first_rank;
  h.count = ha->count + hb->count;
  h.from_y = ha->from_y | hb->from_y;
  const double *da = rec_cdata(a), *db = rec_cdata(b);
  double *dout = rec_data(out);
  if (kind == KIND_FWD) {
    moments_combine(c, ha->count, da, da + c, hb->count, db, db + c, dout, dout + c);
  } else {
    for (int64_t i = 0; i < 3 * c; i++) dout[i] = da[i] + db[i];
  }
  *(rec_hdr *)out = h;
}

/* MPI_User_function: inoutvec = invec (+) inoutvec, invec holding the lower ranks. */
static void op_apply(int kind, void *in, void *inout, int *len, MPI_Datatype *dt) {
  int sz = 0;
  MPI_Type_size(*dt, &sz);
  int64_t c = ((int64_t)sz - (int64_t)sizeof(rec_hdr)) / (per_channel[kind] * 8);
  for (int i = 0; i < *len; i++)
    combine_records(kind, c, (char *)in + (size_t)i * sz, (char *)inout + (size_t)i * sz,
                    (char *)inout + (size_t)i * sz);
}
static void op_fwd(void *in, void *inout, int *len, MPI_Datatype *dt) {
  op_apply(KIND_FWD, in, inout, len, dt);
}
static void op_bwd(void *in, void *inout, int *len, MPI_Datatype *dt) {
  op_apply(KIND_BWD, in, inout, len, dt);
}

/* ------------------------------------------------------------------------------------------ */
/* Per-communicator state, cached on the user's communicator                                  */
/* ------------------------------------------------------------------------------------------ */

typedef struct comm_state {
  MPI_Comm user;           /* the communicator the attribute hangs on */
  MPI_Comm dup;            /* private duplicate with MPI_ERRORS_RETURN */
  int rank, size;
  MPI_Datatype type[2];    /* contiguous record type per kind (allreduce path) */
  int type_bytes[2];
  void *scratch;           /* grown on demand, reused by every call */
  size_t scratch_bytes;
  struct comm_state *prev, *next;
} comm_state;

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_init_rc = MPI_SUCCESS;
static int g_keyval = MPI_KEYVAL_INVALID;      /* state on a user communicator */
static int g_self_keyval = MPI_KEYVAL_INVALID; /* cleanup at MPI_Finalize */
static MPI_Op g_op[2] = {MPI_OP_NULL, MPI_OP_NULL};
static comm_state *g_states;                   /* every live state, for the cleanup */

static void state_free(comm_state *s) {
  for (int k = 0; k < 2; k++)
    if (s->type[k] != MPI_DATATYPE_NULL) MPI_Type_free(&s->type[k]);
  if (s->dup != MPI_COMM_NULL) MPI_Comm_free(&s->dup);
  free(s->scratch);
  free(s);
}

/* Called by MPI when the user's communicator is freed (or by the cleanup below). */
static int state_delete_fn(MPI_Comm comm, int keyval, void *val, void *extra) {
  (void)comm;
  (void)keyval;
  (void)extra;
  comm_state *s = val;
  pthread_mutex_lock(&g_lock);
  if (s->prev) s->prev->next = s->next;
  else g_states = s->next;
  if (s->next) s->next->prev = s->prev;
  pthread_mutex_unlock(&g_lock);
  state_free(s);
  return MPI_SUCCESS;
}

/* Attributes of MPI_COMM_SELF are deleted first thing in MPI_Finalize, while MPI still works:
   drop the states still cached on live communicators, then the operations and keyvals. */
static int self_delete_fn(MPI_Comm comm, int keyval, void *val, void *extra) {
  (void)comm;
  (void)keyval;
  (void)val;
  (void)extra;
  for (;;) {
    pthread_mutex_lock(&g_lock);
    comm_state *s = g_states;
    pthread_mutex_unlock(&g_lock);
    if (!s) break;
    MPI_Comm_delete_attr(s->user, g_keyval); /* calls state_delete_fn, which unlinks s */
  }
  for (int k = 0; k < 2; k++)
    if (g_op[k] != MPI_OP_NULL) MPI_Op_free(&g_op[k]);
  MPI_Comm_free_keyval(&g_keyval);
  return MPI_SUCCESS;
}

static void global_init(void) {
  int rc = MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, state_delete_fn, &g_keyval, NULL);
  if (rc == MPI_SUCCESS) rc = MPI_Op_create(op_fwd, 0 /* not commutative */, &g_op[KIND_FWD]);
  if (rc == MPI_SUCCESS) rc = MPI_Op_create(op_bwd, 0, &g_op[KIND_BWD]);
  if (rc == MPI_SUCCESS)
    rc = MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, self_delete_fn, &g_self_keyval, NULL);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_set_attr(MPI_COMM_SELF, g_self_keyval, NULL);
  g_init_rc = rc;
}

/* MPI is usable, comm is an intracommunicator; its state (created on first use: the
   MPI_Comm_dup there is a collective of comm). */
static norma_status comm_prepare(const char *fn, MPI_Comm comm, comm_state **out) {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (!inited || finalized)
    return fail(NORMA_ERR_COMMUNICATION, "%s: MPI is %s", fn,
                finalized ? "already finalized" : "not initialized");
  if (comm == MPI_COMM_NULL)
    return fail(NORMA_ERR_INVALID_ARGUMENT, "%s: comm must not be MPI_COMM_NULL", fn);
  pthread_once(&g_once, global_init);
  if (g_init_rc != MPI_SUCCESS) return fail_mpi(fn, "setting up libnorma_mpi", g_init_rc, -1, -1);

  int inter = 0;
  int rc = MPI_Comm_test_inter(comm, &inter);
  if (rc != MPI_SUCCESS) return fail_mpi(fn, "MPI_Comm_test_inter", rc, -1, -1);
  if (inter)
    return fail(NORMA_ERR_INVALID_ARGUMENT,
                "%s: comm is an intercommunicator; an intracommunicator is required", fn);

  void *val = NULL;
  int found = 0;
  rc = MPI_Comm_get_attr(comm, g_keyval, &val, &found);
  if (rc != MPI_SUCCESS) return fail_mpi(fn, "MPI_Comm_get_attr", rc, -1, -1);
  if (found) {
    *out = val;
    return NORMA_OK;
  }

  comm_state *s = calloc(1, sizeof *s);
  if (!s) return fail(NORMA_ERR_OUT_OF_MEMORY, "%s: out of memory (communicator state)", fn);
  s->user = comm;
  s->dup = MPI_COMM_NULL;
  s->type[0] = s->type[1] = MPI_DATATYPE_NULL;
  /* Duplicate with errors returned, also from MPI_Comm_dup itself; comm's handler is restored. */
  MPI_Errhandler old;
  rc = MPI_Comm_get_errhandler(comm, &old);
  if (rc == MPI_SUCCESS) {
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    rc = MPI_Comm_dup(comm, &s->dup);
    MPI_Comm_set_errhandler(comm, old);
    MPI_Errhandler_free(&old);
  }
  if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(s->dup, MPI_ERRORS_RETURN);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(s->dup, &s->rank);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_size(s->dup, &s->size);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_set_attr(comm, g_keyval, s);
  if (rc != MPI_SUCCESS) {
    state_free(s);
    return fail_mpi(fn, "duplicating the communicator", rc, -1, -1);
  }
  pthread_mutex_lock(&g_lock);
  s->next = g_states;
  if (g_states) g_states->prev = s;
  g_states = s;
  pthread_mutex_unlock(&g_lock);
  *out = s;
  return NORMA_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* The exchange                                                                               */
/* ------------------------------------------------------------------------------------------ */

/* The allgather moves size - 1 records to every rank and merges them all; a recursive-doubling
   allreduce moves and merges ceil(log2 size).  The allgather is taken while the difference,
   in bytes, stays below this (always for 1 to 3 ranks); see docs/distributed.md ("Choosing
   the exchange"). */
#define ALLGATHER_EXTRA_MAX_BYTES ((size_t)32 * 1024)

enum { EX_AUTO, EX_ALLGATHER, EX_ALLREDUCE, EX_BAD };

static int exchange_mode(void) {
  const char *e = getenv("NORMA_MPI_EXCHANGE");
  if (!e || !*e || !strcmp(e, "auto")) return EX_AUTO;
  if (!strcmp(e, "allgather")) return EX_ALLGATHER;
  if (!strcmp(e, "allreduce")) return EX_ALLREDUCE;
  return EX_BAD;
}

static int use_allgather(int mode, int size, size_t rb) {
  if (mode == EX_ALLGATHER) return 1;
  if (mode == EX_ALLREDUCE) return 0;
  int rounds = 0; /* ceil(log2 size) */
  while ((1L << rounds) < size) rounds++;
  size_t extra = (size_t)(size - 1 - rounds); /* >= 0 */
  return extra == 0 || rb <= ALLGATHER_EXTRA_MAX_BYTES / extra;
}

/* Scratch of the call, carved from the state's buffer. */
typedef struct call_buffers {
  void *send;      /* this rank's record */
  void *recv;      /* size records (allgather) or one */
  void *acc;       /* the combined record (allgather: a separate accumulator; allreduce: recv) */
  double *work;    /* kind-specific doubles */
  int64_t *counts; /* c counts */
  int gather;
} call_buffers;

static norma_status get_buffers(const char *fn, comm_state *s, int kind, int64_t c,
                                int64_t work_doubles, int mode, call_buffers *b) {
  size_t rb = rec_bytes(kind, c);
  b->gather = use_allgather(mode, s->size, rb);
  size_t nrecv = b->gather ? (size_t)s->size : 1, recv_bytes;
  size_t need = rb /* send */ + (b->gather ? rb : 0) + (size_t)work_doubles * sizeof(double) +
                (size_t)c * sizeof(int64_t);
  if (__builtin_mul_overflow(nrecv, rb, &recv_bytes) ||
      __builtin_add_overflow(need, recv_bytes, &need))
    need = SIZE_MAX; /* cannot be allocated */
  if (need > s->scratch_bytes) {
    void *p = malloc(need);
    if (!p)
      return fail(NORMA_ERR_OUT_OF_MEMORY,
                  "%s: out of memory (%zu bytes of exchange buffers); this rank cannot take part "
                  "in the exchange", fn, need);
    free(s->scratch);
    s->scratch = p;
    s->scratch_bytes = need;
  }
  char *p = s->scratch;
  b->send = p;
  p += rb;
  b->recv = p;
  p += nrecv * rb;
  if (b->gather) {
    b->acc = p;
    p += rb;
  } else {
    b->acc = b->recv;
  }
  b->work = (double *)p;
  p += (size_t)work_doubles * sizeof(double);
  b->counts = (int64_t *)p;
  return NORMA_OK;
}

static void record_init(void *rec, int kind, int64_t c, int rank, double eps, uint32_t fp_flags) {
  rec_hdr *h = rec;
  memset(h, 0, sizeof *h); /* status 0, count 0, from_y 0 */
  h->err_rank = -1;
  h->first_rank = rank;
  h->mismatch_rank = -1;
  h->c = c;
  h->eps = eps;
  h->fp_flags = fp_flags;
  memset(rec_data(rec), 0, (size_t)(per_channel[kind] * c) * sizeof(double));
}

/* A local failure: the record carries the status and no data. */
static void record_fail(void *rec, int kind, int64_t c, int rank, norma_status st) {
  rec_hdr *h = rec;
  h->status = (int32_t)st;
  h->err_rank = rank;
  h->count = 0;
  memset(rec_data(rec), 0, (size_t)(per_channel[kind] * c) * sizeof(double));
}

/* The one collective.  On success b->acc holds the combined record of all ranks. */
static norma_status exchange(const char *fn, comm_state *s, int kind, int64_t c,
                             call_buffers *b) {
  size_t rb = rec_bytes(kind, c);
  int rc;
  if (b->gather) {
    rc = MPI_Allgather(b->send, (int)rb, MPI_BYTE, b->recv, (int)rb, MPI_BYTE, s->dup);
    if (rc != MPI_SUCCESS) return fail_mpi(fn, "MPI_Allgather", rc, s->rank, s->size);
    memcpy(b->acc, b->recv, rb);
    for (int r = 1; r < s->size; r++)
      combine_records(kind, c, b->acc, (char *)b->recv + (size_t)r * rb, b->acc);
    return NORMA_OK;
  }
  if (s->type_bytes[kind] != (int)rb) {
    if (s->type[kind] != MPI_DATATYPE_NULL) MPI_Type_free(&s->type[kind]);
    s->type_bytes[kind] = 0;
    rc = MPI_Type_contiguous((int)rb, MPI_BYTE, &s->type[kind]);
    if (rc == MPI_SUCCESS) rc = MPI_Type_commit(&s->type[kind]);
    if (rc != MPI_SUCCESS) {
      s->type[kind] = MPI_DATATYPE_NULL;
      return fail_mpi(fn, "creating the record datatype", rc, s->rank, s->size);
    }
    s->type_bytes[kind] = (int)rb;
  }
  rc = MPI_Allreduce(b->send, b->recv, 1, s->type[kind], g_op[kind], s->dup);
  if (rc != MPI_SUCCESS) return fail_mpi(fn, "MPI_Allreduce", rc, s->rank, s->size);
  return NORMA_OK;
}

/* After the exchange: the verdict every rank reaches from the same combined header. */
static norma_status verdict(const char *fn, const comm_state *s, const rec_hdr *h,
                            norma_status local, int need_two) {
  if (h->status != 0) {
    if (local != NORMA_OK) return local; /* this rank's own message is already set */
    return fail((norma_status)h->status,
                "%s: rank %d of %d failed (%s; its norma_mpi_last_error() has the detail); "
                "nothing written", fn, (int)h->err_rank, s->size,
                norma_status_string((norma_status)h->status));
  }
  if (h->mismatch_rank >= 0)
    return fail(NORMA_ERR_INVALID_ARGUMENT,
                "%s: the descriptor of rank %d differs from that of rank 0 in d->c, d->eps, the "
                "parameter type (f64 or float) or the statistics flags; they must be the same on "
                "every rank; nothing written", fn, (int)h->mismatch_rank);
  if (need_two && h->count < 2)
    return fail(NORMA_ERR_INVALID_ARGUMENT,
                "%s: expected more than 1 value per channel when training, got n * spatial = "
                "%lld summed over the %d ranks", fn, (long long)h->count, s->size);
  return NORMA_OK;
}

static norma_status prologue(const char *fn, MPI_Comm comm, const norma_bn_desc *d,
                             comm_state **s) {
  TRY(comm_prepare(fn, comm, s));
  if (!d)
    return fail(NORMA_ERR_INVALID_ARGUMENT,
                "%s: d (the descriptor) must not be NULL; it sizes the exchange, so this rank "
                "could not take part in it", fn);
  if (d->c <= 0 || d->c > MAX_C)
    return fail(NORMA_ERR_INVALID_ARGUMENT, "%s: d->c must be in [1, %lld] (got %lld)", fn,
                (long long)MAX_C, (long long)d->c);
  return NORMA_OK;
}

static uint32_t fingerprint_flags(const norma_bn_desc *d, unsigned stat_flags) {
  return (d->dtype == NORMA_F64 ? FP_PARAM_F64 : 0u) | (d->flags & stat_flags);
}

/* ------------------------------------------------------------------------------------------ */
/* Forward                                                                                    */
/* ------------------------------------------------------------------------------------------ */

static norma_status check_forward(const char *fn, const norma_bn_desc *d, const void *x,
                                  const void **residual, const void *gamma, const void *beta,
                                  const void *y, const void *save_mean, const void *save_invstd,
                                  const void *running_mean, const void *running_var,
                                  double momentum) {
  local_shape ls;
  TRY(check_desc(fn, d, &ls));
  if (ls.act != 2) *residual = NULL;
  if (d->n > 0) {
    TRY(require(fn, "x", x));
    TRY(require(fn, "y", y));
    if (ls.act == 2) TRY(require(fn, "residual (required with NORMA_BN_ADD_RELU)", *residual));
  }
  if ((running_mean || running_var) && !(momentum >= 0.0 && momentum <= 1.0))
    return fail(NORMA_ERR_INVALID_ARGUMENT, "%s: momentum must be in [0, 1] (got %g)", fn,
                momentum);
  const region r[] = {
      {"x", x, ls.tbytes, R_TENSOR_IN},
      {"residual", *residual, ls.tbytes, R_TENSOR_IN},
      {"gamma", gamma, ls.pbytes, R_PARAM_IN},
      {"beta", beta, ls.pbytes, R_PARAM_IN},
      {"y", y, ls.tbytes, R_TENSOR_OUT},
      {"save_mean", save_mean, ls.pbytes, R_PARAM_OUT},
      {"save_invstd", save_invstd, ls.pbytes, R_PARAM_OUT},
      {"running_mean", running_mean, ls.pbytes, R_PARAM_OUT},
      {"running_var", running_var, ls.pbytes, R_PARAM_OUT},
  };
  TRY(check_overlaps(fn, r, (int)(sizeof r / sizeof r[0])));
  if (d->flags & NORMA_CHECK_FINITE) {
    if (d->n > 0) {
      TRY(check_finite(fn, "x", d->dtype, x, ls.total));
      TRY(check_finite(fn, "residual", d->dtype, *residual, ls.total));
    }
    TRY(check_finite_param(fn, "gamma", d->dtype, gamma, d->c));
    TRY(check_finite_param(fn, "beta", d->dtype, beta, d->c));
    TRY(check_finite_param(fn, "running_mean", d->dtype, running_mean, d->c));
    TRY(check_finite_param(fn, "running_var", d->dtype, running_var, d->c));
  }
  return NORMA_OK;
}

/* The running count of the counted variant (norma_bn_running_update's rules). */
static norma_status check_running_count(const char *fn, const norma_bn_desc *d,
                                        const void *running_mean, const void *running_var,
                                        const double *running_count, int counted) {
  if (!(d->flags & NORMA_BN_COUNT_WEIGHTED) || (!running_mean && !running_var)) return NORMA_OK;
  if (!counted)
    return fail(NORMA_ERR_INVALID_ARGUMENT, "%s: NORMA_BN_COUNT_WEIGHTED needs the running "
                "count: call norma_bn_forward_training_counted_mpi", fn);
  if (!running_count)
    return fail(NORMA_ERR_INVALID_ARGUMENT,
                "%s: running_count (required with NORMA_BN_COUNT_WEIGHTED) must not be NULL", fn);
  if (!(*running_count >= 0.0) || !isfinite(*running_count))
    return fail(NORMA_ERR_INVALID_ARGUMENT,
                "%s: *running_count must be finite and >= 0 (got %g)", fn, *running_count);
  return NORMA_OK;
}

static norma_status forward_mpi(const char *fn, MPI_Comm comm, const norma_bn_desc *d,
                                const void *x, const void *residual, const void *gamma,
                                const void *beta, void *y, void *save_mean, void *save_invstd,
                                void *running_mean, void *running_var, double *running_count,
                                double momentum, int counted) {
  comm_state *s;
  TRY(prologue(fn, comm, d, &s));
  const int64_t c = d->c;
  const int mode = exchange_mode();
  call_buffers b;
  /* work: mean_out[c], invstd_out[c], the previous contents of the 4 per-channel outputs, and
     the batch variance of the count-weighted update */
  TRY(get_buffers(fn, s, KIND_FWD, c, 7 * c, mode, &b));
  norma_bn_desc dl = *d;
  dl.flags &= ~(unsigned)NORMA_CHECK_FINITE; /* scanned here, before the exchange */
  const int counting =
      (d->flags & NORMA_BN_COUNT_WEIGHTED) && (running_mean || running_var) && counted;

  /* 1. local moments into the record (or the local error as its status) */
  record_init(b.send, KIND_FWD, c, s->rank, d->eps,
              fingerprint_flags(d, NORMA_BN_BIASED_RUNNING_VAR | NORMA_BN_COUNT_WEIGHTED));
  norma_status local = check_forward(fn, d, x, &residual, gamma, beta, y, save_mean, save_invstd,
                                     running_mean, running_var, momentum);
  if (local == NORMA_OK)
    local = check_running_count(fn, d, running_mean, running_var, running_count, counted);
  if (local == NORMA_OK && mode == EX_BAD)
    local = fail(NORMA_ERR_INVALID_ARGUMENT,
                 "%s: the environment variable NORMA_MPI_EXCHANGE must be auto, allgather or "
                 "allreduce (got \"%s\")", fn, getenv("NORMA_MPI_EXCHANGE"));
  if (local == NORMA_OK && d->n > 0) {
    double *data = rec_data(b.send);
    local = norma_bn_moments(&dl, x, b.counts, data, data + c);
    if (local != NORMA_OK) fail_inner(fn, local);
    else ((rec_hdr *)b.send)->count = b.counts[0];
  }
  if (local != NORMA_OK) record_fail(b.send, KIND_FWD, c, s->rank, local);

  /* 2. the exchange, and the verdict */
  TRY(exchange(fn, s, KIND_FWD, c, &b));
  const rec_hdr *h = b.acc;
  TRY(verdict(fn, s, h, local, 1));

  /* 3. statistics (in double for y; save_* and running_* written), then y.  y is the only step
        that can still fail (out of memory in the core, before it writes anything); then the
        per-channel outputs get their previous bytes back, so that nothing is written on error.
        (Computing the statistics a second time after y instead costs ~6 ns per channel.) */
  const double *gmean = rec_cdata(b.acc), *gm2 = gmean + c;
  double *mean_out = b.work, *invstd_out = b.work + c;
  void *outs[4] = {save_mean, save_invstd, running_mean, running_var};
  const size_t pbytes = (size_t)c * norma__param_size(d->dtype);
  for (int k = 0; k < 4; k++)
    if (outs[k]) memcpy(b.work + (2 + k) * c, outs[k], pbytes);
  const double count_before = counting ? *running_count : 0.0;
  for (int64_t i = 0; i < c; i++) b.counts[i] = h->count;
  norma_status st = norma_bn_stats_from_moments(&dl, b.counts, gmean, gm2, mean_out, invstd_out,
                                                save_mean, save_invstd,
                                                counting ? NULL : running_mean,
                                                counting ? NULL : running_var, momentum);
  if (st == NORMA_OK && counting) {
    /* the count-weighted update with the global count (norma_bn_running_update) */
    double *var = b.work + 6 * c;
    for (int64_t i = 0; i < c; i++) {
      const double v = gm2[i] / (double)h->count;
      var[i] = v < 0.0 ? 0.0 : v;
    }
    st = norma_bn_running_update(&dl, h->count, gmean, var, running_mean, running_var,
                                 running_count, momentum);
  }
  if (st == NORMA_OK && d->n > 0)
    st = norma_bn_forward_apply(&dl, x, residual, gamma, beta, mean_out, invstd_out, y);
  if (st != NORMA_OK) {
    for (int k = 0; k < 4; k++)
      if (outs[k]) memcpy(outs[k], b.work + (2 + k) * c, pbytes);
    if (counting) *running_count = count_before;
    return fail_inner(fn, st);
  }
  return NORMA_OK;
}

norma_status norma_bn_forward_training_mpi(MPI_Comm comm, const norma_bn_desc *d, const void *x,
                                           const void *residual, const void *gamma,
                                           const void *beta, void *y, void *save_mean,
                                           void *save_invstd, void *running_mean,
                                           void *running_var, double momentum) {
  return forward_mpi("norma_bn_forward_training_mpi", comm, d, x, residual, gamma, beta, y,
                     save_mean, save_invstd, running_mean, running_var, NULL, momentum, 0);
}

norma_status norma_bn_forward_training_counted_mpi(MPI_Comm comm, const norma_bn_desc *d,
                                                   const void *x, const void *residual,
                                                   const void *gamma, const void *beta, void *y,
                                                   void *save_mean, void *save_invstd,
                                                   void *running_mean, void *running_var,
                                                   double *running_count, double momentum) {
  return forward_mpi("norma_bn_forward_training_counted_mpi", comm, d, x, residual, gamma, beta,
                     y, save_mean, save_invstd, running_mean, running_var, running_count,
                     momentum, 1);
}

/* ------------------------------------------------------------------------------------------ */
/* Backward                                                                                   */
/* ------------------------------------------------------------------------------------------ */

static norma_status check_backward(const char *fn, const norma_bn_desc *d, const void **x,
                                   const void **y, const void *dy, const void *gamma,
                                   const void *beta, const void *save_mean,
                                   const void *save_invstd, const void *dx, void **dresidual,
                                   const void *dgamma, const void *dbeta) {
  local_shape ls;
  TRY(check_desc(fn, d, &ls));
  TRY(require(fn, "save_mean", save_mean));
  TRY(require(fn, "save_invstd", save_invstd));
  if (ls.act != 2) *dresidual = NULL;
  if (d->n > 0) {
    TRY(require(fn, "dy", dy));
    TRY(require(fn, "dx", dx));
    if (ls.act != 0) {
      TRY(require(fn, "x (required with NORMA_BN_RELU / NORMA_BN_ADD_RELU)", *x));
      TRY(require(fn, "y (required with NORMA_BN_RELU / NORMA_BN_ADD_RELU: the mask is y > 0)",
                  *y));
    } else if (!*x) {
      TRY(require(fn, "y (required when x is NULL: x_hat is recovered from y)", *y));
    }
  }
  if (ls.act == 0 && *x) *y = NULL; /* not used */
  const region r[] = {
      {"x", *x, ls.tbytes, R_TENSOR_IN},
      {"y", *y, ls.tbytes, R_TENSOR_IN},
      {"dy", dy, ls.tbytes, R_TENSOR_IN},
      {"gamma", gamma, ls.pbytes, R_PARAM_IN},
      {"beta", beta, ls.pbytes, R_PARAM_IN},
      {"save_mean", save_mean, ls.pbytes, R_PARAM_IN},
      {"save_invstd", save_invstd, ls.pbytes, R_PARAM_IN},
      {"dx", dx, ls.tbytes, R_TENSOR_OUT},
      {"dresidual", *dresidual, ls.tbytes, R_TENSOR_OUT},
      {"dgamma", dgamma, ls.pbytes, R_PARAM_OUT},
      {"dbeta", dbeta, ls.pbytes, R_PARAM_OUT},
  };
  TRY(check_overlaps(fn, r, (int)(sizeof r / sizeof r[0])));
  if (d->n > 0 && !*x && gamma) {
    for (int64_t ch = 0; ch < d->c; ch++)
      if (param_at(d->dtype, gamma, ch) == 0.0)
        return fail(NORMA_ERR_INVALID_ARGUMENT,
                    "%s: gamma[%lld] is 0: x_hat cannot be recovered from y when x is NULL; "
                    "pass x", fn, (long long)ch);
  }
  if (d->flags & NORMA_CHECK_FINITE) {
    if (d->n > 0) {
      TRY(check_finite(fn, "x", d->dtype, *x, ls.total));
      TRY(check_finite(fn, "y", d->dtype, *y, ls.total));
      TRY(check_finite(fn, "dy", d->dtype, dy, ls.total));
    }
    TRY(check_finite_param(fn, "gamma", d->dtype, gamma, d->c));
    TRY(check_finite_param(fn, "beta", d->dtype, beta, d->c));
    TRY(check_finite_param(fn, "save_mean", d->dtype, save_mean, d->c));
    TRY(check_finite_param(fn, "save_invstd", d->dtype, save_invstd, d->c));
  }
  return NORMA_OK;
}

norma_status norma_bn_backward_mpi(MPI_Comm comm, const norma_bn_desc *d, const void *x,
                                   const void *y, const void *dy, const void *gamma,
                                   const void *beta, const void *save_mean,
                                   const void *save_invstd, void *dx, void *dresidual,
                                   void *dgamma, void *dbeta) {
  static const char fn[] = "norma_bn_backward_mpi";
  comm_state *s;
  TRY(prologue(fn, comm, d, &s));
  const int64_t c = d->c;
  const int mode = exchange_mode();
  const int global_stats = (d->flags & NORMA_BN_GLOBAL_STATS) != 0;
  call_buffers b;
  /* work: mean[c], invstd[c] in double */
  TRY(get_buffers(fn, s, KIND_BWD, c, 3 * c, mode, &b));
  norma_bn_desc dl = *d;
  dl.flags &= ~(unsigned)NORMA_CHECK_FINITE;

  /* 1. local sums into the record */
  record_init(b.send, KIND_BWD, c, s->rank, 0.0, fingerprint_flags(d, NORMA_BN_GLOBAL_STATS));
  norma_status local = check_backward(fn, d, &x, &y, dy, gamma, beta, save_mean, save_invstd, dx,
                                      &dresidual, dgamma, dbeta);
  if (local == NORMA_OK && mode == EX_BAD)
    local = fail(NORMA_ERR_INVALID_ARGUMENT,
                 "%s: the environment variable NORMA_MPI_EXCHANGE must be auto, allgather or "
                 "allreduce (got \"%s\")", fn, getenv("NORMA_MPI_EXCHANGE"));
  const double *mean = NULL, *invstd = NULL;
  if (local == NORMA_OK && d->n > 0) {
    if (d->dtype == NORMA_F64) {
      mean = save_mean;
      invstd = save_invstd;
    } else {
      double *m = b.work, *v = b.work + c;
      for (int64_t i = 0; i < c; i++) {
        m[i] = ((const float *)save_mean)[i];
        v[i] = ((const float *)save_invstd)[i];
      }
      mean = m;
      invstd = v;
    }
    /* sum_xhat measures the rounding of save_mean in x_hat = (x - save_mean) * invstd; an
       x_hat recovered from y has no such offset (y was made with the mean in double), so a
       rank without x sends none and flags it */
    double *data = rec_data(b.send);
    local = norma_bn_backward_reduce(&dl, x, y, dy, gamma, beta, mean, invstd, data, data + c,
                                     x ? data + 2 * c : NULL);
    if (local != NORMA_OK) fail_inner(fn, local);
    else {
      ((rec_hdr *)b.send)->count = d->n * d->spatial;
      ((rec_hdr *)b.send)->from_y = x == NULL;
    }
  }
  if (local != NORMA_OK) record_fail(b.send, KIND_BWD, c, s->rank, local);

  /* 2. the exchange, and the verdict */
  TRY(exchange(fn, s, KIND_BWD, c, &b));
  const rec_hdr *h = b.acc;
  TRY(verdict(fn, s, h, local, !global_stats));

  /* 3. dx (the step that could still fail), then dgamma / dbeta.  The rounding correction
        (sum_xhat) applies when every rank with data passed x, as in norma_bn_backward; not
        with GLOBAL_STATS (the mean is a constant, not the batch mean), nor when some rank
        recovered x_hat from y (the offset is then not the same on every rank: uncorrected, as
        PyTorch computes it; the same on every rank). */
  const double *sdy = rec_cdata(b.acc), *sdyx = sdy + c;
  const int64_t count = h->count >= 1 ? h->count : 1; /* 0 only with GLOBAL_STATS: sums are 0 */
  /* norma_bn_backward's rule, channel by channel: an offset |sum_xhat / count| above 1/16 is
     not rounding but caller-supplied statistics, used as given */
  double *sx = NULL;
  if (!global_stats && !h->from_y) {
    sx = b.work + 2 * c;
    for (int64_t j = 0; j < c; j++) {
      sx[j] = bn_xhat_offset(sdy[2 * c + j], (double)count) != 0.0 ? sdy[2 * c + j] : 0.0;
    }
  }
  norma_status st;
  if (d->n > 0) {
    st = norma_bn_backward_apply(&dl, x, y, dy, gamma, beta, mean, invstd, sdy, sdyx, sx, count,
                                 dx, dresidual);
    if (st != NORMA_OK) return fail_inner(fn, st);
  }
  if (dgamma || dbeta) {
    st = norma_bn_param_grads(&dl, sdy, sdyx, sx, count, dgamma, dbeta);
    if (st != NORMA_OK) return fail_inner(fn, st);
  }
  return NORMA_OK;
}
