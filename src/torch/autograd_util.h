/* autograd_util.h - what the autograd functions of bn_ops.cpp and norms_ops.cpp share: which
   tensor arguments are defined (the edges of a backward are numbered over the defined ones
   only; the indices travel through the context's saved_data packed in one int64), and the
   node that makes a backward once-differentiable. */
#ifndef NORMA_TORCH_AUTOGRAD_UTIL_H
#define NORMA_TORCH_AUTOGRAD_UTIL_H

#include <initializer_list>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/functions/basic_ops.h>

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

/* Double backward is not supported: the gradients go out through a node that raises if they
   are differentiated (Python's @once_differentiable). */
inline torch::autograd::variable_list once_differentiable(torch::autograd::variable_list out,
                                                        const torch::autograd::variable_list &grads,
                                                        const char *what) {
  bool grad_needed = false;
  for (const auto &g : grads) grad_needed = grad_needed || (g.defined() && g.requires_grad());
  if (!at::GradMode::is_enabled() || !grad_needed) return out;
  torch::autograd::variable_list in;
  for (auto &v : out) {
    at::Tensor t;
    if (v.defined()) {
      t = v.detach();
      t.set_requires_grad(true);
    }
    in.push_back(t);
  }
  auto err = std::make_shared<torch::autograd::DelayedError>(
      std::string("norma's ") + what + " backward is not differentiable (double backward is "
      "not supported)", (int)in.size());
  auto res = err->apply(std::move(in));
  for (size_t i = 0; i < res.size(); i++)
    if (!out[i].defined()) res[i] = at::Tensor();
  return res;
}

}  // namespace norma_torch

#endif
