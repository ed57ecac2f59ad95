/* fuzz_norms.h - the norm family's descriptors and their validity oracles, for the targets
 * fuzz_ln_*, fuzz_rms_*, fuzz_gn_*, fuzz_in_* (fuzz_common.h does the rest).
 *
 * Written from norma.h (the norm family section and the conventions at its top), not from
 * src/core/api_norms.c:
 *  - norma_ln_desc: rows, d >= 1; dtype one of the four; eps >= 0 and finite; flags: only
 *    NORMA_CHECK_FINITE (the only flag the descriptor lists; no other flag applies to any
 *    LayerNorm / RMSNorm call); rows * d * element size <= NORMA_MAX_TENSOR_BYTES.
 *  - norma_gn_desc: n, c, spatial >= 1; groups >= 1 and dividing c; layout and dtype known;
 *    eps >= 0 and finite; flags within NORMA_RELU | NORMA_SILU | NORMA_CHECK_FINITE, not both
 *    activations; n * c * spatial * element size <= NORMA_MAX_TENSOR_BYTES.
 *  - norma_in_desc: as GroupNorm without groups; flags within NORMA_RELU | NORMA_SILU |
 *    NORMA_BN_BIASED_RUNNING_VAR | NORMA_CHECK_FINITE, not both activations; spatial >= 2 for
 *    the training forward.
 * All products in 128 bits.  A valid descriptor too large to allocate gets force_null: the
 * target passes NULL for a required tensor, so the call must stop at that check.
 */
#ifndef NORMA_FUZZ_NORMS_H
#define NORMA_FUZZ_NORMS_H

#include "fuzz_common.h"

#define FZ_LN_FLAGS ((unsigned)NORMA_CHECK_FINITE)
#define FZ_GN_FLAGS ((unsigned)(NORMA_RELU | NORMA_SILU | NORMA_CHECK_FINITE))
#define FZ_IN_FLAGS ((unsigned)(FZ_GN_FLAGS | NORMA_BN_BIASED_RUNNING_VAR))

static FZ_UNUSED norma_layout fz_layout(fz *r) {
  const unsigned lay = fz_u8(r);
  return (norma_layout)(lay < 250 ? (int)(lay & 1) : lay == 250 ? -1 : 2 + (int)(lay % 3));
}
static FZ_UNUSED norma_dtype fz_dtype(fz *r) {
  const unsigned dt = fz_u8(r);
  return (norma_dtype)(dt < 250 ? (int)(dt & 3) : dt == 250 ? -1 : 4 + (int)(dt % 3));
}

/* Flags: mostly within `allowed`, sometimes one more known bit that the op does not list
   (bits 0-6) or an unknown bit. */
static FZ_UNUSED unsigned fz_family_flags(fz *r, unsigned allowed) {
  unsigned f = fz_u8(r) & allowed;
  if ((f & NORMA_RELU) && (f & NORMA_SILU) && fz_u8(r) < 200) f &= ~(unsigned)NORMA_RELU;
  const unsigned v = fz_u8(r);
  if (v >= 232) f |= 1u << fz_pick(r, 7);
  else if (v >= 224) f |= 1u << (7 + fz_pick(r, 25));
  return f;
}

static FZ_UNUSED int fz_eps_ok(double eps) { return eps >= 0 && isfinite(eps); }
static FZ_UNUSED int fz_bytes_ok(fz_i128 elems, norma_dtype dt) {
  /* elems: a product of two factors below 2^63 (< 2^126), or of such a checked product and a
     third factor */
  if (elems > (fz_i128)NORMA_MAX_TENSOR_BYTES) return 0;
  return elems * (fz_i128)fz_dsize(dt) <= (fz_i128)NORMA_MAX_TENSOR_BYTES;
}
static FZ_UNUSED int fz_acts_ok(unsigned f) { return !((f & NORMA_RELU) && (f & NORMA_SILU)); }

/* ---- LayerNorm / RMSNorm ----------------------------------------------------------------- */

typedef struct fz_ln {
  norma_ln_desc d;
  int present, valid, sizes_ok, force_null;
  int64_t T, R, D; /* tensor elements, rows, features */
} fz_ln;

static FZ_UNUSED void fz_ln_make(fz *r, fz_ln *l, int64_t small) {
  l->present = fz_u8(r) != 0xff;
  l->d.rows = fz_u8(r) < 16 ? (int64_t)fz_pick(r, 2) : fz_size(r, small);
  l->d.d = fz_u8(r) < 16 ? (int64_t)fz_pick(r, 2) : fz_size(r, 4 * small);
  l->d.dtype = fz_dtype(r);
  l->d.eps = fz_eps(r);
  l->d.flags = fz_family_flags(r, FZ_LN_FLAGS);
  const norma_ln_desc *d = &l->d;
  l->valid = l->present && d->rows >= 1 && d->d >= 1 && fz_dtype_ok(d->dtype) &&
             fz_eps_ok(d->eps) && !(d->flags & ~FZ_LN_FLAGS) &&
             fz_bytes_ok((fz_i128)d->rows * d->d, d->dtype);
  if (l->valid) {
    l->T = d->rows * d->d, l->R = d->rows, l->D = d->d;
    l->sizes_ok = l->T <= FZ_CAP_ELEMS;
  } else {
    l->T = 64, l->R = 64, l->D = 64, l->sizes_ok = 0;
  }
  l->force_null = l->valid && !l->sizes_ok;
}
static FZ_UNUSED const norma_ln_desc *fz_ln_ptr(const fz_ln *l) {
  return l->present ? &l->d : NULL;
}

/* ---- GroupNorm / InstanceNorm ------------------------------------------------------------ */

typedef struct fz_gn {
  norma_gn_desc d; /* InstanceNorm: groups == c, copied into an norma_in_desc by fz_in_desc */
  int present, valid, sizes_ok, force_null;
  int64_t T, C, S; /* tensor elements, channels, saved statistics (n * groups) */
} fz_gn;

static FZ_UNUSED int64_t fz_groups(fz *r, int64_t c) {
  const unsigned v = fz_u8(r);
  if (v < 200 && c >= 1 && c <= 4096) { /* a divisor of c */
    int64_t divs[64];
    int nd = 0;
    for (int64_t g = 1; g <= c && nd < 64; g++)
      if (c % g == 0) divs[nd++] = g;
    return divs[fz_pick(r, (unsigned)nd)];
  }
  if (v < 230) return 1 + (int64_t)fz_pick(r, 9);
  static const int64_t bad[] = {0, -1, INT64_MIN, INT64_MAX, (int64_t)1 << 40};
  return v < 240 ? c : bad[fz_pick(r, 5)];
}

/* in: 0 GroupNorm, 1 InstanceNorm (training: spatial >= 2 required) */
static FZ_UNUSED void fz_gn_make(fz *r, fz_gn *g, int in, int training, int64_t small) {
  g->present = fz_u8(r) != 0xff;
  norma_gn_desc *d = &g->d;
  d->n = fz_u8(r) < 16 ? (int64_t)fz_pick(r, 2) : fz_size(r, small);
  d->c = fz_size(r, small);
  d->spatial = fz_u8(r) < 16 ? (int64_t)fz_pick(r, 3) : fz_size(r, small);
  d->groups = in ? d->c : fz_groups(r, d->c);
  d->layout = fz_layout(r);
  d->dtype = fz_dtype(r);
  d->eps = fz_eps(r);
  const unsigned allowed = in ? FZ_IN_FLAGS : FZ_GN_FLAGS;
  d->flags = fz_family_flags(r, allowed);
  g->valid = g->present && d->n >= 1 && d->c >= 1 && d->spatial >= 1 && d->groups >= 1 &&
             d->c % d->groups == 0 &&
             (d->layout == NORMA_CHANNELS_FIRST || d->layout == NORMA_CHANNELS_LAST) &&
             fz_dtype_ok(d->dtype) && fz_eps_ok(d->eps) && !(d->flags & ~allowed) &&
             fz_acts_ok(d->flags) && (!training || d->spatial >= 2);
  if (g->valid) { /* n, c, spatial >= 1: check the products step by step */
    const fz_i128 nc = (fz_i128)d->n * d->c;
    g->valid = fz_bytes_ok(nc, d->dtype) && fz_bytes_ok(nc * d->spatial, d->dtype);
  }
  if (g->valid) {
    g->T = d->n * d->c * d->spatial, g->C = d->c, g->S = d->n * d->groups;
    g->sizes_ok = g->T <= FZ_CAP_ELEMS;
  } else {
    g->T = 64, g->C = 64, g->S = 64, g->sizes_ok = 0;
  }
  g->force_null = g->valid && !g->sizes_ok;
}
static FZ_UNUSED const norma_gn_desc *fz_gn_ptr(const fz_gn *g) {
  return g->present ? &g->d : NULL;
}

static FZ_UNUSED norma_in_desc fz_in_desc(const fz_gn *g) {
  norma_in_desc d = {g->d.n, g->d.c, g->d.spatial, g->d.layout, g->d.dtype, g->d.eps, g->d.flags};
  return d;
}

static FZ_UNUSED int fz_momentum_bad(double m) { return !(m >= 0 && m <= 1); }

#endif
