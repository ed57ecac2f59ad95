/* norms_ops.cpp - LayerNorm, RMSNorm, GroupNorm and InstanceNorm as PyTorch operators, with
   autograd in C++ (one norma call forward, one backward).

   norma::layer_norm(input, normalized_shape, weight, bias, eps, flags) -> y
   norma::layer_norm_residual(input, residual, normalized_shape, weight, bias, eps, flags)
       -> (y, h)        h = input + residual, y = layer_norm(h); gradients flow through both
   norma::rms_norm(input, normalized_shape, weight, eps?, flags) -> y     (eps None: finfo.eps)
   norma::rms_norm_residual(input, residual, normalized_shape, weight, eps?, flags) -> (y, h)
   norma::group_norm(input, num_groups, weight, bias, eps, flags) -> y
       [N, C, *] channels-first, or channels_last (3-D to 5-D) used in place;
       flags: NORMA_RELU / NORMA_SILU fuse the activation
   norma::instance_norm(input, weight, bias, running_mean, running_var, use_input_stats,
                        momentum, eps, flags) -> y
       torch.nn.functional.instance_norm's semantics (batched input [N, C, *])

   `flags` holds norma.h's flags (NORMA_CHECK_FINITE, the activations) and kTorchFallback:
   inputs norma does not take (another device or dtype, no values) are computed by torch's own
   functions instead of raising.  Parameters are converted to float32 (float64 for float64
   storage) for the C call; parameter gradients come back in the parameter's dtype.  A backward
   with create_graph=True computes the first-order gradients with torch's differentiable ops
   (double backward); norma's kernel does every ordinary backward. */
#include <cmath>
#include <limits>

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/functions/basic_ops.h>

#include "autograd_util.h"
#include "norma_torch.h"

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace norma_torch {
namespace {

using OptT = c10::optional<at::Tensor>;

at::Tensor opt_(const OptT &t) { return t.has_value() ? *t : at::Tensor(); }
bool needs_grad(const at::Tensor &t) { return t.defined() && t.requires_grad(); }

norma_dtype ndtype(at::ScalarType t) {
  switch (t) {
    case at::kDouble: return NORMA_F64;
    case at::kHalf: return NORMA_F16;
    case at::kBFloat16: return NORMA_BF16;
    default: return NORMA_F32;
  }
}

bool takes(const at::Tensor &x) {
  return x.device().is_cpu() && supported_dtype(x.scalar_type()) && x.numel() > 0;
}

void refuse(const at::Tensor &x) {
  TORCH_CHECK_TYPE(supported_dtype(x.scalar_type()), "input has dtype ", x.scalar_type(),
                   "; norma supports float32, float64, float16 and bfloat16");
  TORCH_CHECK_VALUE(x.device().is_cpu(), "input is on ", x.device(),
                    ": norma runs on CPU tensors");
  TORCH_CHECK_VALUE(false, "input has no values (shape ", x.sizes(), ")");
}

/* A per-element / per-channel parameter for the C call: contiguous, of type pdt. */
at::Tensor pin(const at::Tensor &p, int64_t numel, at::ScalarType pdt, const char *name) {
  if (!p.defined()) return p;
  TORCH_CHECK_VALUE(p.device().is_cpu(), name, " is on ", p.device(),
                    ": norma runs on CPU tensors");
  TORCH_CHECK_VALUE(p.numel() == numel, name, " must have ", numel, " elements (got shape ",
                    p.sizes(), ")");
  if (p.scalar_type() == pdt && p.is_contiguous()) return p;
  return p.detach().to(pdt).contiguous();
}

at::Tensor grad_to(const at::Tensor &g, const at::Tensor &like) {
  if (!g.defined() || !like.defined() || g.scalar_type() == like.scalar_type()) return g;
  return g.to(like.scalar_type());
}

/* Double backward (a backward with create_graph=True runs with grad mode on): the first-order
   gradients by torch's differentiable ops from the saved tensors, which are the inputs
   themselves (or h, an output of the node), so that they can be differentiated again; norma
   computes the ordinary backward.  Returns the gradients of `ins` (undefined where an input is
   undefined or does not require grad). */
std::vector<at::Tensor> torch_grads(const at::Tensor &y, const std::vector<at::Tensor> &ins,
                                    const at::Tensor &gy) {
  std::vector<at::Tensor> want;
  for (const auto &t : ins)
    if (t.defined() && t.requires_grad()) want.push_back(t);
  std::vector<at::Tensor> got;
  if (!want.empty())
    got = torch::autograd::grad({y}, want, {gy.to(y.scalar_type())}, /*retain_graph=*/true,
                                /*create_graph=*/true, /*allow_unused=*/true);
  std::vector<at::Tensor> out;
  size_t k = 0;
  for (const auto &t : ins) {
    if (t.defined() && t.requires_grad()) {
      at::Tensor g = got[k++];
      out.push_back(g.defined() ? g : at::zeros_like(t));
    } else {
      out.push_back(at::Tensor());
    }
  }
  return out;
}

/* t in the compute type of the double backward (float64 for float64 storage, else float32) */
at::Tensor compute_type(const at::Tensor &t, at::ScalarType ct) {
  return (!t.defined() || t.scalar_type() == ct) ? t : t.to(ct);
}

void check_connected(AutogradContext *ctx, const char *what) {
  TORCH_CHECK(ctx->saved_data["connected"].toBool(), "norma's ", what,
              ": double backward needs an input that norma used in place (a contiguous, or "
              "channels_last, tensor); this one was copied");
}

at::Tensor torch_act(at::Tensor y, int64_t flags) {
  if (flags & NORMA_SILU) return at::silu(y);
  if (flags & NORMA_RELU) return at::relu(y);
  return y;
}


/* ------------------------------------------------------------------------------------------ */
/* LayerNorm and RMSNorm                                                                       */
/* ------------------------------------------------------------------------------------------ */

int64_t ln_size(const at::Tensor &x, at::IntArrayRef ns) {
  const int64_t k = (int64_t)ns.size();
  bool ok = k >= 1 && x.dim() >= k;
  int64_t d = 1;
  for (int64_t i = 0; ok && i < k; i++) {
    ok = x.size(x.dim() - k + i) == ns[i];
    d *= ns[i];
  }
  TORCH_CHECK_VALUE(ok, "Given normalized_shape=", ns, ", expected input with shape [*",
                    [&] {
                      std::string s;
                      for (auto v : ns) s += ", " + std::to_string(v);
                      return s;
                    }(),
                    "], but got input of size", x.sizes());
  return d;
}

/* the descriptor of a LayerNorm / RMSNorm call on x viewed as [rows, d] */
norma_ln_desc ln_desc(const at::Tensor &x, int64_t rows, int64_t d, double eps, int64_t flags) {
  norma_ln_desc dd;
  dd.rows = rows;
  dd.d = d;
  dd.dtype = ndtype(x.scalar_type());
  dd.eps = eps;
  dd.flags = (unsigned)(flags & kCFlags);
  return dd;
}

struct LnOut {
  at::Tensor x, y, h, mean, invstd; /* x: the contiguous input (h with a residual) */
};

/* keep_stats: the statistics for a backward (without autograd none are written) */
LnOut ln_forward_impl(bool rms, const at::Tensor &input, const at::Tensor &residual,
                      const at::Tensor &weight, const at::Tensor &bias, int64_t d, double eps,
                      int64_t flags, bool keep_stats) {
  LnOut o;
  const at::Tensor x = input.is_contiguous() ? input : input.contiguous();
  at::Tensor r;
  if (residual.defined()) {
    TORCH_CHECK_VALUE(residual.sizes() == input.sizes(), "residual has shape ",
                      residual.sizes(), ", expected ", input.sizes(), " (the shape of x)");
    TORCH_CHECK_VALUE(residual.device().is_cpu(), "residual is on ", residual.device(),
                      ": norma runs on CPU tensors");
    r = residual.is_contiguous() ? residual : residual.contiguous();
  }
  const at::ScalarType pdt = param_type(x.scalar_type());
  const at::Tensor w = pin(weight, d, pdt, "weight");
  const at::Tensor b = rms ? at::Tensor() : pin(bias, d, pdt, "bias");
  const int64_t rows = x.numel() / d;
  o.y = at::empty(x.sizes(), x.options());
  if (r.defined()) o.h = at::empty(x.sizes(), x.options());
  auto popts = x.options().dtype(pdt);
  if (keep_stats) {
    if (!rms) o.mean = at::empty({rows}, popts);
    o.invstd = at::empty({rows}, popts);
  }
  const norma_ln_desc dd = ln_desc(x, rows, d, eps, flags);
  if (rms)
    check(norma_rms_forward(&dd, x.data_ptr(), ptr(r), ptr(w), o.y.data_ptr(), ptr(o.h),
                            ptr(o.invstd)),
          "norma_rms_forward");
  else
    check(norma_ln_forward(&dd, x.data_ptr(), ptr(r), ptr(w), ptr(b), o.y.data_ptr(), ptr(o.h),
                           ptr(o.mean), ptr(o.invstd)),
          "norma_ln_forward");
  o.x = r.defined() ? o.h : x;
  return o;
}

struct LnGrads {
  at::Tensor dx, dw, db; /* dw, db in the parameter type (float, double for float64) */
};

/* One norma_ln_backward / norma_rms_backward call.  x: the normalized input (h with a
   residual); gh: the gradient reaching h from elsewhere (or undefined); k: the rank of
   normalized_shape (the shape of dw, db). */
LnGrads ln_backward_impl(bool rms, const at::Tensor &x_, at::Tensor gy, at::Tensor gh,
                         const at::Tensor &w, const at::Tensor &mean, const at::Tensor &invstd,
                         int64_t d, int64_t k, double eps, int64_t flags, bool nw, bool nb) {
  const at::Tensor x = x_.is_contiguous() ? x_ : x_.contiguous();
  if (!gy.defined()) gy = at::zeros(x.sizes(), x.options());
  TORCH_CHECK_VALUE(gy.sizes() == x.sizes(), "grad_output has shape ", gy.sizes(),
                    ", expected ", x.sizes());
  TORCH_CHECK_TYPE(gy.scalar_type() == x.scalar_type(), "grad_output has dtype ",
                   gy.scalar_type(), ", expected ", x.scalar_type());
  if (!gy.is_contiguous()) gy = gy.contiguous();
  if (gh.defined()) {
    TORCH_CHECK_VALUE(gh.sizes() == x.sizes(), "the gradient of h has shape ", gh.sizes(),
                      ", expected ", x.sizes());
    if (gh.scalar_type() != x.scalar_type()) gh = gh.to(x.scalar_type());
    if (!gh.is_contiguous()) gh = gh.contiguous();
  }
  const at::ScalarType pdt = param_type(x.scalar_type());
  const int64_t rows = x.numel() / d;
  const at::Tensor wp = pin(w, d, pdt, "weight");
  const at::Tensor mp = rms ? at::Tensor() : pin(mean, rows, pdt, "save_mean");
  const at::Tensor ip = pin(invstd, rows, pdt, rms ? "save_invrms" : "save_invstd");
  TORCH_CHECK_VALUE(ip.defined() && (rms || mp.defined()), "the saved statistics are required");
  LnGrads g;
  g.dx = at::empty(x.sizes(), x.options());
  if (nw) g.dw = at::empty({d}, x.options().dtype(pdt));
  if (nb && !rms) g.db = at::empty({d}, x.options().dtype(pdt));
  const norma_ln_desc dd = ln_desc(x, rows, d, eps, flags);
  if (rms)
    check(norma_rms_backward(&dd, x.data_ptr(), gy.data_ptr(), ptr(gh), ptr(wp), ip.data_ptr(),
                             g.dx.data_ptr(), ptr(g.dw)),
          "norma_rms_backward");
  else
    check(norma_ln_backward(&dd, x.data_ptr(), gy.data_ptr(), ptr(gh), ptr(wp), mp.data_ptr(),
                            ip.data_ptr(), g.dx.data_ptr(), ptr(g.dw), ptr(g.db)),
          "norma_ln_backward");
  const auto pshape = x.sizes().slice(x.dim() - k);
  if (g.dw.defined()) g.dw = g.dw.view(pshape);
  if (g.db.defined()) g.db = g.db.view(pshape);
  return g;
}

struct LnFn : public torch::autograd::Function<LnFn> {
  /* returns {y} or {y, h} */
  static variable_list forward(AutogradContext *ctx, const at::Tensor &x, const OptT &weight,
                               const OptT &bias, const OptT &residual, int64_t d, int64_t k,
                               double eps, int64_t flags, bool rms) {
    const at::Tensor w = opt_(weight), b = opt_(bias), r = opt_(residual);
    LnOut o = ln_forward_impl(rms, x, r, w, b, d, eps, flags, true);
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({o.x, w, o.mean, o.invstd});
    ctx->saved_data["d"] = d;
    ctx->saved_data["k"] = k; /* the rank of normalized_shape: the parameters' shape */
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["flags"] = flags & NORMA_CHECK_FINITE;
    ctx->saved_data["rms"] = rms;
    ctx->saved_data["connected"] = r.defined() || o.x.is_same(x);
    ctx->saved_data["edges"] = Edges::of({&x, &w, &b, &r}).pack();
    if (b.defined()) ctx->saved_data["bias_dtype"] = (int64_t)b.scalar_type();
    if (r.defined()) return {o.y, o.h};
    return {o.y};
  }

  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    auto s = ctx->get_saved_variables();
    const at::Tensor &x = s[0], &w = s[1], &mean = s[2], &invstd = s[3];
    const bool rms = ctx->saved_data["rms"].toBool();
    const Edges e = Edges::unpack(ctx->saved_data["edges"].toInt());
    if (at::GradMode::is_enabled()) return double_backward(ctx, grads, x, w, rms, e);
    LnGrads g = ln_backward_impl(rms, x, grads[0], grads.size() > 1 ? grads[1] : at::Tensor(), w,
                                 mean, invstd, ctx->saved_data["d"].toInt(),
                                 ctx->saved_data["k"].toInt(),
                                 ctx->saved_data["eps"].toDouble(),
                                 ctx->saved_data["flags"].toInt(), e.needs(ctx, 1),
                                 e.needs(ctx, 2));
    variable_list out{g.dx, grad_to(g.dw, w), g.db, e.idx[3] >= 0 ? g.dx : at::Tensor()};
    if (out[2].defined()) { /* bias is not saved: its dtype travels in saved_data */
      const auto bt = ctx->saved_data.find("bias_dtype");
      if (bt != ctx->saved_data.end()) out[2] = out[2].to((at::ScalarType)bt->second.toInt());
    }
    out = once_differentiable(std::move(out), grads, rms ? "RMSNorm" : "LayerNorm");
    out.resize(9); /* d, k, eps, flags, rms */
    return out;
  }

  static variable_list double_backward(AutogradContext *ctx, const variable_list &grads,
                                       const at::Tensor &x, const at::Tensor &w, bool rms,
                                       const Edges &e) {
    check_connected(ctx, rms ? "RMSNorm" : "LayerNorm");
    const int64_t k = ctx->saved_data["k"].toInt();
    const double eps = ctx->saved_data["eps"].toDouble();
    const at::ScalarType ct = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    /* the backward's formula in torch ops (not autograd.grad: with a residual, x is h, an
       output of this node, and the engine would run this node again to reach the weight) */
    const at::Tensor xc = compute_type(x, ct), wc = compute_type(w, ct);
    std::vector<int64_t> dims, lead;
    for (int64_t i = 0; i < k; i++) dims.push_back(x.dim() - 1 - i);
    for (int64_t i = 0; i < x.dim() - k; i++) lead.push_back(i);
    at::Tensor gy = compute_type(grads[0].defined() ? grads[0] : at::zeros_like(x), ct);
    const at::Tensor gh = grads.size() > 1 ? grads[1] : at::Tensor();
    at::Tensor xhat, rinv, dx;
    if (rms) {
      rinv = at::rsqrt(xc.pow(2).mean(dims, true) + eps);
      xhat = xc * rinv;
    } else {
      const at::Tensor c = xc - xc.mean(dims, true);
      rinv = at::rsqrt(c.pow(2).mean(dims, true) + eps);
      xhat = c * rinv;
    }
    const at::Tensor g = wc.defined() ? gy * wc : gy;
    if (rms)
      dx = rinv * (g - xhat * (g * xhat).mean(dims, true));
    else
      dx = rinv * (g - g.mean(dims, true) - xhat * (g * xhat).mean(dims, true));
    dx = dx.to(x.scalar_type());
    if (gh.defined()) dx = dx + gh.to(x.scalar_type());
    at::Tensor dw = e.needs(ctx, 1) ? (gy * xhat).sum(lead).to(w.scalar_type()) : at::Tensor();
    at::Tensor db;
    if (e.needs(ctx, 2)) {
      db = gy.sum(lead);
      const auto bt = ctx->saved_data.find("bias_dtype");
      if (bt != ctx->saved_data.end()) db = db.to((at::ScalarType)bt->second.toInt());
    }
    variable_list out{e.idx[0] >= 0 ? dx : at::Tensor(), dw, db,
                      e.idx[3] >= 0 ? dx : at::Tensor()};
    out.resize(9);
    return out;
  }
};

variable_list ln_dispatch(bool rms, const at::Tensor &input, const OptT &residual_,
                          at::IntArrayRef ns, const OptT &weight_, const OptT &bias_, double eps,
                          int64_t flags) {
  const at::Tensor weight = opt_(weight_), bias = rms ? at::Tensor() : opt_(bias_),
                   residual = opt_(residual_);
  const int64_t d = ln_size(input, ns);
  const bool fused = residual.defined();
  if (!takes(input) || (fused && residual.scalar_type() != input.scalar_type())) {
    if (!takes(input) && !(flags & kTorchFallback)) refuse(input);
    /* torch's own computation (another device or dtype, no values, mixed dtypes) */
    at::Tensor h = fused ? input + residual : input;
    at::Tensor y;
    if (rms) {
      std::vector<int64_t> dims;
      for (int64_t i = 0; i < (int64_t)ns.size(); i++) dims.push_back(h.dim() - 1 - i);
      y = h * at::rsqrt(h.pow(2).mean(dims, true) + eps);
      if (weight.defined()) y = y * weight;
    } else {
      y = at::layer_norm(h, ns, weight, bias, eps);
    }
    return fused ? variable_list{y, h} : variable_list{y};
  }
  const bool grad = at::GradMode::is_enabled() &&
                    (needs_grad(input) || needs_grad(weight) || needs_grad(bias) ||
                     needs_grad(residual));
  if (!grad) {
    LnOut o = ln_forward_impl(rms, input, residual, weight, bias, d, eps, flags, false);
    return fused ? variable_list{o.y, o.h} : variable_list{o.y};
  }
  return LnFn::apply(input, weight_, rms ? OptT() : bias_, residual_, d, (int64_t)ns.size(), eps,
                     flags, rms);
}

double rms_eps(const at::Tensor &x, c10::optional<double> eps) {
  if (eps.has_value()) return *eps;
  switch (x.scalar_type()) {
    case at::kDouble: return std::numeric_limits<double>::epsilon();
    case at::kHalf: return 0.0009765625;     /* torch.finfo(float16).eps */
    case at::kBFloat16: return 0.0078125;    /* torch.finfo(bfloat16).eps */
    default: return std::numeric_limits<float>::epsilon();
  }
}

at::Tensor layer_norm(const at::Tensor &input, at::IntArrayRef normalized_shape,
                      const OptT &weight, const OptT &bias, double eps, int64_t flags) {
  return ln_dispatch(false, input, c10::nullopt, normalized_shape, weight, bias, eps, flags)[0];
}

std::tuple<at::Tensor, at::Tensor> layer_norm_residual(const at::Tensor &input,
                                                       const at::Tensor &residual,
                                                       at::IntArrayRef normalized_shape,
                                                       const OptT &weight, const OptT &bias,
                                                       double eps, int64_t flags) {
  auto o = ln_dispatch(false, input, residual, normalized_shape, weight, bias, eps, flags);
  return {o[0], o[1]};
}

at::Tensor rms_norm(const at::Tensor &input, at::IntArrayRef normalized_shape,
                    const OptT &weight, c10::optional<double> eps, int64_t flags) {
  return ln_dispatch(true, input, c10::nullopt, normalized_shape, weight, c10::nullopt,
                     rms_eps(input, eps), flags)[0];
}

std::tuple<at::Tensor, at::Tensor> rms_norm_residual(const at::Tensor &input,
                                                     const at::Tensor &residual,
                                                     at::IntArrayRef normalized_shape,
                                                     const OptT &weight,
                                                     c10::optional<double> eps, int64_t flags) {
  auto o = ln_dispatch(true, input, residual, normalized_shape, weight, c10::nullopt,
                       rms_eps(input, eps), flags);
  return {o[0], o[1]};
}

/* ------------------------------------------------------------------------------------------ */
/* GroupNorm and InstanceNorm                                                                  */
/* ------------------------------------------------------------------------------------------ */

constexpr int64_t kActs = NORMA_RELU | NORMA_SILU;

norma_gn_desc gn_desc(const Dense &X, int64_t groups, double eps, int64_t flags) {
  norma_gn_desc d;
  d.n = X.n;
  d.c = X.c;
  d.spatial = X.spatial;
  d.groups = groups;
  d.layout = X.layout;
  d.dtype = X.dtype;
  d.eps = eps;
  d.flags = (unsigned)(flags & kCFlags);
  return d;
}

norma_in_desc in_desc(const Dense &X, double eps, int64_t flags) {
  norma_in_desc d;
  d.n = X.n;
  d.c = X.c;
  d.spatial = X.spatial;
  d.layout = X.layout;
  d.dtype = X.dtype;
  d.eps = eps;
  d.flags = (unsigned)(flags & kCFlags);
  return d;
}

/* The forward of GroupNorm (groups > 0) or InstanceNorm with instance statistics (groups ==
   0): y, save_mean, save_invstd. */
struct GnOut {
  at::Tensor y, mean, invstd;
};

GnOut gn_forward_impl(const Dense &X, int64_t groups, const at::Tensor &w, const at::Tensor &b,
                      const OptT &rmean, const OptT &rvar, double momentum, double eps,
                      int64_t flags, bool keep_stats) {
  GnOut o;
  o.y = empty_like(X);
  const int64_t per = groups > 0 ? groups : X.c;
  auto popts = X.t.options().dtype(X.pdtype);
  if (keep_stats) {
    o.mean = at::empty({X.n * per}, popts);
    o.invstd = at::empty({X.n * per}, popts);
  }
  if (groups > 0) {
    const norma_gn_desc d = gn_desc(X, groups, eps, flags);
    check(norma_gn_forward(&d, X.ptr(), ptr(w), ptr(b), o.y.data_ptr(), ptr(o.mean),
                           ptr(o.invstd)),
          "norma_gn_forward");
  } else {
    InOut rm = param_inout(rmean, X.c, X.pdtype, "running_mean");
    InOut rv = param_inout(rvar, X.c, X.pdtype, "running_var");
    const norma_in_desc d = in_desc(X, eps, flags);
    check(norma_in_forward_training(&d, X.ptr(), ptr(w), ptr(b), o.y.data_ptr(),
                                    ptr(o.mean), ptr(o.invstd), rm.ptr(), rv.ptr(), momentum),
          "norma_in_forward_training");
    rm.commit();
    rv.commit();
  }
  return o;
}

struct GnGrads {
  at::Tensor dx, dw, db; /* dw, db in the parameter type */
};

/* One norma_gn_backward (groups > 0) or norma_in_backward (groups == 0) call; y is needed
   with NORMA_RELU (the mask), beta with NORMA_SILU. */
GnGrads gn_backward_impl(int64_t groups, const at::Tensor &x, const at::Tensor &y,
                         const at::Tensor &gy, const at::Tensor &w, const at::Tensor &b,
                         const at::Tensor &mean, const at::Tensor &invstd, double eps,
                         int64_t flags, bool nw, bool nb) {
  const Dense X = dense(x, "x");
  Dense Y;
  if (flags & NORMA_RELU) {
    TORCH_CHECK_VALUE(y.defined(), "the backward of a fused ReLU needs y");
    Y = dense_like(y, X, "y");
  }
  const Dense DY = dense_like(gy, X, "grad_output");
  const at::Tensor wp = pin(w, X.c, X.pdtype, "weight");
  const at::Tensor bp = (flags & NORMA_SILU) ? pin(b, X.c, X.pdtype, "bias") : at::Tensor();
  const int64_t per = X.n * (groups > 0 ? groups : X.c);
  const at::Tensor mp = pin(mean, per, X.pdtype, "save_mean");
  const at::Tensor ip = pin(invstd, per, X.pdtype, "save_invstd");
  TORCH_CHECK_VALUE(mp.defined() && ip.defined(), "the saved statistics are required");
  GnGrads g;
  g.dx = empty_like(X);
  if (nw) g.dw = param_out(X);
  if (nb) g.db = param_out(X);
  if (groups > 0) {
    const norma_gn_desc d = gn_desc(X, groups, eps, flags);
    check(norma_gn_backward(&d, X.ptr(), Y.t.defined() ? Y.ptr() : nullptr, DY.ptr(), ptr(wp),
                            ptr(bp), mp.data_ptr(), ip.data_ptr(), g.dx.data_ptr(), ptr(g.dw),
                            ptr(g.db)),
          "norma_gn_backward");
  } else {
    const norma_in_desc d = in_desc(X, eps, flags);
    check(norma_in_backward(&d, X.ptr(), Y.t.defined() ? Y.ptr() : nullptr, DY.ptr(), ptr(wp),
                            ptr(bp), mp.data_ptr(), ip.data_ptr(), g.dx.data_ptr(), ptr(g.dw),
                            ptr(g.db)),
          "norma_in_backward");
  }
  return g;
}

struct GnFn : public torch::autograd::Function<GnFn> {
  /* groups == 0: InstanceNorm (running statistics updated when given) */
  static at::Tensor forward(AutogradContext *ctx, const at::Tensor &x, const OptT &weight,
                            const OptT &bias, int64_t groups, const OptT &rmean,
                            const OptT &rvar, double momentum, double eps, int64_t flags) {
    const Dense X = dense(x, "input");
    const at::Tensor w = opt_(weight), b = opt_(bias);
    const at::Tensor wp = pin(w, X.c, X.pdtype, "weight"), bp = pin(b, X.c, X.pdtype, "bias");
    GnOut o = gn_forward_impl(X, groups, wp, bp, rmean, rvar, momentum, eps, flags, true);
    const bool relu = (flags & NORMA_RELU) != 0;
    ctx->save_for_backward({X.t, relu ? o.y : at::Tensor(), w, b, o.mean, o.invstd});
    ctx->saved_data["groups"] = groups;
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["flags"] = flags & (kActs | NORMA_CHECK_FINITE);
    ctx->saved_data["connected"] = X.t.is_same(x);
    ctx->saved_data["edges"] = Edges::of({&x, &w, &b}).pack();
    return o.y;
  }

  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    auto s = ctx->get_saved_variables();
    const int64_t groups = ctx->saved_data["groups"].toInt();
    const Edges e = Edges::unpack(ctx->saved_data["edges"].toInt());
    const at::Tensor &w = s[2], &b = s[3];
    if (at::GradMode::is_enabled()) { /* double backward: torch's ops, see torch_grads */
      check_connected(ctx, groups > 0 ? "GroupNorm" : "InstanceNorm");
      const at::Tensor &x = s[0];
      const int64_t flags = ctx->saved_data["flags"].toInt();
      const at::ScalarType ct = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
      at::Tensor y = at::group_norm(compute_type(x, ct), groups > 0 ? groups : x.size(1),
                                    compute_type(w, ct), compute_type(b, ct),
                                    ctx->saved_data["eps"].toDouble());
      y = torch_act(y, flags);
      auto g = torch_grads(y, {x, w, b}, grads[0]);
      variable_list out{e.idx[0] >= 0 ? g[0] : at::Tensor(), g[1], g[2]};
      out.resize(9);
      return out;
    }
    GnGrads g = gn_backward_impl(groups, s[0], s[1], grads[0], w, b, s[4], s[5],
                                 ctx->saved_data["eps"].toDouble(),
                                 ctx->saved_data["flags"].toInt(), e.needs(ctx, 1),
                                 e.needs(ctx, 2));
    variable_list out{g.dx, grad_to(g.dw, w), grad_to(g.db, b)};
    out = once_differentiable(std::move(out), grads, groups > 0 ? "GroupNorm" : "InstanceNorm");
    out.resize(9); /* groups, running_mean, running_var, momentum, eps, flags */
    return out;
  }
};

/* InstanceNorm with the running statistics (eval mode of a layer that tracks them): the
   backward of constant statistics is BatchNorm's with NORMA_BN_GLOBAL_STATS. */
struct InEvalFn : public torch::autograd::Function<InEvalFn> {
  static at::Tensor forward(AutogradContext *ctx, const at::Tensor &x, const OptT &weight,
                            const OptT &bias, const at::Tensor &rmean, const at::Tensor &rvar,
                            double eps, int64_t flags) {
    const Dense X = dense(x, "input");
    const at::Tensor w = opt_(weight), b = opt_(bias);
    const at::Tensor m = pin(rmean, X.c, X.pdtype, "running_mean");
    const at::Tensor v = pin(rvar, X.c, X.pdtype, "running_var");
    at::Tensor y = empty_like(X);
    const norma_in_desc d = in_desc(X, eps, flags);
    check(norma_in_forward_inference(&d, X.ptr(), ptr(pin(w, X.c, X.pdtype, "weight")),
                                     ptr(pin(b, X.c, X.pdtype, "bias")), m.data_ptr(),
                                     v.data_ptr(), y.data_ptr()),
          "norma_in_forward_inference");
    at::Tensor sm = m.clone();
    at::Tensor si = (v.to(at::kDouble) + eps).rsqrt().to(X.pdtype);
    ctx->save_for_backward({X.t, (flags & NORMA_RELU) ? y : at::Tensor(), w, b, sm, si});
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["flags"] = flags & (NORMA_RELU | NORMA_CHECK_FINITE);
    ctx->saved_data["connected"] = X.t.is_same(x);
    ctx->saved_data["edges"] = Edges::of({&x, &w, &b}).pack();
    return y;
  }

  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    auto s = ctx->get_saved_variables();
    const int64_t flags = ctx->saved_data["flags"].toInt();
    const Edges e = Edges::unpack(ctx->saved_data["edges"].toInt());
    if (at::GradMode::is_enabled()) { /* double backward: torch's ops, see torch_grads */
      check_connected(ctx, "InstanceNorm");
      const at::Tensor &x = s[0], &w = s[2], &b = s[3];
      const at::ScalarType ct = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
      std::vector<int64_t> shape(x.dim(), 1);
      shape[1] = x.size(1);
      at::Tensor y = (compute_type(x, ct) - compute_type(s[4], ct).view(shape)) *
                     compute_type(s[5], ct).view(shape);
      if (w.defined()) y = y * compute_type(w, ct).view(shape);
      if (b.defined()) y = y + compute_type(b, ct).view(shape);
      y = torch_act(y, flags);
      auto g = torch_grads(y, {x, w, b}, grads[0]);
      variable_list out{e.idx[0] >= 0 ? g[0] : at::Tensor(), g[1], g[2]};
      out.resize(7);
      return out;
    }
    const Dense X = dense(s[0], "x");
    Dense Y;
    if (flags & NORMA_RELU) Y = dense_like(s[1], X, "y");
    const Dense DY = dense_like(grads[0], X, "grad_output");
    const at::Tensor &w = s[2], &b = s[3];
    const bool nw = e.needs(ctx, 1), nb = e.needs(ctx, 2);
    at::Tensor dx = empty_like(X);
    at::Tensor dw = nw ? param_out(X) : at::Tensor();
    at::Tensor db = nb ? param_out(X) : at::Tensor();
    const norma_bn_desc d =
        X.desc(ctx->saved_data["eps"].toDouble(), flags | NORMA_BN_GLOBAL_STATS);
    check(norma_bn_backward(&d, X.ptr(), Y.t.defined() ? Y.ptr() : nullptr, DY.ptr(),
                            ptr(pin(w, X.c, X.pdtype, "weight")),
                            ptr(pin(b, X.c, X.pdtype, "bias")), s[4].data_ptr(),
                            s[5].data_ptr(), dx.data_ptr(), nullptr, ptr(dw), ptr(db)),
          "norma_bn_backward");
    variable_list out{dx, grad_to(dw, w), grad_to(db, b)};
    out = once_differentiable(std::move(out), grads, "InstanceNorm");
    out.resize(7);
    return out;
  }
};

at::Tensor group_norm(const at::Tensor &input, int64_t num_groups, const OptT &weight_,
                      const OptT &bias_, double eps, int64_t flags) {
  const at::Tensor weight = opt_(weight_), bias = opt_(bias_);
  TORCH_CHECK_VALUE(!((flags & NORMA_RELU) && (flags & NORMA_SILU)),
                    "group_norm: NORMA_RELU and NORMA_SILU exclude each other");
  TORCH_CHECK_VALUE(input.dim() >= 2, "group_norm: expected an input [N, C, *], got shape ",
                    input.sizes());
  const int64_t c = input.size(1);
  TORCH_CHECK_VALUE(num_groups > 0 && c % num_groups == 0,
                    "Expected number of channels in input to be divisible by num_groups, but "
                    "got input of shape ",
                    input.sizes(), " and num_groups=", num_groups);
  TORCH_CHECK_VALUE(!weight.defined() || weight.numel() == c, "weight must have ", c,
                    " elements (the channels of the input), got shape ", weight.sizes());
  TORCH_CHECK_VALUE(!bias.defined() || bias.numel() == c, "bias must have ", c,
                    " elements (the channels of the input), got shape ", bias.sizes());
  if (!takes(input)) {
    if (!(flags & kTorchFallback)) refuse(input);
    return torch_act(at::group_norm(input, num_groups, weight, bias, eps), flags);
  }
  if (input.dim() > 5) { /* [N, C, s1, ..., sk]: as [N, C, s1 * ... * sk] */
    at::Tensor y = group_norm(input.contiguous().view({input.size(0), c, -1}), num_groups,
                              weight_, bias_, eps, flags);
    return y.view(input.sizes());
  }
  const bool grad = at::GradMode::is_enabled() &&
                    (needs_grad(input) || needs_grad(weight) || needs_grad(bias));
  if (grad)
    return GnFn::apply(input, weight_, bias_, num_groups, c10::nullopt, c10::nullopt, 0.0, eps,
                       flags);
  const Dense X = dense(input, "input");
  return gn_forward_impl(X, num_groups, pin(weight, c, X.pdtype, "weight"),
                         pin(bias, c, X.pdtype, "bias"), c10::nullopt, c10::nullopt, 0.0, eps,
                         flags, false)
      .y;
}

at::Tensor instance_norm(const at::Tensor &input, const OptT &weight_, const OptT &bias_,
                         const OptT &running_mean, const OptT &running_var, bool use_input_stats,
                         double momentum, double eps, int64_t flags) {
  const at::Tensor weight = opt_(weight_), bias = opt_(bias_);
  const at::Tensor rm = opt_(running_mean), rv = opt_(running_var);
  TORCH_CHECK_VALUE(input.dim() >= 3, "instance_norm: expected an input [N, C, *] with at least "
                    "one spatial dimension, got shape ", input.sizes());
  const int64_t c = input.size(1);
  for (auto *p : {&weight, &bias, &rm, &rv})
    TORCH_CHECK_VALUE(!p->defined() || p->numel() == c, "instance_norm: a per-channel "
                      "parameter or statistic has shape ", p->sizes(), " but the input has ", c,
                      " channels");
  TORCH_CHECK_VALUE(use_input_stats || (rm.defined() && rv.defined()),
                    "Expected running_mean and running_var to be defined when use_input_stats "
                    "is false");
  if (use_input_stats) {
    int64_t spatial = 1;
    for (int64_t i = 2; i < input.dim(); i++) spatial *= input.size(i);
    TORCH_CHECK_VALUE(spatial != 1,
                      "Expected more than 1 spatial element when training, got input size ",
                      input.sizes());
  }
  if (!takes(input)) {
    if (!(flags & kTorchFallback)) refuse(input);
    return torch_act(at::instance_norm(input, weight, bias, rm, rv, use_input_stats, momentum,
                                       eps, false),
                     flags);
  }
  if (input.dim() > 5) {
    at::Tensor y = instance_norm(input.contiguous().view({input.size(0), c, -1}), weight_,
                                 bias_, running_mean, running_var, use_input_stats, momentum,
                                 eps, flags);
    return y.view(input.sizes());
  }
  const bool grad = at::GradMode::is_enabled() &&
                    (needs_grad(input) || needs_grad(weight) || needs_grad(bias));
  if (use_input_stats) {
    if (grad)
      return GnFn::apply(input, weight_, bias_, 0, running_mean, running_var, momentum, eps,
                         flags);
    const Dense X = dense(input, "input");
    return gn_forward_impl(X, 0, pin(weight, c, X.pdtype, "weight"),
                           pin(bias, c, X.pdtype, "bias"), running_mean, running_var, momentum,
                           eps, flags, false)
        .y;
  }
  TORCH_CHECK_VALUE(!(flags & NORMA_SILU), "instance_norm: NORMA_SILU with running statistics "
                    "is not supported");
  if (grad) return InEvalFn::apply(input, weight_, bias_, rm, rv, eps, flags);
  const Dense X = dense(input, "input");
  at::Tensor y = empty_like(X);
  const norma_in_desc d = in_desc(X, eps, flags);
  check(norma_in_forward_inference(&d, X.ptr(), ptr(pin(weight, c, X.pdtype, "weight")),
                                   ptr(pin(bias, c, X.pdtype, "bias")),
                                   ptr(pin(rm, c, X.pdtype, "running_mean")),
                                   ptr(pin(rv, c, X.pdtype, "running_var")), y.data_ptr()),
        "norma_in_forward_inference");
  return y;
}

/* ------------------------------------------------------------------------------------------ */
/* The C calls as operators (no autograd), for tests and for code that owns its autograd       */
/* ------------------------------------------------------------------------------------------ */

void check_takes(const at::Tensor &x) {
  if (!takes(x)) refuse(x);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> ln_forward(
    const at::Tensor &x, const OptT &residual, at::IntArrayRef normalized_shape,
    const OptT &weight, const OptT &bias, double eps, int64_t flags) {
  check_takes(x);
  const int64_t d = ln_size(x, normalized_shape);
  const at::Tensor r = opt_(residual);
  TORCH_CHECK_TYPE(!r.defined() || r.scalar_type() == x.scalar_type(), "residual has dtype ",
                   (r.defined() ? r.scalar_type() : x.scalar_type()), ", expected ",
                   x.scalar_type());
  LnOut o = ln_forward_impl(false, x, r, opt_(weight), opt_(bias), d, eps, flags, true);
  return {o.y, o.h, o.mean, o.invstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> ln_backward(
    const at::Tensor &x, const at::Tensor &dy, const OptT &dsum,
    at::IntArrayRef normalized_shape, const OptT &weight, const at::Tensor &save_mean,
    const at::Tensor &save_invstd, int64_t flags, bool param_grads) {
  check_takes(x);
  const int64_t d = ln_size(x, normalized_shape);
  LnGrads g = ln_backward_impl(false, x, dy, opt_(dsum), opt_(weight), save_mean, save_invstd,
                               d, (int64_t)normalized_shape.size(), 0.0, flags, param_grads,
                               param_grads);
  return {g.dx, g.dw, g.db};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> rms_forward(
    const at::Tensor &x, const OptT &residual, at::IntArrayRef normalized_shape,
    const OptT &weight, c10::optional<double> eps, int64_t flags) {
  check_takes(x);
  const int64_t d = ln_size(x, normalized_shape);
  const at::Tensor r = opt_(residual);
  TORCH_CHECK_TYPE(!r.defined() || r.scalar_type() == x.scalar_type(), "residual has dtype ",
                   (r.defined() ? r.scalar_type() : x.scalar_type()), ", expected ",
                   x.scalar_type());
  LnOut o = ln_forward_impl(true, x, r, opt_(weight), at::Tensor(), d, rms_eps(x, eps), flags,
                            true);
  return {o.y, o.h, o.invstd};
}

std::tuple<at::Tensor, at::Tensor> rms_backward(
    const at::Tensor &x, const at::Tensor &dy, const OptT &dsum,
    at::IntArrayRef normalized_shape, const OptT &weight, const at::Tensor &save_invrms,
    int64_t flags, bool param_grads) {
  check_takes(x);
  const int64_t d = ln_size(x, normalized_shape);
  LnGrads g = ln_backward_impl(true, x, dy, opt_(dsum), opt_(weight), at::Tensor(), save_invrms,
                               d, (int64_t)normalized_shape.size(), 0.0, flags, param_grads,
                               false);
  return {g.dx, g.dw};
}

void check_groups(const at::Tensor &x, int64_t groups) {
  TORCH_CHECK_VALUE(x.dim() >= 2 && x.dim() <= 5, "x must have 2 to 5 dimensions, got shape ",
                    x.sizes());
  TORCH_CHECK_VALUE(groups > 0 && x.size(1) % groups == 0,
                    "Expected number of channels in input to be divisible by num_groups, but "
                    "got input of shape ",
                    x.sizes(), " and num_groups=", groups);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> gn_forward(const at::Tensor &x,
                                                          int64_t num_groups,
                                                          const OptT &weight, const OptT &bias,
                                                          double eps, int64_t flags) {
  check_takes(x);
  check_groups(x, num_groups);
  const Dense X = dense(x, "x");
  GnOut o = gn_forward_impl(X, num_groups, pin(opt_(weight), X.c, X.pdtype, "weight"),
                            pin(opt_(bias), X.c, X.pdtype, "bias"), c10::nullopt, c10::nullopt,
                            0.0, eps, flags, true);
  return {o.y, o.mean, o.invstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> gn_backward(
    const at::Tensor &x, const OptT &y, const at::Tensor &dy, int64_t num_groups,
    const OptT &weight, const OptT &bias, const at::Tensor &save_mean,
    const at::Tensor &save_invstd, int64_t flags, bool param_grads) {
  check_takes(x);
  check_groups(x, num_groups);
  GnGrads g = gn_backward_impl(num_groups, x, opt_(y), dy, opt_(weight), opt_(bias), save_mean,
                               save_invstd, 0.0, flags, param_grads, param_grads);
  return {g.dx, g.dw, g.db};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> in_forward_training(
    const at::Tensor &x, const OptT &weight, const OptT &bias, const OptT &running_mean,
    const OptT &running_var, double momentum, double eps, int64_t flags) {
  check_takes(x);
  const Dense X = dense(x, "x");
  GnOut o = gn_forward_impl(X, 0, pin(opt_(weight), X.c, X.pdtype, "weight"),
                            pin(opt_(bias), X.c, X.pdtype, "bias"), running_mean, running_var,
                            momentum, eps, flags, true);
  return {o.y, o.mean, o.invstd};
}

at::Tensor in_forward_inference(const at::Tensor &x, const OptT &weight, const OptT &bias,
                                const at::Tensor &mean, const at::Tensor &var, double eps,
                                int64_t flags) {
  check_takes(x);
  const Dense X = dense(x, "x");
  at::Tensor y = empty_like(X);
  const norma_in_desc d = in_desc(X, eps, flags);
  check(norma_in_forward_inference(&d, X.ptr(), ptr(pin(opt_(weight), X.c, X.pdtype, "weight")),
                                   ptr(pin(opt_(bias), X.c, X.pdtype, "bias")),
                                   pin(mean, X.c, X.pdtype, "mean").data_ptr(),
                                   pin(var, X.c, X.pdtype, "var").data_ptr(), y.data_ptr()),
        "norma_in_forward_inference");
  return y;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> in_backward(
    const at::Tensor &x, const OptT &y, const at::Tensor &dy, const OptT &weight,
    const OptT &bias, const at::Tensor &save_mean, const at::Tensor &save_invstd, int64_t flags,
    bool param_grads) {
  check_takes(x);
  GnGrads g = gn_backward_impl(0, x, opt_(y), dy, opt_(weight), opt_(bias), save_mean,
                               save_invstd, 0.0, flags, param_grads, param_grads);
  return {g.dx, g.dw, g.db};
}

}  // namespace
}  // namespace norma_torch

TORCH_LIBRARY_FRAGMENT(norma, m) {
  using namespace norma_torch;
  m.def("layer_norm(Tensor input, int[] normalized_shape, Tensor? weight, Tensor? bias, "
        "float eps, int flags) -> Tensor",
        &layer_norm);
  m.def("layer_norm_residual(Tensor input, Tensor residual, int[] normalized_shape, "
        "Tensor? weight, Tensor? bias, float eps, int flags) -> (Tensor, Tensor)",
        &layer_norm_residual);
  m.def("rms_norm(Tensor input, int[] normalized_shape, Tensor? weight, float? eps, int flags) "
        "-> Tensor",
        &rms_norm);
  m.def("rms_norm_residual(Tensor input, Tensor residual, int[] normalized_shape, "
        "Tensor? weight, float? eps, int flags) -> (Tensor, Tensor)",
        &rms_norm_residual);
  m.def("group_norm(Tensor input, int num_groups, Tensor? weight, Tensor? bias, float eps, "
        "int flags) -> Tensor",
        &group_norm);
  m.def("instance_norm(Tensor input, Tensor? weight, Tensor? bias, Tensor(a!)? running_mean, "
        "Tensor(b!)? running_var, bool use_input_stats, float momentum, float eps, int flags) "
        "-> Tensor",
        &instance_norm);
  /* the C calls themselves (no autograd); save_* as the forwards return them */
  m.def("ln_forward(Tensor x, Tensor? residual, int[] normalized_shape, Tensor? weight, "
        "Tensor? bias, float eps, int flags) -> (Tensor y, Tensor h, Tensor save_mean, "
        "Tensor save_invstd)",
        &ln_forward);
  m.def("ln_backward(Tensor x, Tensor dy, Tensor? dsum, int[] normalized_shape, "
        "Tensor? weight, Tensor save_mean, Tensor save_invstd, int flags, bool param_grads) "
        "-> (Tensor dx, Tensor dweight, Tensor dbias)",
        &ln_backward);
  m.def("rms_forward(Tensor x, Tensor? residual, int[] normalized_shape, Tensor? weight, "
        "float? eps, int flags) -> (Tensor y, Tensor h, Tensor save_invrms)",
        &rms_forward);
  m.def("rms_backward(Tensor x, Tensor dy, Tensor? dsum, int[] normalized_shape, "
        "Tensor? weight, Tensor save_invrms, int flags, bool param_grads) "
        "-> (Tensor dx, Tensor dweight)",
        &rms_backward);
  m.def("gn_forward(Tensor x, int num_groups, Tensor? weight, Tensor? bias, float eps, "
        "int flags) -> (Tensor y, Tensor save_mean, Tensor save_invstd)",
        &gn_forward);
  m.def("gn_backward(Tensor x, Tensor? y, Tensor dy, int num_groups, Tensor? weight, "
        "Tensor? bias, Tensor save_mean, Tensor save_invstd, int flags, bool param_grads) "
        "-> (Tensor dx, Tensor dweight, Tensor dbias)",
        &gn_backward);
  m.def("in_forward_training(Tensor x, Tensor? weight, Tensor? bias, "
        "Tensor(a!)? running_mean, Tensor(b!)? running_var, float momentum, float eps, "
        "int flags) -> (Tensor y, Tensor save_mean, Tensor save_invstd)",
        &in_forward_training);
  m.def("in_forward_inference(Tensor x, Tensor? weight, Tensor? bias, Tensor mean, "
        "Tensor var, float eps, int flags) -> Tensor",
        &in_forward_inference);
  m.def("in_backward(Tensor x, Tensor? y, Tensor dy, Tensor? weight, Tensor? bias, "
        "Tensor save_mean, Tensor save_invstd, int flags, bool param_grads) "
        "-> (Tensor dx, Tensor dweight, Tensor dbias)",
        &in_backward);
}
