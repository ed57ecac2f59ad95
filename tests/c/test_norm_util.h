/* test_norm_util.h - helpers shared by the tests of the norm family (LayerNorm, RMSNorm,
   GroupNorm, InstanceNorm), on top of test_util.h: the shape of a norm's tensor and its groups
   (which statistics group and which channel an element belongs to), fills with a chosen mean
   and spread per group, and comparisons whose tolerance floor depends on the element's group
   or channel (a gradient's natural scale is its group's invstd times gamma, a parameter
   gradient's is the sum of the magnitudes of its terms). */
#ifndef NORMA_TEST_NORM_UTIL_H
#define NORMA_TEST_NORM_UTIL_H

#include "test_util.h"

/* The call (or status) is evaluated once. */
#define EXPECT_OK(call, what)                                                                 \
  do {                                                                                        \
    const norma_status st_ = (call);                                                          \
    TU_CHECK(st_ == NORMA_OK, "[%s] %s returned %s: %s", tu_ctx, what, norma_status_string(st_), \
             norma_last_error());                                                             \
  } while (0)

/* A norm's tensor: n samples (LayerNorm / RMSNorm: rows), c channels (LayerNorm: d), s spatial
   positions (1 for LayerNorm), groups of cpg adjacent channels of one sample (LayerNorm:
   cpg = d, InstanceNorm: cpg = 1), in layout lay (any layout when s == 1). */
typedef struct tn_geo {
  int64_t n, c, s, cpg;
  norma_layout lay;
} tn_geo;

static TU_UNUSED tn_geo tn_geo_ln(int64_t rows, int64_t d) {
  tn_geo g = {rows, d, 1, d, NORMA_CHANNELS_LAST};
  return g;
}
static TU_UNUSED tn_geo tn_geo_gn(int64_t n, int64_t c, int64_t s, int64_t groups,
                                  norma_layout lay) {
  tn_geo g = {n, c, s, c / groups, lay};
  return g;
}
static TU_UNUSED int64_t tn_total(const tn_geo *g) { return g->n * g->c * g->s; }
static TU_UNUSED int64_t tn_ngroups(const tn_geo *g) { return g->n * (g->c / g->cpg); }
/* values per group */
static TU_UNUSED int64_t tn_count(const tn_geo *g) { return g->cpg * g->s; }

static TU_UNUSED int64_t tn_index(const tn_geo *g, int64_t i, int64_t ch, int64_t sp) {
  return tu_index(g->lay, g->c, g->s, i, ch, sp);
}
/* element e -> sample, channel, position */
static TU_UNUSED void tn_decode(const tn_geo *g, int64_t e, int64_t *i, int64_t *ch, int64_t *sp) {
  if (g->lay == NORMA_CHANNELS_FIRST) {
    *sp = e % g->s;
    *ch = (e / g->s) % g->c;
    *i = e / (g->s * g->c);
  } else {
    *ch = e % g->c;
    *sp = (e / g->c) % g->s;
    *i = e / (g->c * g->s);
  }
}
static TU_UNUSED int64_t tn_group_of(const tn_geo *g, int64_t e) {
  int64_t i, ch, sp;
  tn_decode(g, e, &i, &ch, &sp);
  return i * (g->c / g->cpg) + ch / g->cpg;
}
static TU_UNUSED int64_t tn_channel_of(const tn_geo *g, int64_t e) {
  int64_t i, ch, sp;
  tn_decode(g, e, &i, &ch, &sp);
  return ch;
}

/* Group G's elements: calls visit for each (in the group's logical order: channel, position) */
#define TN_FOR_GROUP(g, G, e)                                                                \
  for (int64_t tn_i_ = (G) / ((g)->c / (g)->cpg), tn_c0_ = ((G) % ((g)->c / (g)->cpg)) * (g)->cpg, \
               tn_k_ = 0, e = 0;                                                             \
       tn_k_ < (g)->cpg * (g)->s &&                                                          \
       ((e = tn_index((g), tn_i_, tn_c0_ + tn_k_ / (g)->s, tn_k_ % (g)->s)), 1);             \
       tn_k_++)

/* x = mu[G] + off[ch] + sd[G] * u, u uniform with unit variance: every group has its own mean
   and spread, channels of a group their own offsets (off may be NULL) */
static TU_UNUSED void tn_fill_groups(norma_dtype t, const tn_geo *g, void *x, const double *mu,
                                     const double *sd, const double *off, tu_rng *r) {
  const double a = 1.7320508075688772;
  const int64_t total = tn_total(g);
  for (int64_t e = 0; e < total; e++) {
    const int64_t G = tn_group_of(g, e), ch = tn_channel_of(g, e);
    tu_store(t, x, e, mu[G] + (off ? off[ch] : 0.0) + sd[G] * tu_uniform(r, -a, a));
  }
}

/* Compares count elements of got (type t) against ref (type rt, or double when rt < 0):
   |got - ref| <= tol * max(|ref|, floor), floor = fl, or floors[group of e] when floors and g
   are given, or floors[e] when only floors is.  NaN matches NaN, an infinity the same one.
   One check; the first and the worst mismatch are printed. */
static TU_UNUSED int tn_cmp(const char *what, norma_dtype t, const void *got, int rt,
                            const void *ref, int64_t count, double tol, double fl,
                            const double *floors, const tn_geo *g) {
  int64_t bad = 0, first = -1, worst_i = -1;
  double worst = 0.0;
  for (int64_t e = 0; e < count; e++) {
    const double gv = tu_load(t, got, e);
    const double rv = rt < 0 ? ((const double *)ref)[e] : tu_load((norma_dtype)rt, ref, e);
    const double f = floors ? (g ? floors[tn_group_of(g, e)] : floors[e]) : fl;
    double err = INFINITY;
    int ok;
    if (isnan(rv) || isnan(gv)) ok = isnan(rv) && isnan(gv);
    else if (isinf(rv) || isinf(gv)) ok = gv == rv;
    else {
      const double den = fabs(rv) > f ? fabs(rv) : f;
      err = fabs(gv - rv) / (den > 0 ? den : 1.0);
      ok = err <= tol;
    }
    if (!ok) {
      if (first < 0) first = e;
      bad++;
      if (worst_i < 0 || !(err <= worst)) worst = err, worst_i = e;
    }
  }
  if (!bad) {
    tu_passed++;
    return 1;
  }
#define TN_REF_AT(k) (rt < 0 ? ((const double *)ref)[k] : tu_load((norma_dtype)rt, ref, k))
  tu_check_at(0, __LINE__,
              "[%s] %s: %lld of %lld elements off (tol %.3g); first [%lld] got %.17g ref %.17g; "
              "worst [%lld] got %.17g ref %.17g (rel %.3g, floor %.3g)",
              tu_ctx, what, (long long)bad, (long long)count, tol, (long long)first,
              tu_load(t, got, first), TN_REF_AT(first), (long long)worst_i,
              tu_load(t, got, worst_i), TN_REF_AT(worst_i), worst,
              floors ? (g ? floors[tn_group_of(g, worst_i)] : floors[worst_i]) : fl);
#undef TN_REF_AT
  return 0;
}

/* Values of t equal bitwise?  (compares the stored element values, -0 != +0, NaN == NaN of the
   same bits) */
static TU_UNUSED int tn_same(const char *what, norma_dtype t, const void *a, const void *b,
                             int64_t count) {
  return tu_same_bits(what, a, b, (size_t)count * tu_esize(t));
}

/* 16-bit dtypes have a poison of all ones that is a NaN; every dtype's: see TU_POISON_BYTE */
static TU_UNUSED const norma_dtype TN_DTS[4] = {NORMA_F32, NORMA_F64, NORMA_F16, NORMA_BF16};

#endif
