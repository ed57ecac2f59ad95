/* bench_syncbn.c - cost of SyncBatchNorm over MPI: time per call of the synchronized forward
   and backward against the single-process call on the same local shape, and the time of the
   collective alone (the same record sizes, both exchanges), per rank count.

     mpirun -np P bench_syncbn [--iters K] [--min] [--threads T] [--layout cl|cf]
                               [--dtype f32|bf16|f64] [--shape n,c,h,w]...

   Without --shape: ResNet-50's BN shapes (shared/shapes/resnet50.txt) at 1 and 4 images per
   rank, and two [N, C] shapes.  Every figure is the median (--min: the minimum, for a shared,
   noisy machine) over K timed calls (after warm-up), each call started together on every rank
   (barrier) and timed as the slowest rank's.
   Columns:
     local   norma_bn_forward_training / norma_bn_backward on the local batch, one process
     mpi     the _mpi call (this rank's batch is the local batch; the global batch is P times)
     coll    the exchange alone: MPI_Allgather (ag) or MPI_Allreduce with a non-commutative
             operation (ar) of the library's records (a fixed-size first record, and a second
             for the channels beyond its 512 / 341); "used" is what the automatic choice takes
             for each record (NORMA_MPI_EXCHANGE unset)
     share   coll(used) / mpi
   Also printed once: MPI_Comm_dup + MPI_Comm_free, what a per-call duplicate would add. */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "norma_mpi.h"

static int g_rank, g_size, g_iters = 20, g_use_min = 0;

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Median over iterations of the slowest rank's time of fn(arg), in microseconds. */
typedef void (*bench_fn)(void *arg);
static double time_it(bench_fn fn, void *arg) {
  double *t = malloc(sizeof(double) * (size_t)g_iters);
  for (int w = 0; w < 3; w++) fn(arg);
  for (int i = 0; i < g_iters; i++) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    fn(arg);
    double dt = MPI_Wtime() - t0, mx;
    MPI_Allreduce(&dt, &mx, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    t[i] = mx;
  }
  qsort(t, (size_t)g_iters, sizeof(double), cmp_double);
  double r = t[g_use_min ? 0 : g_iters / 2] * 1e6;
  free(t);
  return r;
}

typedef struct ctx {
  norma_bn_desc d;
  void *x, *y, *dy, *dx;
  float *gamma, *beta, *sm, *sis, *rm, *rv, *dg, *db; /* f32 parameters (f64: doubles) */
  /* the collective alone */
  MPI_Comm comm;
  MPI_Datatype type;
  MPI_Op op;
  void *send, *recv;
  int rec_bytes;
} ctx;

static void run_fwd_local(void *a) {
  ctx *c = a;
  norma_bn_forward_training(&c->d, c->x, NULL, c->gamma, c->beta, c->y, c->sm, c->sis, c->rm,
                            c->rv, 0.1);
}
static void run_fwd_mpi(void *a) {
  ctx *c = a;
  norma_status st = norma_bn_forward_training_mpi(MPI_COMM_WORLD, &c->d, c->x, NULL, c->gamma,
                                                  c->beta, c->y, c->sm, c->sis, c->rm, c->rv, 0.1);
  if (st != NORMA_OK) {
    fprintf(stderr, "forward_mpi: %s\n", norma_mpi_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}
static void run_bwd_local(void *a) {
  ctx *c = a;
  norma_bn_backward(&c->d, c->x, NULL, c->dy, c->gamma, c->beta, c->sm, c->sis, c->dx, NULL,
                    c->dg, c->db);
}
static void run_bwd_mpi(void *a) {
  ctx *c = a;
  norma_status st = norma_bn_backward_mpi(MPI_COMM_WORLD, &c->d, c->x, NULL, c->dy, c->gamma,
                                          c->beta, c->sm, c->sis, c->dx, NULL, c->dg, c->db);
  if (st != NORMA_OK) {
    fprintf(stderr, "backward_mpi: %s\n", norma_mpi_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}
static void run_allgather(void *a) {
  ctx *c = a;
  MPI_Allgather(c->send, c->rec_bytes, MPI_BYTE, c->recv, c->rec_bytes, MPI_BYTE, c->comm);
}
static void run_allreduce(void *a) {
  ctx *c = a;
  MPI_Allreduce(c->send, c->recv, 1, c->type, c->op, c->comm);
}

/* The library's records (src/mpi/bn_mpi.c): a 72-byte header, then per_channel doubles per
   channel; the first record of a call has a fixed size (the header and 8 KiB: the first
   1024 / per_channel channels), and a second one carries the remaining channels when there
   are more.  Each record takes the allgather while (size - 1 - ceil(log2 size)) records are at
   most 32 KiB, else the allreduce. */
#define REC_HDR 72
#define SEG0_DATA 8192
static int use_allgather(size_t rec_bytes) {
  int rounds = 0;
  while ((1 << rounds) < g_size) rounds++;
  const size_t extra = (size_t)(g_size - 1 - rounds);
  return extra == 0 || rec_bytes <= 32768 / extra;
}

/* A non-commutative operation of the record's cost class: adds the doubles after the header. */
static void add_records(void *in, void *inout, int *len, MPI_Datatype *dt) {
  int sz;
  MPI_Type_size(*dt, &sz);
  for (int i = 0; i < *len; i++) {
    const double *a = (const double *)((char *)in + (size_t)i * sz + REC_HDR);
    double *b = (double *)((char *)inout + (size_t)i * sz + REC_HDR);
    for (int k = 0; k < (sz - REC_HDR) / 8; k++) b[k] = a[k] + b[k];
  }
}

/* The exchange of one direction alone, both collectives for every record (ag, ar) and the
   library's choice per record (used, named in which[]: "ag", "ar" or "ag+ar") */
static void coll_times(ctx *c, int per_channel, double *ag, double *ar, double *used,
                       char which[8]) {
  const int64_t seg0_ch = SEG0_DATA / 8 / per_channel;
  size_t bytes[2] = {REC_HDR + SEG0_DATA, 0};
  int nrec = 1;
  if (c->d.c > seg0_ch)
    bytes[1] = REC_HDR + (size_t)(8 * per_channel * (c->d.c - seg0_ch)), nrec = 2;
  *ag = *ar = *used = 0.0;
  which[0] = 0;
  for (int r = 0; r < nrec; r++) {
    c->rec_bytes = (int)bytes[r];
    c->send = calloc(1, bytes[r]);
    c->recv = calloc((size_t)g_size, bytes[r]);
    MPI_Type_contiguous(c->rec_bytes, MPI_BYTE, &c->type);
    MPI_Type_commit(&c->type);
    const double tg = time_it(run_allgather, c), tr = time_it(run_allreduce, c);
    const int g = use_allgather(bytes[r]);
    *ag += tg, *ar += tr, *used += g ? tg : tr;
    strcat(which, r ? (g ? "+ag" : "+ar") : (g ? "ag" : "ar"));
    MPI_Type_free(&c->type);
    free(c->send);
    free(c->recv);
  }
}

static void bench_shape(int64_t n, int64_t ch, int64_t s, norma_layout layout, norma_dtype dt) {
  ctx c;
  memset(&c, 0, sizeof c);
  c.d = (norma_bn_desc){n, ch, s, layout, dt, 1e-5, 0};
  size_t es = dt == NORMA_F64 ? 8 : dt == NORMA_F32 ? 4 : 2, ps = dt == NORMA_F64 ? 8 : 4;
  size_t tb = (size_t)(n * ch * s) * es, pb = (size_t)ch * ps;
  c.x = malloc(tb), c.y = malloc(tb), c.dy = malloc(tb), c.dx = malloc(tb);
  /* deterministic data from 16-bit patterns: finite, moderate f16 / bf16 values, and finite
     f32 / f64 values when read as those (the values do not change the time) */
  for (size_t i = 0; i < tb / 2; i++) {
    ((uint16_t *)c.x)[i] = (uint16_t)(0x3c00u + (i * 2654435761u >> 20) % 0x300u);
    ((uint16_t *)c.dy)[i] = (uint16_t)(0x3400u + (i * 40503u >> 4) % 0x400u);
  }
  float **params[] = {&c.gamma, &c.beta, &c.sm, &c.sis, &c.rm, &c.rv, &c.dg, &c.db};
  for (int i = 0; i < 8; i++) *params[i] = calloc(1, pb);
  for (int64_t k = 0; k < ch; k++) {
    if (dt == NORMA_F64) ((double *)c.gamma)[k] = ((double *)c.rv)[k] = 1.0;
    else c.gamma[k] = c.rv[k] = 1.0f;
  }
  c.comm = MPI_COMM_WORLD;
  MPI_Op_create(add_records, 0 /* not commutative, as the library's */, &c.op);

  run_fwd_mpi(&c); /* the first call duplicates the communicator: not timed */
  double fl = time_it(run_fwd_local, &c), fm = time_it(run_fwd_mpi, &c);
  double bl = time_it(run_bwd_local, &c), bm = time_it(run_bwd_mpi, &c);
  double fag, far, fc, bag, bar, bc;
  char fw[8], bw[8];
  coll_times(&c, 2, &fag, &far, &fc, fw);
  coll_times(&c, 3, &bag, &bar, &bc, bw);
  if (g_rank == 0) {
    char shape[64];
    snprintf(shape, sizeof shape, "%lldx%lldx%lld", (long long)n, (long long)ch, (long long)s);
    printf("%2d  %-16s | fwd local %9.1f mpi %9.1f coll ag %7.1f ar %7.1f used %s %5.1f%% "
           "| bwd local %9.1f mpi %9.1f coll ag %7.1f ar %7.1f used %s %5.1f%%\n",
           g_size, shape, fl, fm, fag, far, fw, 100.0 * fc / fm, bl, bm, bag, bar, bw,
           100.0 * bc / bm);
    fflush(stdout);
  }
  MPI_Op_free(&c.op);
  free(c.x), free(c.y), free(c.dy), free(c.dx);
  for (int i = 0; i < 8; i++) free(*params[i]);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  int threads = 1;
  norma_layout layout = NORMA_CHANNELS_LAST;
  norma_dtype dt = NORMA_F32;
  int64_t shapes[32][4];
  int nshapes = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--iters") && i + 1 < argc) g_iters = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--min")) g_use_min = 1;
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--layout") && i + 1 < argc)
      layout = strcmp(argv[++i], "cf") ? NORMA_CHANNELS_LAST : NORMA_CHANNELS_FIRST;
    else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) {
      const char *t = argv[++i];
      dt = !strcmp(t, "bf16") ? NORMA_BF16 : !strcmp(t, "f64") ? NORMA_F64 : NORMA_F32;
    } else if (!strcmp(argv[i], "--shape") && i + 1 < argc && nshapes < 32) {
      long long a = 1, b = 1, h = 1, w = 1;
      if (sscanf(argv[++i], "%lld,%lld,%lld,%lld", &a, &b, &h, &w) < 2) {
        if (g_rank == 0) fprintf(stderr, "--shape n,c[,h,w]\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
      }
      shapes[nshapes][0] = a, shapes[nshapes][1] = b, shapes[nshapes][2] = h,
      shapes[nshapes][3] = w, nshapes++;
    } else {
      if (g_rank == 0)
        fprintf(stderr, "usage: bench_syncbn [--iters K] [--min] [--threads T] [--layout cl|cf] "
                        "[--dtype f32|bf16|f64] [--shape n,c,h,w]...\n");
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  if (g_iters < 1) g_iters = 1;
  norma_set_num_threads(threads);
  if (!nshapes) {
    static const int64_t rn50[][3] = {{64, 112, 112}, {256, 56, 56}, {64, 56, 56}, {512, 28, 28},
                                      {128, 28, 28},  {1024, 14, 14}, {256, 14, 14},
                                      {2048, 7, 7},   {512, 7, 7}};
    for (int b = 0; b < 2; b++)
      for (int k = 0; k < 9; k++) {
        shapes[nshapes][0] = b ? 4 : 1;
        shapes[nshapes][1] = rn50[k][0];
        shapes[nshapes][2] = rn50[k][1];
        shapes[nshapes][3] = rn50[k][2];
        nshapes++;
      }
    int64_t nc[][2] = {{32, 1024}, {16, 4096}};
    for (int k = 0; k < 2; k++) {
      shapes[nshapes][0] = nc[k][0], shapes[nshapes][1] = nc[k][1];
      shapes[nshapes][2] = shapes[nshapes][3] = 1;
      nshapes++;
    }
  }
  if (g_rank == 0) {
    printf("bench_syncbn: %d ranks, %d thread(s) per rank, %s, %s, %s of %d, times in us "
           "(slowest rank)\n", g_size, threads,
           layout == NORMA_CHANNELS_LAST ? "channels-last" : "channels-first",
           dt == NORMA_F64 ? "f64" : dt == NORMA_BF16 ? "bf16" : "f32",
           g_use_min ? "minimum" : "median", g_iters);
  }
  /* what duplicating the communicator on every call would cost */
  {
    double *t = malloc(sizeof(double) * (size_t)g_iters);
    for (int i = 0; i < g_iters; i++) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      MPI_Comm dup;
      MPI_Comm_dup(MPI_COMM_WORLD, &dup);
      MPI_Comm_free(&dup);
      double dtm = MPI_Wtime() - t0, mx;
      MPI_Allreduce(&dtm, &mx, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      t[i] = mx;
    }
    qsort(t, (size_t)g_iters, sizeof(double), cmp_double);
    if (g_rank == 0)
      printf("MPI_Comm_dup + MPI_Comm_free: %.1f us\n", t[g_use_min ? 0 : g_iters / 2] * 1e6);
    free(t);
  }
  /* the per-channel cost of combining two records (the gamma of docs/distributed.md) */
  if (g_rank == 0) {
    enum { MC = 4096, REPS = 200 };
    static int64_t ca[MC], cb[MC];
    static double ma[MC], qa[MC], mb[MC], qb[MC], sa[3 * MC], sb[3 * MC];
    for (int k = 0; k < MC; k++) {
      ca[k] = 100, cb[k] = 37, ma[k] = k * 0.5, qa[k] = 3.0, mb[k] = k * 0.25, qb[k] = 2.0;
      sb[3 * k] = sb[3 * k + 1] = sb[3 * k + 2] = 1.0;
    }
    double t0 = MPI_Wtime();
    for (int r = 0; r < REPS; r++) {
      for (int k = 0; k < MC; k++) ca[k] = 100; /* keep the counts from growing */
      norma_bn_moments_merge(MC, ca, ma, qa, cb, mb, qb);
    }
    double tm = (MPI_Wtime() - t0) / REPS / MC * 1e9;
    t0 = MPI_Wtime();
    for (int r = 0; r < REPS; r++) {
      for (int k = 0; k < 3 * MC; k++) sa[k] = sa[k] + sb[k];
      __asm__ volatile("" : : "r"(sa) : "memory");
    }
    double ts = (MPI_Wtime() - t0) / REPS / MC * 1e9;
    printf("combine per channel: moments merge %.2f ns, backward sums %.2f ns\n", tm, ts);
  }
  for (int k = 0; k < nshapes; k++)
    bench_shape(shapes[k][0], shapes[k][1], shapes[k][2] * shapes[k][3], layout, dt);
  MPI_Finalize();
  return 0;
}
