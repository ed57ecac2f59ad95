"""Drop-in BatchNorm modules computed by norma: BatchNorm1d/2d/3d, SyncBatchNorm, and the
streaming normalization of video-like inputs (StreamingBatchNorm)."""

import copy
from typing import Optional

import torch
from torch import Tensor, nn

from .. import _lib
from . import _ops, _sync
from .functional import eager_batch_norm
from ._ops import TORCH_FALLBACK

_RELU = _lib.BN_RELU
_ADD_RELU = _lib.BN_ADD_RELU
_COUNT_WEIGHTED = _lib.BN_COUNT_WEIGHTED
_CHECK_FINITE = _lib.CHECK_FINITE


class _NormaBatchNorm:
    """Mixin: torch's _BatchNorm forward computed by norma.  Extra constructor arguments:

    fuse_relu=False       y = relu(bn(x)); forward(x, residual) gives relu(bn(x) + residual)
    count_weighted=False  running statistics weighted by batch sizes (NORMA_BN_COUNT_WEIGHTED:
                          N' = (1 - m) N + m B, r = ((1 - m) N r + m B batch) / N'), with the
                          running count N in the buffer `running_count` (float64 scalar; its
                          state_dict key exists only with this option, so the keys are torch's
                          without it).  A negative count means "not known yet": the next batch
                          starts it (that update is then PyTorch's).

    Attribute check_finite (False): scan inputs for NaN / Inf (NORMA_CHECK_FINITE); set by
    norma.torch.detect_nonfinite.
    """

    def _init_norma(self, fuse_relu=False, count_weighted=False):
        self.fuse_relu = bool(fuse_relu)
        self.count_weighted = bool(count_weighted)
        self.check_finite = False
        if self.count_weighted and self.track_running_stats:
            self.register_buffer("running_count", torch.zeros(
                (), dtype=torch.float64, device=self.running_mean.device))
        else:
            self.register_buffer("running_count", None)

    def __prepare_scriptable__(self):
        # torch.jit.script calls this first: the forward it compiles calls torch.ops.norma
        if _ops.backend() != "extension":
            raise RuntimeError("TorchScript needs norma's PyTorch operators (libnorma_torch), "
                               "which are not loaded: %s (torch.jit.trace works with either "
                               "backend)" % _ops.extension_status()["reason"])
        return self

    def _apply(self, fn, *args, **kwargs):
        # module.to(dtype) / .half() convert floating buffers: the running count stays float64
        # (a count in float32 or bfloat16 would round), only its device follows
        rc = self._buffers.get("running_count")
        out = super()._apply(fn, *args, **kwargs)
        new = self._buffers.get("running_count")
        if rc is not None and new is not None and new.dtype != torch.float64:
            self._buffers["running_count"] = rc.to(device=new.device)
        return out

    def reset_running_stats(self):
        super().reset_running_stats()
        rc = self.__dict__.get("_buffers", {}).get("running_count")
        if rc is not None:
            rc.zero_()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        key = prefix + "running_count"
        if self._buffers.get("running_count") is not None and key not in state_dict:
            # statistics saved without a count (torch's keys): unknown, the next batch starts it
            state_dict[key] = torch.tensor(-1.0, dtype=torch.float64)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)

    def extra_repr(self):
        s = super().extra_repr()
        if getattr(self, "fuse_relu", False):
            s += ", fuse_relu=True"
        if getattr(self, "count_weighted", False):
            s += ", count_weighted=True"
        return s

    def forward(self, input: Tensor, residual: Optional[Tensor] = None) -> Tensor:
        self._check_input_dim(input)
        # literals, as TorchScript wants them (checked against the names below the class):
        flags = 33554432  # TORCH_FALLBACK
        if self.fuse_relu:
            flags |= 2 if residual is not None else 1  # NORMA_BN_ADD_RELU, NORMA_BN_RELU
        elif residual is not None:
            raise ValueError("forward(x, residual) computes relu(bn(x) + residual): construct "
                             "the module with fuse_relu=True")
        if self.count_weighted:
            flags |= 64  # NORMA_BN_COUNT_WEIGHTED
        if self.check_finite:
            flags |= 8  # NORMA_CHECK_FINITE
        nbt: Optional[Tensor] = None
        running_mean = self.running_mean
        running_var = self.running_var
        if self.training:
            if self.track_running_stats:
                nbt = self.num_batches_tracked
            else:
                running_mean = None
                running_var = None
        if torch.jit.is_scripting():
            return torch.ops.norma.batch_norm(input, self.weight, self.bias, residual,
                                              running_mean, running_var, nbt, self.running_count,
                                              self.training, self.momentum, self.eps, flags)
        return eager_batch_norm(input, self.weight, self.bias, residual, running_mean,
                                running_var, nbt, self.running_count, self.training,
                                self.momentum, self.eps, flags)


assert (TORCH_FALLBACK, _ADD_RELU, _RELU, _COUNT_WEIGHTED, _CHECK_FINITE) == \
    (33554432, 2, 1, 64, 8), "the flag literals of _NormaBatchNorm.forward are out of date"


class BatchNorm1d(_NormaBatchNorm, nn.BatchNorm1d):
    """Drop-in torch.nn.BatchNorm1d ([N, C] or [N, C, L]) computed by norma."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, device=None, dtype=None, fuse_relu=False,
                 count_weighted=False):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)
        self._init_norma(fuse_relu, count_weighted)


class BatchNorm2d(_NormaBatchNorm, nn.BatchNorm2d):
    """Drop-in torch.nn.BatchNorm2d ([N, C, H, W], channels_last too) computed by norma."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, device=None, dtype=None, fuse_relu=False,
                 count_weighted=False):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)
        self._init_norma(fuse_relu, count_weighted)


class BatchNorm3d(_NormaBatchNorm, nn.BatchNorm3d):
    """Drop-in torch.nn.BatchNorm3d ([N, C, D, H, W], channels_last_3d too) computed by
    norma."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, device=None, dtype=None, fuse_relu=False,
                 count_weighted=False):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)
        self._init_norma(fuse_relu, count_weighted)


# ------------------------------------------------------------------------------------------
# SyncBatchNorm
# ------------------------------------------------------------------------------------------

_PARAM_GRADS = ("mean", "sum")


class SyncBatchNorm(_NormaBatchNorm, nn.modules.batchnorm._BatchNorm):
    """Drop-in torch.nn.SyncBatchNorm for CPU tensors, synchronized by norma.

    SyncBatchNorm(num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                  process_group=None, device=None, dtype=None, fuse_relu=False,
                  param_grads="mean", count_weighted=False, sync=True)

    process_group: a torch.distributed process group, or an mpi4py communicator; None: the
    default group of torch.distributed when it is initialized, else MPI.COMM_WORLD (looked up
    at each forward).  Any input rank >= 2, channels_last too.  In training mode on a group of
    more than one process, the batch statistics are those of the global batch (every rank's
    local batch, in rank order; local batch sizes may differ and may be 0), the running
    statistics come out identical on every rank, and the forward and the backward are
    collective: every rank must run them, in the same order.  Otherwise (eval mode, one
    process, or sync=False) it is norma's BatchNorm with local statistics.

    Parameter gradients: norma computes the gradient of the global batch, the same on every
    rank.  param_grads="mean" (default) hands out that value divided by the number of ranks,
    which is what torch's SyncBatchNorm gives after DistributedDataParallel averages its
    per-rank gradients; since it is the same on every rank, averaging it again (DDP, or an
    allreduce / size) leaves it unchanged.  param_grads="sum" hands out the global gradient.

    It subclasses torch's _BatchNorm, not nn.SyncBatchNorm: DistributedDataParallel refuses
    nn.SyncBatchNorm subclasses in CPU modules (its check is for torch's CUDA-only kernels).
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_group=None, device=None, dtype=None,
                 fuse_relu=False, param_grads="mean", count_weighted=False, sync=True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)
        if param_grads not in _PARAM_GRADS:
            raise ValueError("param_grads must be 'mean' or 'sum' (got %r)" % (param_grads,))
        self.process_group = process_group
        self.param_grads = param_grads
        self.sync = bool(sync)
        self._init_norma(fuse_relu, count_weighted)
        self._sync_times = None
        self._group_cache = None

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError("expected at least 2D input (got {}D input)".format(input.dim()))

    def extra_repr(self):
        s = super().extra_repr()
        if getattr(self, "param_grads", "mean") != "mean":
            s += ", param_grads=%r" % self.param_grads
        if not getattr(self, "sync", True):
            s += ", sync=False"
        return s

    def __deepcopy__(self, memo):
        # communicators and process groups cannot be copied: the copy shares them
        new = self.__class__.__new__(self.__class__)
        memo[id(self)] = new
        for key in ("process_group", "_group_cache"):
            v = self.__dict__.get(key)
            if v is not None:
                memo[id(v)] = v
        new.__setstate__(copy.deepcopy(self.__dict__, memo))
        return new

    def group(self):
        """The group this layer synchronizes over now (a norma.torch._sync.Group)."""
        handle = self.process_group if self.process_group is not None else \
            _sync.default_group()
        cache = self._group_cache
        if cache is None or cache[0] is not handle:
            cache = (handle, _sync.Group(handle))
            self._group_cache = cache
        return cache[1]

    @torch.jit.unused
    def forward(self, input: Tensor, residual: Optional[Tensor] = None) -> Tensor:
        if input.dim() >= 2 and input.size(1) == 0:
            raise ValueError("SyncBatchNorm number of input channels should be non-zero")
        if not (self.training and self.sync):
            return super().forward(input, residual)
        group = self.group()
        if group.size == 1:
            return super().forward(input, residual)
        self._check_input_dim(input)
        if input.device.type != "cpu" or input.dtype not in (torch.float32, torch.float64,
                                                             torch.float16, torch.bfloat16):
            raise ValueError("norma.torch.SyncBatchNorm takes CPU float32 / float64 / float16 / "
                             "bfloat16 tensors (got %s on %s)" % (input.dtype, input.device))
        flags = 0
        if self.fuse_relu:
            flags |= _ADD_RELU if residual is not None else _RELU
        elif residual is not None:
            raise ValueError("forward(x, residual) computes relu(bn(x) + residual): construct "
                             "the module with fuse_relu=True")
        if self.check_finite:
            flags |= _CHECK_FINITE
        factor = self.momentum if self.momentum is not None else 0.0
        running_mean = running_var = running_count = None
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked)
            running_mean, running_var = self.running_mean, self.running_var
            if self.count_weighted:
                flags |= _COUNT_WEIGHTED
                running_count = self.running_count
        scale = 1.0 / group.size if self.param_grads == "mean" else 1.0
        return _sync.SyncBatchNormFunction.apply(input, self.weight, self.bias, residual,
                                                 running_mean, running_var, running_count,
                                                 factor, self.eps, flags, group, scale,
                                                 self._sync_times)

    @classmethod
    def convert_sync_batchnorm(cls, module, process_group=None):
        """As torch.nn.SyncBatchNorm.convert_sync_batchnorm: every BatchNorm*D (any
        _BatchNorm) in `module` becomes a norma SyncBatchNorm on process_group, sharing its
        parameters and buffers and keeping its training flag (and fuse_relu /
        count_weighted of norma's modules).  Returns the module (a new one when `module`
        itself is a BatchNorm)."""
        from .convert import convert_tree, convert_one
        return convert_tree(module, lambda n, m: isinstance(m, nn.modules.batchnorm._BatchNorm),
                            lambda m: convert_one(m, cls, process_group))


# ------------------------------------------------------------------------------------------
# Streaming normalization
# ------------------------------------------------------------------------------------------


class StreamingBatchNorm(nn.Module):
    """Normalization of a stream (video frames, audio chunks) with statistics that follow it.

    The samples of a batch are consecutive frames of one stream: frame t (sample t of
    [N, C, *spatial]) is normalized with running statistics into which its own per-channel
    statistics (over its spatial positions) are blended first:

        m_t = (1 - alpha) * m_{t-1} + alpha * mean_t
        v_t = (1 - alpha) * v_{t-1} + alpha * var_t          (biased, per frame)
        y_t = (x_t - m_t) / sqrt(v_t + eps) * weight + bias

    (m, v) carry over from call to call in the buffers running_mean / running_var (the last
    frame's), in training and in eval mode alike; reset() starts a new stream, whose first
    frame then starts the statistics.  In training, gradients flow through the statistics of
    the frames of the batch; the state carried in from earlier calls is a constant.

    Statistics and arithmetic are float32 (float64 for float64 inputs) whatever the input
    dtype: bfloat16 / float16 inputs (torch.autocast) give outputs of their dtype.
    """

    def __init__(self, num_features, alpha=0.1, eps=1e-5, affine=True, device=None,
                 dtype=None):
        super().__init__()
        if not 0.0 < alpha <= 1.0:
            raise ValueError("alpha must be in (0, 1] (got %r)" % (alpha,))
        factory = {"device": device, "dtype": dtype}
        self.num_features = num_features
        self.alpha = float(alpha)
        self.eps = eps
        self.affine = affine
        if affine:
            self.weight = nn.Parameter(torch.ones(num_features, **factory))
            self.bias = nn.Parameter(torch.zeros(num_features, **factory))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.register_buffer("running_mean", torch.zeros(num_features, **factory))
        self.register_buffer("running_var", torch.ones(num_features, **factory))
        self.register_buffer("frames_seen", torch.zeros((), dtype=torch.long, device=device))

    def extra_repr(self):
        return "{num_features}, alpha={alpha}, eps={eps}, affine={affine}".format(
            **self.__dict__)

    def reset(self):
        """Starts a new stream: the next frame's statistics become the running ones."""
        self.running_mean.zero_()
        self.running_var.fill_(1.0)
        self.frames_seen.zero_()

    def forward(self, input: Tensor) -> Tensor:
        if input.dim() < 2:
            raise ValueError("expected at least 2D input (got %dD input)" % input.dim())
        n, c = input.shape[0], input.shape[1]
        if c != self.num_features:
            raise ValueError("expected %d channels, got %d" % (self.num_features, c))
        if n == 0:
            return input.clone()
        cdt = torch.float64 if input.dtype == torch.float64 else torch.float32
        xf = input if input.dtype == cdt else input.to(cdt)
        dims = tuple(range(2, input.dim()))
        if dims:
            var_t, mean_t = torch.var_mean(xf, dim=dims, unbiased=False)
        else:
            mean_t, var_t = xf, torch.zeros_like(xf)
        a = self.alpha
        # m_t = (1 - a)^(t + 1) m_{-1} + sum_{k <= t} a (1 - a)^(t - k) mean_k, as one product
        t = torch.arange(n, device=input.device, dtype=cdt)
        decay = (1.0 - a) ** (t[:, None] - t[None, :])
        w = torch.tril(a * decay)
        carry = (1.0 - a) ** (t + 1.0)
        m0 = self.running_mean.to(cdt)
        v0 = self.running_var.to(cdt)
        if int(self.frames_seen) == 0:  # a new stream: its first frame starts the statistics
            w = w.clone()
            w[:, 0] = (1.0 - a) ** t
            carry = torch.zeros_like(carry)
        m = w @ mean_t + carry[:, None] * m0[None, :]
        v = w @ var_t + carry[:, None] * v0[None, :]
        with torch.no_grad():
            self.running_mean.copy_(m[-1])
            self.running_var.copy_(v[-1])
            self.frames_seen.add_(n)
        shape = (n, c) + (1,) * len(dims)
        scale = torch.rsqrt(v + self.eps)
        if self.weight is not None:
            scale = scale * self.weight.to(cdt)
        shift = -m * scale
        if self.bias is not None:
            shift = shift + self.bias.to(cdt)
        y = xf * scale.reshape(shape) + shift.reshape(shape)
        return y if y.dtype == input.dtype else y.to(input.dtype)
