"""The functional API over numpy arrays and (CPU) torch tensors.

Tensor conventions
------------------
torch tensors always have the logical shape [N, C, *spatial] (as torch.nn's BatchNorm); the
layout is the memory format: ``'channels_last'`` means the tensor is stored as
[N, *spatial, C] (``torch.channels_last`` / ``torch.channels_last_3d`` for 4-D / 5-D).  With
``layout=None`` it is inferred: channels-first when the tensor is contiguous, channels-last when
it is dense in that order, else a channels-first copy is made.  Outputs have the layout used.

numpy arrays have no memory format, so the layout says what the axes are: ``'channels_first'``
(the default): [N, C, *spatial]; ``'channels_last'``: [N, *spatial, C].  Non-contiguous arrays
are copied.

Per-channel arrays are float64 when the data are float64 and float32 otherwise (the C
convention); other dtypes are converted, and running statistics of another dtype are updated
through a temporary and copied back.
"""

import ctypes
import math
import sys

import numpy as np

from . import _lib
from ._lib import (BnDesc, call, CHANNELS_FIRST, CHANNELS_LAST, F32, F64, F16, BF16,
                   BN_RELU, BN_ADD_RELU, BN_BIASED_RUNNING_VAR, CHECK_FINITE, BN_GLOBAL_STATS,
                   BN_COUNT_WEIGHTED)

_NP_DTYPES = {np.dtype(np.float32): F32, np.dtype(np.float64): F64, np.dtype(np.float16): F16}
_DTYPE_NAMES = {F32: "float32", F64: "float64", F16: "float16", BF16: "bfloat16"}


_TORCH = None
_TORCH_DTYPES = None


def _torch():
    """The torch module when it has been imported (norma never imports it itself)."""
    global _TORCH
    if _TORCH is None:
        _TORCH = sys.modules.get("torch")
    return _TORCH


def is_torch_tensor(x):
    t = _TORCH if _TORCH is not None else _torch()
    return t is not None and isinstance(x, t.Tensor)


def _torch_dtypes():
    global _TORCH_DTYPES
    if _TORCH_DTYPES is None:
        t = _torch()
        _TORCH_DTYPES = {t.float32: F32, t.float64: F64, t.float16: F16, t.bfloat16: BF16}
    return _TORCH_DTYPES


def parse_layout(layout):
    """None, 'channels_first' / 'channels_last' (also 'nchw'-style names) or 0 / 1."""
    if layout is None:
        return None
    if isinstance(layout, str):
        key = layout.lower().replace("-", "_")
        if key in ("channels_first", "first", "nc", "ncl", "nchw", "ncdhw"):
            return CHANNELS_FIRST
        if key in ("channels_last", "last", "nlc", "nhwc", "ndhwc"):
            return CHANNELS_LAST
    elif layout in (CHANNELS_FIRST, CHANNELS_LAST) and not isinstance(layout, bool):
        return int(layout)
    else:
        t = _torch()
        if t is not None and layout in (t.channels_last, t.channels_last_3d):
            return CHANNELS_LAST
        if t is not None and layout is t.contiguous_format:
            return CHANNELS_FIRST
    raise ValueError("layout must be None, 'channels_first' or 'channels_last' (got %r)"
                     % (layout,))


def _cl_perm(ndim):
    return [0] + list(range(2, ndim)) + [1]


def _cl_strides(shape):
    """Strides (in elements) of a dense [N, *spatial, C] tensor of logical shape
    [N, C, *spatial]."""
    c = shape[1]
    strides = [0] * len(shape)
    strides[1] = 1
    acc = c
    for i in range(len(shape) - 1, 1, -1):
        strides[i] = acc
        acc *= shape[i]
    strides[0] = acc
    return strides


def _inv_perm(perm):
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return inv


class _T:
    """A dense tensor ready to be passed to C."""

    __slots__ = ("obj", "ptr", "kind", "shape", "n", "c", "spatial", "layout", "dtype")

    def desc(self, eps, flags):
        return BnDesc(self.n, self.c, self.spatial, self.layout, self.dtype, float(eps),
                      int(flags))

    @property
    def pdtype(self):
        """The dtype of per-channel arrays, as numpy dtype or torch dtype."""
        if self.kind == "torch":
            t = _torch()
            return t.float64 if self.dtype == F64 else t.float32
        return np.dtype(np.float64) if self.dtype == F64 else np.dtype(np.float32)


def _check_ndim(shape, name):
    if len(shape) < 2 or len(shape) > 5:
        raise ValueError("%s must have 2 to 5 dimensions ([N, C], [N, C, L], [N, C, H, W], "
                         "[N, C, D, H, W]); got shape %s" % (name, tuple(shape)))


def _torch_dense(x, layout):
    """x (a detached CPU tensor) made dense in `layout`; returns the tensor of logical shape."""
    if layout == CHANNELS_FIRST:
        return x if x.is_contiguous() else x.contiguous()
    perm = _cl_perm(x.dim())
    p = x.permute(perm)
    if p.is_contiguous():
        return x
    return p.contiguous().permute(_inv_perm(perm))


def _torch_prepare(x, layout, name):
    if x.device.type != "cpu":
        raise ValueError("%s is on %s: norma runs on CPU tensors" % (name, x.device))
    dts = _torch_dtypes()
    if x.dtype not in dts:
        raise TypeError("%s has dtype %s; norma supports float32, float64, float16 and bfloat16"
                        % (name, x.dtype))
    _check_ndim(x.shape, name)
    if x.requires_grad:
        x = x.detach()
    if layout is None:
        if x.is_contiguous():
            layout = CHANNELS_FIRST
        elif x.dim() >= 3 and x.permute(_cl_perm(x.dim())).is_contiguous():
            layout = CHANNELS_LAST
        else:
            layout = CHANNELS_FIRST
    x = _torch_dense(x, layout)
    T = _T()
    T.obj = x
    T.ptr = x.data_ptr() if x.numel() else None
    T.kind = "torch"
    T.shape = tuple(x.shape)
    T.n = x.shape[0]
    T.c = x.shape[1]
    T.spatial = int(math.prod(x.shape[2:]))
    T.layout = layout
    T.dtype = dts[x.dtype]
    return T


def _np_prepare(x, layout, name):
    if is_torch_tensor(x):
        raise TypeError("%s is a torch tensor while the data are numpy arrays" % name)
    x = np.asarray(x)
    if x.dtype not in _NP_DTYPES:
        raise TypeError("%s has dtype %s; norma supports float32, float64 and float16 numpy "
                        "arrays (bfloat16 through torch tensors)" % (name, x.dtype))
    _check_ndim(x.shape, name)
    if layout is None:
        layout = CHANNELS_FIRST
    x = np.ascontiguousarray(x)
    T = _T()
    T.obj = x
    T.ptr = x.ctypes.data if x.size else None
    T.kind = "numpy"
    T.shape = tuple(x.shape)
    T.n = x.shape[0]
    if layout == CHANNELS_FIRST:
        T.c = x.shape[1]
        T.spatial = int(math.prod(x.shape[2:]))
    else:
        T.c = x.shape[-1]
        T.spatial = int(math.prod(x.shape[1:-1]))
    T.layout = layout
    T.dtype = _NP_DTYPES[x.dtype]
    return T


def prepare(x, layout=None, name="x"):
    """The main tensor: decides the kind (numpy / torch) and the layout."""
    layout = parse_layout(layout)
    if is_torch_tensor(x):
        return _torch_prepare(x, layout, name)
    return _np_prepare(x, layout, name)


def prepare_like(t, ref, name):
    """Another tensor argument (residual, dy, y...) in the kind, layout, shape, dtype of ref."""
    if ref.kind == "torch":
        if not is_torch_tensor(t):
            t = _torch().as_tensor(np.asarray(t))
        T = _torch_prepare(t, ref.layout, name)
    else:
        if is_torch_tensor(t):
            t = t.detach().cpu().numpy()
        T = _np_prepare(t, ref.layout, name)
    if T.shape != ref.shape:
        raise ValueError("%s has shape %s, expected %s (the shape of x)"
                         % (name, T.shape, ref.shape))
    if T.dtype != ref.dtype:
        raise TypeError("%s has dtype %s, expected %s (the dtype of x)"
                        % (name, _DTYPE_NAMES[T.dtype], _DTYPE_NAMES[ref.dtype]))
    return T


def new_like(ref):
    """An uninitialized output tensor of ref's shape, dtype and layout."""
    T = _T()
    if ref.kind == "torch":
        t = _torch()
        if ref.layout == CHANNELS_FIRST:
            o = t.empty(ref.shape, dtype=ref.obj.dtype)
        else:
            # a base tensor with channels-last strides, not a view (autograd allows in-place
            # ops on it, e.g. a following ReLU(inplace=True))
            o = t.empty_strided(ref.shape, _cl_strides(ref.shape), dtype=ref.obj.dtype)
        T.ptr = o.data_ptr() if o.numel() else None
    else:
        o = np.empty(ref.shape, dtype=ref.obj.dtype)
        T.ptr = o.ctypes.data if o.size else None
    T.obj = o
    for a in ("kind", "shape", "n", "c", "spatial", "layout", "dtype"):
        setattr(T, a, getattr(ref, a))
    return T


class _P:
    """A per-channel array passed to C: ptr, the object that owns the memory, and (for
    arrays updated in place through a temporary) the original to copy back to."""

    __slots__ = ("obj", "ptr", "target")

    def __init__(self, obj, ptr, target=None):
        self.obj = obj
        self.ptr = ptr
        self.target = target

    def finish(self):
        if self.target is None:
            return
        if is_torch_tensor(self.target):
            t = _torch()
            src = self.obj if is_torch_tensor(self.obj) else t.from_numpy(self.obj)
            with t.no_grad():
                self.target.copy_(src.reshape(self.target.shape))
        else:
            np.copyto(self.target, np.asarray(self.obj).reshape(self.target.shape),
                      casting="unsafe")


_NULL = _P(None, None)


def _numel_ok(shape, numel):
    return int(math.prod(shape)) == numel


def _param_in_generic(p, numel, pdt_np, name):
    """An input array of `numel` elements of numpy dtype pdt_np; returns _P."""
    if p is None:
        return _NULL
    if is_torch_tensor(p):
        t = _torch()
        if p.device.type != "cpu":
            raise ValueError("%s is on %s: norma runs on CPU tensors" % (name, p.device))
        if p.numel() != numel:
            raise ValueError("%s must have %d elements (got shape %s)"
                             % (name, numel, tuple(p.shape)))
        pdt = t.float64 if pdt_np == np.float64 else t.float32
        if p.dtype == pdt and p.is_contiguous():
            return _P(p, p.data_ptr())  # read only: no copy (a Parameter keeps its autograd)
        q = p.detach().to(pdt).contiguous()
        return _P(q, q.data_ptr())
    a = np.ascontiguousarray(p, dtype=pdt_np)
    if a.size != numel:
        raise ValueError("%s must have %d elements (got shape %s)" % (name, numel, a.shape))
    return _P(a, a.ctypes.data)


def param_in(p, ref, name):
    pdt = np.float64 if ref.dtype == F64 else np.float32
    if p is not None and ref.kind == "numpy" and is_torch_tensor(p):
        p = p.detach().cpu().numpy()
    return _param_in_generic(p, ref.c, pdt, name)


def inout_generic(p, numel, pdt_np, name):
    """An array updated in place: its own memory when it has the right dtype and is dense,
    else a temporary copied back by finish()."""
    if p is None:
        return _NULL
    if is_torch_tensor(p):
        t = _torch()
        if p.device.type != "cpu":
            raise ValueError("%s is on %s: norma runs on CPU tensors" % (name, p.device))
        if not _numel_ok(p.shape, numel):
            raise ValueError("%s must have %d elements (got shape %s)"
                             % (name, numel, tuple(p.shape)))
        pdt = t.float64 if pdt_np == np.float64 else t.float32
        d = p.detach() if p.requires_grad else p
        if d.dtype == pdt and d.is_contiguous():
            return _P(d, d.data_ptr())
        tmp = d.to(pdt).contiguous().clone()
        return _P(tmp, tmp.data_ptr(), target=p)
    if not isinstance(p, np.ndarray):
        raise TypeError("%s is updated in place and must be a numpy array or a torch tensor "
                        "(got %s)" % (name, type(p).__name__))
    if p.size != numel:
        raise ValueError("%s must have %d elements (got shape %s)" % (name, numel, p.shape))
    if not p.flags.writeable:
        raise ValueError("%s is updated in place but is read-only" % name)
    if p.dtype == pdt_np and p.flags.c_contiguous:
        return _P(p, p.ctypes.data)
    tmp = np.array(p, dtype=pdt_np, order="C", copy=True)
    return _P(tmp, tmp.ctypes.data, target=p)


def param_inout(p, ref, name):
    return inout_generic(p, ref.c, np.float64 if ref.dtype == F64 else np.float32, name)


def param_out(ref):
    """A new per-channel output array of ref's kind and parameter dtype."""
    if ref.kind == "torch":
        o = _torch().empty(ref.c, dtype=ref.pdtype)
        return _P(o, o.data_ptr())
    o = np.empty(ref.c, dtype=ref.pdtype)
    return _P(o, o.ctypes.data)


def _flags(relu=False, add_relu=False, biased_running_var=False, check_finite=False,
           global_stats=False, count_weighted=False):
    f = 0
    if relu and add_relu:
        raise ValueError("relu and add_relu are exclusive (add_relu already applies the ReLU)")
    if relu:
        f |= BN_RELU
    if add_relu:
        f |= BN_ADD_RELU
    if biased_running_var:
        f |= BN_BIASED_RUNNING_VAR
    if check_finite:
        f |= CHECK_FINITE
    if global_stats:
        f |= BN_GLOBAL_STATS
    if count_weighted:
        f |= BN_COUNT_WEIGHTED
    return f


def act_flags(relu, residual):
    """The activation flags of a forward: NORMA_BN_ADD_RELU with a residual, NORMA_BN_RELU with
    relu alone.  The one home of the residual rule: the residual is fused only as
    y = relu(bn(x) + residual), so a residual without relu=True is an error (norma has no
    add-without-ReLU fusion, and adding a ReLU the caller did not ask for would be wrong)."""
    if residual is not None:
        if not relu:
            raise ValueError("residual is fused as y = relu(bn(x) + residual): pass relu=True "
                             "(norma has no add-without-ReLU fusion)")
        return BN_ADD_RELU
    return BN_RELU if relu else 0


def running_count_inout(p):
    """The running count of count-weighted statistics (one float64 value, updated in place)."""
    return inout_generic(p, 1, np.float64, "running_count")


def counted_inout(running_count, count):
    """The running count to pass to C for a batch of `count` values per channel (summed over
    the ranks when synchronized).  The one home of the binding's rule for an unknown count: a
    negative count (a module converted after training, statistics loaded without a count)
    starts at this batch's count, which makes this update PyTorch's; the count is written
    back only after the call succeeded (finish())."""
    rc = running_count_inout(running_count)
    if rc.ptr is None:
        raise ValueError("count-weighted running statistics need running_count")
    if ctypes.c_double.from_address(rc.ptr).value < 0:
        tmp = np.array([float(count)])
        rc = _P(tmp, tmp.ctypes.data, target=running_count)
    return rc


def count_unknown(running_count):
    """Whether a running count (array or tensor, or None) is negative: not known yet."""
    return running_count is not None and float(running_count.reshape(-1)[0]) < 0


# ------------------------------------------------------------------------------------------
# Public functions
# ------------------------------------------------------------------------------------------


def batch_norm_forward_training(x, gamma=None, beta=None, eps=1e-5, running_mean=None,
                                running_var=None, momentum=0.1, layout=None, relu=False,
                                residual=None, biased_running_var=False, check_finite=False,
                                running_count=None):
    """Training forward: normalizes x with the statistics of the batch.

    y = gamma * (x - mean) / sqrt(var + eps) + beta, then max(0, y) with ``relu=True``, or
    max(0, y + residual) when ``residual`` is given (it requires ``relu=True``: the C library
    fuses the residual add only with the ReLU).  running_mean / running_var, when given, are
    updated in place: r = (1 - momentum) * r + momentum * batch_stat, with the unbiased batch
    variance (the biased one with ``biased_running_var=True``).

    ``running_count`` (a one-element float64 array or tensor, start it at 0) makes the update
    count-weighted (NORMA_BN_COUNT_WEIGHTED, see norma_bn_running_update): with B the values
    per channel of this batch, N' = (1 - momentum) N + momentum B and
    r = ((1 - momentum) N r + momentum B batch_stat) / N'; the count is updated in place.

    Returns (y, save_mean, save_invstd); the last two feed batch_norm_backward.
    """
    return forward_training_with(None, x, gamma, beta, eps, running_mean, running_var, momentum,
                                 layout, relu, residual, biased_running_var, check_finite,
                                 running_count)


def invoker(name, *leading):
    """A function that calls the C function `name` with `leading` arguments first (e.g. a
    communicator) and raises NormaError on failure."""
    def invoke(*args):
        return call(name, *(leading + args))
    return invoke


_TRAIN = invoker("norma_bn_forward_training")
_TRAIN_COUNTED = invoker("norma_bn_forward_training_counted")


def forward_training_with(invoke, x, gamma=None, beta=None, eps=1e-5, running_mean=None,
                          running_var=None, momentum=0.1, layout=None, relu=False,
                          residual=None, biased_running_var=False, check_finite=False,
                          running_count=None, invoke_counted=None, unknown_count=None):
    """batch_norm_forward_training through `invoke(d, x, residual, gamma, beta, y, save_mean,
    save_invstd, running_mean, running_var, momentum)` and, with a running count,
    `invoke_counted(..., running_var, running_count, momentum)` (None: the single-process
    calls; norma.mpi passes the synchronized ones)."""
    X = prepare(x, layout)
    flags = act_flags(relu, residual) | _flags(biased_running_var=biased_running_var,
                                               check_finite=check_finite,
                                               count_weighted=running_count is not None)
    Y, sm, si = train_prepared(X, residual, gamma, beta, running_mean, running_var,
                               running_count, momentum, eps, flags, invoke, invoke_counted,
                               unknown_count)
    return Y.obj, sm.obj, si.obj


def train_prepared(X, residual, gamma, beta, running_mean, running_var, running_count, momentum,
                   eps, flags, invoke=None, invoke_counted=None, unknown_count=None):
    """The training forward on a prepared x (the one home of the call; the functional API,
    norma.mpi and norma.torch's ctypes backend use it).  Returns the _T / _P objects
    (Y, save_mean, save_invstd); running statistics are written back on success only.
    unknown_count: the count a negative running count starts from (synchronized calls: the
    global one; default this batch's)."""
    R = prepare_like(residual, X, "residual") if flags & BN_ADD_RELU else None
    g = param_in(gamma, X, "gamma")
    b = param_in(beta, X, "beta")
    rm = param_inout(running_mean, X, "running_mean")
    rv = param_inout(running_var, X, "running_var")
    if (running_mean is not None or running_var is not None) and momentum is None:
        raise ValueError("momentum is None: pass a number in [0, 1] (the cumulative average "
                         "of torch's modules is 1 / num_batches_tracked)")
    counted = bool(flags & BN_COUNT_WEIGHTED) and (rm.ptr is not None or rv.ptr is not None)
    rc = counted_inout(running_count, X.n * X.spatial if unknown_count is None
                       else unknown_count) if counted else _NULL
    Y = new_like(X)
    sm = param_out(X)
    si = param_out(X)
    d = X.desc(eps, flags)
    mom = float(momentum) if momentum is not None else 0.0
    if counted:
        (invoke_counted or _TRAIN_COUNTED)(ctypes.byref(d), X.ptr, R.ptr if R else None, g.ptr,
                                           b.ptr, Y.ptr, sm.ptr, si.ptr, rm.ptr, rv.ptr,
                                           rc.ptr, mom)
    else:
        (invoke or _TRAIN)(ctypes.byref(d), X.ptr, R.ptr if R else None, g.ptr, b.ptr, Y.ptr,
                           sm.ptr, si.ptr, rm.ptr, rv.ptr, mom)
    rm.finish()
    rv.finish()
    rc.finish()
    return Y, sm, si


def batch_norm_inference(x, mean, var, gamma=None, beta=None, eps=1e-5, layout=None,
                         relu=False, residual=None, check_finite=False):
    """Inference forward with given statistics (e.g. the running ones):
    y = gamma * (x - mean) / sqrt(var + eps) + beta, then the ReLU / add+ReLU.  Returns y."""
    X = prepare(x, layout)
    if mean is None or var is None:
        raise ValueError("batch_norm_inference needs mean and var (e.g. the running statistics)")
    flags = act_flags(relu, residual) | _flags(check_finite=check_finite)
    return inference_prepared(X, residual, gamma, beta, mean, var, eps, flags).obj


def inference_prepared(X, residual, gamma, beta, mean, var, eps, flags):
    """The inference forward on a prepared x; returns Y (a _T)."""
    R = prepare_like(residual, X, "residual") if flags & BN_ADD_RELU else None
    g = param_in(gamma, X, "gamma")
    b = param_in(beta, X, "beta")
    m = param_in(mean, X, "mean")
    v = param_in(var, X, "var")
    Y = new_like(X)
    d = X.desc(eps, flags)
    call("norma_bn_forward_inference", ctypes.byref(d), X.ptr, R.ptr if R else None, g.ptr,
         b.ptr, m.ptr, v.ptr, Y.ptr)
    return Y


def batch_norm_backward(dy, x, save_mean, save_invstd, gamma=None, beta=None, y=None,
                        eps=1e-5, layout=None, relu=False, add_relu=False, global_stats=False,
                        check_finite=False, compute_param_grads=True):
    """Backward of the training forward (or of a frozen layer with ``global_stats=True``, where
    save_mean / save_invstd are the constants mean and 1/sqrt(var + eps)).

    x may be None when y is given and there is no activation (x_hat is recovered from y; gamma
    must have no zero).  With ``relu`` or ``add_relu`` both x and y are needed (the mask is
    y > 0).  Returns (dx, dgamma, dbeta), plus dresidual with ``add_relu``; dgamma and dbeta
    are None with ``compute_param_grads=False``.
    """
    return backward_with(None, dy, x, save_mean, save_invstd, gamma, beta, y, eps, layout,
                         relu, add_relu, global_stats, check_finite, compute_param_grads)


def backward_with(invoke, dy, x, save_mean, save_invstd, gamma=None, beta=None, y=None,
                  eps=1e-5, layout=None, relu=False, add_relu=False, global_stats=False,
                  check_finite=False, compute_param_grads=True):
    """batch_norm_backward through `invoke(d, x, y, dy, gamma, beta, save_mean, save_invstd, dx,
    dresidual, dgamma, dbeta)` (norma_bn_backward's arguments)."""
    if x is None and y is None:
        raise ValueError("batch_norm_backward needs x, or y when x is None")
    if (relu or add_relu) and (x is None or y is None):
        raise ValueError("with relu / add_relu the backward needs both x and y (the mask is "
                         "y > 0)")
    if save_mean is None or save_invstd is None:
        raise ValueError("batch_norm_backward needs save_mean and save_invstd")
    ref = prepare(x if x is not None else y, layout, "x" if x is not None else "y")
    flags = _flags(relu, add_relu, False, check_finite, global_stats)
    DX, dg, db, DR = backward_prepared(ref, x is not None, y, dy, gamma, beta, save_mean,
                                       save_invstd, eps, flags, compute_param_grads,
                                       compute_param_grads, add_relu, invoke)
    out = (DX.obj, dg.obj, db.obj)
    if add_relu:
        out = out + (DR.obj,)
    return out


def backward_prepared(ref, has_x, y, dy, gamma, beta, save_mean, save_invstd, eps, flags,
                      need_dgamma=True, need_dbeta=True, need_dresidual=True, invoke=None):
    """The backward on a prepared reference tensor (x, or y when has_x is False): the one home
    of the call.  Returns (DX, dgamma, dbeta, DR) objects (_T / _P; DR None without
    NORMA_BN_ADD_RELU or when not wanted)."""
    act = flags & (BN_RELU | BN_ADD_RELU)
    Yt = prepare_like(y, ref, "y") if (y is not None and (not has_x or act)) else None
    DY = prepare_like(dy, ref, "dy")
    g = param_in(gamma, ref, "gamma")
    b = param_in(beta, ref, "beta")
    sm = param_in(save_mean, ref, "save_mean")
    si = param_in(save_invstd, ref, "save_invstd")
    DX = new_like(ref)
    DR = new_like(ref) if (flags & BN_ADD_RELU) and need_dresidual else None
    dg = param_out(ref) if need_dgamma else _NULL
    db = param_out(ref) if need_dbeta else _NULL
    d = ref.desc(eps, flags)
    (invoke or _BACKWARD)(ctypes.byref(d), ref.ptr if has_x else None, Yt.ptr if Yt else None,
                          DY.ptr, g.ptr, b.ptr, sm.ptr, si.ptr, DX.ptr, DR.ptr if DR else None,
                          dg.ptr, db.ptr)
    return DX, dg, db, DR


_BACKWARD = invoker("norma_bn_backward")


def batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False,
               momentum=0.1, eps=1e-5, layout=None):
    """torch.nn.functional.batch_norm's arguments and meaning, without autograd: returns y.
    (norma.batch_norm sends torch tensors to norma.torch.batch_norm, with autograd.)"""
    if training:
        return batch_norm_forward_training(x, weight, bias, eps, running_mean, running_var,
                                           momentum, layout)[0]
    if running_mean is None or running_var is None:
        raise ValueError("running_mean and running_var must be defined in evaluation mode")
    return batch_norm_inference(x, running_mean, running_var, weight, bias, eps, layout)


# ------------------------------------------------------------------------------------------
# Folding and moments
# ------------------------------------------------------------------------------------------


def _f32_in(p, c, name):
    if p is not None and is_torch_tensor(p):
        p = p.detach().cpu().numpy()
    return _param_in_generic(p, c, np.float32, name)


def bn_fold(mean, var, gamma=None, beta=None, eps=1e-5):
    """scale = gamma / sqrt(var + eps), shift = beta - mean * scale (float32 numpy arrays)."""
    m = np.ascontiguousarray(mean.detach().cpu().numpy() if is_torch_tensor(mean) else mean,
                             dtype=np.float32)
    c = m.size
    v = _f32_in(var, c, "var")
    g = _f32_in(gamma, c, "gamma")
    b = _f32_in(beta, c, "beta")
    scale = np.empty(c, np.float32)
    shift = np.empty(c, np.float32)
    call("norma_bn_fold", c, g.ptr, b.ptr, m.ctypes.data, v.ptr, float(eps), scale.ctypes.data,
         shift.ctypes.data)
    return scale, shift


def fold_into_weights(weight, bias, mean, var, gamma=None, beta=None, eps=1e-5):
    """Folds a BN into the producer before it, in place: weight [c_out, ...] (output channel
    outermost) *= scale; bias = (bias - mean) * scale + beta.  weight and bias are float32
    numpy arrays or torch tensors (others go through a temporary); returns (weight, bias)."""
    shape = tuple(weight.shape)
    if len(shape) < 1:
        raise ValueError("weight must have the output channel as its first dimension")
    c_out = int(shape[0])
    per_out = int(math.prod(shape[1:]))
    if bias is None:
        raise ValueError("bias is required (pass zeros for a producer without bias)")
    w = inout_generic(weight, c_out * per_out, np.float32, "weight")
    b = inout_generic(bias, c_out, np.float32, "bias")
    m = _f32_in(mean, c_out, "mean")
    v = _f32_in(var, c_out, "var")
    g = _f32_in(gamma, c_out, "gamma")
    be = _f32_in(beta, c_out, "beta")
    call("norma_bn_fold_into_weights", c_out, per_out, w.ptr, b.ptr, g.ptr, be.ptr, m.ptr,
         v.ptr, float(eps))
    w.finish()
    b.finish()
    return weight, bias


def moments(x, layout=None, check_finite=False):
    """(count, mean, m2) per channel (int64, float64, float64 numpy arrays), m2 = sum of the
    squared deviations from the mean: the statistics of the split API."""
    X = prepare(x, layout)
    count = np.empty(X.c, np.int64)
    mean = np.empty(X.c, np.float64)
    m2 = np.empty(X.c, np.float64)
    d = X.desc(0.0, _flags(check_finite=check_finite))
    call("norma_bn_moments", ctypes.byref(d), X.ptr, count.ctypes.data, mean.ctypes.data,
         m2.ctypes.data)
    return count, mean, m2


_OPS = {"forward_training": _lib.BN_OP_FORWARD_TRAINING, "training": _lib.BN_OP_FORWARD_TRAINING,
        "forward_inference": _lib.BN_OP_FORWARD_INFERENCE,
        "inference": _lib.BN_OP_FORWARD_INFERENCE, "backward": _lib.BN_OP_BACKWARD}


def query_plan(x, op="forward_training", layout=None, relu=False, add_relu=False,
               global_stats=False, eps=1e-5):
    """How norma would run `op` ('forward_training', 'inference' or 'backward') on x (an array
    or tensor: only its shape, dtype and layout are used) with the current settings: a dict
    with dram_passes (1: the one-pass floor, 2: reductions then apply), fused (schedule),
    unit (channels per block), threads, isa ('scalar' / 'avx2'), streaming_stores, reference.
    """
    if op not in _OPS:
        raise ValueError("op must be one of %s (got %r)" % (sorted(_OPS), op))
    X = prepare(x, layout)
    d = X.desc(eps, _flags(relu, add_relu, False, False, global_stats))
    plan = _lib.BnPlan()
    call("norma_bn_query_plan", ctypes.byref(d), _OPS[op], ctypes.byref(plan))
    out = plan.as_dict()
    L = _lib.lib()
    out["isa"] = L.norma_isa_name(plan.isa).decode()
    return out


# ------------------------------------------------------------------------------------------
# Library settings
# ------------------------------------------------------------------------------------------

_ISA_NAMES = {"scalar": _lib.ISA_SCALAR, "avx2": _lib.ISA_AVX2, "avx512": _lib.ISA_AVX512}


def version():
    """The C library's version string."""
    return _lib.lib().norma_version().decode()


def set_num_threads(n):
    """Threads the C kernels may use; n <= 0 restores the default.  Results do not depend
    on it."""
    _lib.lib().norma_set_num_threads(int(n))


def get_num_threads():
    return int(_lib.lib().norma_get_num_threads())


def set_max_isa(isa):
    """Caps the instruction set: 'scalar' or 'avx2' (or 0 / 1)."""
    if isinstance(isa, str):
        if isa.lower() not in _ISA_NAMES:
            raise ValueError("isa must be 'scalar', 'avx2' or 'avx512' (got %r)" % isa)
        isa = _ISA_NAMES[isa.lower()]
    call("norma_set_max_isa", int(isa))


def get_isa():
    """The instruction set the kernels use now: 'scalar', 'avx2' or 'avx512'."""
    L = _lib.lib()
    return L.norma_isa_name(L.norma_get_isa()).decode()


def set_use_reference(on):
    """Run the slow reference kernels (for debugging)."""
    _lib.lib().norma_set_use_reference(1 if on else 0)


def get_use_reference():
    return bool(_lib.lib().norma_get_use_reference())


def set_streaming_stores(min_bytes=0, max_bytes=(1 << 63) - 1):
    """Outputs of min_bytes..max_bytes bytes are written with non-temporal stores (around the
    caches); min_bytes=0 is the library's default (8 MiB, and only in calls whose tensors
    together exceed 32 MiB), the default max_bytes no maximum, max_bytes < min_bytes none at
    all.  Speed only: results do not depend on it.
    norma.torch sets max_bytes to 32 MiB when imported (norma.h: norma_set_streaming_stores)."""
    call("norma_set_streaming_stores", int(min_bytes), int(max_bytes))
