/* test_isa_equal.c - the vector ISAs agree bit for bit.  The AVX2 and AVX-512 kernels are one
 * source (ukernels_vec.inc) with one accumulation structure, so every op must give identical
 * outputs under NORMA_ISA_AVX2 and NORMA_ISA_AVX512: BatchNorm (training, inference,
 * backward, each activation, both layouts), LayerNorm / RMSNorm (residual, dsum), GroupNorm /
 * InstanceNorm (ReLU, SiLU, both layouts), f32 / f16 / bf16, over shapes with every tail of
 * 8- and 16-lane vectors.
 *
 * On a CPU without AVX-512 the avx512 level exists only under NORMA_EMULATE_AVX512=1 (ctest
 * sets it): the AVX-512 code then runs on simd_emu16.h.  Without either the test says so and
 * exits 77 (ctest: skipped), which is not a pass.
 */
#include "test_util.h"

/* nonzero: compare() puts special values in the first channels of a channels-first x whose
   runs have this many values, and compares NaNs as equal whatever their sign and payload
   (AVX2 and AVX-512 differ there: a NaN channel's save_mean, c = 3, s = 2) */
static int64_t special_s;
typedef struct bufs {
  size_t tb, pb, gb; /* tensor, [c] parameter, [groups] statistics bytes */
  void *x, *r, *dy, *g, *b, *rm, *rv;
  void *out[32];     /* outputs of one run */
  size_t osz[32];
  int nout;
} bufs;

static void *fresh(bufs *B, size_t bytes) {
  void *p = tu_poisoned(bytes);
  B->out[B->nout] = p, B->osz[B->nout] = bytes, B->nout++;
  return p;
}
static void drop(bufs *B) {
  for (int i = 0; i < B->nout; i++) free(B->out[i]);
  B->nout = 0;
}

/* the ops of one case, into fresh outputs; returns 0 when a call failed */
typedef int (*run_fn)(bufs *B, const void *desc);

static int run_bn(bufs *B, const void *dv) {
  const norma_bn_desc *d = dv;
  void *y = fresh(B, B->tb), *sm = fresh(B, B->pb), *si = fresh(B, B->pb);
  void *rm = tu_dup(B->rm, B->pb), *rv = tu_dup(B->rv, B->pb);
  int ok = norma_bn_forward_training(d, B->x, B->r, B->g, B->b, y, sm, si, rm, rv, 0.1) == NORMA_OK;
  memcpy(fresh(B, B->pb), rm, B->pb), memcpy(fresh(B, B->pb), rv, B->pb);
  free(rm), free(rv);
  void *yi = fresh(B, B->tb);
  ok &= norma_bn_forward_inference(d, B->x, B->r, B->g, B->b, B->rm, B->rv, yi) == NORMA_OK;
  void *dx = fresh(B, B->tb), *dr = fresh(B, B->tb), *dg = fresh(B, B->pb), *db = fresh(B, B->pb);
  ok &= norma_bn_backward(d, B->x, y, B->dy, B->g, B->b, sm, si, dx,
                          (d->flags & NORMA_BN_ADD_RELU) ? dr : NULL, dg, db) == NORMA_OK;
  return ok;
}

static int run_ln(bufs *B, const void *dv) {
  const norma_ln_desc *d = dv;
  int ok = 1;
  for (int rms = 0; rms < 2; rms++) {
    void *y = fresh(B, B->tb), *h = fresh(B, B->tb), *sm = fresh(B, B->gb), *si = fresh(B, B->gb);
    void *dx = fresh(B, B->tb);
    void *dg = fresh(B, B->pb);
    if (!rms) {
      void *db = fresh(B, B->pb);
      ok &= norma_ln_forward(d, B->x, B->r, B->g, B->b, y, h, sm, si) == NORMA_OK;
      ok &= norma_ln_backward(d, h, B->dy, B->r, B->g, sm, si, dx, dg, db) == NORMA_OK;
    } else {
      ok &= norma_rms_forward(d, B->x, B->r, B->g, y, h, si) == NORMA_OK;
      ok &= norma_rms_backward(d, h, B->dy, B->r, B->g, si, dx, dg) == NORMA_OK;
    }
  }
  return ok;
}

static int run_gn(bufs *B, const void *dv) {
  const norma_gn_desc *d = dv;
  void *y = fresh(B, B->tb), *sm = fresh(B, B->gb), *si = fresh(B, B->gb);
  void *dx = fresh(B, B->tb), *dg = fresh(B, B->pb), *db = fresh(B, B->pb);
  int ok = norma_gn_forward(d, B->x, B->g, B->b, y, sm, si) == NORMA_OK;
  ok &= norma_gn_backward(d, B->x, y, B->dy, B->g, B->b, sm, si, dx, dg, db) == NORMA_OK;
  return ok;
}

static int run_in(bufs *B, const void *dv) {
  const norma_in_desc *d = dv;
  void *y = fresh(B, B->tb), *sm = fresh(B, B->gb), *si = fresh(B, B->gb);
  void *rm = tu_dup(B->rm, B->pb), *rv = tu_dup(B->rv, B->pb);
  int ok = norma_in_forward_training(d, B->x, B->g, B->b, y, sm, si, rm, rv, 0.1) == NORMA_OK;
  memcpy(fresh(B, B->pb), rm, B->pb), memcpy(fresh(B, B->pb), rv, B->pb);
  free(rm), free(rv);
  void *yi = fresh(B, B->tb);
  ok &= norma_in_forward_inference(d, B->x, B->g, B->b, B->rm, B->rv, yi) == NORMA_OK;
  void *dx = fresh(B, B->tb), *dg = fresh(B, B->pb), *db = fresh(B, B->pb);
  ok &= norma_in_backward(d, B->x, y, B->dy, B->g, B->b, sm, si, dx, dg, db) == NORMA_OK;
  return ok;
}

/* every NaN of a buffer of f32 values (t16: of 16-bit values of dt) to one pattern */
static void nan_canon(void *p, size_t bytes, int t16, norma_dtype dt) {
  if (!t16) {
    for (size_t k = 0; k < bytes / 4; k++) {
      uint32_t u;
      memcpy(&u, (char *)p + 4 * k, 4);
      if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffffu)) u = 0x7fc00000u;
      memcpy((char *)p + 4 * k, &u, 4);
    }
    return;
  }
  const uint16_t e = dt == NORMA_F16 ? 0x7c00 : 0x7f80, canon = dt == NORMA_F16 ? 0x7e00 : 0x7fc0;
  for (size_t k = 0; k < bytes / 2; k++) {
    uint16_t h;
    memcpy(&h, (char *)p + 2 * k, 2);
    if ((h & e) == e && (h & (uint16_t)~(e | 0x8000u))) h = canon;
    memcpy((char *)p + 2 * k, &h, 2);
  }
}
/* runs a case under AVX2 and AVX-512 and compares every output byte for byte */
static void compare(const char *what, run_fn fn, const void *desc, norma_dtype dt, int64_t total,
                    int64_t c, int64_t groups, uint64_t seed) {
  bufs B;
  memset(&B, 0, sizeof B);
  B.tb = (size_t)total * tu_esize(dt), B.pb = (size_t)c * tu_psize(dt);
  B.gb = (size_t)groups * tu_psize(dt);
  tu_rng r = tu_rng_make(seed);
  B.x = tu_alloc(B.tb), B.r = tu_alloc(B.tb), B.dy = tu_alloc(B.tb);
  B.g = tu_alloc(B.pb), B.b = tu_alloc(B.pb), B.rm = tu_alloc(B.pb), B.rv = tu_alloc(B.pb);
  tu_fill_uniform(dt, B.x, total, &r, -2.0, 3.0);
  tu_fill_uniform(dt, B.r, total, &r, -1.0, 1.0);
  tu_fill_uniform(dt, B.dy, total, &r, -1.0, 1.0);
  tu_fill_param(dt, B.g, c, &r, 0.5, 1.5);
  tu_fill_param(dt, B.b, c, &r, -0.5, 0.5);
  tu_fill_param(dt, B.rm, c, &r, -0.5, 0.5);
  tu_fill_param(dt, B.rv, c, &r, 0.5, 2.0);
  if (special_s) { /* channels-first x: channel 0 zeros of both signs, 1 a NaN, 2 constant */
    const int64_t n = total / (c * special_s);
    for (int64_t i = 0; i < n; i++)
      for (int64_t p = 0; p < special_s; p++) {
        const int64_t e = i * c * special_s + p;
        tu_store(dt, B.x, e, (i + p) % 2 ? -0.0 : 0.0);
        if (c > 1) tu_store(dt, B.x, e + special_s, i == n - 1 && p == special_s / 2 ? NAN : 1.0);
        if (c > 2) tu_store(dt, B.x, e + 2 * special_s, 1.5);
      }
  }
  (void)norma_set_max_isa(NORMA_ISA_AVX2);
  const int ok2 = fn(&B, desc);
  bufs A = B;
  memcpy(A.out, B.out, sizeof B.out);
  B.nout = 0;
  (void)norma_set_max_isa(NORMA_ISA_AVX512);
  const int ok5 = fn(&B, desc);
  TU_CHECK(ok2 && ok5, "%s: a call failed (%s)", what, norma_last_error());
  for (int i = 0; i < B.nout && i < A.nout; i++) {
    if (special_s) { /* a NaN's sign and payload are not compared */
      const int t16 = B.osz[i] == B.tb && dt != NORMA_F32;
      nan_canon(A.out[i], B.osz[i], t16, dt), nan_canon(B.out[i], B.osz[i], t16, dt);
    }
    TU_CHECK(memcmp(A.out[i], B.out[i], B.osz[i]) == 0, "%s: output %d differs between AVX2 and "
             "AVX-512", what, i);
  }
  drop(&A), drop(&B);
  free(B.x), free(B.r), free(B.dy), free(B.g), free(B.b), free(B.rm), free(B.rv);
}

int main(void) {
  (void)norma_set_max_isa(NORMA_ISA_AVX512);
  if (norma_get_isa() != NORMA_ISA_AVX512) {
    printf("test_isa_equal: no avx512 level on this CPU and NORMA_EMULATE_AVX512 unset: not "
           "run\n");
    return 77;
  }
  (void)norma_set_max_isa(NORMA_ISA_AVX2);
  if (norma_get_isa() != NORMA_ISA_AVX2) {
    printf("test_isa_equal: no AVX2: not run\n");
    return 77;
  }
  const norma_dtype dts[] = {NORMA_F32, NORMA_F16, NORMA_BF16};
  const int64_t cs[] = {1, 3, 8, 15, 16, 17, 33, 64, 129, 250, 300, 1000};
  const int64_t ss[] = {1, 7, 15, 16, 17, 49, 97};
  char what[256];
  uint64_t seed = 1;
  for (int di = 0; di < 3; di++)
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++)
      for (size_t si = 0; si < sizeof ss / sizeof ss[0]; si++)
        for (int lay = 0; lay < 2; lay++) {
          const norma_dtype dt = dts[di];
          const int64_t c = cs[ci], s = ss[si], n = 2;
          if (c * s > 20000) continue;
          const unsigned bnf[] = {0, NORMA_BN_RELU, NORMA_BN_ADD_RELU};
          for (int f = 0; f < 3; f++) {
            norma_bn_desc d = {n, c, s, (norma_layout)lay, dt, 1e-5, bnf[f]};
            snprintf(what, sizeof what, "bn %s %s c=%lld s=%lld flags=%u", tu_dt_name(dt),
                     tu_layout_name(d.layout), (long long)c, (long long)s, bnf[f]);
            compare(what, run_bn, &d, dt, n * c * s, c, c, seed++);
          }
          const unsigned gnf[] = {0, NORMA_RELU, NORMA_SILU};
          const int64_t gs[] = {1, c};
          for (int f = 0; f < 3; f++)
            for (int gi = 0; gi < 2; gi++) {
              norma_gn_desc d = {n, c, s, gs[gi], (norma_layout)lay, dt, 1e-5, gnf[f]};
              snprintf(what, sizeof what, "gn %s %s c=%lld s=%lld G=%lld flags=%u", tu_dt_name(dt),
                       tu_layout_name(d.layout), (long long)c, (long long)s, (long long)gs[gi],
                       gnf[f]);
              compare(what, run_gn, &d, dt, n * c * s, c, n * gs[gi], seed++);
            }
          if (s >= 2) {
            norma_in_desc d = {n, c, s, (norma_layout)lay, dt, 1e-5, NORMA_SILU};
            snprintf(what, sizeof what, "in %s %s c=%lld s=%lld", tu_dt_name(dt),
                     tu_layout_name(d.layout), (long long)c, (long long)s);
            compare(what, run_in, &d, dt, n * c * s, c, n * c, seed++);
          }
          if (lay == 0 && s <= 17) { /* LayerNorm / RMSNorm rows of c * s values */
            norma_ln_desc d = {3, c * s, dt, 1e-5, 0};
            snprintf(what, sizeof what, "ln/rms %s d=%lld", tu_dt_name(dt), (long long)(c * s));
            compare(what, run_ln, &d, dt, 3 * c * s, c * s, 3, seed++);
          }
        }
  /* channels-last rows that end inside a line, large enough for the split schedule: the
     AVX-512 apply takes rows of 728 and 200 channels as aligned super-rows (engine.c), which
     AVX2's vectors fit as they are; 100 and 468 channels the other way round (AVX-512's
     strips: the backward's up to 480 channels); 728 channels take the backward's wider strips
     (rows over 480 channels in the caches whose stride does not alias, ukernels_vec.inc) */
  const int64_t wide_cs[] = {728, 468, 200, 100};
  for (int di = 0; di < 3; di++)
    for (size_t ci = 0; ci < sizeof wide_cs / sizeof wide_cs[0]; ci++) {
      const norma_dtype dt = dts[di];
      const int64_t c = wide_cs[ci], s = 49, n = 8;
      const unsigned bnf[] = {0, NORMA_BN_RELU, NORMA_BN_ADD_RELU};
      for (int f = 0; f < 3; f++) {
        norma_bn_desc d = {n, c, s, NORMA_CHANNELS_LAST, dt, 1e-5, bnf[f]};
        snprintf(what, sizeof what, "bn %s channels_last c=%lld s=%lld n=%lld flags=%u",
                 tu_dt_name(dt), (long long)c, (long long)s, (long long)n, bnf[f]);
        compare(what, run_bn, &d, dt, n * c * s, c, c, seed++);
      }
      norma_gn_desc d = {1, c, 4 * s, c / 4, NORMA_CHANNELS_LAST, dt, 1e-5, NORMA_SILU};
      snprintf(what, sizeof what, "gn %s channels_last c=%lld s=%lld n=1 G=%lld", tu_dt_name(dt),
               (long long)c, (long long)(4 * s), (long long)(c / 4));
      compare(what, run_gn, &d, dt, c * 4 * s, c, c / 4, seed++);
    }
  /* channels-first runs of up to 8 values, whose statistics AVX-512 takes with the channels
     packed in a vector's lanes (k_stats_chans_packed) and AVX2 a channel at a time: n = 9
     takes a segment of 8 samples and one of 1; signed zeros, a NaN and a constant channel
     meet its trees' padding */
  const int64_t short_s[] = {2, 3, 4, 5, 8}, short_c[] = {1, 3, 17, 64, 129}, short_n[] = {1, 2, 9};
  for (int di = 0; di < 3; di++)
    for (size_t si = 0; si < sizeof short_s / sizeof short_s[0]; si++)
      for (size_t ci = 0; ci < sizeof short_c / sizeof short_c[0]; ci++)
        for (size_t ni = 0; ni < sizeof short_n / sizeof short_n[0]; ni++)
          for (int sp = 0; sp < 2; sp++) {
            const norma_dtype dt = dts[di];
            const int64_t c = short_c[ci], s = short_s[si], n = short_n[ni];
            norma_bn_desc d = {n, c, s, NORMA_CHANNELS_FIRST, dt, 1e-5, 0};
            snprintf(what, sizeof what, "bn %s channels_first n=%lld c=%lld s=%lld%s",
                     tu_dt_name(dt), (long long)n, (long long)c, (long long)s,
                     sp ? " special values" : "");
            special_s = sp ? s : 0;
            compare(what, run_bn, &d, dt, n * c * s, c, c, seed++);
          }
  special_s = 0;
  /* channels-last tensors beyond NORM_SEQ_BYTES (32 MiB), whose backward sums go in address
     order: rows of 48 channels (AVX2 by fours, AVX-512 in its one strip), 200 (both a row at
     a time) and 300 (a row at a time; in the caches AVX-512's strips and AVX2's rows by
     fours); an odd number of rows, so that the rows of 200 and 300 channels, which end inside
     a line, stay as they are (no wide view); bf16's rows of 48 channels take the wide view's
     rows of 96 (op_bn.c, wide_factor) */
  if (!tu_quick()) {
    const int64_t far_c[] = {48, 200, 300}, far_n[] = {17, 5, 3}, far_n16[] = {34, 9, 7};
    const int64_t s = 10609;
    for (int di = 0; di < 3; di += 2)
      for (size_t ci = 0; ci < sizeof far_c / sizeof far_c[0]; ci++) {
        const norma_dtype dt = dts[di];
        const int64_t c = far_c[ci], n = dt == NORMA_F32 ? far_n[ci] : far_n16[ci];
        const unsigned bnf[] = {0, NORMA_BN_ADD_RELU};
        for (int f = 0; f < 2; f++) {
          norma_bn_desc d = {n, c, s, NORMA_CHANNELS_LAST, dt, 1e-5, bnf[f]};
          snprintf(what, sizeof what, "bn %s channels_last beyond the caches n=%lld c=%lld "
                   "s=%lld flags=%u", tu_dt_name(dt), (long long)n, (long long)c,
                   (long long)s, bnf[f]);
          compare(what, run_bn, &d, dt, n * c * s, c, c, seed++);
        }
      }
  }
  return tu_finish("test_isa_equal");
}
