"""The ctypes backend of norma.torch: the operators of src/torch/ (see _ops.py for their
signatures) in Python over norma/_core.py, with torch.autograd.Function for autograd.  Used
where libnorma_torch was not built; the results are the same (the same C calls), only the cost
per call is higher."""

import ctypes
import warnings

import numpy as np
import torch
import torch.nn.functional as F

from .. import _core
from .. import _lib
from .._lib import (NormaError, call, BN_RELU, BN_ADD_RELU, BN_GLOBAL_STATS, CHECK_FINITE,
                    BN_COUNT_WEIGHTED, BN_BIASED_RUNNING_VAR)
from ._ops import SAVE_OUTPUT, TORCH_FALLBACK, HEADER, H_STATUS, H_COUNT, H_EPS, H_FP

C_FLAGS = 0xffff
_ACT = BN_RELU | BN_ADD_RELU
_SUPPORTED = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
# norma.h, norma_bn_backward_apply: norma_bn_backward removes the x_hat offset only when
# |sum_xhat / count| <= 1/16; callers of the split API apply that rule themselves.
_MEAN_CORRECTION_MAX = 0.0625


def _verify_batch_size(size):
    m = size[0]
    for s in size[2:]:
        m *= s
    if m == 1:
        raise ValueError("Expected more than 1 value per channel when training, got input size "
                         "{}".format(size))


def _norma_takes(x):
    return x.device.type == "cpu" and x.dtype in _SUPPORTED and x.numel() > 0


def _requires_grad(*ts):
    return any(t is not None and t.requires_grad for t in ts)


def _grad_to(g, like):
    """A per-channel gradient (float32/64) in the dtype of the parameter it belongs to."""
    if g is None or like is None:
        return None
    return g if g.dtype == like.dtype else g.to(like.dtype)


def _save(ctx, x, y, weight, bias, save_mean, save_invstd, flags, weight_has_zero, eps, layout):
    act = bool(flags & _ACT)
    y_only = not act and bool(flags & SAVE_OUTPUT) and not weight_has_zero
    ctx.save_for_backward(None if y_only else x, y if (act or y_only) else None, weight, bias)
    ctx.flags = flags
    ctx.eps = float(eps)
    ctx.layout = layout
    ctx.save_mean = save_mean
    ctx.save_invstd = save_invstd


def _backward(ctx, gy, extra_flags):
    x, y, weight, bias = ctx.saved_tensors
    need = ctx.needs_input_grad
    ref = _core.prepare(x if x is not None else y, ctx.layout)
    flags = (ctx.flags & (_ACT | CHECK_FINITE)) | extra_flags
    DX, dg, db, DR = _core.backward_prepared(
        ref, x is not None, y, gy, weight, bias, ctx.save_mean, ctx.save_invstd, ctx.eps, flags,
        need[1] and weight is not None, need[2] and bias is not None, need[3])
    return (DX.obj, _grad_to(dg.obj, weight), _grad_to(db.obj, bias),
            DR.obj if DR is not None else None)


class _quiet_tracer:
    """Inside the autograd functions a trace records one op; the sizes the ctypes binding
    reads there are not data flow, so the tracer's warnings about them are noise."""

    def __enter__(self):
        self.ctx = None
        if torch.jit.is_tracing():
            self.ctx = warnings.catch_warnings()
            self.ctx.__enter__()
            warnings.simplefilter("ignore", torch.jit.TracerWarning)

    def __exit__(self, *exc):
        if self.ctx is not None:
            self.ctx.__exit__(*exc)
        return False


class BatchNormTrainFunction(torch.autograd.Function):
    """apply(x, weight, bias, residual, running_mean, running_var, running_count, momentum,
    eps, flags) -> y: the training forward (batch statistics; running statistics updated in
    place) and its backward (one norma_bn_backward call)."""

    @staticmethod
    def forward(ctx, x, weight, bias, residual, running_mean, running_var, running_count,
                momentum, eps, flags):
        with _quiet_tracer():
            return BatchNormTrainFunction._forward(ctx, x, weight, bias, residual, running_mean,
                                                   running_var, running_count, momentum, eps,
                                                   flags)

    @staticmethod
    def _forward(ctx, x, weight, bias, residual, running_mean, running_var, running_count,
                 momentum, eps, flags):
        X = _core.prepare(x, None)
        Y, sm, si = _core.train_prepared(X, residual, weight, bias, running_mean, running_var,
                                         running_count, momentum, eps, flags & C_FLAGS)
        zero = (flags & SAVE_OUTPUT) and weight is not None and bool((weight == 0).any())
        _save(ctx, x, Y.obj, weight, bias, sm.obj, si.obj, flags, zero, eps, X.layout)
        return Y.obj

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gy):
        return _backward(ctx, gy, 0) + (None,) * 6


class BatchNormEvalFunction(torch.autograd.Function):
    """apply(x, weight, bias, residual, mean, var, eps, flags) -> y: the inference forward with
    given statistics, and the backward of a frozen layer (NORMA_BN_GLOBAL_STATS)."""

    @staticmethod
    def forward(ctx, x, weight, bias, residual, mean, var, eps, flags):
        with _quiet_tracer():
            return BatchNormEvalFunction._forward(ctx, x, weight, bias, residual, mean, var, eps,
                                                  flags)

    @staticmethod
    def _forward(ctx, x, weight, bias, residual, mean, var, eps, flags):
        X = _core.prepare(x, None)
        Y = _core.inference_prepared(X, residual, weight, bias, mean, var, eps, flags & C_FLAGS)
        pdt = X.pdtype
        sm = mean.detach().to(pdt).clone()
        si = (1.0 / torch.sqrt(var.detach().double() + float(eps))).to(pdt)
        _save(ctx, x, Y.obj, weight, bias, sm, si, flags & ~SAVE_OUTPUT, False, eps, X.layout)
        return Y.obj

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gy):
        return _backward(ctx, gy, BN_GLOBAL_STATS) + (None,) * 4


class _no_trace:
    """Python-side checks that a trace must not record (their sizes and counts would appear
    as graph nodes named after this file's variables, which differ between traces)."""

    def __enter__(self):
        self.state = torch._C._get_tracing_state()
        if self.state is not None:
            torch._C._set_tracing_state(None)

    def __exit__(self, *exc):
        if self.state is not None:
            torch._C._set_tracing_state(self.state)
        return False


def batch_norm(input, weight, bias, residual, running_mean, running_var, num_batches_tracked,
               running_count, training, momentum, eps, flags):
    """The ctypes twin of torch.ops.norma.batch_norm (src/torch/bn_ops.cpp)."""
    if torch.jit.is_tracing():
        with _no_trace():
            takes = _norma_takes(input)
        if takes and not (flags & BN_ADD_RELU and residual.dtype != input.dtype):
            # one autograd function, which the trace records as one op; the batch counter's
            # increment is recorded too (as torch's _BatchNorm.forward does it)
            with _no_trace():
                factor, bn_training = _module_rules(input, running_mean, running_var, None,
                                                    training, momentum)
            if num_batches_tracked is not None:
                with torch.no_grad():
                    num_batches_tracked.add_(1)
                if momentum is None:
                    factor = 1.0 / float(num_batches_tracked)
            if bn_training:
                return BatchNormTrainFunction.apply(input, weight, bias, residual, running_mean,
                                                    running_var, running_count, factor, eps,
                                                    flags)
            return BatchNormEvalFunction.apply(input, weight, bias, residual, running_mean,
                                               running_var, eps, flags)
    return _batch_norm(input, weight, bias, residual, running_mean, running_var,
                       num_batches_tracked, running_count, training, momentum, eps, flags)


def _module_rules(input, running_mean, running_var, num_batches_tracked, training, momentum):
    """torch's _BatchNorm.forward: batch or running statistics, the batch counter and the
    cumulative average of momentum None.  Returns (momentum to use, batch statistics?)."""
    if input.dim() < 2:
        raise ValueError("batch_norm: expected an input of 2 to 5 dimensions, got %d"
                         % input.dim())
    bn_training = training or (running_mean is None and running_var is None)
    if bn_training:
        _verify_batch_size(input.size())
    factor = momentum if momentum is not None else 0.0
    if num_batches_tracked is not None:
        with torch.no_grad():
            num_batches_tracked.add_(1)
        if momentum is None:
            factor = 1.0 / float(num_batches_tracked)
    return factor, bn_training


def _batch_norm(input, weight, bias, residual, running_mean, running_var, num_batches_tracked,
                running_count, training, momentum, eps, flags):
    if flags & BN_ADD_RELU and residual is None:
        raise ValueError("NORMA_BN_ADD_RELU needs the residual")
    factor, bn_training = _module_rules(input, running_mean, running_var, num_batches_tracked,
                                        training, momentum)
    if not _norma_takes(input):
        if not flags & TORCH_FALLBACK:
            if input.dtype not in _SUPPORTED:
                raise TypeError("input has dtype %s; norma supports float32, float64, float16 "
                                "and bfloat16" % input.dtype)
            if input.device.type != "cpu":
                raise ValueError("input is on %s: norma runs on CPU tensors" % input.device)
            raise ValueError("input has no values (shape %s)" % (tuple(input.shape),))
        y = F.batch_norm(input, running_mean, running_var, weight, bias, bn_training, factor,
                         eps)
        if flags & BN_ADD_RELU:
            return torch.relu(y + residual)
        return torch.relu(y) if flags & BN_RELU else y
    if flags & BN_ADD_RELU and residual.dtype != input.dtype:
        # a residual of another dtype (autocast): the add in torch, with its type promotion
        y = _batch_norm(input, weight, bias, None, running_mean, running_var, None,
                        running_count, training, factor, eps, flags & ~_ACT)
        return torch.relu(y + residual)
    grad = torch.is_grad_enabled() and _requires_grad(input, weight, bias, residual)
    if bn_training:
        if grad:
            return BatchNormTrainFunction.apply(input, weight, bias, residual, running_mean,
                                                running_var, running_count, factor, eps, flags)
        X = _core.prepare(input, None)
        return _core.train_prepared(X, residual, weight, bias, running_mean, running_var,
                                    running_count, factor, eps, flags & C_FLAGS)[0].obj
    if grad:
        return BatchNormEvalFunction.apply(input, weight, bias, residual, running_mean,
                                           running_var, eps, flags)
    X = _core.prepare(input, None)
    return _core.inference_prepared(X, residual, weight, bias, running_mean, running_var, eps,
                                    flags & C_FLAGS).obj


# ------------------------------------------------------------------------------------------
# The split API for synchronized BatchNorm and exact statistics (src/torch/sync_ops.cpp)
# ------------------------------------------------------------------------------------------


def _dptr(t, offset=0):
    return t.data_ptr() + 8 * offset


def _fingerprint(X, flags, stat_flags):
    return float((flags & stat_flags) + (256 if X.dtype == _lib.F64 else 0))


def bn_record_forward(x, eps, flags):
    X = _core.prepare(x, None)
    c = X.c
    rec = torch.zeros(HEADER + 2 * c, dtype=torch.float64)
    count = np.empty(c, np.int64)
    d = X.desc(eps, flags & C_FLAGS & ~_ACT)
    try:
        call("norma_bn_moments", ctypes.byref(d), X.ptr, count.ctypes.data, _dptr(rec, HEADER),
             _dptr(rec, HEADER + c))
    except NormaError as e:  # the message stays in norma_last_error() for this thread
        rec.zero_()
        rec[H_STATUS] = float(e.status)
        rec[H_EPS] = float(eps)
        return rec
    rec[H_COUNT] = float(count[0])
    rec[H_EPS] = float(eps)
    rec[H_FP] = _fingerprint(X, flags, BN_BIASED_RUNNING_VAR | BN_COUNT_WEIGHTED)
    return rec


def bn_merge_records(records):
    r = records.contiguous()
    P, L = r.shape
    c = (L - HEADER) // 2
    out = r[0].clone()
    na = np.empty(c, np.int64)
    nb = np.empty(c, np.int64)
    for k in range(1, P):
        ca, cb = int(out[H_COUNT]), int(r[k, H_COUNT])
        if cb == 0:
            continue  # an empty rank is the identity: no bit changes
        if ca == 0:
            out[HEADER:] = r[k, HEADER:]
        else:
            na.fill(ca)
            nb.fill(cb)
            call("norma_bn_moments_merge", c, na.ctypes.data, _dptr(out, HEADER),
                 _dptr(out, HEADER + c), nb.ctypes.data, _dptr(r[k], HEADER),
                 _dptr(r[k], HEADER + c))
        out[H_COUNT] = float(ca + cb)
    return out


def bn_sync_forward(x, residual, weight, bias, merged, running_mean, running_var, running_count,
                    momentum, eps, flags):
    X = _core.prepare(x, None)
    c = X.c
    rec = merged.contiguous()
    total = int(rec[H_COUNT])
    R = _core.prepare_like(residual, X, "residual") if flags & BN_ADD_RELU else None
    g = _core.param_in(weight, X, "weight")
    b = _core.param_in(bias, X, "bias")
    rm = _core.param_inout(running_mean, X, "running_mean")
    rv = _core.param_inout(running_var, X, "running_var")
    counted = bool(flags & BN_COUNT_WEIGHTED) and (rm.ptr is not None or rv.ptr is not None)
    rc = _core.counted_inout(running_count, total) if counted else _core._NULL
    counts = np.full(c, total, np.int64)
    stats = np.empty(2 * c, np.float64)
    sm = _core.param_out(X)
    si = _core.param_out(X)
    d = X.desc(eps, flags & C_FLAGS & ~CHECK_FINITE)
    gm, gm2 = _dptr(rec, HEADER), _dptr(rec, HEADER + c)
    call("norma_bn_stats_from_moments", ctypes.byref(d), counts.ctypes.data, gm, gm2,
         stats.ctypes.data, stats.ctypes.data + 8 * c, sm.ptr, si.ptr,
         None if counted else rm.ptr, None if counted else rv.ptr, float(momentum))
    if counted:
        var = np.maximum(rec[HEADER + c:].numpy() / float(total), 0.0)
        call("norma_bn_running_update", ctypes.byref(d), total, gm, var.ctypes.data, rm.ptr,
             rv.ptr, rc.ptr, float(momentum))
    Y = _core.new_like(X)
    if X.n > 0:
        call("norma_bn_forward_apply", ctypes.byref(d), X.ptr, R.ptr if R else None, g.ptr,
             b.ptr, stats.ctypes.data, stats.ctypes.data + 8 * c, Y.ptr)
    rm.finish()
    rv.finish()
    rc.finish()
    return Y.obj, sm.obj, si.obj


def _as_double(p, ref, name):
    return _core.param_in(p, ref, name).obj.double().contiguous()


def bn_record_backward(x, y, dy, weight, bias, save_mean, save_invstd, flags):
    ref = _core.prepare(x if x is not None else y, None)
    act = flags & _ACT
    Yt = _core.prepare_like(y, ref, "y") if (y is not None and (x is None or act)) else None
    DY = _core.prepare_like(dy, ref, "grad_output")
    g = _core.param_in(weight, ref, "weight")
    b = _core.param_in(bias, ref, "bias")
    sm = _as_double(save_mean, ref, "save_mean")
    si = _as_double(save_invstd, ref, "save_invstd")
    c = ref.c
    rec = torch.zeros(HEADER + 3 * c, dtype=torch.float64)
    d = ref.desc(0.0, flags & C_FLAGS)
    try:
        call("norma_bn_backward_reduce", ctypes.byref(d), ref.ptr if x is not None else None,
             Yt.ptr if Yt else None, DY.ptr, g.ptr, b.ptr, sm.data_ptr(), si.data_ptr(),
             _dptr(rec, HEADER), _dptr(rec, HEADER + c),
             _dptr(rec, HEADER + 2 * c) if x is not None else None)
    except NormaError as e:
        rec.zero_()
        rec[H_STATUS] = float(e.status)
        return rec
    rec[H_COUNT] = float(ref.n * ref.spatial)
    rec[H_EPS] = 0.0 if x is not None else 1.0  # x_hat from y: no rounding offset to remove
    rec[H_FP] = _fingerprint(ref, flags, BN_GLOBAL_STATS)
    return rec


def bn_sum_records(records):
    r = records.contiguous()
    out = r[0].clone()
    for k in range(1, r.shape[0]):  # rank order, one addition at a time
        out[H_COUNT] += r[k, H_COUNT]
        out[H_EPS] = 1.0 if (out[H_EPS] != 0 or r[k, H_EPS] != 0) else 0.0
        out[HEADER:] += r[k, HEADER:]
    return out


def bn_sync_backward(x, y, dy, weight, bias, save_mean, save_invstd, summed, flags,
                     param_grads):
    ref = _core.prepare(x if x is not None else y, None)
    c = ref.c
    rec = summed.contiguous()
    total = int(rec[H_COUNT])
    count = max(total, 1)  # 0 only with GLOBAL_STATS: the sums are 0
    sx = None
    if not flags & BN_GLOBAL_STATS and float(rec[H_EPS]) == 0.0:
        sxh = rec[HEADER + 2 * c:].numpy()
        s = sxh / count
        sx = np.where(np.abs(s) <= _MEAN_CORRECTION_MAX, sxh, 0.0)
    act = flags & _ACT
    Yt = _core.prepare_like(y, ref, "y") if (y is not None and (x is None or act)) else None
    DY = _core.prepare_like(dy, ref, "grad_output")
    g = _core.param_in(weight, ref, "weight")
    b = _core.param_in(bias, ref, "bias")
    sm = _as_double(save_mean, ref, "save_mean")
    si = _as_double(save_invstd, ref, "save_invstd")
    d = ref.desc(0.0, flags & C_FLAGS & ~CHECK_FINITE)
    DX = _core.new_like(ref)
    DR = _core.new_like(ref) if flags & BN_ADD_RELU else None
    sdy, sdyx = _dptr(rec, HEADER), _dptr(rec, HEADER + c)
    sxp = sx.ctypes.data if sx is not None else None
    if ref.n > 0:
        call("norma_bn_backward_apply", ctypes.byref(d), ref.ptr if x is not None else None,
             Yt.ptr if Yt else None, DY.ptr, g.ptr, b.ptr, sm.data_ptr(), si.data_ptr(), sdy,
             sdyx, sxp, count, DX.ptr, DR.ptr if DR else None)
    dw = db = None
    if param_grads:
        dg, dbb = _core.param_out(ref), _core.param_out(ref)
        call("norma_bn_param_grads", ctypes.byref(d), sdy, sdyx, sxp, count, dg.ptr, dbb.ptr)
        dw, db = dg.obj, dbb.obj
    return DX.obj, dw, db, DR.obj if DR is not None else None

from ._fallback_norms import (layer_norm, layer_norm_residual, rms_norm,  # noqa: E402,F401
                              rms_norm_residual, group_norm, instance_norm, ln_forward,
                              ln_backward, rms_forward, rms_backward, gn_forward, gn_backward,
                              in_forward_training, in_forward_inference, in_backward)
