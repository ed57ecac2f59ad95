"""norma: fast, exact BatchNorm for CPUs (Python binding of libnorma).

Functional API on numpy arrays and CPU torch tensors::

    y, save_mean, save_invstd = norma.batch_norm_forward_training(x, gamma, beta, eps=1e-5,
        running_mean=rm, running_var=rv, momentum=0.1)
    dx, dgamma, dbeta = norma.batch_norm_backward(dy, x, save_mean, save_invstd, gamma, beta)
    y = norma.batch_norm_inference(x, rm, rv, gamma, beta)
    y = norma.batch_norm(x, rm, rv, weight, bias, training, momentum, eps)   # F.batch_norm order

PyTorch modules (autograd, channels_last, fused ReLU / add+ReLU, TorchScript) are in
``norma.torch``: ``BatchNorm1d/2d/3d``, ``SyncBatchNorm`` (over torch.distributed or MPI,
inside DistributedDataParallel), ``convert(model, sync=...)``, ``fold_bn(model)``,
``recompute_bn_stats``, ``detect_nonfinite``, ``AdaptiveGradClip``, ``StreamingBatchNorm``.
``norma.mpi`` is the functional SyncBatchNorm over MPI (libnorma_mpi); ``norma.check`` the
precision checker (also the command tools/norma-check).

The shared libraries are found through NORMA_LIBRARY (NORMA_MPI_LIBRARY,
NORMA_TORCH_LIBRARY), beside the package, in the build tree of the checkout, or where
``cmake --install`` put them (see norma._lib).
"""

from ._lib import (NormaError, NormaLibraryNotFound, library_path, CHANNELS_FIRST,
                   CHANNELS_LAST, BN_RELU, BN_ADD_RELU, BN_BIASED_RUNNING_VAR, CHECK_FINITE,
                   BN_GLOBAL_STATS, BN_COUNT_WEIGHTED)
from . import _core
from ._core import (batch_norm_forward_training, batch_norm_inference, batch_norm_backward,
                    bn_fold, fold_into_weights, moments, query_plan, version,
                    set_num_threads, get_num_threads, set_max_isa, get_isa, set_use_reference,
                    get_use_reference, set_streaming_stores)

__version__ = "0.1.0"

__all__ = [
    "NormaError", "NormaLibraryNotFound", "library_path",
    "batch_norm_forward_training", "batch_norm_inference", "batch_norm_backward", "batch_norm",
    "bn_fold", "fold_into_weights", "moments", "query_plan",
    "version", "set_num_threads", "get_num_threads", "set_max_isa", "get_isa",
    "set_use_reference", "get_use_reference", "set_streaming_stores",
    "CHANNELS_FIRST", "CHANNELS_LAST", "BN_RELU", "BN_ADD_RELU", "BN_BIASED_RUNNING_VAR",
    "CHECK_FINITE", "BN_GLOBAL_STATS", "BN_COUNT_WEIGHTED",
]


def batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False,
               momentum=0.1, eps=1e-5, layout=None):
    """torch.nn.functional.batch_norm's arguments and meaning.  torch tensors go through
    autograd (norma.torch.batch_norm); numpy arrays return y."""
    if _core.is_torch_tensor(x):
        from .torch import batch_norm as _torch_batch_norm
        return _torch_batch_norm(x, running_mean, running_var, weight, bias, training, momentum,
                                 eps)
    return _core.batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps,
                            layout)


def __getattr__(name):
    # `norma.torch` / `norma.mpi` without an explicit import (torch / mpi4py are imported only
    # then).
    if name in ("torch", "mpi", "check", "profiling"):
        import importlib
        return importlib.import_module("." + name, __name__)
    raise AttributeError("module 'norma' has no attribute %r" % name)
