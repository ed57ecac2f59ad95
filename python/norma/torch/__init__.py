"""PyTorch integration: drop-in BatchNorm modules, autograd functions, convert() and fold_bn(),
synchronized BatchNorm (torch.distributed or MPI), precise statistics, non-finite diagnosis.

    import norma.torch as nt
    bn = nt.BatchNorm2d(64)                 # same arguments, parameters, buffers as nn's
    model = nt.convert(model)               # every nn.BatchNorm{1,2,3}d, LayerNorm, GroupNorm,
                                            # InstanceNorm{1,2,3}d -> norma's, state kept
    model = nt.convert(model, kinds=("layer", "rms"))   # only some kinds
    ln = nt.LayerNorm(768); rms = nt.RMSNorm(4096); gn = nt.GroupNorm(32, 320)
    y, h = nt.layer_norm(x, (768,), w, b, residual=r)   # h = x + r, y = layer_norm(h)
    inference_model = nt.fold_bn(model)     # BN after Conv/Linear folded into its weights
    model = nt.convert(model, sync=True)    # SyncBatchNorm: torch.distributed's default group
                                            # (DDP, gloo), or MPI (mpi4py)
    model = nt.convert(model, sync=nt.deepest(4))   # only the 4 deepest layers synchronized
    nt.recompute_bn_stats(model, batches)   # exact population statistics

CPU tensors in float32, float64, bfloat16 (with float32 parameters, as torch's CPU BatchNorm)
and float16; channels_last (4-D, 5-D) inputs are used in place and give channels_last outputs.
Inputs the C library cannot take (other devices, other dtypes, empty batches) fall back to
torch's own implementation in the modules.

The kernels are called through libnorma_torch (PyTorch operators, torch.ops.norma.*) when it
was built, else through the ctypes binding; backend() says which (see _ops.py).
"""

from .._lib import NormaError
from .. import _core as _norma_core
from ._ops import backend, extension_status, SAVE_OUTPUT, TORCH_FALLBACK
from .functional import batch_norm, batch_norm_relu, batch_norm_add_relu
from .norms import (LayerNorm, RMSNorm, GroupNorm, InstanceNorm1d, InstanceNorm2d,
                    InstanceNorm3d, layer_norm, rms_norm, group_norm, instance_norm)
from .modules import (BatchNorm1d, BatchNorm2d, BatchNorm3d, SyncBatchNorm,
                      StreamingBatchNorm)
from ._sync import SyncBatchNormFunction, sync_batch_norm, sync_timings, default_group
from .convert import convert, fold_bn, SyncPolicy, deepest, where, synchronized_layers
from .fuse import fuse_bn_relu
from .precise import recompute_bn_stats
from .diagnose import (detect_nonfinite, NonFiniteError, NonFiniteFinding, AdaptiveGradClip,
                       bn_parameters)

__all__ = [
    "batch_norm", "batch_norm_relu", "batch_norm_add_relu",
    "LayerNorm", "RMSNorm", "GroupNorm", "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d",
    "layer_norm", "rms_norm", "group_norm", "instance_norm",
    "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm", "StreamingBatchNorm",
    "SyncBatchNormFunction", "sync_batch_norm", "sync_timings", "default_group",
    "convert", "fold_bn", "fuse_bn_relu", "SyncPolicy", "deepest", "where", "synchronized_layers",
    "recompute_bn_stats",
    "detect_nonfinite", "NonFiniteError", "NonFiniteFinding", "AdaptiveGradClip",
    "bn_parameters",
    "backend", "extension_status", "NormaError", "SAVE_OUTPUT", "TORCH_FALLBACK",
]


def _streaming_policy():
    """PyTorch hands norma a new output tensor for every call.  Above 32 MiB glibc's malloc maps
    fresh pages for each allocation, which the kernel has just zero-filled through the cache:
    such outputs are faster written through the cache than around it (measured in
    docs/performance.md), so the streaming-store range ends there.  NORMA_NT_MIN_BYTES in the
    environment (an explicit choice) leaves the library's default alone; norma.set_streaming_stores
    changes it at any time."""
    import os
    if not os.environ.get("NORMA_NT_MIN_BYTES"):
        _norma_core.set_streaming_stores(0, 32 << 20)


_streaming_policy()
