/* geom.h - the geometry of a normalization: the one description every op is reduced to.
 *
 * BatchNorm, InstanceNorm, GroupNorm, LayerNorm and RMSNorm are one computation: reduce over a
 * set of values (a *group*), then normalize each value with its group's statistics and an
 * affine indexed by its channel.  They differ only in which values form a group:
 *
 *   tensor       [n][c][s] (channels-first) or [n][s][c] (channels-last)
 *   BatchNorm    group = one channel over all samples and positions      per_sample = 0, cpg = 1
 *   InstanceNorm group = one channel of one sample                       per_sample = 1, cpg = 1
 *   GroupNorm    group = cpg adjacent channels of one sample              per_sample = 1, cpg = c/G
 *   LayerNorm    group = one row of a [rows, d] tensor: n = rows, c = d, s = 1, cpg = d
 *   RMSNorm      LayerNorm's geometry with the mean square as statistic   rms = 1
 *
 * The affine (gamma, beta) is always per channel (for LayerNorm the channel is the element of
 * the normalized shape).  A tensor with s == 1 is stored the same way in both layouts; it is
 * canonicalized to channels-last (rows of c values).  So is one with c == 1 (and s > 1): it
 * is canonicalized to channels-first (each sample one run of s values), whose kernels split a
 * channel's long runs among the threads; channels-last would walk rows of one value (measured,
 * Zen 5, 2 threads, f32: BatchNorm 64x1x32x32 backward 0.030 ms as rows against 0.008 as runs,
 * 1024x1x256x256 forward 16.5 against 14.0 ms, backward 26.9 against 19.8).
 */
#ifndef NORMA_GEOM_H
#define NORMA_GEOM_H

#include <stdint.h>

#include "internal.h"

enum { NORM_ACT_NONE = 0, NORM_ACT_RELU = 1, NORM_ACT_ADD_RELU = 2, NORM_ACT_SILU = 3 };

typedef struct norm_geom {
  int64_t n, c, s;     /* samples, channels, spatial positions */
  norma_layout layout; /* NORMA_CHANNELS_LAST whenever s == 1, else FIRST whenever c == 1 */
  norma_dtype dt;
  size_t esize;        /* bytes per tensor element */
  int per_sample;      /* 0: a group is a channel over all samples (BatchNorm) */
  int64_t cpg;         /* channels per group (1 for BatchNorm and InstanceNorm) */
  int rms;             /* the statistic is the mean square, not mean and variance */
  double eps;
  unsigned flags;      /* the descriptor's flags */
  int act;             /* NORM_ACT_* */
  int64_t total;       /* n * c * s */
  int64_t count;       /* values per group: n * s (BatchNorm) or cpg * s */
  int64_t groups;      /* number of groups: c (BatchNorm) or n * c / cpg */
  int64_t m;           /* values per channel of the batch, n * s (BatchNorm's m) */
} norm_geom;

/* Group of channel ch of sample i (an index into save_mean / save_invstd). */
static inline int64_t norm_group(const norm_geom *g, int64_t i, int64_t ch) {
  return g->per_sample ? i * (g->c / g->cpg) + ch / g->cpg : ch;
}

/* Offset (in elements) of value (sample i, channel ch, position sp). */
static inline int64_t norm_index(const norm_geom *g, int64_t i, int64_t ch, int64_t sp) {
  return g->layout == NORMA_CHANNELS_FIRST ? (i * g->c + ch) * g->s + sp
                                           : (i * g->s + sp) * g->c + ch;
}

/* Fills the derived fields; the shape fields, layout, dt, per_sample, cpg, rms, eps, flags and
   act must be set (and checked) first. */
static inline void norm_geom_finish(norm_geom *g) {
  if (g->s == 1) g->layout = NORMA_CHANNELS_LAST;
  else if (g->c == 1) g->layout = NORMA_CHANNELS_FIRST;
  g->esize = norma__dtype_size(g->dt);
  g->total = g->n * g->c * g->s;
  g->m = g->n * g->s;
  g->count = g->per_sample ? g->cpg * g->s : g->n * g->s;
  g->groups = g->per_sample ? g->n * (g->c / g->cpg) : g->c;
}

/* BatchNorm's geometry from its checked descriptor (check.h's bn_problem) */
static inline norm_geom norm_geom_bn(const bn_problem *p) {
  norm_geom g = {0};
  g.n = p->n, g.c = p->c, g.s = p->s, g.layout = p->layout, g.dt = p->dt;
  g.per_sample = 0, g.cpg = 1, g.rms = 0;
  g.eps = p->eps, g.flags = p->flags, g.act = p->act;
  norm_geom_finish(&g);
  return g;
}

#endif
