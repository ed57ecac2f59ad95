/* bn_mpi.c - SyncBatchNorm over MPI, built only on the split API of norma.h plus MPI.

   Each rank packs a record: a header (its status, its count, the fingerprint of its
   descriptor: c, eps, dtype, layout, flags, direction) and its per-channel partials (forward:
   the moments mean, m2; backward: sum g, sum g * x_hat, sum x_hat).  The records are combined
   in rank order by one function, combine_records, either
     - after an MPI_Allgather, by every rank, left to right (bitwise identical on every rank by
       construction), or
     - inside MPI_Allreduce, as a non-commutative user-defined operation (MPI keeps the rank
       order of the operands; see docs/distributed.md for why every rank gets the same bits).
   The first moves P records to every rank, the second O(log P); the choice depends only on
   the communicator size and the record size (and NORMA_MPI_EXCHANGE), so every rank makes
   the same one.

   Segments: the first record of a call has a fixed size (SEG0_BYTES: the header and the first
   512 / 341 channels), so that the collective completes whatever each rank's descriptor
   says: ranks that disagree on c, or a rank without a usable d, still exchange, and every
   rank reads the same verdict from the combined header.  Only after that verdict (every rank
   OK, every fingerprint equal) does a second collective carry channels 512.. (341..), whose
   size every rank now knows to be the same.

   Errors: everything a rank can check locally is checked before the exchange; a failed check
   is sent as the record's status (with zero partials) instead of returning early, so the other
   ranks are not left waiting and every rank returns the same error.  Outputs are written only
   after the exchange succeeded and every rank reported OK. */
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
/* The record, its fingerprint, and the rank-order combination                                */
/* ------------------------------------------------------------------------------------------ */

/* What every rank must agree on: the descriptor less n and spatial, and the direction.  A rank
   whose d is NULL (or unusable) sends zeros and a failed status. */
typedef struct rec_fp {
  int64_t c;
  double eps;
  int32_t dtype, layout;
  uint32_t flags;
  uint32_t kind;      /* KIND_FWD / KIND_BWD */
} rec_fp;

enum { FP_C = 1u, FP_EPS = 2u, FP_DTYPE = 4u, FP_LAYOUT = 8u, FP_FLAGS = 16u, FP_KIND = 32u };

typedef struct rec_hdr {
  int32_t status;        /* status of the lowest failing rank in the range (0: none failed) */
  int32_t err_rank;      /* that rank, -1 if none */
  int32_t first_rank;    /* lowest rank of the range the record covers */
  int32_t mismatch_rank; /* lowest rank whose fingerprint differs from first_rank's, -1 if none */
  int64_t count;         /* values per channel over the range */
  int64_t ch0;           /* first channel of the segment the record carries */
  rec_fp fp;             /* first_rank's fingerprint */
  uint32_t fp_diff;      /* FP_* fields in which mismatch_rank differs */
  uint32_t from_y;       /* backward: some rank of the range recovered x_hat from y (x NULL) */
} rec_hdr;
_Static_assert(sizeof(rec_hdr) == 72 && sizeof(rec_hdr) % sizeof(double) == 0,
               "the per-channel doubles follow the header aligned");

enum { KIND_FWD = 0, KIND_BWD = 1 };
static const int64_t per_channel[2] = {2, 3}; /* doubles per channel: mean, m2 | sdy, sdyx, sx */

/* Segment 0: the first record of every call has this fixed size, whatever d says, so that the
   collective completes on every rank even when the ranks disagree on d->c (or a rank has no
   usable d): its header carries the status and the fingerprint, its data the first SEG0_CH
   channels.  Only when every rank agreed and c > SEG0_CH does a second collective follow, for
   channels SEG0_CH..c-1, its size now known to be the same everywhere.  8 KiB: 512 channels
   forward, 341 backward in one message (docs/distributed.md, "One message per direction"). */
#define SEG0_DATA_BYTES ((size_t)8192)
#define SEG0_BYTES (sizeof(rec_hdr) + SEG0_DATA_BYTES)
static int64_t seg0_channels(int kind) {
  return (int64_t)(SEG0_DATA_BYTES / sizeof(double)) / per_channel[kind];
}

/* The largest c a record can carry (the second record's size must fit in an int). */
#define MAX_C (((int64_t)INT_MAX - (int64_t)sizeof(rec_hdr)) / 24)

/* A record with room for `cap` channels: the header, then per_channel planes of cap doubles. */
static size_t rec_bytes(int kind, int64_t cap) {
  return sizeof(rec_hdr) + (size_t)(per_channel[kind] * cap) * sizeof(double);
}
static double *rec_data(void *rec) { return (double *)((char *)rec + sizeof(rec_hdr)); }
static const double *rec_cdata(const void *rec) {
  return (const double *)((const char *)rec + sizeof(rec_hdr));
}

/* LAYOUT_EITHER: this rank's tensor has the same bytes in both layouts (n == 0, spatial == 1
   or c == 1), so its layout cannot disagree with anyone's */
#define LAYOUT_EITHER (-1)

static uint32_t fp_diff(const rec_fp *a, const rec_fp *b) {
  const int layouts_differ =
      a->layout != LAYOUT_EITHER && b->layout != LAYOUT_EITHER && a->layout != b->layout;
  return (a->c != b->c ? FP_C : 0u) | (a->eps != b->eps ? FP_EPS : 0u) |
         (a->dtype != b->dtype ? FP_DTYPE : 0u) | (layouts_differ ? FP_LAYOUT : 0u) |
         (a->flags != b->flags ? FP_FLAGS : 0u) | (a->kind != b->kind ? FP_KIND : 0u);
}

static void fp_make(rec_fp *fp, int kind, const norma_bn_desc *d) {
  memset(fp, 0, sizeof *fp);
  fp->kind = (uint32_t)kind;
  if (!d) return;
  fp->c = d->c;
  fp->eps = d->eps;
  fp->dtype = (int32_t)d->dtype;
  fp->layout = d->n == 0 || d->spatial == 1 || d->c == 1 ? LAYOUT_EITHER : (int32_t)d->layout;
  fp->flags = d->flags;
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
    /* cannot fail: k >= 1, no pointer is NULL, nothing overlaps, ca + cb checked by the caller */
    (void)norma_bn_moments_merge(k, na, tm, tq, nb, mb + j0, qb + j0);
    memcpy(mo + j0, tm, (size_t)k * sizeof(double));
    memcpy(qo + j0, tq, (size_t)k * sizeof(double));
  }
}

/* out = a (+) b, where a covers lower ranks than b; both records have room for cap channels.
   out may alias a or b.  This one function combines records both after the allgather and
   inside the allreduce operation.  The data are combined only while every rank so far is OK
   and agrees on the fingerprint: then they all have the same c, and the channels the record
   carries, min(c - ch0, cap), are the same for all. */
static void combine_records(int kind, int64_t cap, const void *a, const void *b, void *out) {
  const rec_hdr *ha = a, *hb = b;
  rec_hdr h = *ha;
  if (ha->status == 0 && hb->status != 0) {
    h.status = hb->status;
    h.err_rank = hb->err_rank;
  }
  if (ha->mismatch_rank < 0) {
    const uint32_t diff = fp_diff(&ha->fp, &hb->fp);
    h.mismatch_rank = diff ? hb->first_rank : hb->mismatch_rank;
    h.fp_diff = diff ? diff : hb->fp_diff;
  }
  if (h.fp.layout == LAYOUT_EITHER) h.fp.layout = hb->fp.layout; /* the range's first layout */
  if (h.status == 0 && __builtin_add_overflow(ha->count, hb->count, &h.count)) {
    h.status = NORMA_ERR_INVALID_ARGUMENT; /* more values than int64 counts */
    h.err_rank = hb->first_rank;
  }
  h.from_y = ha->from_y | hb->from_y;
  double *dout = rec_data(out);
  if (h.status == 0 && h.mismatch_rank < 0) {
    int64_t n = h.fp.c - h.ch0;
    if (n > cap) n = cap;
    if (n < 0) n = 0;
    const double *da = rec_cdata(a), *db = rec_cdata(b);
    if (kind == KIND_FWD) {
      moments_combine(n, ha->count, da, da + cap, hb->count, db, db + cap, dout, dout + cap);
    } else {
      for (int k = 0; k < 3; k++)
        for (int64_t i = 0; i < n; i++) dout[k * cap + i] = da[k * cap + i] + db[k * cap + i];
    }
  }
  *(rec_hdr *)out = h;
}

/* MPI_User_function: inoutvec = invec (+) inoutvec, invec holding the lower ranks. */
static void op_apply(int kind, void *in, void *inout, int *len, MPI_Datatype *dt) {
  int sz = 0;
  MPI_Type_size(*dt, &sz);
  const int64_t cap = ((int64_t)sz - (int64_t)sizeof(rec_hdr)) / (per_channel[kind] * 8);
  for (int i = 0; i < *len; i++)
    combine_records(kind, cap, (char *)in + (size_t)i * sz, (char *)inout + (size_t)i * sz,
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
  MPI_Datatype type[4];    /* contiguous record type per (kind, segment) (allreduce path) */
  int type_bytes[4];
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
  for (int k = 0; k < 4; k++)
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
  for (int k = 0; k < 4; k++) s->type[k] = MPI_DATATYPE_NULL;
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

/* One collective's buffers: this rank's record, the received ones, the combined one. */
typedef struct seg_buffers {
  int64_t ch0, nch, cap; /* channels ch0 .. ch0 + nch - 1, in records with room for cap */
  size_t rb;             /* record bytes */
  int gather;            /* MPI_Allgather (else MPI_Allreduce with the rank-order operation) */
  void *send, *recv, *acc;
} seg_buffers;

/* Scratch of the call, carved from the state's buffer. */
typedef struct call_buffers {
  int nseg;            /* 1, or 2 when c > seg0_channels */
  seg_buffers seg[2];
  double *local;       /* per_channel planes of c doubles: this rank's partials */
  double *global;      /* per_channel planes of c doubles: the combination of all ranks */
  double *work;        /* kind-specific doubles */
  int64_t *counts;     /* c counts */
} call_buffers;

/* c: d->c when usable, else 0 (the rank takes part in segment 0 only, to report its error). */
static norma_status get_buffers(const char *fn, comm_state *s, int kind, int64_t c,
                                int64_t work_doubles, int mode, call_buffers *b) {
  const int64_t cap0 = seg0_channels(kind);
  b->nseg = c > cap0 ? 2 : 1;
  size_t seg_need = 0;
  for (int k = 0; k < b->nseg; k++) {
    seg_buffers *g = &b->seg[k];
    g->ch0 = k ? cap0 : 0;
    g->cap = k ? c - cap0 : cap0;
    g->nch = k ? c - cap0 : (c < cap0 ? c : cap0);
    g->rb = k ? rec_bytes(kind, g->cap) : SEG0_BYTES; /* the same for both directions */
    g->gather = use_allgather(mode, s->size, g->rb);
    size_t nrec = 1 + (g->gather ? (size_t)s->size + 1 : 1), bytes;
    if (__builtin_mul_overflow(nrec, g->rb, &bytes)) bytes = SIZE_MAX;
    if (bytes > seg_need) seg_need = bytes; /* the segments use the same space in turn */
  }
  size_t need = seg_need, planes = (size_t)(2 * per_channel[kind] * c + work_doubles);
  if (__builtin_add_overflow(need, planes * sizeof(double) + (size_t)c * sizeof(int64_t), &need))
    need = SIZE_MAX; /* cannot be allocated */
  if (need > s->scratch_bytes) {
    void *p = need == SIZE_MAX ? NULL : malloc(need);
    if (!p)
      return fail(NORMA_ERR_OUT_OF_MEMORY,
                  "%s: out of memory (%zu bytes of exchange buffers); this rank cannot take part "
                  "in the exchange", fn, need);
    free(s->scratch);
    s->scratch = p;
    s->scratch_bytes = need;
  }
  char *p = s->scratch;
  for (int k = 0; k < b->nseg; k++) {
    seg_buffers *g = &b->seg[k];
    g->send = p;
    g->recv = p + g->rb;
    g->acc = g->gather ? p + g->rb * (1 + (size_t)s->size) : g->recv;
  }
  p += seg_need;
  b->local = (double *)p;
  b->global = b->local + per_channel[kind] * c;
  b->work = b->global + per_channel[kind] * c;
  b->counts = (int64_t *)(b->work + work_doubles);
  return NORMA_OK;
}

/* The header every rank sends: its status (0 while OK), count, fingerprint. */
static void header_init(rec_hdr *h, int kind, const norma_bn_desc *d, int rank) {
  memset(h, 0, sizeof *h);
  h->err_rank = -1;
  h->first_rank = rank;
  h->mismatch_rank = -1;
  fp_make(&h->fp, kind, d);
}

/* A segment's record: the header (with the segment's first channel) and the partials of its
   channels, from the planes of c doubles (NULL: zeros, a failed rank). */
static void record_pack(const seg_buffers *g, int kind, const rec_hdr *h, const double *planes,
                        int64_t c) {
  rec_hdr *r = g->send;
  *r = *h;
  r->ch0 = g->ch0;
  double *data = rec_data(g->send);
  memset(data, 0, (size_t)(per_channel[kind] * g->cap) * sizeof(double));
  if (planes)
    for (int k = 0; k < per_channel[kind]; k++)
      memcpy(data + k * g->cap, planes + k * c + g->ch0, (size_t)g->nch * sizeof(double));
}

/* The combined partials of a segment into the planes of c doubles. */
static void record_unpack(const seg_buffers *g, int kind, double *planes, int64_t c) {
  const double *data = rec_cdata(g->acc);
  for (int k = 0; k < per_channel[kind]; k++)
    memcpy(planes + k * c + g->ch0, data + k * g->cap, (size_t)g->nch * sizeof(double));
}

/* The record datatype of (kind, segment) for the allreduce, committed once per size. */
static norma_status record_type(const char *fn, comm_state *s, int slot, size_t rb,
                                MPI_Datatype *out) {
  if (s->type_bytes[slot] != (int)rb) {
    if (s->type[slot] != MPI_DATATYPE_NULL) MPI_Type_free(&s->type[slot]);
    s->type_bytes[slot] = 0;
    int rc = MPI_Type_contiguous((int)rb, MPI_BYTE, &s->type[slot]);
    if (rc == MPI_SUCCESS) rc = MPI_Type_commit(&s->type[slot]);
    if (rc != MPI_SUCCESS) {
      s->type[slot] = MPI_DATATYPE_NULL;
      return fail_mpi(fn, "creating the record datatype", rc, s->rank, s->size);
    }
    s->type_bytes[slot] = (int)rb;
  }
  *out = s->type[slot];
  return NORMA_OK;
}

/* One collective.  On success g->acc holds the combined record of all ranks. */
static norma_status exchange(const char *fn, comm_state *s, int kind, int seg, seg_buffers *g) {
  int rc;
  if (g->gather) {
    rc = MPI_Allgather(g->send, (int)g->rb, MPI_BYTE, g->recv, (int)g->rb, MPI_BYTE, s->dup);
    if (rc != MPI_SUCCESS) return fail_mpi(fn, "MPI_Allgather", rc, s->rank, s->size);
    memcpy(g->acc, g->recv, g->rb);
    for (int r = 1; r < s->size; r++)
      combine_records(kind, g->cap, g->acc, (char *)g->recv + (size_t)r * g->rb, g->acc);
    return NORMA_OK;
  }
  MPI_Datatype type = MPI_DATATYPE_NULL;
  TRY(record_type(fn, s, 2 * kind + seg, g->rb, &type));
  rc = MPI_Allreduce(g->send, g->recv, 1, type, g_op[kind], s->dup);
  if (rc != MPI_SUCCESS) return fail_mpi(fn, "MPI_Allreduce", rc, s->rank, s->size);
  return NORMA_OK;
}

static const char *fp_fields(uint32_t diff, char *buf, size_t n) {
  static const char *const names[] = {"d->c", "d->eps", "d->dtype", "d->layout", "d->flags",
                                      "the direction (forward / backward)"};
  buf[0] = '\0';
  for (int i = 0; i < 6; i++)
    if (diff & (1u << i)) {
      size_t len = strlen(buf);
      snprintf(buf + len, n - len, "%s%s", len ? ", " : "", names[i]);
    }
  return buf;
}

/* After segment 0: the verdict every rank reaches from the same combined header.  Every rank
   returns the same status: that of the lowest failing rank (a rank that failed itself keeps
   its own message), else NORMA_ERR_INVALID_ARGUMENT for a fingerprint mismatch or too few
   values. */
static norma_status verdict(const char *fn, const comm_state *s, const rec_hdr *h,
                            norma_status local, int need_two) {
  if (h->status != 0) {
    const norma_status st = (norma_status)h->status;
    if (local != NORMA_OK && h->err_rank == s->rank) return local; /* its message is set */
    if (local != NORMA_OK)
      return fail(st, "%s (and rank %d of %d failed first: %s; nothing written)",
                  mpi_last_error, (int)h->err_rank, s->size, norma_status_string(st));
    return fail(st,
                "%s: rank %d of %d failed (%s; its norma_mpi_last_error() has the detail); "
                "nothing written", fn, (int)h->err_rank, s->size, norma_status_string(st));
  }
  if (h->mismatch_rank >= 0) {
    char fields[160];
    return fail(NORMA_ERR_INVALID_ARGUMENT,
                "%s: the descriptor of rank %d differs from that of rank 0 in %s; d->c, "
                "d->dtype, d->layout, d->flags and d->eps must be the same on every rank; "
                "nothing written", fn, (int)h->mismatch_rank,
                fp_fields(h->fp_diff, fields, sizeof fields));
  }
  if (need_two && h->count < 2)
    return fail(NORMA_ERR_INVALID_ARGUMENT,
                "%s: expected more than 1 value per channel when training, got n * spatial = "
                "%lld summed over the %d ranks", fn, (long long)h->count, s->size);
  return NORMA_OK;
}

/* The whole exchange of a call: segment 0 (fixed size) and the verdict, then segment 1 when
   c > seg0_channels.  `planes` are this rank's partials (NULL when it failed), the result
   goes to b->global.  On a verdict other than OK, or an MPI failure, returns it. */
static norma_status exchange_all(const char *fn, comm_state *s, int kind, call_buffers *b,
                                 const rec_hdr *h, const double *planes, int64_t c,
                                 norma_status local, int need_two, rec_hdr *combined) {
  record_pack(&b->seg[0], kind, h, planes, c);
  TRY(exchange(fn, s, kind, 0, &b->seg[0]));
  *combined = *(const rec_hdr *)b->seg[0].acc;
  TRY(verdict(fn, s, combined, local, need_two));
  /* every rank is OK and has the same c from here on: the segments are the same everywhere */
  record_unpack(&b->seg[0], kind, b->global, c);
  if (b->nseg == 2) {
    record_pack(&b->seg[1], kind, h, planes, c);
    TRY(exchange(fn, s, kind, 1, &b->seg[1]));
    record_unpack(&b->seg[1], kind, b->global, c);
  }
  return NORMA_OK;
}

/* Steps before the exchange that every call shares: MPI usable and comm an intracommunicator
   (else a local error: this rank cannot take part), and the c this rank can size its
   buffers with (0 when d is NULL or d->c out of range: it then reports that in segment 0). */
static norma_status prologue(const char *fn, MPI_Comm comm, const norma_bn_desc *d,
                             comm_state **s, int64_t *c, norma_status *local) {
  TRY(comm_prepare(fn, comm, s));
  *c = 0;
  *local = NORMA_OK;
  if (!d)
    *local = fail(NORMA_ERR_INVALID_ARGUMENT, "%s: d (the descriptor) must not be NULL", fn);
  else if (d->c <= 0 || d->c > MAX_C)
    *local = fail(NORMA_ERR_INVALID_ARGUMENT, "%s: d->c must be in [1, %lld] (got %lld)", fn,
                  (long long)MAX_C, (long long)d->c);
  else
    *c = d->c;
  if (*local == NORMA_OK && exchange_mode() == EX_BAD)
    *local = fail(NORMA_ERR_INVALID_ARGUMENT,
                  "%s: the environment variable NORMA_MPI_EXCHANGE must be auto, allgather or "
                  "allreduce (got \"%s\")", fn, getenv("NORMA_MPI_EXCHANGE"));
  return NORMA_OK;
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
  int64_t c;
  norma_status local;
  TRY(prologue(fn, comm, d, &s, &c, &local));
  call_buffers b;
  /* work: mean_out[c], invstd_out[c], the previous contents of the 4 per-channel outputs, and
     the batch variance of the count-weighted update */
  TRY(get_buffers(fn, s, KIND_FWD, c, 7 * c, exchange_mode(), &b));

  /* 1. local moments (or the local error) */
  rec_hdr h;
  header_init(&h, KIND_FWD, d, s->rank);
  norma_bn_desc dl;
  int counting = 0;
  if (local == NORMA_OK) {
    dl = *d;
    dl.flags &= ~(unsigned)NORMA_CHECK_FINITE; /* scanned here, before the exchange */
    /* argument errors before NORMA_ERR_NONFINITE, as in every call: the running count's
       rules first, check_forward ends with the CHECK_FINITE scan */
    local = check_running_count(fn, d, running_mean, running_var, running_count, counted);
    if (local == NORMA_OK)
      local = check_forward(fn, d, x, &residual, gamma, beta, y, save_mean, save_invstd,
                            running_mean, running_var, momentum);
    counting = (d->flags & NORMA_BN_COUNT_WEIGHTED) && (running_mean || running_var) && counted;
  }
  if (local == NORMA_OK && d->n > 0) {
    local = norma_bn_moments(&dl, x, b.counts, b.local, b.local + c);
    if (local != NORMA_OK) fail_inner(fn, local);
    else h.count = b.counts[0];
  }
  if (local != NORMA_OK) {
    h.status = (int32_t)local;
    h.err_rank = s->rank;
    h.count = 0;
  } else if (d->n == 0) {
    memset(b.local, 0, (size_t)(2 * c) * sizeof(double));
  }

  /* 2. the exchange, and the verdict */
  rec_hdr g;
  TRY(exchange_all(fn, s, KIND_FWD, &b, &h, local == NORMA_OK ? b.local : NULL, c, local, 1,
                   &g));

  /* 3. statistics (in double for y; save_* and running_* written), then y.  y is the only step
        that can still fail (out of memory in the core, before it writes anything); then the
        per-channel outputs (and the running count) get their previous bytes back, so that
        nothing is written on error.  (Computing the statistics a second time after y instead
        costs ~6 ns per channel.) */
  const double *gmean = b.global, *gm2 = b.global + c;
  double *mean_out = b.work, *invstd_out = b.work + c;
  void *outs[4] = {save_mean, save_invstd, running_mean, running_var};
  const size_t pbytes = (size_t)c * norma__param_size(d->dtype);
  for (int k = 0; k < 4; k++)
    if (outs[k]) memcpy(b.work + (2 + k) * c, outs[k], pbytes);
  const double count_before = counting ? *running_count : 0.0;
  for (int64_t i = 0; i < c; i++) b.counts[i] = g.count;
  norma_status st = norma_bn_stats_from_moments(&dl, b.counts, gmean, gm2, mean_out, invstd_out,
                                                save_mean, save_invstd,
                                                counting ? NULL : running_mean,
                                                counting ? NULL : running_var, momentum);
  if (st == NORMA_OK && counting) {
    /* the count-weighted update with the global count (norma_bn_running_update) */
    double *var = b.work + 6 * c;
    for (int64_t i = 0; i < c; i++) {
      const double v = gm2[i] / (double)g.count;
      var[i] = v < 0.0 ? 0.0 : v;
    }
    st = norma_bn_running_update(&dl, g.count, gmean, var, running_mean, running_var,
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
  int64_t c;
  norma_status local;
  TRY(prologue(fn, comm, d, &s, &c, &local));
  call_buffers b;
  /* work: mean[c], invstd[c] in double, the corrections sx[c] */
  TRY(get_buffers(fn, s, KIND_BWD, c, 3 * c, exchange_mode(), &b));
  const int global_stats = d && (d->flags & NORMA_BN_GLOBAL_STATS) != 0;

  /* 1. local sums */
  rec_hdr h;
  header_init(&h, KIND_BWD, d, s->rank);
  norma_bn_desc dl;
  if (local == NORMA_OK) {
    dl = *d;
    dl.flags &= ~(unsigned)NORMA_CHECK_FINITE;
    local = check_backward(fn, d, &x, &y, dy, gamma, beta, save_mean, save_invstd, dx,
                           &dresidual, dgamma, dbeta);
  }
  const double *mean = NULL, *invstd = NULL;
  memset(b.local, 0, (size_t)(3 * c) * sizeof(double));
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
    local = norma_bn_backward_reduce(&dl, x, y, dy, gamma, beta, mean, invstd, b.local,
                                     b.local + c, x ? b.local + 2 * c : NULL);
    if (local != NORMA_OK) fail_inner(fn, local);
    else {
      h.count = d->n * d->spatial;
      h.from_y = x == NULL;
    }
  }
  if (local != NORMA_OK) {
    h.status = (int32_t)local;
    h.err_rank = s->rank;
    h.count = 0;
    h.from_y = 0;
  }

  /* 2. the exchange, and the verdict */
  rec_hdr g;
  TRY(exchange_all(fn, s, KIND_BWD, &b, &h, local == NORMA_OK ? b.local : NULL, c, local,
                   !global_stats, &g));

  /* 3. dx (the step that could still fail), then dgamma / dbeta.  The rounding correction
        (sum_xhat) applies when every rank with data passed x, as in norma_bn_backward; not
        with GLOBAL_STATS (the mean is a constant, not the batch mean), nor when some rank
        recovered x_hat from y (the offset is then not the same on every rank: uncorrected, as
        PyTorch computes it; the same on every rank). */
  const double *sdy = b.global, *sdyx = b.global + c, *gsx = b.global + 2 * c;
  const int64_t count = g.count >= 1 ? g.count : 1; /* 0 only with GLOBAL_STATS: sums are 0 */
  /* norma_bn_backward's rule, channel by channel: an offset |sum_xhat / count| above 1/16 is
     not rounding but caller-supplied statistics, used as given */
  double *sx = NULL;
  if (!global_stats && !g.from_y) {
    sx = b.work + 2 * c;
    for (int64_t j = 0; j < c; j++)
      sx[j] = bn_xhat_offset(gsx[j], (double)count) != 0.0 ? gsx[j] : 0.0;
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
