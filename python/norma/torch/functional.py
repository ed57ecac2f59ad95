"""Functional BatchNorm with autograd: torch.nn.functional.batch_norm's arguments, plus norma's
fusions and options.  Runs the operators of _ops.py (the extension, or the ctypes fallback)."""

from typing import Optional

import torch
from torch import Tensor

from .. import _core
from . import _ops
from ._ops import SAVE_OUTPUT, TORCH_FALLBACK


def call_batch_norm(input, weight, bias, residual, running_mean, running_var,
                    num_batches_tracked, running_count, training, momentum, eps, flags):
    """ops().batch_norm with the extension's norma errors raised as norma.NormaError."""
    try:
        return _ops.ops().batch_norm(input, weight, bias, residual, running_mean, running_var,
                                     num_batches_tracked, running_count, training, momentum,
                                     eps, flags)
    except RuntimeError as e:
        _ops.raise_norma_error(e)


@torch.jit.unused
def eager_batch_norm(input: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                     residual: Optional[Tensor], running_mean: Optional[Tensor],
                     running_var: Optional[Tensor], num_batches_tracked: Optional[Tensor],
                     running_count: Optional[Tensor], training: bool,
                     momentum: Optional[float], eps: float, flags: int) -> Tensor:
    """What the modules call outside TorchScript (inside it they call torch.ops.norma)."""
    try:
        return _ops.ops().batch_norm(input, weight, bias, residual, running_mean, running_var,
                                     num_batches_tracked, running_count, training, momentum,
                                     eps, flags)
    except RuntimeError as e:
        _ops.raise_norma_error(e)


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False,
               momentum=0.1, eps=1e-5, relu=False, residual=None, biased_running_var=False,
               save_output=False, running_count=None, check_finite=False):
    """torch.nn.functional.batch_norm with autograd, plus the fusions of norma:
    ``relu=True``: relu(bn(x)); ``relu=True, residual=r``: relu(bn(x) + r) in one pass (a
    residual needs relu=True: norma fuses the add only with the ReLU).

    The memory format of input is kept (channels_last in, channels_last out).
    ``save_output=True`` (training, no activation) keeps y instead of x for the backward.
    ``running_count`` (a float64 scalar tensor) makes the running statistics count-weighted.
    """
    flags = _core.act_flags(relu, residual) | _core._flags(
        biased_running_var=biased_running_var, check_finite=check_finite,
        count_weighted=running_count is not None)
    if save_output:
        flags |= SAVE_OUTPUT
    if not training and (running_mean is None or running_var is None):
        raise ValueError("running_mean and running_var must be defined in evaluation mode")
    return call_batch_norm(input, weight, bias, residual, running_mean, running_var, None,
                           running_count, training, momentum, eps, flags)


def batch_norm_relu(input, running_mean, running_var, weight=None, bias=None, training=False,
                    momentum=0.1, eps=1e-5):
    """relu(batch_norm(...)) in one pass."""
    return batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps,
                      relu=True)


def batch_norm_add_relu(input, residual, running_mean, running_var, weight=None, bias=None,
                        training=False, momentum=0.1, eps=1e-5):
    """relu(batch_norm(...) + residual) in one pass."""
    return batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps,
                      relu=True, residual=residual)


# the norm family (norms.py): layer_norm / rms_norm with the fused residual add, group_norm
# with the fused activation, instance_norm
from .norms import layer_norm, rms_norm, group_norm, instance_norm  # noqa: E402

__all__ = ["batch_norm", "batch_norm_relu", "batch_norm_add_relu", "layer_norm", "rms_norm",
           "group_norm", "instance_norm", "TORCH_FALLBACK"]
