/* edges.h - which of an autograd function's tensor arguments are defined: the edges of its
   backward are numbered over the defined ones only (shared by bn_ops.cpp and norms_ops.cpp).
   The indices travel through the context's saved_data packed in one int64. */
#ifndef NORMA_TORCH_EDGES_H
#define NORMA_TORCH_EDGES_H

#include <initializer_list>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

namespace norma_torch {

using torch::autograd::AutogradContext;

struct Edges {
  int idx[4] = {-1, -1, -1, -1};
  static Edges of(std::initializer_list<const at::Tensor *> ts) {
    Edges e;
    int k = 0, i = 0;
    for (auto *t : ts) {
      if (t->defined()) e.idx[i] = k++;
      i++;
    }
    return e;
  }
  int64_t pack() const {
    int64_t v = 0;
    for (int i = 0; i < 4; i++) v |= (int64_t)(idx[i] + 1) << (8 * i);
    return v;
  }
  static Edges unpack(int64_t v) {
    Edges e;
    for (int i = 0; i < 4; i++) e.idx[i] = (int)((v >> (8 * i)) & 0xff) - 1;
    return e;
  }
  bool needs(AutogradContext *ctx, int i) const {
    return idx[i] >= 0 && ctx->needs_input_grad((size_t)idx[i]);
  }
};

}  // namespace norma_torch

#endif
