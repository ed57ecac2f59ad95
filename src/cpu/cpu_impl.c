/* cpu_impl.c - norm_impl_cpu: which op of the engine serves a geometry.
     per_sample == 0                  BatchNorm (op_bn.c)
     per_sample, s == 1, no activation  rows of contiguous groups: LayerNorm, RMSNorm, GroupNorm
                                        and InstanceNorm on [N, C] (op_row.c)
     per_sample otherwise             GroupNorm, InstanceNorm (op_group.c) */
#include "engine.h"

static norma_status cpu_forward(const norm_geom *g, norm_fwd_mode mode, const norm_fwd_args *a) {
  if (!g->per_sample) return norm_bn_forward(g, mode, a);
  if (g->s == 1 && g->act == NORM_ACT_NONE) return norm_row_forward(g, mode, a);
  return norm_group_forward(g, mode, a);
}

static norma_status cpu_backward(const norm_geom *g, norm_bwd_mode mode, const norm_bwd_args *a) {
  if (!g->per_sample) return norm_bn_backward(g, mode, a);
  if (g->s == 1 && g->act == NORM_ACT_NONE) return norm_row_backward(g, mode, a);
  return norm_group_backward(g, mode, a);
}

const norm_impl norm_impl_cpu = {cpu_forward, cpu_backward, norm_bn_moments_tile};
