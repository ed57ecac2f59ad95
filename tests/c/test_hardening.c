/* test_hardening.c - the contract at its edges (issue 12):
 *  - size products: counts and sizes whose products overflow int64 are rejected before they
 *    are formed (norma_bn_moments_merge, norma_bn_moments_accumulate, norma_bn_query_plan and
 *    every descriptor: NORMA_MAX_TENSOR_BYTES), with nothing written;
 *  - overlaps: every split-API function rejects an output that overlaps another argument
 *    (partially or exactly), except the exact in-place aliasing norma.h allows;
 *  - the ADD_RELU backward's dresidual may alias x, y or dy exactly (norma.h's list) and gives
 *    the same bits as with a separate buffer.
 * Built with -fsanitize=undefined in the sanitizer job: a signed overflow there fails the run.
 */
#include "test_util.h"

#define EXPECT(st, want, what)                                                                 \
  TU_CHECK((st) == (want), "%s: got %s, expected %s (%s)", what, norma_status_string(st),      \
           norma_status_string(want), norma_last_error())

/* ---- overflow ------------------------------------------------------------------------------ */

static void merge_overflow(void) {
  int64_t ca[2] = {INT64_MAX - 1, 3}, cb[2] = {5, 4};
  double ma[2] = {1, 2}, qa[2] = {3, 4}, mb[2] = {5, 6}, qb[2] = {7, 8};
  int64_t ca0[2];
  double ma0[2], qa0[2];
  memcpy(ca0, ca, sizeof ca), memcpy(ma0, ma, sizeof ma), memcpy(qa0, qa, sizeof qa);
  norma_status st = norma_bn_moments_merge(2, ca, ma, qa, cb, mb, qb);
  EXPECT(st, NORMA_ERR_INVALID_ARGUMENT, "merge: INT64_MAX - 1 + 5");
  TU_CHECK(!memcmp(ca, ca0, sizeof ca) && !memcmp(ma, ma0, sizeof ma) &&
               !memcmp(qa, qa0, sizeof qa),
           "merge: a was written on error (count_a[0] = %lld)", (long long)ca[0]);
  TU_CHECK(strstr(norma_last_error(), "overflow") != NULL, "merge message: %s", norma_last_error());
  /* the largest sum that fits is accepted */
  int64_t c1[1] = {INT64_MAX - 5}, c2[1] = {5};
  double m1[1] = {0}, q1[1] = {0}, m2v[1] = {0}, q2[1] = {0};
  st = norma_bn_moments_merge(1, c1, m1, q1, c2, m2v, q2);
  EXPECT(st, NORMA_OK, "merge: INT64_MAX - 5 + 5");
  TU_CHECK(c1[0] == INT64_MAX, "merge: count %lld", (long long)c1[0]);
}

static void accumulate_overflow(void) {
  float x[4] = {1, 2, 3, 4};
  int64_t cnt[2] = {INT64_MAX, 0};
  double mean[2] = {1, 0}, m2[2] = {0, 0};
  norma_status st = norma_bn_moments_accumulate(NORMA_F32, 2, 2, x, 2, 1, cnt, mean, m2);
  EXPECT(st, NORMA_ERR_INVALID_ARGUMENT, "accumulate: count INT64_MAX + 2 rows");
  TU_CHECK(cnt[0] == INT64_MAX && cnt[1] == 0 && mean[0] == 1 && mean[1] == 0,
           "accumulate: written on error (count %lld %lld)", (long long)cnt[0], (long long)cnt[1]);
  cnt[0] = INT64_MAX - 2;
  st = norma_bn_moments_accumulate(NORMA_F32, 2, 2, x, 2, 1, cnt, mean, m2);
  EXPECT(st, NORMA_OK, "accumulate: count INT64_MAX - 2 + 2 rows");
  TU_CHECK(cnt[0] == INT64_MAX && cnt[1] == 2, "accumulate: counts %lld %lld", (long long)cnt[0],
           (long long)cnt[1]);
}

/* A tile of one row may have any row stride: the kernels must not form ld * element size.
   libFuzzer under clang's UBSan found INT64_MAX * 2 in the rows statistics; gcc folds that
   product into a mask, so under gcc's sanitizers this test passed on the faulty code too: the
   input kept as tests/fuzz/corpus/bn_moments_accumulate/regress-237443e68507 (scripts/fuzz.sh)
   is what fails there.  Here: one row gives mean = x, m2 = 0, on every instruction set the CPU
   has and every storage type. */
static void accumulate_huge_row_stride(void) {
  const norma_dtype dts[4] = {NORMA_F32, NORMA_F64, NORMA_F16, NORMA_BF16};
  const int64_t strides[3] = {INT64_MAX, INT64_MAX / 4 + 1, (int64_t)1 << 40};
  const float v[5] = {1.5f, -2.0f, 0.25f, 3.0f, -0.5f};
  const norma_isa before = norma_get_isa();
  for (int isa = NORMA_ISA_SCALAR; isa <= NORMA_ISA_AVX512; isa++) {
    if (norma_set_max_isa((norma_isa)isa) != NORMA_OK) continue;
    for (int d = 0; d < 4; d++)
      for (int s = 0; s < 3; s++) {
        unsigned char buf[5 * 8];
        for (int j = 0; j < 5; j++) tu_store(dts[d], buf, j, v[j]);
        int64_t cnt[5] = {0};
        double mean[5] = {0}, m2[5] = {0};
        norma_status st =
            norma_bn_moments_accumulate(dts[d], 1, 5, buf, strides[s], 1, cnt, mean, m2);
        EXPECT(st, NORMA_OK, "accumulate: one row, row stride 2^k");
        for (int j = 0; j < 5; j++)
          TU_CHECK(cnt[j] == 1 && mean[j] == (double)v[j] && m2[j] == 0.0,
                   "accumulate %s isa %d stride %lld channel %d: count %lld mean %g m2 %g",
                   tu_dt_name(dts[d]), isa, (long long)strides[s], j, (long long)cnt[j],
                   mean[j], m2[j]);
      }
  }
  norma_set_max_isa(before);
}

static void descriptor_bounds(void) {
  norma_bn_plan plan, plan0;
  memset(&plan, 0x5a, sizeof plan);
  memcpy(&plan0, &plan, sizeof plan);
  /* the case: 2^58 * 2 f32 values = 2^61 bytes, representable but far past any
     machine; planning products formed from it overflowed */
  for (int dt = 0; dt < 4; dt++)
    for (int lay = 0; lay < 2; lay++)
      for (int op = 0; op < 3; op++) {
        norma_bn_desc d = {(int64_t)1 << 58, 1, 2, (norma_layout)lay, (norma_dtype)dt, 1e-5, 0};
        norma_status st = norma_bn_query_plan(&d, (norma_bn_op)op, &plan);
        EXPECT(st, NORMA_ERR_INVALID_ARGUMENT, "query_plan n = 2^58");
        TU_CHECK(!memcmp(&plan, &plan0, sizeof plan), "query_plan wrote the plan on error");
      }
  /* the documented bound, exactly: NORMA_MAX_TENSOR_BYTES accepted, one element more not */
  const int64_t max_f32 = (int64_t)(NORMA_MAX_TENSOR_BYTES / 4);
  norma_bn_desc ok = {max_f32 / 1024, 1024, 1, NORMA_CHANNELS_LAST, NORMA_F32, 1e-5, 0};
  norma_status st = norma_bn_query_plan(&ok, NORMA_BN_OP_FORWARD_TRAINING, &plan);
  EXPECT(st, NORMA_OK, "query_plan at NORMA_MAX_TENSOR_BYTES");
  for (int op = 0; op < 3; op++) {
    ok.layout = NORMA_CHANNELS_FIRST;
    st = norma_bn_query_plan(&ok, (norma_bn_op)op, &plan);
    EXPECT(st, NORMA_OK, "query_plan at NORMA_MAX_TENSOR_BYTES (channels-first)");
  }
  norma_bn_desc big = {max_f32 / 1024 + 1, 1024, 1, NORMA_CHANNELS_LAST, NORMA_F32, 1e-5, 0};
  st = norma_bn_query_plan(&big, NORMA_BN_OP_FORWARD_TRAINING, &plan);
  EXPECT(st, NORMA_ERR_INVALID_ARGUMENT, "query_plan past NORMA_MAX_TENSOR_BYTES");
  TU_CHECK(strstr(norma_last_error(), "NORMA_MAX_TENSOR_BYTES") != NULL, "message: %s",
           norma_last_error());
  /* products that wrap int64 itself */
  norma_bn_desc wrap = {INT64_MAX / 2, 3, 1, NORMA_CHANNELS_FIRST, NORMA_F32, 1e-5, 0};
  st = norma_bn_query_plan(&wrap, NORMA_BN_OP_FORWARD_INFERENCE, &plan);
  EXPECT(st, NORMA_ERR_INVALID_ARGUMENT, "query_plan n * c wraps");
  /* the split API with n == 0 still bounds c * spatial (the per-rank tensor of other calls) */
  int64_t cnt[1];
  double mean[1], m2[1];
  norma_bn_desc z = {0, 1, INT64_MAX, NORMA_CHANNELS_FIRST, NORMA_F32, 1e-5, 0};
  st = norma_bn_moments(&z, NULL, cnt, mean, m2);
  EXPECT(st, NORMA_OK, "moments n = 0 spatial INT64_MAX (empty tensor)");
}

/* ---- overlaps in the split API -------------------------------------------------------------- */

static void split_overlaps(void) {
  enum { C = 4 };
  /* merge: a's three arrays and b's three are pairwise disjoint */
  double buf[4 * C];
  int64_t ca[C], cb[C] = {1, 1, 1, 1};
  for (int i = 0; i < C; i++) ca[i] = 2;
  for (int i = 0; i < 4 * C; i++) buf[i] = i;
  double saved[4 * C];
  memcpy(saved, buf, sizeof buf);
  norma_status st = norma_bn_moments_merge(C, ca, buf, buf + 2, cb, buf + 2 * C, buf + 3 * C);
  EXPECT(st, NORMA_ERR_INVALID_ARGUMENT, "merge: mean_a overlaps m2_a");
  TU_CHECK(!memcmp(saved, buf, sizeof buf) && ca[0] == 2, "merge wrote on error");
  st = norma_bn_moments_merge(C, ca, buf, buf + C, cb, buf, buf + 3 * C);
  EXPECT(st, NORMA_ERR_INVALID_ARGUMENT, "merge: mean_b == mean_a");
  st = norma_bn_moments_merge(C, ca, buf, buf + C, ca, buf + 2 * C, buf + 3 * C);
  EXPECT(st, NORMA_ERR_INVALID_ARGUMENT, "merge: count_b == count_a");
  st = norma_bn_moments_merge(C, ca, buf, buf + C, (const int64_t *)(buf + 1), buf + 2 * C,
                              buf + 3 * C);
  EXPECT(st, NORMA_ERR_INVALID_ARGUMENT, "merge: count_b overlaps mean_a");
  st = norma_bn_moments_merge(C, ca, buf, buf + C, cb, buf + 2 * C, buf + 3 * C);
  EXPECT(st, NORMA_OK, "merge: disjoint");

  /* accumulate: the outputs must not overlap the tile */
  float tile[2 * C + 8];
  for (int i = 0; i < 2 * C + 8; i++) tile[i] = (float)i;
  double mm[2 * C];
  int64_t cnt[C] = {0};
  for (int i = 0; i < 2 * C; i++) mm[i] = 0;
  st = norma_bn_moments_accumulate(NORMA_F32, 2, C, tile, C, 1, cnt, (double *)(void *)tile, mm);
  EXPECT(st, NORMA_ERR_INVALID_ARGUMENT, "accumulate: mean aliases the tile");
  st = norma_bn_moments_accumulate(NORMA_F32, 2, C, tile, C, 1, (int64_t *)(void *)(tile + 4), mm,
                                   mm + C);
  EXPECT(st, NORMA_ERR_INVALID_ARGUMENT, "accumulate: count inside the tile");
  st = norma_bn_moments_accumulate(NORMA_F32, 2, C, tile, C, 1, cnt, mm, mm + 1);
  EXPECT(st, NORMA_ERR_INVALID_ARGUMENT, "accumulate: mean overlaps m2");
  TU_CHECK(cnt[0] == 0 && mm[0] == 0, "accumulate wrote on error");
  st = norma_bn_moments_accumulate(NORMA_F32, 2, C, tile, C, 1, cnt, mm, mm + C);
  EXPECT(st, NORMA_OK, "accumulate: disjoint");

  /* backward_reduce: the sums must not overlap the tensors */
  norma_bn_desc d = {2, C, 2, NORMA_CHANNELS_FIRST, NORMA_F64, 1e-5, 0};
  double x[16], dy[16], mean[C] = {0}, inv[C] = {1, 1, 1, 1}, s1[C], s2[C];
  for (int i = 0; i < 16; i++) x[i] = i, dy[i] = 1;
  double x0[16];
  memcpy(x0, x, sizeof x);
  st = norma_bn_backward_reduce(&d, x, NULL, dy, NULL, NULL, mean, inv, x + 4, s2, NULL);
  EXPECT(st, NORMA_ERR_INVALID_ARGUMENT, "backward_reduce: sum_dy inside x");
  TU_CHECK(!memcmp(x, x0, sizeof x), "backward_reduce wrote x");
  st = norma_bn_backward_reduce(&d, x, NULL, dy, NULL, NULL, mean, inv, s1, dy, NULL);
  EXPECT(st, NORMA_ERR_INVALID_ARGUMENT, "backward_reduce: sum_dy_xhat == dy");
  st = norma_bn_backward_reduce(&d, x, NULL, dy, NULL, NULL, mean, inv, s1, s2, NULL);
  EXPECT(st, NORMA_OK, "backward_reduce: disjoint");

  /* moments: outputs inside x */
  int64_t mc[C];
  double mmean[C];
  st = norma_bn_moments(&d, x, mc, mmean, x + 8);
  EXPECT(st, NORMA_ERR_INVALID_ARGUMENT, "moments: m2 inside x");
}

/* ---- ADD_RELU backward: dresidual aliasing x, y or dy ---------------------------------------- */

static void dresidual_aliasing(void) {
  enum { N = 3, C = 5, S = 7, T = N * C * S };
  for (int dt = 0; dt < 4; dt++)
    for (int lay = 0; lay < 2; lay++) {
      norma_dtype t = (norma_dtype)dt;
      tu_set_ctx("dresidual aliasing %s %s", tu_dt_name(t), tu_layout_name((norma_layout)lay));
      const size_t es = tu_esize(t), ps = tu_psize(t);
      norma_bn_desc d = {N, C, S, (norma_layout)lay, t, 1e-5, NORMA_BN_ADD_RELU};
      tu_rng r = tu_rng_make(77 + (uint64_t)dt * 2 + (uint64_t)lay);
      void *x = tu_alloc(T * es), *res = tu_alloc(T * es), *y = tu_alloc(T * es);
      void *dy = tu_alloc(T * es), *dx = tu_alloc(T * es), *dres = tu_alloc(T * es);
      void *sm = tu_alloc(C * ps), *sis = tu_alloc(C * ps), *g = tu_alloc(C * ps);
      void *dg = tu_alloc(C * ps), *db = tu_alloc(C * ps);
      tu_fill_uniform(t, x, T, &r, -2, 2);
      tu_fill_uniform(t, res, T, &r, -1, 1);
      tu_fill_uniform(t, dy, T, &r, -1, 1);
      tu_fill_param(t, g, C, &r, 0.5, 1.5);
      norma_status st = norma_bn_forward_training(&d, x, res, g, NULL, y, sm, sis, NULL, NULL, 0);
      EXPECT(st, NORMA_OK, "forward");
      /* reference: separate outputs */
      st = norma_bn_backward(&d, x, y, dy, g, NULL, sm, sis, dx, dres, dg, db);
      EXPECT(st, NORMA_OK, "backward, separate dresidual");
      const char *names[3] = {"x", "y", "dy"};
      for (int k = 0; k < 3; k++) {
        void *xa = tu_dup(x, T * es), *ya = tu_dup(y, T * es), *dya = tu_dup(dy, T * es);
        void *target = k == 0 ? xa : k == 1 ? ya : dya;
        void *dx2 = tu_alloc(T * es), *dg2 = tu_alloc(C * ps), *db2 = tu_alloc(C * ps);
        st = norma_bn_backward(&d, xa, ya, dya, g, NULL, sm, sis, dx2, target, dg2, db2);
        char what[64];
        snprintf(what, sizeof what, "backward, dresidual == %s", names[k]);
        EXPECT(st, NORMA_OK, what);
        tu_same_bits(what, target, dres, T * es);
        tu_same_bits("dx", dx2, dx, T * es);
        tu_same_bits("dgamma", dg2, dg, C * ps);
        tu_same_bits("dbeta", db2, db, C * ps);
        free(xa), free(ya), free(dya), free(dx2), free(dg2), free(db2);
      }
      /* still rejected: dresidual == dx, and a partial overlap with x */
      st = norma_bn_backward(&d, x, y, dy, g, NULL, sm, sis, dx, dx, NULL, NULL);
      EXPECT(st, NORMA_ERR_INVALID_ARGUMENT, "dresidual == dx");
      st = norma_bn_backward(&d, x, y, dy, g, NULL, sm, sis, dx, (char *)x + es, NULL, NULL);
      EXPECT(st, NORMA_ERR_INVALID_ARGUMENT, "dresidual overlaps x partially");
      free(x), free(res), free(y), free(dy), free(dx), free(dres);
      free(sm), free(sis), free(g), free(dg), free(db);
    }
}

/* norma_set_streaming_stores: the plan reports the streaming stores its range gives; bad
   values are rejected; results do not depend on it */
static void streaming_range(void) {
  /* 32 MiB of f32, channels-first (whole lines): streaming by default (>= 8 MiB, and the
     call's tensors over 32 MiB) */
  norma_bn_desc d = {4, 64, 32768, NORMA_CHANNELS_FIRST, NORMA_F32, 1e-5, 0};
  norma_bn_plan p;
  const int64_t big = (int64_t)1 << 62;
  EXPECT(norma_bn_query_plan(&d, 0, &p), NORMA_OK, "plan");
  TU_CHECK(p.streaming_stores == 1, "default: streaming %d", p.streaming_stores);
  {
    /* 12 MiB: its forward reads and writes 24 MiB, which the caches keep between calls (no
       streaming); its backward 36 MiB (streaming); a minimum set by the user decides alone */
    norma_bn_desc m = {4, 64, 12288, NORMA_CHANNELS_FIRST, NORMA_F32, 1e-5, 0};
    EXPECT(norma_bn_query_plan(&m, NORMA_BN_OP_FORWARD_TRAINING, &p), NORMA_OK, "plan 12 MiB");
    TU_CHECK(p.streaming_stores == 0, "12 MiB forward: streaming %d", p.streaming_stores);
    EXPECT(norma_bn_query_plan(&m, NORMA_BN_OP_FORWARD_INFERENCE, &p), NORMA_OK, "plan 12 MiB");
    TU_CHECK(p.streaming_stores == 0, "12 MiB inference: streaming %d", p.streaming_stores);
    EXPECT(norma_bn_query_plan(&m, NORMA_BN_OP_BACKWARD, &p), NORMA_OK, "plan 12 MiB");
    TU_CHECK(p.streaming_stores == 1, "12 MiB backward: streaming %d", p.streaming_stores);
    m.flags = NORMA_BN_ADD_RELU; /* x, residual, y: 36 MiB */
    EXPECT(norma_bn_query_plan(&m, NORMA_BN_OP_FORWARD_TRAINING, &p), NORMA_OK, "plan 12 MiB");
    TU_CHECK(p.streaming_stores == 1, "12 MiB add-relu forward: streaming %d", p.streaming_stores);
    m.flags = 0;
    EXPECT(norma_set_streaming_stores((int64_t)8 << 20, big), NORMA_OK, "min 8 MiB");
    EXPECT(norma_bn_query_plan(&m, NORMA_BN_OP_FORWARD_TRAINING, &p), NORMA_OK, "plan 12 MiB");
    TU_CHECK(p.streaming_stores == 1, "12 MiB forward, min 8 MiB: streaming %d",
             p.streaming_stores);
    EXPECT(norma_set_streaming_stores(0, big), NORMA_OK, "defaults");
  }
  EXPECT(norma_set_streaming_stores(0, (int64_t)8 << 20), NORMA_OK, "max 8 MiB");
  EXPECT(norma_bn_query_plan(&d, 0, &p), NORMA_OK, "plan");
  TU_CHECK(p.streaming_stores == 0, "max 8 MiB: streaming %d", p.streaming_stores);
  EXPECT(norma_set_streaming_stores((int64_t)64 << 20, big), NORMA_OK, "min 64 MiB");
  EXPECT(norma_bn_query_plan(&d, 0, &p), NORMA_OK, "plan");
  TU_CHECK(p.streaming_stores == 0, "min 64 MiB: streaming %d", p.streaming_stores);
  EXPECT(norma_set_streaming_stores(-1, big), NORMA_ERR_INVALID_ARGUMENT, "min < 0");
  EXPECT(norma_set_streaming_stores(0, -1), NORMA_ERR_INVALID_ARGUMENT, "max < 0");
  EXPECT(norma_set_streaming_stores(1024, big), NORMA_OK, "min 1 KiB");
  EXPECT(norma_bn_query_plan(&d, 0, &p), NORMA_OK, "plan");
  TU_CHECK(p.streaming_stores == 1, "min 1 KiB: streaming %d", p.streaming_stores);
  /* the same bits with and without streaming stores */
  const int64_t total = d.n * d.c * d.spatial;
  float *x = malloc(sizeof(float) * (size_t)total), *y1 = malloc(sizeof(float) * (size_t)total);
  float *y2 = malloc(sizeof(float) * (size_t)total);
  for (int64_t i = 0; i < total; i++) x[i] = (float)((i * 7919) % 1013) * 0.01f - 3.0f;
  EXPECT(norma_bn_forward_training(&d, x, NULL, NULL, NULL, y1, NULL, NULL, NULL, NULL, 0.1),
         NORMA_OK, "forward, streaming");
  EXPECT(norma_set_streaming_stores(0, 0), NORMA_OK, "none");
  EXPECT(norma_bn_forward_training(&d, x, NULL, NULL, NULL, y2, NULL, NULL, NULL, NULL, 0.1),
         NORMA_OK, "forward, cached");
  TU_CHECK(!memcmp(y1, y2, sizeof(float) * (size_t)total), "streaming stores changed the results");
  EXPECT(norma_set_streaming_stores(0, big), NORMA_OK, "defaults");
  free(x), free(y1), free(y2);
}

int main(void) {
  streaming_range();
  merge_overflow();
  accumulate_overflow();
  accumulate_huge_row_stride();
  descriptor_bounds();
  split_overlaps();
  dresidual_aliasing();
  return tu_finish("test_hardening");
}
