/* norma_torch.h - what every PyTorch operator file of libnorma_torch shares: how a torch tensor
   becomes a norma descriptor and a data pointer, per-channel arrays in and out, errors.

   libnorma_torch registers norma's kernels as PyTorch operators (torch.ops.norma.*).  It uses
   libnorma through the public header only (norma.h) and is loaded by the Python package with
   torch.ops.load_library (python/norma/torch/_ops.py), after the package has loaded libnorma,
   so that both share one copy of the library and of its settings.

   Adding an operator: a file src/torch/<op>_ops.cpp with its kernels and a
   TORCH_LIBRARY_FRAGMENT(norma, m) block (m.def(schema) + m.impl), listed in CMakeLists.txt's
   NORMA_TORCH_SOURCES.  The helpers below turn arguments into pointers. */
#ifndef NORMA_TORCH_H
#define NORMA_TORCH_H

#include <ATen/ATen.h>
#include <torch/library.h>

#include "norma.h"

namespace norma_torch {

/* Bits of the operators' `flags` argument above the C library's flags (norma.h uses the low
   16 bits): options of the binding, never passed to C. */
constexpr int64_t kSaveOutput = int64_t(1) << 24;    /* training, no activation: the backward
                                                        recovers x_hat from y, x is not kept */
constexpr int64_t kTorchFallback = int64_t(1) << 25; /* inputs norma does not take (another
                                                        device or dtype, no values): torch's
                                                        own BatchNorm instead of an error */
constexpr int64_t kCFlags = 0xffff;

/* Throws the failure of a norma call as a Python RuntimeError whose text starts with the
   status name ("NORMA_ERR_INVALID_ARGUMENT: <norma_last_error()>"); python/norma turns it into
   norma.NormaError. */
[[noreturn]] void fail(norma_status st, const char *fn);
inline void check(norma_status st, const char *fn) {
  if (st != NORMA_OK) fail(st, fn);
}

bool supported_dtype(at::ScalarType t);
/* The parameter type of a storage type: double for float64, float otherwise. */
inline at::ScalarType param_type(at::ScalarType t) {
  return t == at::kDouble ? at::kDouble : at::kFloat;
}

/* A tensor as norma sees it: dense in `layout`, logical shape [N, C, spatial...]. */
struct Dense {
  at::Tensor t;
  int64_t n = 0, c = 0, spatial = 1;
  norma_layout layout = NORMA_CHANNELS_FIRST;
  norma_dtype dtype = NORMA_F32;
  at::ScalarType pdtype = at::kFloat;

  void *ptr() const { return t.numel() ? t.data_ptr() : nullptr; }
  norma_bn_desc desc(double eps, int64_t flags) const {
    norma_bn_desc d;
    d.n = n;
    d.c = c;
    d.spatial = spatial;
    d.layout = layout;
    d.dtype = dtype;
    d.eps = eps;
    d.flags = (unsigned)(flags & kCFlags);
    return d;
  }
};

/* x (CPU, a supported dtype, 2 to 5 dimensions) dense in its own layout: channels-first when
   contiguous, channels-last when dense in [N, spatial..., C] order, else a channels-first
   copy. */
Dense dense(const at::Tensor &x, const char *name);
/* Another tensor of the call (residual, dy, y) in ref's layout; same shape and dtype. */
Dense dense_like(const at::Tensor &t, const Dense &ref, const char *name);
/* A new tensor of ref's shape, dtype and layout. */
at::Tensor empty_like(const Dense &ref);
/* A new per-channel array of ref's parameter type. */
at::Tensor param_out(const Dense &ref);

/* A per-channel input: contiguous, of ref's parameter type (converted when needed);
   undefined when absent. */
at::Tensor param_in(const c10::optional<at::Tensor> &p, const Dense &ref, const char *name);
inline void *ptr(const at::Tensor &t) { return t.defined() ? t.data_ptr() : nullptr; }

/* An array updated in place (running statistics, the running count): its own memory when it
   has the type and is contiguous, else a temporary that commit() copies back.  Call commit()
   only after the C call succeeded, so that nothing is written on error. */
struct InOut {
  at::Tensor target, work;
  void *ptr() const { return work.defined() ? work.data_ptr() : nullptr; }
  void commit();
};
InOut param_inout(const c10::optional<at::Tensor> &p, int64_t numel, at::ScalarType type,
                  const char *name);

}  // namespace norma_torch

#endif
