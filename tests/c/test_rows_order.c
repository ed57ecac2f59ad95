/* test_rows_order.c - the channels-last kernels give the same bits whatever order they walk
 * memory in.  Far beyond the caches (flag BN_ROWS_SEQ) the backward's sums read whole rows one
 * after the other (ukernels_vec.inc, bwd_sums_seq); else they take strips of a row (AVX-512) or
 * rows by fours.  Each ISA's bwd_sums_rows is called on the same block with and without the
 * flags: f32 / bf16 / f16, every activation, widths with every tail of 8 and 16 lanes (1 ..
 * 1024 channels, and 1040, which the sequential walk does not take, so its sums must not
 * change a bit), row counts around the fours and the blocks of BN_SUMS_BLOCK_ROWS.  Rows of up
 * to BN_SEQ_SUMS_MAX channels add a row at a time under the flag (AVX-512's rows of one strip,
 * up to 64 channels, in registers; the others in L1): their sums are checked bit for bit
 * against that arithmetic done here in scalar f32 (fmaf where the kernels fuse), which
 * every vector ISA must match (no activation, ReLU, add + ReLU; SiLU, whose gradient the test
 * does not model, against the sums without the flag within rounding).  Under the flag, the sums
 * of blocks of 48 channels of the rows (as the engine's threads may split them) must be those
 * of the whole rows, bit for bit, at every width. Likewise the backward's apply (bwd_rows, dx
 * and dresidual), which walks a row at a time in address order under the flag, and with
 * streaming stores a row at a time under BN_ROWS_ONE (rows by fours without it on AVX-512), and
 * with streaming stores against ordinary ones on rows that end inside a line (every row's
 * stores on the line); and the channels-first statistics of consecutive runs (stats_runs)
 * against one run at a time, and those of consecutive channels (stats_chans, and the backward's
 * bwd_sums_chans) against one channel at a time, on every table.  The baseline table takes no
 * flag; an ISA the CPU lacks is said and skipped.
 */
#include "cpu.h"
#include "cpu/ukernels.h"
#include "test_util.h"

static int same_d(double a, double b) {
  return memcmp(&a, &b, sizeof a) == 0 || (a != a && b != b);
}

/* the sums of rows of up to BN_SEQ_SUMS_MAX channels under BN_ROWS_SEQ: in
   each block of BN_SUMS_BLOCK_ROWS rows a row at a time in f32, x_hat = fmaf(x, xs, xo),
   g = dy (where y > 0 with an activation), s2 = fmaf(g, x_hat, s2); the blocks added in double */
static void seq_row_sums(norma_dtype dt, const void *x, const void *y, const void *dy,
                         int64_t rows, int64_t c, const float *cst, int act, double *o) {
  for (int64_t j = 0; j < c; j++) {
    const float xs = cst[C_XS * c + j], xo = cst[C_XO * c + j];
    double d1 = 0.0, d2 = 0.0, d3 = 0.0;
    for (int64_t b = 0; b < rows; b += BN_SUMS_BLOCK_ROWS) {
      float s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
      for (int64_t i = b; i < rows && i < b + BN_SUMS_BLOCK_ROWS; i++) {
        const int64_t e = i * c + j;
        const float xh = fmaf((float)tu_load(dt, x, e), xs, xo);
        float g = (float)tu_load(dt, dy, e);
        if (act != BN_ACT_NONE && !(tu_load(dt, y, e) > 0.0)) g = 0.0f;
        s1 += g, s2 = fmaf(g, xh, s2), s3 += xh;
      }
      d1 += (double)s1, d2 += (double)s2, d3 += (double)s3;
    }
    o[j] = d1, o[c + j] = d2, o[2 * c + j] = d3;
  }
}

static void check_sums(const char *isa, const bn_ukernels *uk, norma_dtype dt) {
  static const int64_t widths[] = {1,   3,   8,   16,  17,   64,   100, 255,
                                   256, 257, 480, 481, 1000, 1024, 1040};
  static const int64_t rowss[] = {1, 3, 4, 5, 63, 64, 65, 130};
  static const int acts[] = {BN_ACT_NONE, BN_ACT_RELU, BN_ACT_ADD_RELU, BN_ACT_SILU};
  if (!uk || !uk->bwd_sums_rows) {
    printf("test_rows_order: %s has no bwd_sums_rows for dtype %d\n", isa, (int)dt);
    return;
  }
  const size_t es = tu_esize(dt);
  tu_rng r = tu_rng_make(77);
  for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++)
    for (size_t ri = 0; ri < sizeof rowss / sizeof rowss[0]; ri++) {
      const int64_t c = widths[wi], rows = rowss[ri], n = rows * c;
      void *x = malloc((size_t)n * es), *y = malloc((size_t)n * es), *dy = malloc((size_t)n * es);
      float *cst = malloc(sizeof(float) * (size_t)(C_COUNT * c));
      double *o[6], *m = malloc(sizeof(double) * (size_t)(3 * c));
      for (int k = 0; k < 6; k++) o[k] = malloc(sizeof(double) * (size_t)c);
      tu_fill_uniform(dt, x, n, &r, -3.0, 3.0);
      tu_fill_uniform(dt, y, n, &r, -1.0, 1.0);
      tu_fill_uniform(dt, dy, n, &r, -1.0, 1.0);
      for (int64_t j = 0; j < c; j++) {
        cst[C_XS * c + j] = (j % 3) ? 0.5f : 2.0f; /* a power of two, as lower_x makes it */
        cst[C_XO * c + j] = (float)tu_uniform(&r, -1.0, 1.0);
        for (int q = 2; q < C_COUNT; q++) cst[q * c + j] = (float)tu_uniform(&r, -1.5, 1.5);
      }
      for (size_t ai = 0; ai < sizeof acts / sizeof acts[0]; ai++) {
        const int act = acts[ai];
        uk->bwd_sums_rows(x, y, dy, rows, c, c, cst, c, act, o[0], o[1], o[2]);
        uk->bwd_sums_rows(x, y, dy, rows, c, c, cst, c, act | BN_PF_AHEAD | BN_ROWS_SEQ, o[3], o[4],
                          o[5]);
        int ok = 1;
        /* the engine may split the channels of these rows among the threads (split_cblock in
           engine.c: blocks of a multiple of 16 channels): each channel's sums must be those of
           the whole rows, whatever block holds it */
        for (int64_t j0 = 0; j0 < c; j0 += 48) {
          const int64_t nc = c - j0 < 48 ? c - j0 : 48;
          const size_t off = (size_t)j0 * es;
          uk->bwd_sums_rows((char *)x + off, (char *)y + off, (char *)dy + off, rows, c, nc,
                            cst + j0, c, act | BN_PF_AHEAD | BN_ROWS_SEQ, m, m + c, m + 2 * c);
          for (int64_t j = 0; j < nc; j++)
            ok &= same_d(m[j], o[3][j0 + j]) & same_d(m[c + j], o[4][j0 + j]) &
                  same_d(m[2 * c + j], o[5][j0 + j]);
        }
        TU_CHECK(ok, "%s dtype %d act %d: %lld rows of %lld channels in order (BN_ROWS_SEQ): "
                 "the sums of blocks of 48 channels differ from those of whole rows", isa,
                 (int)dt, act, (long long)rows, (long long)c);
        ok = 1; /* the checks below report their own failures */
        if (c > BN_SEQ_SUMS_MAX) {
          for (int64_t j = 0; j < c; j++)
            ok &= same_d(o[0][j], o[3][j]) & same_d(o[1][j], o[4][j]) & same_d(o[2][j], o[5][j]);
          TU_CHECK(ok, "%s dtype %d act %d: %lld rows of %lld channels: the sums differ with the "
                   "rows read in order (BN_ROWS_SEQ)", isa, (int)dt, act, (long long)rows,
                   (long long)c);
        } else if (act != BN_ACT_SILU) {
          seq_row_sums(dt, x, y, dy, rows, c, cst, act, m);
          for (int64_t j = 0; j < c; j++)
            ok &= same_d(m[j], o[3][j]) & same_d(m[c + j], o[4][j]) & same_d(m[2 * c + j], o[5][j]);
          TU_CHECK(ok, "%s dtype %d act %d: %lld rows of %lld channels in order (BN_ROWS_SEQ): "
                   "the sums are not those of a row at a time", isa, (int)dt, act,
                   (long long)rows, (long long)c);
        } else { /* within f32 rounding of the rows-by-fours sums (terms below 8 in size; a
                    row left out or taken twice would move them by far more) */
          const double tol = 8e-5 * (double)rows;
          for (int64_t j = 0; j < c; j++)
            ok &= fabs(o[0][j] - o[3][j]) <= tol && fabs(o[1][j] - o[4][j]) <= tol &&
                  fabs(o[2][j] - o[5][j]) <= tol;
          TU_CHECK(ok, "%s dtype %d SiLU: %lld rows of %lld channels in order (BN_ROWS_SEQ): "
                   "the sums are off those by fours", isa, (int)dt, (long long)rows, (long long)c);
        }
      }
      free(x), free(y), free(dy), free(cst), free(m);
      for (int k = 0; k < 6; k++) free(o[k]);
    }
}

/* the inputs of the backward's apply: x, y, dy (n values each) and the constants of c
   channels (C_XS a power of two, as the engine's lowering makes it) */
static void apply_inputs(norma_dtype dt, tu_rng *r, int64_t n, int64_t c, void *x, void *y,
                         void *dy, float *cst) {
  tu_fill_uniform(dt, x, n, r, -3.0, 3.0);
  tu_fill_uniform(dt, y, n, r, -1.0, 1.0);
  tu_fill_uniform(dt, dy, n, r, -1.0, 1.0);
  for (int64_t j = 0; j < c; j++) {
    cst[C_XS * c + j] = (j % 3) ? 0.5f : 2.0f;
    for (int q = 1; q < C_COUNT; q++) cst[q * c + j] = (float)tu_uniform(r, -1.5, 1.5);
  }
}

/* the backward's apply (bwd_rows): dx and dresidual, with the flags `base` and with `base |
   flag`, bit for bit, every activation; the buffers 64-byte aligned for streaming stores, or
   every tensor `off` values past that; nc = c - narrow of the rows' c channels (narrow > 0:
   the first channels of each row, as the engine's channel blocks, the others untouched) */
static void check_apply_rows(const char *isa, const bn_ukernels *uk, norma_dtype dt,
                             const int64_t *widths, size_t nw, const int64_t *rowss, size_t nr,
                             int base, int flag, int64_t off, int64_t narrow, uint64_t seed,
                             const char *what) {
  static const int acts[] = {BN_ACT_NONE, BN_ACT_RELU, BN_ACT_ADD_RELU, BN_ACT_SILU};
  if (!uk || !uk->bwd_rows) return;
  const size_t es = tu_esize(dt);
  tu_rng r = tu_rng_make(seed);
  for (size_t wi = 0; wi < nw; wi++)
    for (size_t ri = 0; ri < nr; ri++) {
      const int64_t c = widths[wi], rows = rowss[ri], n = rows * c + off;
      const int64_t nc = narrow > 0 && narrow < c ? c - narrow : c;
      const size_t tb = ((size_t)n * es + 63) / 64 * 64, ob = (size_t)off * es;
      char *x = aligned_alloc(64, tb), *y = aligned_alloc(64, tb), *dy = aligned_alloc(64, tb),
           *o[4];
      for (int k = 0; k < 4; k++) o[k] = aligned_alloc(64, tb);
      float *cst = malloc(sizeof(float) * (size_t)(C_COUNT * c));
      apply_inputs(dt, &r, n, c, x, y, dy, cst);
      for (size_t ai = 0; ai < sizeof acts / sizeof acts[0]; ai++) {
        const int act = acts[ai] | base;
        for (int k = 0; k < 4; k++) memset(o[k], 0, tb);
        uk->bwd_rows(x + ob, y + ob, dy + ob, o[0] + ob, o[1] + ob, rows, c, nc, cst, c, act);
        uk->bwd_rows(x + ob, y + ob, dy + ob, o[2] + ob, o[3] + ob, rows, c, nc, cst, c,
                     act | flag);
        TU_CHECK(memcmp(o[0], o[2], tb) == 0 && memcmp(o[1], o[3], tb) == 0,
                 "%s dtype %d act %d: the apply of %lld rows of %lld of %lld channels (%lld "
                 "values off the line) differs %s", isa, (int)dt, acts[ai], (long long)rows,
                 (long long)nc, (long long)c, (long long)off, what);
      }
      free(x), free(y), free(dy), free(cst);
      for (int k = 0; k < 4; k++) free(o[k]);
    }
}
static void check_apply_flag(const char *isa, const bn_ukernels *uk, norma_dtype dt,
                             const int64_t *widths, size_t nw, int base, int flag, uint64_t seed,
                             const char *what) {
  static const int64_t rowss[] = {1, 3, 4, 5, 9, 64, 67};
  check_apply_rows(isa, uk, dt, widths, nw, rowss, sizeof rowss / sizeof rowss[0], base, flag,
                   0, 0, seed, what);
}

/* the apply in place (dx == dy, as the API allows) against out of place, bit for bit: the
   line across a row boundary writes the next row's first values before that row is reached,
   which must then not read them again; with and without streaming stores, on the line and
   3 values off it (where the rows after whole groups of rows on one offset begin inside a
   line too) */
static void check_apply_inplace(const char *isa, const bn_ukernels *uk, norma_dtype dt) {
  static const int64_t widths[] = {33, 100, 643, 999, 1000, 1004};
  static const int64_t rowss[] = {1, 5, 17, 64, 67, 130};
  static const int acts[] = {BN_ACT_NONE, BN_ACT_RELU, BN_ACT_SILU};
  static const int flags[] = {0, BN_STORE_NT, BN_STORE_NT | BN_PF_AHEAD};
  if (!uk || !uk->bwd_rows) return;
  const size_t es = tu_esize(dt);
  tu_rng r = tu_rng_make(101);
  for (int64_t off = 0; off <= 3; off += 3)
  for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++)
    for (size_t ri = 0; ri < sizeof rowss / sizeof rowss[0]; ri++) {
      const int64_t c = widths[wi], rows = rowss[ri], n = rows * c + off;
      const size_t tb = ((size_t)n * es + 63) / 64 * 64, ob = (size_t)off * es;
      char *x = aligned_alloc(64, tb), *y = aligned_alloc(64, tb), *dy = aligned_alloc(64, tb);
      char *o = aligned_alloc(64, tb), *d = aligned_alloc(64, tb);
      float *cst = malloc(sizeof(float) * (size_t)(C_COUNT * c));
      apply_inputs(dt, &r, n, c, x, y, dy, cst);
      for (size_t ai = 0; ai < sizeof acts / sizeof acts[0]; ai++)
        for (size_t fi = 0; fi < sizeof flags / sizeof flags[0]; fi++) {
          const int act = acts[ai] | flags[fi];
          memset(o, 0, tb);
          memcpy(d, dy, tb);
          uk->bwd_rows(x + ob, y + ob, dy + ob, o + ob, NULL, rows, c, c, cst, c, act);
          uk->bwd_rows(x + ob, y + ob, d + ob, d + ob, NULL, rows, c, c, cst, c, act);
          TU_CHECK(memcmp(o + ob, d + ob, (size_t)(n - off) * es) == 0,
                   "%s dtype %d act %d flags %d: the apply of %lld rows of %lld channels (%lld "
                   "values off the line) in place differs", isa, (int)dt, acts[ai], flags[fi],
                   (long long)rows, (long long)c, (long long)off);
        }
      free(x), free(y), free(dy), free(o), free(d), free(cst);
    }
}

/* the apply a row at a time in address order (BN_ROWS_SEQ) against the strips / rows by
   fours, and with streaming stores a row at a time (BN_ROWS_ONE, with its prefetch) against
   rows by fours: rows of whole lines there */
static void check_apply(const char *isa, const bn_ukernels *uk, norma_dtype dt) {
  static const int64_t seq_widths[] = {1, 3, 16, 17, 64, 100, 255, 256, 257};
  static const int64_t one_widths[] = {16, 64, 512, 576, 672, 768, 896};
  check_apply_flag(isa, uk, dt, seq_widths, sizeof seq_widths / sizeof seq_widths[0],
                   BN_PF_AHEAD, BN_ROWS_SEQ, 79, "with the rows in order (BN_ROWS_SEQ)");
  check_apply_flag(isa, uk, dt, one_widths, sizeof one_widths / sizeof one_widths[0],
                   BN_PF_AHEAD | BN_STORE_NT, BN_ROWS_ONE, 83,
                   "with streaming stores a row at a time (BN_ROWS_ONE)");
  /* streaming stores against ordinary ones on rows that end inside a line (AVX-512: by fours
     of rows that start on one offset, 4 P rows a group, P = 2 .. 16; the line across each
     row boundary one vector), rows a multiple of the vectors on a tensor off the line, the
     first channels of the rows only, and with the prefetch and far beyond the caches (a row
     at a time on the line) */
  static const int64_t nt_widths[] = {33, 40, 100, 643, 999, 1000, 1004, 1106};
  static const int64_t nt_rows[] = {1, 3, 4, 5, 9, 17, 64, 67, 130};
  static const int64_t off_widths[] = {64, 512, 999};
  const size_t nw = sizeof nt_widths / sizeof nt_widths[0], nr = sizeof nt_rows / sizeof nt_rows[0];
  const size_t no = sizeof off_widths / sizeof off_widths[0];
  check_apply_rows(isa, uk, dt, nt_widths, nw, nt_rows, nr, 0, BN_STORE_NT, 0, 0, 87,
                   "with streaming stores");
  check_apply_rows(isa, uk, dt, off_widths, no, nt_rows, nr, 0, BN_STORE_NT, 3, 0, 89,
                   "with streaming stores");
  check_apply_rows(isa, uk, dt, nt_widths, nw, nt_rows, nr, 0, BN_STORE_NT, 0, 7, 91,
                   "with streaming stores");
  check_apply_rows(isa, uk, dt, nt_widths, nw, nt_rows, nr, BN_PF_AHEAD, BN_STORE_NT, 0, 0, 93,
                   "with streaming stores and the prefetch");
  check_apply_rows(isa, uk, dt, nt_widths, nw, nt_rows, nr, BN_PF_AHEAD | BN_ROWS_SEQ,
                   BN_STORE_NT, 0, 0, 95, "with streaming stores far beyond the caches");
  /* and with ordinary stores (AVX-512: the same fours of rows) against a row at a time */
  check_apply_rows(isa, uk, dt, nt_widths, nw, nt_rows, nr, 0, BN_ROWS_ONE, 0, 0, 97,
                   "a row at a time (BN_ROWS_ONE)");
  check_apply_rows(isa, uk, dt, off_widths, no, nt_rows, nr, 0, BN_ROWS_ONE, 3, 0, 99,
                   "a row at a time (BN_ROWS_ONE)");
}

/* the channels-first statistics of a sample's consecutive channels (stats_runs, whose vector
   kernels overlap pass 2 of one run with pass 1 of the next) against stats_run run by run:
   lengths around the 32-value steps, 1 to 9 runs, data far from zero, constant runs (anchor
   at the minimum), a NaN and infinities, which must come out in the same place */
static void check_runs(const char *isa, const bn_ukernels *uk, norma_dtype dt) {
  static const int64_t lens[] = {1, 5, 16, 31, 32, 33, 63, 64, 65, 100, 784, 3136};
  static const int64_t ms[] = {1, 2, 3, 9};
  if (!uk || !uk->stats_runs || !uk->stats_run) return;
  const size_t es = tu_esize(dt);
  tu_rng r = tu_rng_make(81);
  for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
    for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++)
      for (int kind = 0; kind < 3; kind++) {
        const int64_t len = lens[li], m = ms[mi], n = len * m;
        char *x = malloc((size_t)n * es);
        double *a = malloc(sizeof(double) * (size_t)(3 * m)),
               *b = malloc(sizeof(double) * (size_t)(3 * m));
        for (int64_t q = 0; q < m; q++) {
          const double base = kind == 1 ? 1000.0 + 10.0 * (double)q : 0.0;
          tu_fill_uniform(dt, x + (size_t)(q * len) * es, len, &r, base - 1.0, base + 2.0);
        }
        if (kind == 2) { /* run 0 constant, a NaN in run 1, +-Inf in the last run */
          for (int64_t i = 1; i < len; i++) memcpy(x + (size_t)i * es, x, es);
          if (m > 1) tu_store(dt, x, len + len / 2, NAN);
          if (m > 2) tu_store(dt, x, (m - 1) * len, INFINITY), tu_store(dt, x, n - 1, -INFINITY);
        }
        uk->stats_runs(x, len, m, a);
        for (int64_t q = 0; q < m; q++)
          uk->stats_run(x + (size_t)(q * len) * es, len, 1, 0, NULL, b + 3 * q);
        int ok = 1;
        for (int64_t k = 0; k < 3 * m; k++) ok &= same_d(a[k], b[k]);
        TU_CHECK(ok, "%s dtype %d: stats_runs of %lld runs of %lld values (data %d) differs "
                 "from stats_run run by run", isa, (int)dt, (long long)m, (long long)len, kind);
        free(x), free(a), free(b);
      }
}

/* the statistics of consecutive channels of a channels-first block (stats_chans, whose AVX-512
   kernel takes short runs sixteen channels at a time) against stats_run channel by channel:
   run lengths around the 16-value vectors and the 32-value steps, 1 to 9 runs a sample apart,
   channel counts with every tail of sixteen, data far from zero, constant channels (anchor
   at the minimum), zeros of both signs, NaN and infinities */
static void check_chans(const char *isa, const bn_ukernels *uk, norma_dtype dt) {
  static const int64_t lens[] = {1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 49, 63, 64, 65, 100};
  static const int64_t nrs[] = {1, 2, 3, 9};
  static const int64_t ms[] = {1, 5, 16, 17, 40};
  if (!uk || !uk->stats_chans || !uk->stats_run) return;
  const size_t es = tu_esize(dt);
  tu_rng r = tu_rng_make(85);
  for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
    for (size_t ni = 0; ni < sizeof nrs / sizeof nrs[0]; ni++)
      for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++)
        for (int kind = 0; kind < 4; kind++) {
          const int64_t len = lens[li], nr = nrs[ni], m = ms[mi], c = m + 3;
          const int64_t stride = c * len, n = nr * stride;
          char *x = malloc((size_t)n * es);
          double *a = malloc(sizeof(double) * (size_t)(3 * m)),
                 *b = malloc(sizeof(double) * (size_t)(3 * m));
          for (int64_t j = 0; j < c; j++) {
            const double base = kind == 1 ? 1000.0 + 10.0 * (double)j : 0.0;
            for (int64_t i = 0; i < nr; i++)
              tu_fill_uniform(dt, x + (size_t)(i * stride + j * len) * es, len, &r, base - 1.0,
                              base + 2.0);
          }
          if (kind == 2) /* channel 0 constant, channel 1 all zeros of both signs */
            for (int64_t i = 0; i < nr; i++)
              for (int64_t q = 0; q < len; q++) {
                tu_store(dt, x, i * stride + q, 0.75);
                if (m > 1) tu_store(dt, x, i * stride + len + q, (q + i) % 2 ? -0.0 : 0.0);
              }
          if (kind == 3) { /* a NaN in channel 0, +Inf in channel 2, -Inf and +Inf in the last */
            tu_store(dt, x, (nr - 1) * stride + len / 2, NAN);
            if (m > 2) tu_store(dt, x, 2 * len, INFINITY);
            if (m > 3)
              tu_store(dt, x, (m - 1) * len, -INFINITY),
                  tu_store(dt, x, (nr - 1) * stride + m * len - 1, INFINITY);
          }
          uk->stats_chans(x, len, nr, stride, m, a);
          for (int64_t j = 0; j < m; j++)
            uk->stats_run(x + (size_t)(j * len) * es, len, nr, stride, NULL, b + 3 * j);
          int ok = 1;
          for (int64_t k = 0; k < 3 * m; k++) ok &= same_d(a[k], b[k]);
          TU_CHECK(ok, "%s dtype %d: stats_chans of %lld channels, %lld runs of %lld values (data "
                   "%d) differs from stats_run channel by channel", isa, (int)dt, (long long)m,
                   (long long)nr, (long long)len, kind);
          free(x), free(a), free(b);
        }
}

/* the backward's sums of consecutive channels of a channels-first block (bwd_sums_chans,
   whose AVX-512 kernel takes runs of up to 8 values with the channels packed in a vector's
   lanes) against bwd_sums_run channel by channel, and bwd_sums_run's BN_RUN_CHANS sweep of
   one run per channel against a call per run: each activation, runs around the packing
   (1-9 values, 17), channel counts with every tail, zeros of both signs in dy, a NaN */
static void check_bwd_chans(const char *isa, const bn_ukernels *uk, norma_dtype dt) {
  static const int64_t lens[] = {1, 2, 3, 4, 5, 7, 8, 9, 17};
  static const int64_t nrs[] = {1, 2, 9};
  static const int64_t ms[] = {1, 3, 16, 17, 40};
  static const int acts[] = {BN_ACT_NONE, BN_ACT_RELU, BN_ACT_ADD_RELU, BN_ACT_SILU};
  if (!uk || !uk->bwd_sums_chans || !uk->bwd_sums_run) return;
  const size_t es = tu_esize(dt), cb = dt == NORMA_F64 ? 8 : 4;
  tu_rng r = tu_rng_make(86);
  for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
    for (size_t ni = 0; ni < sizeof nrs / sizeof nrs[0]; ni++)
      for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++)
        for (int kind = 0; kind < 2; kind++) {
          const int64_t len = lens[li], nr = nrs[ni], m = ms[mi], c = m + 3;
          const int64_t stride = c * len, n = nr * stride;
          char *x = malloc((size_t)n * es), *y = malloc((size_t)n * es),
               *dy = malloc((size_t)n * es);
          char *cst = malloc(cb * (size_t)(C_COUNT * c));
          double *a = malloc(sizeof(double) * (size_t)(3 * m)),
                 *b = malloc(sizeof(double) * (size_t)(3 * m));
          tu_fill_uniform(dt, x, n, &r, -3.0, 3.0);
          tu_fill_uniform(dt, y, n, &r, -1.0, 1.0);
          tu_fill_uniform(dt, dy, n, &r, -1.0, 1.0);
          for (int64_t j = 0; j < c; j++) {
            const double xs = (j % 3) ? 0.5 : 2.0, xo = tu_uniform(&r, -1.0, 1.0);
            for (int q = 0; q < C_COUNT; q++) {
              const double v = q == C_XS ? xs : q == C_XO ? xo : tu_uniform(&r, -1.5, 1.5);
              if (cb == 8) ((double *)cst)[q * c + j] = v;
              else ((float *)cst)[q * c + j] = (float)v;
            }
          }
          if (kind == 1) { /* channel 0's dy zeros of both signs, a NaN in the last channel's x */
            for (int64_t i = 0; i < nr; i++)
              for (int64_t q = 0; q < len; q++)
                tu_store(dt, dy, i * stride + q, (q + i) % 2 ? -0.0 : 0.0);
            tu_store(dt, x, (nr - 1) * stride + (m - 1) * len + len / 2, NAN);
          }
          for (size_t ai = 0; ai < sizeof acts / sizeof acts[0]; ai++) {
            const int act = acts[ai];
            uk->bwd_sums_chans(x, y, dy, len, nr, stride, m, cst, c, act, a);
            for (int64_t j = 0; j < m; j++) {
              const size_t o = (size_t)(j * len) * es;
              uk->bwd_sums_run(x + o, y + o, dy + o, len, nr, stride, cst + (size_t)j * cb, c, act,
                               b + 3 * j);
            }
            int ok = 1;
            for (int64_t k = 0; k < 3 * m; k++) ok &= same_d(a[k], b[k]);
            TU_CHECK(ok, "%s dtype %d act %d: bwd_sums_chans of %lld channels, %lld runs of %lld "
                     "values (data %d) differs from bwd_sums_run channel by channel", isa, (int)dt,
                     act, (long long)m, (long long)nr, (long long)len, kind);
            if (nr == 1) { /* one run per channel, back to back: the BN_RUN_CHANS sweep */
              uk->bwd_sums_run(x, y, dy, len, m, len, cst, c, act | BN_RUN_CHANS, a);
              ok = 1;
              for (int64_t k = 0; k < 3 * m; k++) ok &= same_d(a[k], b[k]);
              TU_CHECK(ok, "%s dtype %d act %d: bwd_sums_run's sweep (BN_RUN_CHANS) of %lld runs "
                       "of %lld values (data %d) differs from a call per run", isa, (int)dt, act,
                       (long long)m, (long long)len, kind);
            }
          }
          free(x), free(y), free(dy), free(cst), free(a), free(b);
        }
}

static void check_table(const char *isa, const bn_ukernels *uk, norma_dtype dt) {
  check_sums(isa, uk, dt);
  check_apply(isa, uk, dt);
  check_apply_inplace(isa, uk, dt);
  check_runs(isa, uk, dt);
  check_chans(isa, uk, dt);
  check_bwd_chans(isa, uk, dt);
}

int main(void) {
  int ran = 0;
#if defined(__x86_64__) || defined(_M_X64)
  const norma_cpu_features *f = norma__cpu_features();
  static const norma_dtype dts[] = {NORMA_F32, NORMA_BF16, NORMA_F16};
  for (int d = 0; d < 3; d++) {
    check_runs("scalar", bn_ukernels_scalar(dts[d]), dts[d]);
    check_chans("scalar", bn_ukernels_scalar(dts[d]), dts[d]);
#ifdef NORMA_TEST_HAVE_AVX2
#ifdef NORMA_TEST_HAVE_EMU16
    if (norma__cpu_has_avx2_kernels(f)) check_runs("emu16", bn_ukernels_emu16(dts[d]), dts[d]);
    if (norma__cpu_has_avx2_kernels(f)) check_chans("emu16", bn_ukernels_emu16(dts[d]), dts[d]);
#endif
    if (norma__cpu_has_avx2_kernels(f))
      check_table("avx2", bn_ukernels_avx2(dts[d]), dts[d]), ran++;
#endif
#ifdef NORMA_TEST_HAVE_AVX512
    if (norma__cpu_has_avx512_kernels(f))
      check_table("avx512", bn_ukernels_avx512(dts[d]), dts[d]), ran++;
#ifdef NORMA_TEST_HAVE_AVX512BF16
    if (dts[d] == NORMA_BF16 && f->avx512bf16)
      check_table("avx512bf16", bn_ukernels_avx512bf16(dts[d]), dts[d]), ran++;
#endif
#endif
  }
  (void)f;
#endif
  printf("test_rows_order: %d table(s) checked\n", ran);
  if (ran == 0) {
    printf("test_rows_order: no vector kernels on this CPU: skipped (not a pass)\n");
    return 77;
  }
  return tu_finish("test_rows_order");
}
