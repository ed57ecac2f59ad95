"""Drop-in LayerNorm, RMSNorm, GroupNorm and InstanceNorm1d/2d/3d computed by norma, and their
functional forms (with the fused residual add of a pre-norm transformer block, and GroupNorm's
fused SiLU / ReLU).

Inputs norma does not take (another device, another dtype, no values) are computed by torch's
own functions (RMSNorm: x * rsqrt(mean(x^2) + eps) * weight), as the BatchNorm modules do.
A backward with create_graph=True (double backward) computes the first-order gradients with
torch's differentiable ops instead of norma's kernel, so that they can be differentiated
again."""

import numbers
from typing import List, Optional, Tuple

import torch
from torch import Tensor, nn

from .. import _lib
from . import _ops
from ._ops import TORCH_FALLBACK

_RELU = _lib.BN_RELU
_SILU = _lib.SILU
_CHECK_FINITE = _lib.CHECK_FINITE

assert (TORCH_FALLBACK, _RELU, _SILU, _CHECK_FINITE) == (33554432, 1, 32, 8), \
    "the flag literals of the norm modules are out of date"

_ACTIVATIONS = {None: 0, "relu": _RELU, "silu": _SILU}


def _activation_flags(activation):
    if activation not in _ACTIVATIONS:
        raise ValueError("activation must be None, 'relu' or 'silu' (got %r)" % (activation,))
    return _ACTIVATIONS[activation]


def _shape(normalized_shape):
    if isinstance(normalized_shape, numbers.Integral):
        return (int(normalized_shape),)
    return tuple(int(v) for v in normalized_shape)


# ------------------------------------------------------------------------------------------
# What the modules call outside TorchScript (inside it they call torch.ops.norma directly)
# ------------------------------------------------------------------------------------------


@torch.jit.unused
def _eager_layer_norm(input: Tensor, normalized_shape: List[int], weight: Optional[Tensor],
                      bias: Optional[Tensor], eps: float, flags: int) -> Tensor:
    try:
        return _ops.ops().layer_norm(input, normalized_shape, weight, bias, eps, flags)
    except RuntimeError as e:
        _ops.raise_norma_error(e)


@torch.jit.unused
def _eager_rms_norm(input: Tensor, normalized_shape: List[int], weight: Optional[Tensor],
                    eps: Optional[float], flags: int) -> Tensor:
    try:
        return _ops.ops().rms_norm(input, normalized_shape, weight, eps, flags)
    except RuntimeError as e:
        _ops.raise_norma_error(e)


@torch.jit.unused
def _eager_group_norm(input: Tensor, num_groups: int, weight: Optional[Tensor],
                      bias: Optional[Tensor], eps: float, flags: int) -> Tensor:
    try:
        return _ops.ops().group_norm(input, num_groups, weight, bias, eps, flags)
    except RuntimeError as e:
        _ops.raise_norma_error(e)


@torch.jit.unused
def _eager_instance_norm(input: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                         running_mean: Optional[Tensor], running_var: Optional[Tensor],
                         use_input_stats: bool, momentum: float, eps: float,
                         flags: int) -> Tensor:
    try:
        return _ops.ops().instance_norm(input, weight, bias, running_mean, running_var,
                                        use_input_stats, momentum, eps, flags)
    except RuntimeError as e:
        _ops.raise_norma_error(e)


class _Scriptable:
    def __prepare_scriptable__(self):
        # torch.jit.script calls this first: the forward it compiles calls torch.ops.norma
        if _ops.backend() != "extension":
            raise RuntimeError("TorchScript needs norma's PyTorch operators (libnorma_torch), "
                               "which are not loaded: %s (torch.jit.trace works with either "
                               "backend)" % _ops.extension_status()["reason"])
        return self


# ------------------------------------------------------------------------------------------
# Modules
# ------------------------------------------------------------------------------------------


class LayerNorm(_Scriptable, nn.LayerNorm):
    """Drop-in torch.nn.LayerNorm computed by norma (input [..., *normalized_shape]).

    LayerNorm(normalized_shape, eps=1e-5, elementwise_affine=True, bias=True, device=None,
              dtype=None); bias=False gives no bias parameter (as torch 2.1+).
    The fused residual form is norma.torch.layer_norm(x, ..., residual=r)."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True,
                 device=None, dtype=None):
        super().__init__(normalized_shape, eps, elementwise_affine, device=device, dtype=dtype)
        if elementwise_affine and not bias:
            self.register_parameter("bias", None)
        self.check_finite = False

    def forward(self, input: Tensor) -> Tensor:
        flags = 33554432  # TORCH_FALLBACK
        if self.check_finite:
            flags |= 8  # NORMA_CHECK_FINITE
        if torch.jit.is_scripting():
            return torch.ops.norma.layer_norm(input, self.normalized_shape, self.weight,
                                              self.bias, self.eps, flags)
        return _eager_layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps,
                                 flags)


class RMSNorm(_Scriptable, nn.Module):
    """Drop-in torch.nn.RMSNorm (PyTorch 2.4+) computed by norma:
    y = x * rsqrt(mean(x^2 over normalized_shape) + eps) * weight; eps=None means
    torch.finfo(x.dtype).eps at forward time."""

    __constants__ = ["normalized_shape", "eps", "elementwise_affine"]
    normalized_shape: Tuple[int, ...]
    eps: Optional[float]
    elementwise_affine: bool

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, device=None,
                 dtype=None):
        super().__init__()
        self.normalized_shape = _shape(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = nn.Parameter(torch.empty(self.normalized_shape, device=device,
                                                   dtype=dtype))
        else:
            self.register_parameter("weight", None)
        self.check_finite = False
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.ones_(self.weight)

    def extra_repr(self):
        return "{normalized_shape}, eps={eps}, elementwise_affine={elementwise_affine}".format(
            **self.__dict__)

    def forward(self, input: Tensor) -> Tensor:
        flags = 33554432  # TORCH_FALLBACK
        if self.check_finite:
            flags |= 8  # NORMA_CHECK_FINITE
        if torch.jit.is_scripting():
            return torch.ops.norma.rms_norm(input, self.normalized_shape, self.weight, self.eps,
                                            flags)
        return _eager_rms_norm(input, self.normalized_shape, self.weight, self.eps, flags)


class GroupNorm(_Scriptable, nn.GroupNorm):
    """Drop-in torch.nn.GroupNorm computed by norma: input [N, C, *]; a channels_last 4-D / 5-D
    input is used in place and gives a channels_last output.  Extra keyword: activation=None,
    'relu' or 'silu' fuses that activation into the same pass (y = act(groupnorm(x)))."""

    def __init__(self, num_groups, num_channels, eps=1e-5, affine=True, device=None,
                 dtype=None, activation=None):
        super().__init__(num_groups, num_channels, eps, affine, device=device, dtype=dtype)
        self.act_flags = _activation_flags(activation)
        self.activation = activation
        self.check_finite = False

    def extra_repr(self):
        s = super().extra_repr()
        if getattr(self, "activation", None) is not None:
            s += ", activation=%r" % (self.activation,)
        return s

    def forward(self, input: Tensor) -> Tensor:
        flags = 33554432 | self.act_flags  # TORCH_FALLBACK | the activation
        if self.check_finite:
            flags |= 8  # NORMA_CHECK_FINITE
        if torch.jit.is_scripting():
            return torch.ops.norma.group_norm(input, self.num_groups, self.weight, self.bias,
                                              self.eps, flags)
        return _eager_group_norm(input, self.num_groups, self.weight, self.bias, self.eps, flags)


class _NormaInstanceNorm(_Scriptable):
    """Mixin: torch's _InstanceNorm.forward computed by norma (PyTorch 1.13 semantics)."""

    def _init_norma(self):
        self.check_finite = False

    def _norma_apply(self, input: Tensor) -> Tensor:
        flags = 33554432  # TORCH_FALLBACK
        if self.check_finite:
            flags |= 8  # NORMA_CHECK_FINITE
        use_input_stats = self.training or not self.track_running_stats
        if torch.jit.is_scripting():
            return torch.ops.norma.instance_norm(input, self.weight, self.bias,
                                                 self.running_mean, self.running_var,
                                                 use_input_stats, self.momentum, self.eps, flags)
        return _eager_instance_norm(input, self.weight, self.bias, self.running_mean,
                                    self.running_var, use_input_stats, self.momentum, self.eps,
                                    flags)

    def forward(self, input: Tensor) -> Tensor:
        self._check_input_dim(input)
        if input.dim() == self._get_no_batch_dim():
            return self._norma_apply(input.unsqueeze(0)).squeeze(0)
        return self._norma_apply(input)


class InstanceNorm1d(_NormaInstanceNorm, nn.InstanceNorm1d):
    """Drop-in torch.nn.InstanceNorm1d ([N, C, L] or unbatched [C, L]) computed by norma."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=False,
                 track_running_stats=False, device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)
        self._init_norma()


class InstanceNorm2d(_NormaInstanceNorm, nn.InstanceNorm2d):
    """Drop-in torch.nn.InstanceNorm2d ([N, C, H, W], channels_last too, or unbatched
    [C, H, W]) computed by norma."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=False,
                 track_running_stats=False, device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)
        self._init_norma()


class InstanceNorm3d(_NormaInstanceNorm, nn.InstanceNorm3d):
    """Drop-in torch.nn.InstanceNorm3d ([N, C, D, H, W], channels_last_3d too, or unbatched
    [C, D, H, W]) computed by norma."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=False,
                 track_running_stats=False, device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)
        self._init_norma()


# ------------------------------------------------------------------------------------------
# Functional forms
# ------------------------------------------------------------------------------------------


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5, residual=None,
               check_finite=False):
    """torch.nn.functional.layer_norm computed by norma.  With residual: returns (y, h) where
    h = x + residual and y = layer_norm(h), in one pass (the pre-norm transformer step);
    gradients flow through both outputs into x and residual."""
    ns = _shape(normalized_shape)
    flags = TORCH_FALLBACK | (_CHECK_FINITE if check_finite else 0)
    o = _ops.ops()
    try:
        if residual is None:
            return o.layer_norm(x, ns, weight, bias, float(eps), flags)
        return tuple(o.layer_norm_residual(x, residual, ns, weight, bias, float(eps), flags))
    except RuntimeError as e:
        _ops.raise_norma_error(e)


def rms_norm(x, normalized_shape, weight=None, eps=None, residual=None, check_finite=False):
    """y = x * rsqrt(mean(x^2) + eps) * weight over the trailing normalized_shape (eps None:
    torch.finfo(x.dtype).eps).  With residual: returns (y, h), h = x + residual, as
    layer_norm's."""
    ns = _shape(normalized_shape)
    flags = TORCH_FALLBACK | (_CHECK_FINITE if check_finite else 0)
    eps = None if eps is None else float(eps)
    o = _ops.ops()
    try:
        if residual is None:
            return o.rms_norm(x, ns, weight, eps, flags)
        return tuple(o.rms_norm_residual(x, residual, ns, weight, eps, flags))
    except RuntimeError as e:
        _ops.raise_norma_error(e)


def group_norm(x, num_groups, weight=None, bias=None, eps=1e-5, activation=None,
               check_finite=False):
    """torch.nn.functional.group_norm computed by norma; activation None, 'relu' or 'silu' is
    fused into the same pass."""
    flags = TORCH_FALLBACK | _activation_flags(activation) | \
        (_CHECK_FINITE if check_finite else 0)
    try:
        return _ops.ops().group_norm(x, int(num_groups), weight, bias, float(eps), flags)
    except RuntimeError as e:
        _ops.raise_norma_error(e)


def instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None,
                  use_input_stats=True, momentum=0.1, eps=1e-5, check_finite=False):
    """torch.nn.functional.instance_norm computed by norma (input [N, C, *])."""
    flags = TORCH_FALLBACK | (_CHECK_FINITE if check_finite else 0)
    try:
        return _ops.ops().instance_norm(input, weight, bias, running_mean, running_var,
                                        bool(use_input_stats), float(momentum), float(eps),
                                        flags)
    except RuntimeError as e:
        _ops.raise_norma_error(e)


__all__ = ["LayerNorm", "RMSNorm", "GroupNorm", "InstanceNorm1d", "InstanceNorm2d",
           "InstanceNorm3d", "layer_norm", "rms_norm", "group_norm", "instance_norm"]
