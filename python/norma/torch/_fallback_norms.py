"""The ctypes twins of src/torch/norms_ops.cpp: layer_norm, layer_norm_residual, rms_norm,
rms_norm_residual, group_norm, instance_norm with the operators' signatures (see _ops.py),
autograd through torch.autograd.Function, one C call forward and one backward."""

import ctypes
import functools
import math
import warnings

import torch
import torch.nn.functional as F

from .. import _core
from .._lib import (call, LnDesc, GnDesc, InDesc, BnDesc, BN_RELU, SILU, CHECK_FINITE,
                    BN_GLOBAL_STATS, F32, F64, F16, BF16)
from ._ops import TORCH_FALLBACK

C_FLAGS = 0xffff
_SUPPORTED = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_NDT = {torch.float32: F32, torch.float64: F64, torch.float16: F16, torch.bfloat16: BF16}
_FINFO_EPS = {t: torch.finfo(t).eps for t in _SUPPORTED}

__all__ = ["layer_norm", "layer_norm_residual", "rms_norm", "rms_norm_residual", "group_norm",
           "instance_norm"]


def _traceable(fn):
    """Inside torch.jit.trace the operator records one autograd function; the sizes that the
    checks and the ctypes call read are constants of the trace, so the tracer's warnings about
    them are noise."""
    @functools.wraps(fn)
    def wrapper(*args):
        if not torch.jit.is_tracing():
            return fn(*args)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            return fn(*args)
    return wrapper


def _takes(x):
    return x.device.type == "cpu" and x.dtype in _SUPPORTED and x.numel() > 0


def _refuse(x):
    if x.dtype not in _SUPPORTED:
        raise TypeError("input has dtype %s; norma supports float32, float64, float16 and "
                        "bfloat16" % x.dtype)
    if x.device.type != "cpu":
        raise ValueError("input is on %s: norma runs on CPU tensors" % x.device)
    raise ValueError("input has no values (shape %s)" % (tuple(x.shape),))


def _rg(t):
    return t is not None and t.requires_grad


def _ptr(t):
    return t.data_ptr() if t is not None else None


def _pin(p, numel, pdt, name):
    if p is None:
        return None
    if p.device.type != "cpu":
        raise ValueError("%s is on %s: norma runs on CPU tensors" % (name, p.device))
    if p.numel() != numel:
        raise ValueError("%s must have %d elements (got shape %s)" % (name, numel,
                                                                      tuple(p.shape)))
    p = p.detach()
    if p.dtype == pdt and p.is_contiguous():
        return p
    return p.to(pdt).contiguous()


def _grad_to(g, like):
    if g is None or like is None or g.dtype == like.dtype:
        return g
    return g.to(like.dtype)


# ------------------------------------------------------------------------------------------
# LayerNorm / RMSNorm
# ------------------------------------------------------------------------------------------


def _ln_size(x, ns):
    k = len(ns)
    if k < 1 or x.dim() < k or tuple(x.shape[x.dim() - k:]) != tuple(ns):
        raise ValueError("Given normalized_shape=%s, expected input with shape [*, %s], but got "
                         "input of size%s" % (list(ns), ", ".join(str(v) for v in ns),
                                              list(x.shape)))
    return int(math.prod(ns))


def _ln_forward(rms, x, r, w, b, d, eps, flags, keep_stats=True):
    x = x.detach()
    x = x if x.is_contiguous() else x.contiguous()
    if r is not None:
        if r.shape != x.shape:
            raise ValueError("residual has shape %s, expected %s (the shape of x)"
                             % (tuple(r.shape), tuple(x.shape)))
        r = r.detach()
        r = r if r.is_contiguous() else r.contiguous()
    pdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    wp = _pin(w, d, pdt, "weight")
    bp = None if rms else _pin(b, d, pdt, "bias")
    rows = x.numel() // d
    y = torch.empty_like(x)
    h = torch.empty_like(x) if r is not None else None
    mean = None if rms or not keep_stats else torch.empty(rows, dtype=pdt)
    invstd = torch.empty(rows, dtype=pdt) if keep_stats else None
    desc = LnDesc(rows, d, _NDT[x.dtype], float(eps), int(flags) & C_FLAGS)
    if rms:
        call("norma_rms_forward", ctypes.byref(desc), x.data_ptr(), _ptr(r), _ptr(wp),
             y.data_ptr(), _ptr(h), _ptr(invstd))
    else:
        call("norma_ln_forward", ctypes.byref(desc), x.data_ptr(), _ptr(r), _ptr(wp), _ptr(bp),
             y.data_ptr(), _ptr(h), _ptr(mean), _ptr(invstd))
    return y, h, (h if r is not None else x), mean, invstd


def _ln_double_backward(ctx, x, w, gy, gh):
    """The first-order gradients as torch ops of x (h), w and gy, differentiable again (a
    backward with create_graph=True); norma computes the ordinary backward."""
    ct = torch.float64 if x.dtype == torch.float64 else torch.float32
    k = ctx.k
    dims = tuple(range(x.dim() - k, x.dim()))
    lead = tuple(range(x.dim() - k))
    xc = x.to(ct)
    gy = (gy if gy is not None else torch.zeros_like(x)).to(ct)
    if ctx.rms:
        rinv = torch.rsqrt(xc.pow(2).mean(dims, keepdim=True) + ctx.eps)
        xhat = xc * rinv
    else:
        c = xc - xc.mean(dims, keepdim=True)
        rinv = torch.rsqrt(c.pow(2).mean(dims, keepdim=True) + ctx.eps)
        xhat = c * rinv
    g = gy * w.to(ct) if w is not None else gy
    if ctx.rms:
        dx = rinv * (g - xhat * (g * xhat).mean(dims, keepdim=True))
    else:
        dx = rinv * (g - g.mean(dims, keepdim=True) - xhat * (g * xhat).mean(dims, keepdim=True))
    dx = dx.to(x.dtype)
    if gh is not None:
        dx = dx + gh.to(x.dtype)
    need = ctx.needs_input_grad
    dw = (gy * xhat).sum(lead).to(w.dtype) if need[1] else None
    db = gy.sum(lead).to(ctx.bias_dtype) if need[2] else None
    return (dx if need[0] else None, dw, db, dx if need[3] else None,
            None, None, None, None, None)


def _torch_grads(y, ins, gy):
    """Gradients of y (differentiable again) with respect to the inputs that require grad."""
    want = [t for t in ins if t is not None and t.requires_grad]
    got = list(torch.autograd.grad(y, want, gy.to(y.dtype), create_graph=True,
                                   allow_unused=True)) if want else []
    out = []
    for t in ins:
        if t is not None and t.requires_grad:
            g = got.pop(0)
            out.append(g if g is not None else torch.zeros_like(t))
        else:
            out.append(None)
    return out


class _LnFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, residual, d, k, eps, flags, rms):
        y, h, xs, mean, invstd = _ln_forward(rms, x, residual, weight, bias, d, eps, flags)
        ctx.set_materialize_grads(False)
        # h (an output) with a residual, else x itself (the double backward differentiates
        # through it)
        ctx.save_for_backward(h if residual is not None else x, weight)
        ctx.mean, ctx.invstd = mean, invstd
        ctx.d, ctx.k, ctx.eps, ctx.flags, ctx.rms = d, k, eps, flags & CHECK_FINITE, rms
        ctx.bias_dtype = bias.dtype if bias is not None else None
        ctx.fused = residual is not None
        if residual is not None:
            return y, h
        return y

    @staticmethod
    def backward(ctx, gy, gh=None):
        x, w = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: differentiable torch ops
            return _ln_double_backward(ctx, x, w, gy, gh)
        x = x.detach()
        x = x if x.is_contiguous() else x.contiguous()
        if gy is None:
            gy = torch.zeros_like(x)
        gy = gy if gy.is_contiguous() else gy.contiguous()
        if gh is not None:
            gh = gh.to(x.dtype) if gh.dtype != x.dtype else gh
            gh = gh if gh.is_contiguous() else gh.contiguous()
        d = ctx.d
        pdt = torch.float64 if x.dtype == torch.float64 else torch.float32
        wp = _pin(w, d, pdt, "weight")
        need = ctx.needs_input_grad
        dx = torch.empty_like(x)
        dw = torch.empty(d, dtype=pdt) if need[1] else None
        db = torch.empty(d, dtype=pdt) if need[2] else None
        desc = LnDesc(x.numel() // d, d, _NDT[x.dtype], float(ctx.eps), ctx.flags)
        if ctx.rms:
            call("norma_rms_backward", ctypes.byref(desc), x.data_ptr(), gy.data_ptr(),
                 _ptr(gh), _ptr(wp), ctx.invstd.data_ptr(), dx.data_ptr(), _ptr(dw))
        else:
            call("norma_ln_backward", ctypes.byref(desc), x.data_ptr(), gy.data_ptr(), _ptr(gh),
                 _ptr(wp), ctx.mean.data_ptr(), ctx.invstd.data_ptr(), dx.data_ptr(), _ptr(dw),
                 _ptr(db))
        pshape = x.shape[x.dim() - ctx.k:]
        dw = dw.view(pshape) if dw is not None else None
        db = db.view(pshape) if db is not None else None
        if db is not None and ctx.bias_dtype is not None and db.dtype != ctx.bias_dtype:
            db = db.to(ctx.bias_dtype)
        return (dx if need[0] else None, _grad_to(dw, w), db, dx if need[3] else None,
                None, None, None, None, None)


def _ln_dispatch(rms, input, residual, ns, weight, bias, eps, flags):
    if rms:
        bias = None
    d = _ln_size(input, ns)
    fused = residual is not None
    if not _takes(input) or (fused and residual.dtype != input.dtype):
        if not _takes(input) and not flags & TORCH_FALLBACK:
            _refuse(input)
        h = input + residual if fused else input
        if rms:
            dims = tuple(range(h.dim() - len(ns), h.dim()))
            y = h * torch.rsqrt(h.pow(2).mean(dims, keepdim=True) + eps)
            if weight is not None:
                y = y * weight
        else:
            y = F.layer_norm(h, list(ns), weight, bias, eps)
        return (y, h) if fused else y
    if torch.is_grad_enabled() and (_rg(input) or _rg(weight) or _rg(bias) or _rg(residual)):
        return _LnFunction.apply(input, weight, bias, residual, d, len(ns), eps, flags, rms)
    y, h, _, _, _ = _ln_forward(rms, input, residual, weight, bias, d, eps, flags, False)
    return (y, h) if fused else y


def _rms_eps(x, eps):
    return _FINFO_EPS.get(x.dtype, 1.1920928955078125e-07) if eps is None else eps


@_traceable
def layer_norm(input, normalized_shape, weight, bias, eps, flags):
    return _ln_dispatch(False, input, None, normalized_shape, weight, bias, eps, flags)


@_traceable
def layer_norm_residual(input, residual, normalized_shape, weight, bias, eps, flags):
    return _ln_dispatch(False, input, residual, normalized_shape, weight, bias, eps, flags)


@_traceable
def rms_norm(input, normalized_shape, weight, eps, flags):
    return _ln_dispatch(True, input, None, normalized_shape, weight, None,
                        _rms_eps(input, eps), flags)


@_traceable
def rms_norm_residual(input, residual, normalized_shape, weight, eps, flags):
    return _ln_dispatch(True, input, residual, normalized_shape, weight, None,
                        _rms_eps(input, eps), flags)


# ------------------------------------------------------------------------------------------
# GroupNorm / InstanceNorm
# ------------------------------------------------------------------------------------------


def _gn_desc(X, groups, eps, flags):
    return GnDesc(X.n, X.c, X.spatial, groups, X.layout, X.dtype, float(eps),
                  int(flags) & C_FLAGS)


def _in_desc(X, eps, flags):
    return InDesc(X.n, X.c, X.spatial, X.layout, X.dtype, float(eps), int(flags) & C_FLAGS)


def _gn_forward(X, groups, w, b, rmean, rvar, momentum, eps, flags, keep_stats=True):
    pdt = X.pdtype
    wp = _pin(w, X.c, pdt, "weight")
    bp = _pin(b, X.c, pdt, "bias")
    Y = _core.new_like(X)
    per = groups if groups > 0 else X.c
    mean = torch.empty(X.n * per, dtype=pdt) if keep_stats else None
    invstd = torch.empty(X.n * per, dtype=pdt) if keep_stats else None
    if groups > 0:
        desc = _gn_desc(X, groups, eps, flags)
        call("norma_gn_forward", ctypes.byref(desc), X.ptr, _ptr(wp), _ptr(bp), Y.ptr,
             _ptr(mean), _ptr(invstd))
    else:
        rm = _core.param_inout(rmean, X, "running_mean")
        rv = _core.param_inout(rvar, X, "running_var")
        desc = _in_desc(X, eps, flags)
        call("norma_in_forward_training", ctypes.byref(desc), X.ptr, _ptr(wp), _ptr(bp), Y.ptr,
             _ptr(mean), _ptr(invstd), rm.ptr, rv.ptr, float(momentum))
        rm.finish()
        rv.finish()
    return Y.obj, mean, invstd


class _GnFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, groups, rmean, rvar, momentum, eps, flags):
        X = _core.prepare(x, None, "input")
        y, mean, invstd = _gn_forward(X, groups, weight, bias, rmean, rvar, momentum, eps, flags)
        ctx.save_for_backward(x, y if flags & BN_RELU else None, weight, bias)
        ctx.layout, ctx.mean, ctx.invstd = X.layout, mean, invstd
        ctx.groups, ctx.eps, ctx.flags = groups, eps, flags & (BN_RELU | SILU | CHECK_FINITE)
        return y

    @staticmethod
    def backward(ctx, gy):
        x, y, w, b = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: torch's ops, differentiable again
            ct = torch.float64 if x.dtype == torch.float64 else torch.float32
            z = F.group_norm(x.to(ct), ctx.groups if ctx.groups > 0 else x.shape[1],
                             w.to(ct) if w is not None else None,
                             b.to(ct) if b is not None else None, ctx.eps)
            g = _torch_grads(_torch_act(z, ctx.flags), [x, w, b], gy)
            return (g[0] if ctx.needs_input_grad[0] else None, g[1], g[2]) + (None,) * 6
        X = _core.prepare(x, ctx.layout, "x")
        Y = _core.prepare_like(y, X, "y") if y is not None else None
        DY = _core.prepare_like(gy, X, "grad_output")
        pdt = X.pdtype
        wp = _pin(w, X.c, pdt, "weight")
        bp = _pin(b, X.c, pdt, "bias") if ctx.flags & SILU else None
        need = ctx.needs_input_grad
        DX = _core.new_like(X)
        dw = torch.empty(X.c, dtype=pdt) if need[1] else None
        db = torch.empty(X.c, dtype=pdt) if need[2] else None
        if ctx.groups > 0:
            desc = _gn_desc(X, ctx.groups, ctx.eps, ctx.flags)
            fn = "norma_gn_backward"
        else:
            desc = _in_desc(X, ctx.eps, ctx.flags)
            fn = "norma_in_backward"
        call(fn, ctypes.byref(desc), X.ptr, Y.ptr if Y is not None else None, DY.ptr, _ptr(wp),
             _ptr(bp), ctx.mean.data_ptr(), ctx.invstd.data_ptr(), DX.ptr, _ptr(dw), _ptr(db))
        return (DX.obj if need[0] else None, _grad_to(dw, w), _grad_to(db, b)) + (None,) * 6


class _InEvalFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, rmean, rvar, eps, flags):
        X = _core.prepare(x, None, "input")
        y = _in_inference(X, weight, bias, rmean, rvar, eps, flags)
        pdt = X.pdtype
        ctx.save_for_backward(x, y if flags & BN_RELU else None, weight, bias)
        ctx.layout = X.layout
        ctx.sm = _pin(rmean, X.c, pdt, "running_mean").clone()
        ctx.si = (1.0 / torch.sqrt(rvar.detach().double() + float(eps))).to(pdt)
        ctx.eps, ctx.flags = eps, flags & (BN_RELU | CHECK_FINITE)
        return y

    @staticmethod
    def backward(ctx, gy):
        x, y, w, b = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: torch's ops, differentiable again
            ct = torch.float64 if x.dtype == torch.float64 else torch.float32
            shape = (1, x.shape[1]) + (1,) * (x.dim() - 2)
            z = (x.to(ct) - ctx.sm.to(ct).view(shape)) * ctx.si.to(ct).view(shape)
            if w is not None:
                z = z * w.to(ct).view(shape)
            if b is not None:
                z = z + b.to(ct).view(shape)
            g = _torch_grads(_torch_act(z, ctx.flags), [x, w, b], gy)
            return (g[0] if ctx.needs_input_grad[0] else None, g[1], g[2]) + (None,) * 4
        X = _core.prepare(x, ctx.layout, "x")
        Y = _core.prepare_like(y, X, "y") if y is not None else None
        DY = _core.prepare_like(gy, X, "grad_output")
        pdt = X.pdtype
        need = ctx.needs_input_grad
        DX = _core.new_like(X)
        dw = torch.empty(X.c, dtype=pdt) if need[1] else None
        db = torch.empty(X.c, dtype=pdt) if need[2] else None
        desc = BnDesc(X.n, X.c, X.spatial, X.layout, X.dtype, float(ctx.eps),
                      ctx.flags | BN_GLOBAL_STATS)
        wp, bp = _pin(w, X.c, pdt, "weight"), _pin(b, X.c, pdt, "bias")
        call("norma_bn_backward", ctypes.byref(desc), X.ptr, Y.ptr if Y is not None else None,
             DY.ptr, _ptr(wp), _ptr(bp),
             ctx.sm.data_ptr(), ctx.si.data_ptr(), DX.ptr, None, _ptr(dw), _ptr(db))
        return (DX.obj if need[0] else None, _grad_to(dw, w), _grad_to(db, b)) + (None,) * 4


def _in_inference(X, weight, bias, rmean, rvar, eps, flags):
    pdt = X.pdtype
    Y = _core.new_like(X)
    desc = _in_desc(X, eps, flags)
    keep = [_pin(weight, X.c, pdt, "weight"), _pin(bias, X.c, pdt, "bias"),
            _pin(rmean, X.c, pdt, "running_mean"), _pin(rvar, X.c, pdt, "running_var")]
    call("norma_in_forward_inference", ctypes.byref(desc), X.ptr, *[_ptr(t) for t in keep],
         Y.ptr)
    return Y.obj


def _torch_act(y, flags):
    if flags & SILU:
        return F.silu(y)
    if flags & BN_RELU:
        return F.relu(y)
    return y


@_traceable
def group_norm(input, num_groups, weight, bias, eps, flags):
    if flags & BN_RELU and flags & SILU:
        raise ValueError("group_norm: NORMA_RELU and NORMA_SILU exclude each other")
    if input.dim() < 2:
        raise ValueError("group_norm: expected an input [N, C, *], got shape %s"
                         % (tuple(input.shape),))
    c = input.shape[1]
    if num_groups <= 0 or c % num_groups:
        raise ValueError("Expected number of channels in input to be divisible by num_groups, "
                         "but got input of shape %s and num_groups=%d"
                         % (list(input.shape), num_groups))
    for p, name in ((weight, "weight"), (bias, "bias")):
        if p is not None and p.numel() != c:
            raise ValueError("%s must have %d elements (the channels of the input), got shape "
                             "%s" % (name, c, tuple(p.shape)))
    if not _takes(input):
        if not flags & TORCH_FALLBACK:
            _refuse(input)
        return _torch_act(F.group_norm(input, num_groups, weight, bias, eps), flags)
    if input.dim() > 5:
        y = group_norm(input.contiguous().view(input.shape[0], c, -1), num_groups, weight, bias,
                       eps, flags)
        return y.view(input.shape)
    if torch.is_grad_enabled() and (_rg(input) or _rg(weight) or _rg(bias)):
        return _GnFunction.apply(input, weight, bias, num_groups, None, None, 0.0, eps, flags)
    X = _core.prepare(input, None, "input")
    return _gn_forward(X, num_groups, weight, bias, None, None, 0.0, eps, flags, False)[0]


@_traceable
def instance_norm(input, weight, bias, running_mean, running_var, use_input_stats, momentum,
                  eps, flags):
    if input.dim() < 3:
        raise ValueError("instance_norm: expected an input [N, C, *] with at least one spatial "
                         "dimension, got shape %s" % (tuple(input.shape),))
    c = input.shape[1]
    for p in (weight, bias, running_mean, running_var):
        if p is not None and p.numel() != c:
            raise ValueError("instance_norm: a per-channel parameter or statistic has shape %s "
                             "but the input has %d channels" % (tuple(p.shape), c))
    if not use_input_stats and (running_mean is None or running_var is None):
        raise ValueError("Expected running_mean and running_var to be defined when "
                         "use_input_stats is false")
    if use_input_stats and math.prod(input.shape[2:]) == 1:
        raise ValueError("Expected more than 1 spatial element when training, got input size "
                         "%s" % (list(input.shape),))
    if not _takes(input):
        if not flags & TORCH_FALLBACK:
            _refuse(input)
        return _torch_act(torch.instance_norm(input, weight, bias, running_mean, running_var,
                                              use_input_stats, momentum, eps, False), flags)
    if input.dim() > 5:
        y = instance_norm(input.contiguous().view(input.shape[0], c, -1), weight, bias,
                          running_mean, running_var, use_input_stats, momentum, eps, flags)
        return y.view(input.shape)
    grad = torch.is_grad_enabled() and (_rg(input) or _rg(weight) or _rg(bias))
    if use_input_stats:
        if grad:
            return _GnFunction.apply(input, weight, bias, 0, running_mean, running_var,
                                     momentum, eps, flags)
        X = _core.prepare(input, None, "input")
        return _gn_forward(X, 0, weight, bias, running_mean, running_var, momentum, eps,
                           flags, False)[0]
    if flags & SILU:
        raise ValueError("instance_norm: NORMA_SILU with running statistics is not supported")
    if grad:
        return _InEvalFunction.apply(input, weight, bias, running_mean, running_var, eps, flags)
    X = _core.prepare(input, None, "input")
    return _in_inference(X, weight, bias, running_mean, running_var, eps, flags)


# ------------------------------------------------------------------------------------------
# The C calls themselves (no autograd): the twins of norma::ln_forward ... norma::in_backward
# ------------------------------------------------------------------------------------------


def _check_takes(x):
    if not _takes(x):
        _refuse(x)


def _ln_backward_raw(rms, x, dy, dsum, ns, weight, mean, invstd, flags, nw, nb):
    _check_takes(x)
    d = _ln_size(x, ns)
    x = x.detach()
    x = x if x.is_contiguous() else x.contiguous()
    if dy.shape != x.shape or dy.dtype != x.dtype:
        raise ValueError("dy must have the shape and dtype of x")
    dy = dy.detach().contiguous()
    if dsum is not None:
        if dsum.shape != x.shape:
            raise ValueError("dsum must have the shape of x")
        dsum = dsum.detach().to(x.dtype).contiguous()
    pdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    rows = x.numel() // d
    wp = _pin(weight, d, pdt, "weight")
    mp = None if rms else _pin(mean, rows, pdt, "save_mean")
    ip = _pin(invstd, rows, pdt, "save_invstd")
    dx = torch.empty_like(x)
    dw = torch.empty(d, dtype=pdt) if nw else None
    db = torch.empty(d, dtype=pdt) if nb and not rms else None
    desc = LnDesc(rows, d, _NDT[x.dtype], 0.0, int(flags) & C_FLAGS)
    if rms:
        call("norma_rms_backward", ctypes.byref(desc), x.data_ptr(), dy.data_ptr(), _ptr(dsum),
             _ptr(wp), ip.data_ptr(), dx.data_ptr(), _ptr(dw))
    else:
        call("norma_ln_backward", ctypes.byref(desc), x.data_ptr(), dy.data_ptr(), _ptr(dsum),
             _ptr(wp), mp.data_ptr(), ip.data_ptr(), dx.data_ptr(), _ptr(dw), _ptr(db))
    pshape = x.shape[x.dim() - len(ns):]
    return (dx, dw.view(pshape) if dw is not None else None,
            db.view(pshape) if db is not None else None)


@_traceable
def ln_forward(x, residual, normalized_shape, weight, bias, eps, flags):
    _check_takes(x)
    d = _ln_size(x, normalized_shape)
    if residual is not None and residual.dtype != x.dtype:
        raise TypeError("residual has dtype %s, expected %s" % (residual.dtype, x.dtype))
    y, h, _, mean, invstd = _ln_forward(False, x, residual, weight, bias, d, eps, flags)
    return y, h, mean, invstd


@_traceable
def ln_backward(x, dy, dsum, normalized_shape, weight, save_mean, save_invstd, flags,
                param_grads):
    return _ln_backward_raw(False, x, dy, dsum, normalized_shape, weight, save_mean,
                            save_invstd, flags, param_grads, param_grads)


@_traceable
def rms_forward(x, residual, normalized_shape, weight, eps, flags):
    _check_takes(x)
    d = _ln_size(x, normalized_shape)
    if residual is not None and residual.dtype != x.dtype:
        raise TypeError("residual has dtype %s, expected %s" % (residual.dtype, x.dtype))
    y, h, _, _, invrms = _ln_forward(True, x, residual, weight, None, d, _rms_eps(x, eps),
                                     flags)
    return y, h, invrms


@_traceable
def rms_backward(x, dy, dsum, normalized_shape, weight, save_invrms, flags, param_grads):
    dx, dw, _ = _ln_backward_raw(True, x, dy, dsum, normalized_shape, weight, None, save_invrms,
                                 flags, param_grads, False)
    return dx, dw


def _check_groups(x, groups):
    if x.dim() < 2 or x.dim() > 5:
        raise ValueError("x must have 2 to 5 dimensions, got shape %s" % (tuple(x.shape),))
    if groups <= 0 or x.shape[1] % groups:
        raise ValueError("Expected number of channels in input to be divisible by num_groups, "
                         "but got input of shape %s and num_groups=%d" % (list(x.shape), groups))


def _gn_backward_raw(groups, x, y, dy, weight, bias, mean, invstd, flags, need):
    _check_takes(x)
    X = _core.prepare(x, None, "x")
    if flags & BN_RELU and y is None:
        raise ValueError("the backward of a fused ReLU needs y")
    Y = _core.prepare_like(y, X, "y") if flags & BN_RELU else None
    DY = _core.prepare_like(dy, X, "grad_output")
    pdt = X.pdtype
    per = X.n * (groups if groups > 0 else X.c)
    wp = _pin(weight, X.c, pdt, "weight")
    bp = _pin(bias, X.c, pdt, "bias") if flags & SILU else None
    mp = _pin(mean, per, pdt, "save_mean")
    ip = _pin(invstd, per, pdt, "save_invstd")
    DX = _core.new_like(X)
    dw = torch.empty(X.c, dtype=pdt) if need else None
    db = torch.empty(X.c, dtype=pdt) if need else None
    if groups > 0:
        desc, fn = _gn_desc(X, groups, 0.0, flags), "norma_gn_backward"
    else:
        desc, fn = _in_desc(X, 0.0, flags), "norma_in_backward"
    call(fn, ctypes.byref(desc), X.ptr, Y.ptr if Y is not None else None, DY.ptr, _ptr(wp),
         _ptr(bp), mp.data_ptr(), ip.data_ptr(), DX.ptr, _ptr(dw), _ptr(db))
    return DX.obj, dw, db


@_traceable
def gn_forward(x, num_groups, weight, bias, eps, flags):
    _check_takes(x)
    _check_groups(x, num_groups)
    X = _core.prepare(x, None, "x")
    return _gn_forward(X, num_groups, weight, bias, None, None, 0.0, eps, flags)


@_traceable
def gn_backward(x, y, dy, num_groups, weight, bias, save_mean, save_invstd, flags, param_grads):
    _check_groups(x, num_groups)
    return _gn_backward_raw(num_groups, x, y, dy, weight, bias, save_mean, save_invstd, flags,
                            param_grads)


@_traceable
def in_forward_training(x, weight, bias, running_mean, running_var, momentum, eps, flags):
    _check_takes(x)
    X = _core.prepare(x, None, "x")
    return _gn_forward(X, 0, weight, bias, running_mean, running_var, momentum, eps, flags)


@_traceable
def in_forward_inference(x, weight, bias, mean, var, eps, flags):
    _check_takes(x)
    X = _core.prepare(x, None, "x")
    return _in_inference(X, weight, bias, mean, var, eps, flags)


@_traceable
def in_backward(x, y, dy, weight, bias, save_mean, save_invstd, flags, param_grads):
    return _gn_backward_raw(0, x, y, dy, weight, bias, save_mean, save_invstd, flags,
                            param_grads)
