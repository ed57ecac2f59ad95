"""PyTorch integration: autograd functions, drop-in BatchNorm modules, convert() and fold_bn().

    import norma.torch as nt
    bn = nt.BatchNorm2d(64)                 # same arguments, parameters, buffers as nn's
    model = nt.convert(model)               # every nn.BatchNorm{1,2,3}d -> norma's, state kept
    inference_model = nt.fold_bn(model)     # BN after Conv/Linear folded into its weights
    model = nt.convert(model, sync=True)    # SyncBatchNorm over MPI (mpi4py communicator)

CPU tensors in float32, float64, bfloat16 (with float32 parameters, as torch's CPU BatchNorm)
and float16; channels_last (4-D, 5-D) inputs are used in place and give channels_last outputs.
Inputs the C library cannot take (other devices, other dtypes, empty batches) fall back to
torch's own implementation in the modules.
"""

import copy
import ctypes
import threading

import torch
from torch import nn

from . import _core
from ._lib import (NormaError, call, BN_RELU, BN_ADD_RELU, BN_BIASED_RUNNING_VAR,
                   BN_GLOBAL_STATS)

__all__ = [
    "batch_norm", "batch_norm_relu", "batch_norm_add_relu",
    "BatchNormTrainFunction", "BatchNormEvalFunction",
    "BatchNorm1d", "BatchNorm2d", "BatchNorm3d",
    "SyncBatchNorm", "SyncBatchNormFunction", "sync_batch_norm",
    "convert", "fold_bn", "NormaError",
]

_SUPPORTED_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


# The layer name set by norma.profiling.label_bn_layers around a module's forward; the autograd
# functions keep it so that their backward is labelled too ("bn:<name>.backward").
_PROFILE_LABEL = threading.local()


def _labelled(ctx, fn, *args, **kw):
    label = getattr(ctx, "label", None)
    if label is None:
        return fn(*args, **kw)
    with torch.autograd.profiler.record_function("bn:%s.backward" % label):
        return fn(*args, **kw)


def _act_flags(relu, add_relu):
    return (BN_ADD_RELU if add_relu else 0) | (BN_RELU if relu and not add_relu else 0)


def _grad_to(g, like):
    """A per-channel gradient (float32/64) in the dtype of the parameter it belongs to."""
    if g is None or like is None:
        return None
    return g.to(like.dtype)


class BatchNormTrainFunction(torch.autograd.Function):
    """Training BatchNorm (+ ReLU, + residual add + ReLU) with batch statistics.

    apply(x, weight, bias, residual, running_mean, running_var, momentum, eps, relu,
          biased_running_var, save_output) -> y

    The running statistics (may be None) are updated in place.  residual (may be None) gives
    y = relu(bn(x) + residual) and implies the ReLU.  With save_output=True and no activation
    the backward recovers x_hat from y instead of keeping x (memory saving; needs no zero in
    weight, else x is kept).
    """

    @staticmethod
    def forward(ctx, x, weight, bias, residual, running_mean, running_var, momentum, eps, relu,
                biased_running_var, save_output):
        return _train_forward(ctx, _invoke_forward_training, x, weight, bias, residual,
                              running_mean, running_var, momentum, eps, relu,
                              biased_running_var, save_output)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gy):
        x, y, weight, bias = ctx.saved_tensors
        need_x, need_w, need_b, need_r = ctx.needs_input_grad[:4]
        return _labelled(ctx, _backward, ctx, gy, x, y, weight, bias, ctx.save_mean,
                         ctx.save_invstd, ctx.flags, need_w or need_b, need_r)


def _invoke_forward_training(*args):
    return call("norma_bn_forward_training", *args)


def _invoke_backward(*args):
    return call("norma_bn_backward", *args)


def _train_forward(ctx, invoke, x, weight, bias, residual, running_mean, running_var, momentum,
                   eps, relu, biased_running_var, save_output):
    """The training forward through `invoke` (norma_bn_forward_training's arguments); fills
    ctx for _backward and returns y."""
    X = _core.prepare(x, None)
    add_relu = residual is not None
    relu = bool(relu) and not add_relu
    R = _core.prepare_like(residual, X, "residual") if add_relu else None
    flags = _act_flags(relu, add_relu) | (BN_BIASED_RUNNING_VAR if biased_running_var else 0)
    g = _core.param_in(weight, X, "weight")
    b = _core.param_in(bias, X, "bias")
    rm = _core.param_inout(running_mean, X, "running_mean")
    rv = _core.param_inout(running_var, X, "running_var")
    Y = _core.new_like(X)
    sm = _core.param_out(X)
    si = _core.param_out(X)
    d = X.desc(eps, flags)
    invoke(ctypes.byref(d), X.ptr, R.ptr if R else None, g.ptr, b.ptr, Y.ptr, sm.ptr, si.ptr,
           rm.ptr, rv.ptr, float(momentum) if momentum is not None else 0.0)
    rm.finish()
    rv.finish()
    y = Y.obj
    use_y_only = (save_output and not relu and not add_relu and
                  (weight is None or not bool((g.obj == 0).any())))
    if use_y_only:
        ctx.save_for_backward(None, y, weight, bias)
    elif relu or add_relu:
        ctx.save_for_backward(x, y, weight, bias)
    else:
        ctx.save_for_backward(x, None, weight, bias)
    ctx.layout = X.layout
    ctx.flags = flags & (BN_RELU | BN_ADD_RELU)
    ctx.eps = float(eps)
    ctx.save_mean = sm.obj
    ctx.save_invstd = si.obj
    ctx.label = getattr(_PROFILE_LABEL, "name", None)
    return y


def _backward(ctx, gy, x, y, weight, bias, save_mean, save_invstd, flags, need_params,
              need_residual, invoke=None):
    ref = _core.prepare(x if x is not None else y, ctx.layout)
    X = ref if x is not None else None
    Yt = _core.prepare_like(y, ref, "y") if y is not None else None
    DY = _core.prepare_like(gy, ref, "grad_output")
    g = _core.param_in(weight, ref, "weight")
    b = _core.param_in(bias, ref, "bias")
    sm = _core.param_in(save_mean, ref, "save_mean")
    si = _core.param_in(save_invstd, ref, "save_invstd")
    DX = _core.new_like(ref)
    add_relu = bool(flags & BN_ADD_RELU)
    DR = _core.new_like(ref) if (add_relu and need_residual) else None
    dg = _core.param_out(ref) if need_params and weight is not None else _core._NULL
    db = _core.param_out(ref) if need_params and bias is not None else _core._NULL
    d = ref.desc(ctx.eps, flags)
    (invoke or _invoke_backward)(ctypes.byref(d), X.ptr if X else None, Yt.ptr if Yt else None,
                                 DY.ptr, g.ptr, b.ptr, sm.ptr, si.ptr, DX.ptr,
                                 DR.ptr if DR else None, dg.ptr, db.ptr)
    dres = DR.obj if DR is not None else None
    return (DX.obj, _grad_to(dg.obj, weight), _grad_to(db.obj, bias), dres,
            None, None, None, None, None, None, None)


class BatchNormEvalFunction(torch.autograd.Function):
    """Inference BatchNorm with given statistics (+ ReLU, + residual add + ReLU), with a
    backward (dx = g * weight / sqrt(var + eps), dweight, dbias) for frozen layers.

    apply(x, weight, bias, residual, mean, var, eps, relu) -> y
    """

    @staticmethod
    def forward(ctx, x, weight, bias, residual, mean, var, eps, relu):
        X = _core.prepare(x, None)
        add_relu = residual is not None
        relu = bool(relu) and not add_relu
        R = _core.prepare_like(residual, X, "residual") if add_relu else None
        flags = _act_flags(relu, add_relu)
        g = _core.param_in(weight, X, "weight")
        b = _core.param_in(bias, X, "bias")
        m = _core.param_in(mean, X, "running_mean")
        v = _core.param_in(var, X, "running_var")
        Y = _core.new_like(X)
        d = X.desc(eps, flags)
        call("norma_bn_forward_inference", ctypes.byref(d), X.ptr, R.ptr if R else None, g.ptr,
             b.ptr, m.ptr, v.ptr, Y.ptr)
        y = Y.obj
        ctx.save_for_backward(x, y if (relu or add_relu) else None, weight, bias)
        ctx.layout = X.layout
        ctx.flags = flags | BN_GLOBAL_STATS
        ctx.eps = float(eps)
        # the constants of the frozen layer, copied (the buffers may change later)
        ctx.save_mean = m.obj.clone()
        ctx.save_invstd = (1.0 / torch.sqrt(v.obj.double() + float(eps))).to(X.pdtype)
        ctx.label = getattr(_PROFILE_LABEL, "name", None)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gy):
        x, y, weight, bias = ctx.saved_tensors
        need_x, need_w, need_b, need_r = ctx.needs_input_grad[:4]
        out = _labelled(ctx, _backward, ctx, gy, x, y, weight, bias, ctx.save_mean,
                        ctx.save_invstd, ctx.flags, need_w or need_b, need_r)
        return out[:4] + (None, None, None, None)


def _verify_batch_size(size):
    m = size[0]
    for s in size[2:]:
        m *= s
    if m == 1:
        raise ValueError("Expected more than 1 value per channel when training, got input size "
                         "{}".format(size))


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False,
               momentum=0.1, eps=1e-5, relu=False, residual=None, biased_running_var=False,
               save_output=False):
    """torch.nn.functional.batch_norm with autograd, plus the fusions of norma:
    ``relu=True``: relu(bn(x)); ``residual=r``: relu(bn(x) + r) (the ReLU is implied).

    The memory format of input is kept (channels_last in, channels_last out).
    ``save_output=True`` (training, no activation) keeps y instead of x for the backward.
    """
    if residual is not None:
        relu = True
    if training:
        _verify_batch_size(input.size())
        return BatchNormTrainFunction.apply(input, weight, bias, residual, running_mean,
                                            running_var, momentum, eps, relu,
                                            biased_running_var, save_output)
    if running_mean is None or running_var is None:
        raise ValueError("running_mean and running_var must be defined in evaluation mode")
    return BatchNormEvalFunction.apply(input, weight, bias, residual, running_mean, running_var,
                                       eps, relu)


def batch_norm_relu(input, running_mean, running_var, weight=None, bias=None, training=False,
                    momentum=0.1, eps=1e-5):
    """relu(batch_norm(...)) in one pass."""
    return batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps,
                      relu=True)


def batch_norm_add_relu(input, residual, running_mean, running_var, weight=None, bias=None,
                        training=False, momentum=0.1, eps=1e-5):
    """relu(batch_norm(...) + residual) in one pass."""
    return batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps,
                      residual=residual)


# ------------------------------------------------------------------------------------------
# Modules
# ------------------------------------------------------------------------------------------


class _NormaBatchNorm:
    """Mixin: the forward of torch's _BatchNorm, computed by norma.  Extra (keyword-only
    in spirit) constructor argument: fuse_relu=False (y = relu(bn(x)), and forward(x,
    residual) gives relu(bn(x) + residual))."""

    def _init_norma(self, fuse_relu):
        self.fuse_relu = bool(fuse_relu)

    def extra_repr(self):
        s = super().extra_repr()
        if getattr(self, "fuse_relu", False):
            s += ", fuse_relu=True"
        return s

    def _norma_can_run(self, input):
        return (input.device.type == "cpu" and input.dtype in _SUPPORTED_DTYPES and
                input.numel() > 0)

    def forward(self, input, residual=None):
        self._check_input_dim(input)
        fuse_relu = getattr(self, "fuse_relu", False)
        if residual is not None and not fuse_relu:
            raise ValueError("forward(x, residual) computes relu(bn(x) + residual): construct "
                             "the module with fuse_relu=True")
        if self.momentum is None:
            exponential_average_factor = 0.0
        else:
            exponential_average_factor = self.momentum
        if self.training and self.track_running_stats:
            if self.num_batches_tracked is not None:
                self.num_batches_tracked.add_(1)
                if self.momentum is None:  # cumulative moving average
                    exponential_average_factor = 1.0 / float(self.num_batches_tracked)
                else:
                    exponential_average_factor = self.momentum
        if self.training:
            bn_training = True
        else:
            bn_training = (self.running_mean is None) and (self.running_var is None)
        use_running = not self.training or self.track_running_stats
        running_mean = self.running_mean if use_running else None
        running_var = self.running_var if use_running else None

        return self._norma_forward(input, residual, running_mean, running_var, bn_training,
                                   exponential_average_factor, fuse_relu)

    def _norma_forward(self, input, residual, running_mean, running_var, bn_training,
                       exponential_average_factor, fuse_relu):
        if not self._norma_can_run(input):
            # what norma cannot take: torch's implementation (other devices, empty batches)
            y = nn.functional.batch_norm(input, running_mean, running_var, self.weight,
                                         self.bias, bn_training, exponential_average_factor,
                                         self.eps)
            if residual is not None:
                y = y + residual
            return torch.relu(y) if fuse_relu else y
        return batch_norm(input, running_mean, running_var, self.weight, self.bias, bn_training,
                          exponential_average_factor, self.eps, relu=fuse_relu,
                          residual=residual)


class BatchNorm1d(_NormaBatchNorm, nn.BatchNorm1d):
    """Drop-in torch.nn.BatchNorm1d ([N, C] or [N, C, L]) computed by norma."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, device=None, dtype=None, fuse_relu=False):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)
        self._init_norma(fuse_relu)


class BatchNorm2d(_NormaBatchNorm, nn.BatchNorm2d):
    """Drop-in torch.nn.BatchNorm2d ([N, C, H, W], channels_last too) computed by norma."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, device=None, dtype=None, fuse_relu=False):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)
        self._init_norma(fuse_relu)


class BatchNorm3d(_NormaBatchNorm, nn.BatchNorm3d):
    """Drop-in torch.nn.BatchNorm3d ([N, C, D, H, W], channels_last_3d too) computed by
    norma."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, device=None, dtype=None, fuse_relu=False):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)
        self._init_norma(fuse_relu)


# ------------------------------------------------------------------------------------------
# SyncBatchNorm (libnorma_mpi, mpi4py communicators)
# ------------------------------------------------------------------------------------------


class SyncBatchNormFunction(torch.autograd.Function):
    """Training BatchNorm with the statistics of the batch split across the ranks of an MPI
    communicator (norma_bn_forward_training_mpi / norma_bn_backward_mpi).  Collective in the
    forward and in the backward: every rank must run both.

    apply(x, weight, bias, residual, running_mean, running_var, momentum, eps, relu,
          biased_running_var, comm, param_grad_scale) -> y

    x may be an empty local batch.  dweight / dbias are the gradients of the global batch
    (identical on every rank) times param_grad_scale.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, residual, running_mean, running_var, momentum, eps, relu,
                biased_running_var, comm, param_grad_scale):
        from . import mpi as _mpi
        y = _train_forward(ctx, _mpi.invoker("norma_bn_forward_training_mpi", comm), x,
                           weight, bias, residual, running_mean, running_var, momentum, eps,
                           relu, biased_running_var, False)
        ctx.comm = comm
        ctx.param_grad_scale = float(param_grad_scale)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gy):
        from . import mpi as _mpi
        x, y, weight, bias = ctx.saved_tensors
        need_x, need_w, need_b, need_r = ctx.needs_input_grad[:4]
        out = _labelled(ctx, _backward, ctx, gy, x, y, weight, bias, ctx.save_mean,
                        ctx.save_invstd, ctx.flags, need_w or need_b, need_r,
                        invoke=_mpi.invoker("norma_bn_backward_mpi", ctx.comm))
        dx, dw, db, dres = out[:4]
        if ctx.param_grad_scale != 1.0:
            dw = dw * ctx.param_grad_scale if dw is not None else None
            db = db * ctx.param_grad_scale if db is not None else None
        return (dx, dw, db, dres) + (None,) * 8


def sync_batch_norm(input, running_mean, running_var, weight=None, bias=None, momentum=0.1,
                    eps=1e-5, comm=None, relu=False, residual=None, biased_running_var=False,
                    param_grad_scale=1.0):
    """Training BatchNorm synchronized over `comm` (an mpi4py communicator, default
    MPI.COMM_WORLD), with autograd.  Collective: every rank calls it (an empty local batch
    too) and runs its backward.  The parameter gradients are the global ones times
    param_grad_scale (see SyncBatchNorm)."""
    if residual is not None:
        relu = True
    if comm is None:
        from . import mpi as _mpi
        comm = _mpi.default_comm()
    return SyncBatchNormFunction.apply(input, weight, bias, residual, running_mean, running_var,
                                       momentum, eps, relu, biased_running_var, comm,
                                       param_grad_scale)


_PARAM_GRADS = ("mean", "sum")


class SyncBatchNorm(_NormaBatchNorm, nn.SyncBatchNorm):
    """Drop-in torch.nn.SyncBatchNorm for CPU tensors, synchronized over MPI by libnorma_mpi.

    SyncBatchNorm(num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                  process_group=None, device=None, dtype=None, fuse_relu=False,
                  param_grads="mean")

    process_group is an mpi4py communicator (None: MPI.COMM_WORLD, looked up at each forward).
    Any input rank >= 2 ([N, C], [N, C, L], [N, C, H, W], [N, C, D, H, W], channels_last
    too).  In training mode on a communicator of more than one rank, the batch statistics are
    those of the global batch (every rank's local batch, in rank order; local batch sizes may
    differ and may be 0), the running statistics are updated identically on every rank, and
    the forward and the backward are collective: every rank must run them, in the same order.
    Otherwise (eval mode, or a single rank) it is norma's BatchNorm.

    Parameter gradients: norma computes the gradient of the global batch, the same on every
    rank.  param_grads="mean" (default) hands out that value divided by the number of ranks,
    which is what torch's SyncBatchNorm gives after DistributedDataParallel averages its
    per-rank gradients; since it is the same on every rank, averaging it again (DDP, or an
    allreduce / size) leaves it unchanged, and summing it gives torch's summed value.
    param_grads="sum" hands out the global gradient itself (the C library's dgamma / dbeta).
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_group=None, device=None, dtype=None,
                 fuse_relu=False, param_grads="mean"):
        super().__init__(num_features, eps, momentum, affine, track_running_stats,
                         process_group, device, dtype)
        if param_grads not in _PARAM_GRADS:
            raise ValueError("param_grads must be 'mean' or 'sum' (got %r)" % (param_grads,))
        self.param_grads = param_grads
        self._init_norma(fuse_relu)

    def extra_repr(self):
        s = super().extra_repr()
        if getattr(self, "param_grads", "mean") != "mean":
            s += ", param_grads=%r" % self.param_grads
        return s

    def __deepcopy__(self, memo):
        # mpi4py communicators cannot be copied: the copy shares the communicator
        new = self.__class__.__new__(self.__class__)
        memo[id(self)] = new
        pg = self.__dict__.get("process_group")
        if pg is not None:
            memo[id(pg)] = pg
        new.__setstate__(copy.deepcopy(self.__dict__, memo))
        return new

    def _comm(self):
        if self.process_group is not None:
            return self.process_group
        from . import mpi as _mpi
        return _mpi.default_comm()

    def _norma_forward(self, input, residual, running_mean, running_var, bn_training,
                       exponential_average_factor, fuse_relu):
        if input.dim() >= 2 and input.size(1) == 0:
            raise ValueError("SyncBatchNorm number of input channels should be non-zero")
        comm = self._comm() if (bn_training and self.training) else None
        if comm is None or comm.Get_size() == 1:
            return super()._norma_forward(input, residual, running_mean, running_var,
                                          bn_training, exponential_average_factor, fuse_relu)
        if input.device.type != "cpu" or input.dtype not in _SUPPORTED_DTYPES:
            raise ValueError("norma.torch.SyncBatchNorm takes CPU float32 / float64 / float16 / "
                             "bfloat16 tensors (got %s on %s)" % (input.dtype, input.device))
        scale = 1.0 / comm.Get_size() if self.param_grads == "mean" else 1.0
        return sync_batch_norm(input, running_mean, running_var, self.weight, self.bias,
                               exponential_average_factor, self.eps, comm, relu=fuse_relu,
                               residual=residual, param_grad_scale=scale)

    @classmethod
    def convert_sync_batchnorm(cls, module, process_group=None):
        """As torch.nn.SyncBatchNorm.convert_sync_batchnorm: every BatchNorm*D (any
        _BatchNorm) in `module` becomes a norma SyncBatchNorm on process_group (an mpi4py
        communicator, None: MPI.COMM_WORLD), sharing its parameters and buffers and keeping its
        training flag (and fuse_relu of norma's modules).  Returns the module (a new one when
        `module` itself is a BatchNorm)."""
        return _convert_tree(module, lambda m: isinstance(m, nn.modules.batchnorm._BatchNorm),
                             lambda m: _convert_one(m, cls, process_group))


_CONVERT = {nn.BatchNorm1d: BatchNorm1d, nn.BatchNorm2d: BatchNorm2d,
            nn.BatchNorm3d: BatchNorm3d}


def _convert_one(m, cls=None, process_group=None):
    p = m.weight if m.weight is not None else m.running_mean
    factory = dict(device=p.device if p is not None else None,
                   dtype=p.dtype if p is not None and p.is_floating_point() else None)
    fuse_relu = getattr(m, "fuse_relu", False)
    if cls is None:
        new = _CONVERT[type(m)](m.num_features, m.eps, m.momentum, m.affine,
                                m.track_running_stats, fuse_relu=fuse_relu, **factory)
    else:
        new = cls(m.num_features, m.eps, m.momentum, m.affine, m.track_running_stats,
                  process_group, fuse_relu=fuse_relu, **factory)
    # the same Parameter and buffer objects: optimizers and references stay valid
    for name, t in m._parameters.items():
        new._parameters[name] = t
    for name, t in m._buffers.items():
        new._buffers[name] = t
    new._non_persistent_buffers_set = set(m._non_persistent_buffers_set)
    new.train(m.training)
    new._forward_pre_hooks.update(m._forward_pre_hooks)
    new._forward_hooks.update(m._forward_hooks)
    if hasattr(m, "qconfig"):
        new.qconfig = m.qconfig
    return new


def _convert_tree(model, match, make):
    if match(model):
        return make(model)
    for parent in list(model.modules()):
        for name, child in list(parent._modules.items()):
            if child is not None and match(child):
                parent._modules[name] = make(child)
    return model


_SYNC_SOURCES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm,
                 BatchNorm1d, BatchNorm2d, BatchNorm3d)


def convert(model, sync=False, process_group=None):
    """Returns `model` with every torch.nn.BatchNorm1d/2d/3d (exactly those types; subclasses
    with their own forward are left alone) replaced by norma's, sharing the same parameters and
    buffers (so state_dict, optimizers and the training flag carry over).  The model is modified
    in place; a bare BatchNorm module is returned converted.

    sync=True: replaces them (and torch.nn.SyncBatchNorm, and norma's BatchNorm1d/2d/3d) by
    norma.torch.SyncBatchNorm on process_group (an mpi4py communicator; None: MPI.COMM_WORLD).
    """
    if sync:
        return _convert_tree(model, lambda m: type(m) in _SYNC_SOURCES,
                             lambda m: _convert_one(m, SyncBatchNorm, process_group))
    return _convert_tree(model, lambda m: type(m) in _CONVERT, _convert_one)


_PRODUCERS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)


def _out_features(m):
    return m.out_channels if isinstance(m, nn.modules.conv._ConvNd) else m.out_features


def _foldable(prod, bn):
    return (isinstance(prod, _PRODUCERS) and isinstance(bn, nn.modules.batchnorm._BatchNorm) and
            bn.running_mean is not None and bn.running_var is not None and
            bn.num_features == _out_features(prod) and not getattr(bn, "fuse_relu", False))


@torch.no_grad()
def _fold(prod, bn):
    w = prod.weight
    c_out = w.shape[0]
    bias = prod.bias if prod.bias is not None else torch.zeros(c_out, dtype=w.dtype,
                                                               device=w.device)
    gamma = bn.weight.detach() if bn.weight is not None else None
    beta = bn.bias.detach() if bn.bias is not None else None
    if w.dtype == torch.float32 and w.device.type == "cpu":
        nw = w.detach().contiguous().clone()
        nb = bias.detach().to(torch.float32).contiguous().clone()
        _core.fold_into_weights(nw, nb, bn.running_mean, bn.running_var, gamma, beta, bn.eps)
    else:  # plain torch math in float64 for other dtypes / devices
        var = bn.running_var.double()
        scale = torch.rsqrt(var + bn.eps)
        if gamma is not None:
            scale = scale * gamma.double()
        shift = -bn.running_mean.double() * scale
        if beta is not None:
            shift = shift + beta.double()
        nw = (w.double() * scale.reshape([-1] + [1] * (w.dim() - 1))).to(w.dtype)
        nb = (bias.double() * scale + shift).to(w.dtype)
    for fmt, dim in ((torch.channels_last, 4), (torch.channels_last_3d, 5)):
        if w.dim() == dim and not w.is_contiguous() and w.is_contiguous(memory_format=fmt):
            nw = nw.contiguous(memory_format=fmt)  # keep the producer's memory format
    prod.weight = nn.Parameter(nw, requires_grad=w.requires_grad)
    prod.bias = nn.Parameter(nb, requires_grad=w.requires_grad)


def fold_bn(model):
    """Returns an inference (eval-mode) copy of `model` in which every BatchNorm that directly
    follows a Conv1d/2d/3d or Linear is folded into that producer's weight and bias (a bias is
    created when it had none) and replaced by nn.Identity.

    "Follows" means: the BN is the next child after the producer in the same parent module,
    which is the data flow of nn.Sequential and of blocks that register their layers in the
    order they use them (conv1, bn1, relu, conv2, bn2...).  A BN with fuse_relu=True, without
    running statistics or whose size differs from the producer's output is left alone.
    The original model is not modified.
    """
    m = copy.deepcopy(model)
    m.eval()
    if isinstance(m, nn.modules.batchnorm._BatchNorm):
        return m
    for parent in list(m.modules()):
        names = [n for n, c in parent._modules.items() if c is not None]
        for a, b in zip(names, names[1:]):
            prod, bn = parent._modules[a], parent._modules[b]
            if _foldable(prod, bn):
                _fold(prod, bn)
                parent._modules[b] = nn.Identity()
    return m
