/* bn_ops.cpp - BatchNorm as PyTorch operators, with autograd in C++.

   norma::batch_norm            what the modules call: torch's _BatchNorm.forward after its
                                Python checks (num_batches_tracked, the cumulative momentum,
                                batch or running statistics), then norma's training or
                                inference forward; differentiable (the backward is one
                                norma_bn_backward call)
   norma::bn_forward_training   the C calls themselves, not differentiable, for tests and
   norma::bn_forward_inference  for code that owns its autograd
   norma::bn_backward

   `flags` is NORMA_BN_RELU | NORMA_BN_ADD_RELU | NORMA_BN_BIASED_RUNNING_VAR |
   NORMA_CHECK_FINITE | NORMA_BN_COUNT_WEIGHTED of norma.h, plus the binding's kSaveOutput and
   kTorchFallback (norma_torch.h).  ADD_RELU requires `residual`. */
#include <cmath>

#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/functions/basic_ops.h>

#include "autograd_util.h"
#include "norma_torch.h"

using namespace norma_torch;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace norma_torch {

constexpr int64_t kAct = NORMA_BN_RELU | NORMA_BN_ADD_RELU;

struct Running {
  c10::optional<at::Tensor> mean, var, count;
  double momentum = 0.0;
};

struct TrainOut {
  at::Tensor y, save_mean, save_invstd;
  bool weight_has_zero = false;
};

/* The training forward: y, save_mean, save_invstd; running statistics updated in place. */
TrainOut train_forward(const Dense &X, const at::Tensor &weight, const at::Tensor &bias,
                       const c10::optional<at::Tensor> &residual, const Running &run, double eps,
                       int64_t flags) {
  Dense R;
  const bool add_relu = (flags & NORMA_BN_ADD_RELU) != 0;
  TORCH_CHECK_VALUE(!add_relu || (residual.has_value() && residual->defined()),
                    "NORMA_BN_ADD_RELU needs the residual");
  if (add_relu) R = dense_like(*residual, X, "residual");
  InOut rm = param_inout(run.mean, X.c, X.pdtype, "running_mean");
  InOut rv = param_inout(run.var, X.c, X.pdtype, "running_var");
  const bool counted = (flags & NORMA_BN_COUNT_WEIGHTED) != 0;
  InOut rc;
  if (counted && (rm.ptr() || rv.ptr())) {
    TORCH_CHECK_VALUE(run.count.has_value() && run.count->defined(),
                      "count-weighted running statistics need running_count");
    rc = param_inout(run.count, 1, at::kDouble, "running_count");
    /* a negative count means "not known yet" (a module converted after training): adopt
       this batch's count, which makes this update PyTorch's */
    double *n = static_cast<double *>(rc.ptr());
    if (*n < 0) {
      if (rc.work.is_same(rc.target)) rc.work = rc.work.clone();
      *static_cast<double *>(rc.ptr()) = (double)(X.n * X.spatial);
    }
  }
  TrainOut o;
  o.y = empty_like(X);
  o.save_mean = param_out(X);
  o.save_invstd = param_out(X);
  const norma_bn_desc d = X.desc(eps, flags);
  norma_status st;
  if (counted)
    st = norma_bn_forward_training_counted(&d, X.ptr(), add_relu ? R.ptr() : nullptr,
                                           ptr(weight), ptr(bias), o.y.data_ptr(),
                                           o.save_mean.data_ptr(), o.save_invstd.data_ptr(),
                                           rm.ptr(), rv.ptr(), static_cast<double *>(rc.ptr()),
                                           run.momentum);
  else
    st = norma_bn_forward_training(&d, X.ptr(), add_relu ? R.ptr() : nullptr, ptr(weight),
                                   ptr(bias), o.y.data_ptr(), o.save_mean.data_ptr(),
                                   o.save_invstd.data_ptr(), rm.ptr(), rv.ptr(), run.momentum);
  check(st, counted ? "norma_bn_forward_training_counted" : "norma_bn_forward_training");
  rm.commit();
  rv.commit();
  rc.commit();
  return o;
}

at::Tensor inference_forward(const Dense &X, const at::Tensor &weight, const at::Tensor &bias,
                             const c10::optional<at::Tensor> &residual, const at::Tensor &mean,
                             const at::Tensor &var, double eps, int64_t flags) {
  Dense R;
  const bool add_relu = (flags & NORMA_BN_ADD_RELU) != 0;
  TORCH_CHECK_VALUE(!add_relu || (residual.has_value() && residual->defined()),
                    "NORMA_BN_ADD_RELU needs the residual");
  if (add_relu) R = dense_like(*residual, X, "residual");
  at::Tensor y = empty_like(X);
  const norma_bn_desc d = X.desc(eps, flags);
  check(norma_bn_forward_inference(&d, X.ptr(), add_relu ? R.ptr() : nullptr, ptr(weight),
                                   ptr(bias), ptr(mean), ptr(var), y.data_ptr()),
        "norma_bn_forward_inference");
  return y;
}

struct Grads {
  at::Tensor dx, dweight, dbias, dresidual;
};

/* One norma_bn_backward call.  x may be undefined (x_hat from y, no activation). */
Grads backward_impl(const at::Tensor &x, const at::Tensor &y, const at::Tensor &gy,
                    const at::Tensor &weight, const at::Tensor &bias, const at::Tensor &save_mean,
                    const at::Tensor &save_invstd, double eps, int64_t flags, bool need_weight,
                    bool need_bias, bool need_residual) {
  const Dense ref = dense(x.defined() ? x : y, x.defined() ? "x" : "y");
  Dense Y;
  const bool use_y = y.defined() && (!x.defined() || (flags & kAct));
  if (use_y) Y = dense_like(y, ref, "y");
  const Dense DY = dense_like(gy, ref, "grad_output");
  const at::Tensor w = param_in(weight, ref, "weight");
  const at::Tensor b = param_in(bias, ref, "bias");
  const at::Tensor sm = param_in(save_mean, ref, "save_mean");
  const at::Tensor si = param_in(save_invstd, ref, "save_invstd");
  Grads g;
  g.dx = empty_like(ref);
  if ((flags & NORMA_BN_ADD_RELU) && need_residual) g.dresidual = empty_like(ref);
  if (need_weight) g.dweight = param_out(ref);
  if (need_bias) g.dbias = param_out(ref);
  const norma_bn_desc d = ref.desc(eps, flags);
  check(norma_bn_backward(&d, x.defined() ? ref.ptr() : nullptr, use_y ? Y.ptr() : nullptr,
                          DY.ptr(), ptr(w), ptr(b), ptr(sm), ptr(si), g.dx.data_ptr(),
                          ptr(g.dresidual), ptr(g.dweight), ptr(g.dbias)),
        "norma_bn_backward");
  /* parameter gradients in the parameters' own dtype (e.g. bfloat16 parameters) */
  if (g.dweight.defined() && g.dweight.scalar_type() != weight.scalar_type())
    g.dweight = g.dweight.to(weight.scalar_type());
  if (g.dbias.defined() && g.dbias.scalar_type() != bias.scalar_type())
    g.dbias = g.dbias.to(bias.scalar_type());
  return g;
}

bool has_zero(const at::Tensor &w) {
  if (!w.defined()) return false;
  if (w.scalar_type() == at::kDouble) {
    const double *p = w.data_ptr<double>();
    for (int64_t i = 0; i < w.numel(); i++)
      if (p[i] == 0.0) return true;
    return false;
  }
  const float *p = w.data_ptr<float>();
  for (int64_t i = 0; i < w.numel(); i++)
    if (p[i] == 0.0f) return true;
  return false;
}

/* the edges of x, weight, bias, residual (edges.h) */
static Edges bn_edges(const at::Tensor &x, const at::Tensor &w, const at::Tensor &b,
                      const at::Tensor &r) {
  return Edges::of({&x, &w, &b, &r});
}

at::Tensor opt(const c10::optional<at::Tensor> &t) {
  return t.has_value() ? *t : at::Tensor();
}

/* What the backward keeps: x, or y instead of x (kSaveOutput, no activation, no zero in
   weight), or both with an activation (the mask is y > 0). */
void save(AutogradContext *ctx, const at::Tensor &x, const at::Tensor &y, const at::Tensor &w,
          const at::Tensor &b, const at::Tensor &sm, const at::Tensor &si, int64_t flags,
          bool weight_has_zero, double eps, const Edges &e) {
  const bool act = (flags & kAct) != 0;
  const bool y_only = !act && (flags & kSaveOutput) && !weight_has_zero;
  ctx->save_for_backward({y_only ? at::Tensor() : x, (act || y_only) ? y : at::Tensor(), w, b,
                          sm, si});
  ctx->saved_data["flags"] = flags;
  ctx->saved_data["eps"] = eps;
  ctx->saved_data["edges"] = e.pack();
}

variable_list run_backward(AutogradContext *ctx, const variable_list &grads, int64_t extra_flags) {
  auto s = ctx->get_saved_variables();
  const int64_t flags = ctx->saved_data["flags"].toInt();
  const double eps = ctx->saved_data["eps"].toDouble();
  const Edges e = Edges::unpack(ctx->saved_data["edges"].toInt());
  const bool nw = e.needs(ctx, 1), nb = e.needs(ctx, 2), nr = e.needs(ctx, 3);
  Grads g = backward_impl(s[0], s[1], grads[0], s[2], s[3], s[4], s[5], eps,
                          (flags & (kAct | NORMA_CHECK_FINITE)) | extra_flags, nw, nb, nr);
  variable_list out{g.dx, g.dweight, g.dbias, g.dresidual};
  out = once_differentiable(std::move(out), grads, "BatchNorm");
  out.resize(7); /* the non-tensor arguments: state, eps, flags */
  return out;
}

struct Stats {
  at::Tensor mean, var;
};

using OptT = c10::optional<at::Tensor>;

struct BatchNormTrain : public torch::autograd::Function<BatchNormTrain> {
  static at::Tensor forward(AutogradContext *ctx, const at::Tensor &x, const OptT &weight,
                            const OptT &bias, const OptT &residual, const Running &run,
                            double eps, int64_t flags) {
    const Dense X = dense(x, "input");
    const at::Tensor w = param_in(weight, X, "weight");
    const at::Tensor b = param_in(bias, X, "bias");
    TrainOut o = train_forward(X, w, b, residual, run, eps, flags);
    save(ctx, x, o.y, opt(weight), opt(bias), o.save_mean, o.save_invstd, flags,
         (flags & kSaveOutput) ? has_zero(w) : false, eps,
         bn_edges(x, opt(weight), opt(bias), opt(residual)));
    return o.y;
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    return run_backward(ctx, grads, 0);
  }
};

struct BatchNormEval : public torch::autograd::Function<BatchNormEval> {
  static at::Tensor forward(AutogradContext *ctx, const at::Tensor &x, const OptT &weight,
                            const OptT &bias, const OptT &residual, const Stats &stats,
                            double eps, int64_t flags) {
    const Dense X = dense(x, "input");
    const at::Tensor w = param_in(weight, X, "weight");
    const at::Tensor b = param_in(bias, X, "bias");
    const at::Tensor m = param_in(stats.mean, X, "running_mean");
    const at::Tensor v = param_in(stats.var, X, "running_var");
    at::Tensor y = inference_forward(X, w, b, residual, m, v, eps, flags);
    /* the constants of the frozen layer (the buffers may change before the backward) */
    at::Tensor sm = m.clone();
    at::Tensor si = (v.to(at::kDouble) + eps).rsqrt().to(X.pdtype);
    save(ctx, x, y, opt(weight), opt(bias), sm, si, flags & ~kSaveOutput, false, eps,
         bn_edges(x, opt(weight), opt(bias), opt(residual)));
    return y;
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    return run_backward(ctx, grads, NORMA_BN_GLOBAL_STATS);
  }
};

bool requires_grad(const at::Tensor &t) { return t.defined() && t.requires_grad(); }

/* torch's own implementation, for what norma does not take (kTorchFallback). */
at::Tensor torch_batch_norm(const at::Tensor &input, const at::Tensor &weight,
                            const at::Tensor &bias, const at::Tensor &residual,
                            const at::Tensor &rm, const at::Tensor &rv, bool bn_training,
                            double factor, double eps, int64_t flags) {
  at::Tensor y = at::batch_norm(input, weight, bias, rm, rv, bn_training, factor, eps, false);
  if (flags & NORMA_BN_ADD_RELU) return at::relu(y + residual);
  if (flags & NORMA_BN_RELU) return at::relu(y);
  return y;
}

bool norma_takes(const at::Tensor &input) {
  return input.device().is_cpu() && supported_dtype(input.scalar_type()) && input.numel() > 0;
}

at::Tensor batch_norm(const at::Tensor &input, const c10::optional<at::Tensor> &weight_,
                      const c10::optional<at::Tensor> &bias_,
                      const c10::optional<at::Tensor> &residual_,
                      const c10::optional<at::Tensor> &running_mean,
                      const c10::optional<at::Tensor> &running_var,
                      const c10::optional<at::Tensor> &num_batches_tracked,
                      const c10::optional<at::Tensor> &running_count, bool training,
                      c10::optional<double> momentum, double eps, int64_t flags) {
  const at::Tensor weight = opt(weight_), bias = opt(bias_), residual = opt(residual_);
  const at::Tensor rm = opt(running_mean), rv = opt(running_var);
  TORCH_CHECK_VALUE(!(flags & NORMA_BN_ADD_RELU) || residual.defined(),
                    "NORMA_BN_ADD_RELU needs the residual");
  TORCH_CHECK_VALUE(input.dim() >= 2, "batch_norm: expected an input of 2 to 5 dimensions, got ",
                    input.dim());
  const bool bn_training = training || (!rm.defined() && !rv.defined());
  if (bn_training) {
    int64_t per_channel = input.size(0);
    for (int64_t i = 2; i < input.dim(); i++) per_channel *= input.size(i);
    TORCH_CHECK_VALUE(per_channel != 1,
                      "Expected more than 1 value per channel when training, got input size ",
                      input.sizes());
  }
  /* torch's _BatchNorm.forward: the batch counter, and the cumulative average when momentum
     is None */
  double factor = momentum.has_value() ? *momentum : 0.0;
  if (num_batches_tracked.has_value() && num_batches_tracked->defined()) {
    const at::Tensor &nbt = *num_batches_tracked;
    int64_t count;
    if (nbt.device().is_cpu() && nbt.scalar_type() == at::kLong && nbt.numel() == 1) {
      int64_t *p = nbt.data_ptr<int64_t>(); /* a buffer: no autograd, no dispatch */
      count = ++*p;
      nbt.unsafeGetTensorImpl()->bump_version();
    } else {
      at::NoGradGuard g;
      nbt.add_(1);
      count = nbt.item<int64_t>();
    }
    if (!momentum.has_value()) factor = 1.0 / (double)count;
  }
  if (!norma_takes(input)) {
    if (!(flags & kTorchFallback)) {
      TORCH_CHECK_TYPE(supported_dtype(input.scalar_type()), "input has dtype ",
                       input.scalar_type(),
                       "; norma supports float32, float64, float16 and bfloat16");
      TORCH_CHECK_VALUE(input.device().is_cpu(), "input is on ", input.device(),
                        ": norma runs on CPU tensors");
      TORCH_CHECK_VALUE(false, "input has no values (shape ", input.sizes(), ")");
    }
    return torch_batch_norm(input, weight, bias, residual, rm, rv, bn_training, factor, eps,
                            flags);
  }
  if ((flags & NORMA_BN_ADD_RELU) && residual.scalar_type() != input.scalar_type()) {
    /* a residual of another dtype (autocast): the add in torch, with its type promotion */
    at::Tensor y = batch_norm(input, weight_, bias_, c10::nullopt, running_mean, running_var,
                              c10::nullopt, running_count, training, factor, eps,
                              flags & ~int64_t(kAct));
    return at::relu(y + residual);
  }
  const bool grad = at::GradMode::is_enabled() &&
                    (requires_grad(input) || requires_grad(weight) || requires_grad(bias) ||
                     requires_grad(residual));
  if (bn_training) {
    Running run;
    run.mean = running_mean;
    run.var = running_var;
    run.count = running_count;
    run.momentum = factor;
    if (grad)
      return BatchNormTrain::apply(input, weight_, bias_, residual_, run, eps, flags);
    const Dense X = dense(input, "input");
    return train_forward(X, param_in(weight, X, "weight"), param_in(bias, X, "bias"), residual,
                         run, eps, flags)
        .y;
  }
  if (grad) {
    Stats stats{rm, rv};
    return BatchNormEval::apply(input, weight_, bias_, residual_, stats, eps, flags);
  }
  const Dense X = dense(input, "input");
  return inference_forward(X, param_in(weight, X, "weight"), param_in(bias, X, "bias"), residual,
                           param_in(rm, X, "running_mean"), param_in(rv, X, "running_var"), eps,
                           flags);
}

/* ---- the C calls as operators (no autograd) ---- */

std::tuple<at::Tensor, at::Tensor, at::Tensor> bn_forward_training(
    const at::Tensor &x, const c10::optional<at::Tensor> &weight,
    const c10::optional<at::Tensor> &bias, const c10::optional<at::Tensor> &residual,
    const c10::optional<at::Tensor> &running_mean, const c10::optional<at::Tensor> &running_var,
    const c10::optional<at::Tensor> &running_count, double momentum, double eps, int64_t flags) {
  const Dense X = dense(x, "x");
  Running run;
  run.mean = running_mean;
  run.var = running_var;
  run.count = running_count;
  run.momentum = momentum;
  TrainOut o = train_forward(X, param_in(weight, X, "weight"), param_in(bias, X, "bias"),
                             residual, run, eps, flags);
  return {o.y, o.save_mean, o.save_invstd};
}

at::Tensor bn_forward_inference(const at::Tensor &x, const c10::optional<at::Tensor> &weight,
                                const c10::optional<at::Tensor> &bias,
                                const c10::optional<at::Tensor> &residual,
                                const at::Tensor &mean, const at::Tensor &var, double eps,
                                int64_t flags) {
  const Dense X = dense(x, "x");
  return inference_forward(X, param_in(weight, X, "weight"), param_in(bias, X, "bias"), residual,
                           param_in(mean, X, "mean"), param_in(var, X, "var"), eps, flags);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> bn_backward(
    const c10::optional<at::Tensor> &x, const c10::optional<at::Tensor> &y, const at::Tensor &dy,
    const c10::optional<at::Tensor> &weight, const c10::optional<at::Tensor> &bias,
    const at::Tensor &save_mean, const at::Tensor &save_invstd, double eps, int64_t flags,
    bool param_grads) {
  TORCH_CHECK_VALUE(opt(x).defined() || opt(y).defined(), "bn_backward needs x or y");
  const at::Tensor w = opt(weight), b = opt(bias);
  Grads g = backward_impl(opt(x), opt(y), dy, w, b, save_mean, save_invstd, eps, flags,
                          param_grads, param_grads, true);
  return {g.dx, g.dweight, g.dbias, g.dresidual};
}

}  // namespace norma_torch

using namespace norma_torch;

TORCH_LIBRARY_FRAGMENT(norma, m) {
  m.def("batch_norm(Tensor input, Tensor? weight, Tensor? bias, Tensor? residual, "
        "Tensor(a!)? running_mean, Tensor(b!)? running_var, Tensor(c!)? num_batches_tracked, "
        "Tensor(d!)? running_count, bool training, float? momentum, float eps, int flags) "
        "-> Tensor",
        &batch_norm);
  m.def("bn_forward_training(Tensor x, Tensor? weight, Tensor? bias, Tensor? residual, "
        "Tensor(a!)? running_mean, Tensor(b!)? running_var, Tensor(c!)? running_count, "
        "float momentum, float eps, int flags) -> (Tensor, Tensor, Tensor)",
        &bn_forward_training);
  m.def("bn_forward_inference(Tensor x, Tensor? weight, Tensor? bias, Tensor? residual, "
        "Tensor mean, Tensor var, float eps, int flags) -> Tensor",
        &bn_forward_inference);
  m.def("bn_backward(Tensor? x, Tensor? y, Tensor dy, Tensor? weight, Tensor? bias, "
        "Tensor save_mean, Tensor save_invstd, float eps, int flags, bool param_grads) "
        "-> (Tensor, Tensor, Tensor, Tensor)",
        &bn_backward);
}
