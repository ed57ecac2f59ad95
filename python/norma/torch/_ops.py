"""The operators norma.torch calls, from one of two backends with the same signatures:

- ``"extension"``: libnorma_torch (src/torch/), norma's kernels registered as PyTorch operators
  (``torch.ops.norma.*``) with autograd in C++.  As cheap per call as torch's own BatchNorm,
  and what TorchScript (``torch.jit.script``) and ``torch.jit.trace`` record.
- ``"ctypes"``: the same operators in Python over the ctypes binding (norma/_core.py), with
  ``torch.autograd.Function``; the fallback where the extension was not built.  Slower per
  call (tens of microseconds), same results.

The extension is found like libnorma (norma._lib.find_library): the environment variable
``NORMA_TORCH_LIBRARY`` (that file or an error), the folder of the loaded libnorma (the same
build), beside the package, the checkout's build trees, the install prefixes.  It must be bound
to the libnorma that the ctypes binding loaded (one copy of the library and its settings);
otherwise it is not used.  ``NORMA_TORCH_BACKEND=ctypes`` forces the fallback,
``=extension`` makes a missing extension an error.

Operator signatures (both backends; ``flags`` are norma.h's flags plus SAVE_OUTPUT and
TORCH_FALLBACK below):

    batch_norm(input, weight, bias, residual, running_mean, running_var, num_batches_tracked,
               running_count, training, momentum, eps, flags) -> y          (autograd)
    bn_record_forward(x, eps, flags) -> record
    bn_merge_records(records) -> record
    bn_sync_forward(x, residual, weight, bias, merged, running_mean, running_var,
                    running_count, momentum, eps, flags) -> (y, save_mean, save_invstd)
    bn_record_backward(x, y, dy, weight, bias, save_mean, save_invstd, flags) -> record
    bn_sum_records(records) -> record
    bn_sync_backward(x, y, dy, weight, bias, save_mean, save_invstd, summed, flags,
                     param_grads) -> (dx, dweight, dbias, dresidual)

The norm family (src/torch/norms_ops.cpp, _fallback_norms.py); differentiable:

    layer_norm(input, normalized_shape, weight, bias, eps, flags) -> y
    layer_norm_residual(input, residual, normalized_shape, weight, bias, eps, flags) -> (y, h)
    rms_norm(input, normalized_shape, weight, eps?, flags) -> y     (eps None: finfo.eps)
    rms_norm_residual(input, residual, normalized_shape, weight, eps?, flags) -> (y, h)
    group_norm(input, num_groups, weight, bias, eps, flags) -> y     (NORMA_RELU / NORMA_SILU)
    instance_norm(input, weight, bias, running_mean, running_var, use_input_stats, momentum,
                  eps, flags) -> y

and the C calls without autograd:

    ln_forward(x, residual, normalized_shape, weight, bias, eps, flags)
        -> (y, h, save_mean, save_invstd)          (h None without residual)
    ln_backward(x, dy, dsum, normalized_shape, weight, save_mean, save_invstd, flags,
                param_grads) -> (dx, dweight, dbias)
    rms_forward(x, residual, normalized_shape, weight, eps?, flags) -> (y, h, save_invrms)
    rms_backward(x, dy, dsum, normalized_shape, weight, save_invrms, flags, param_grads)
        -> (dx, dweight)
    gn_forward(x, num_groups, weight, bias, eps, flags) -> (y, save_mean, save_invstd)
    gn_backward(x, y, dy, num_groups, weight, bias, save_mean, save_invstd, flags,
                param_grads) -> (dx, dweight, dbias)
    in_forward_training(x, weight, bias, running_mean, running_var, momentum, eps, flags)
        -> (y, save_mean, save_invstd)
    in_forward_inference(x, weight, bias, mean, var, eps, flags) -> y
    in_backward(x, y, dy, weight, bias, save_mean, save_invstd, flags, param_grads)
        -> (dx, dweight, dbias)
"""

import ctypes
import os
import threading

import torch

from .. import _lib

# Bits of `flags` above norma.h's (the same values as src/torch/norma_torch.h).
SAVE_OUTPUT = 1 << 24      # training, no activation: the backward keeps y instead of x
TORCH_FALLBACK = 1 << 25   # inputs norma does not take: torch's BatchNorm instead of an error

# The record of the synchronized calls (src/torch/sync_ops.cpp): a header of HEADER float64
# values [status, count, eps, fingerprint], then the per-channel data.
HEADER = 4
H_STATUS, H_COUNT, H_EPS, H_FP = range(4)

_LOCK = threading.Lock()
_STATE = {}


class _Fallback:
    """The ctypes backend, imported on first use."""

    def __getattr__(self, name):
        from . import _fallback
        return getattr(_fallback, name)


def _load_extension():
    """(ops, path, None) or (None, path or None, reason)."""
    _lib.lib()  # libnorma first: the extension then binds to this copy (same soname)
    base = _lib.library_path()
    first = [os.path.dirname(os.path.abspath(base))] if base and os.path.sep in base else []
    try:
        _, path = _lib.find_library("norma_torch", "NORMA_TORCH_LIBRARY", torch.ops.load_library,
                                    first=first, what="libnorma_torch")
    except _lib.NormaLibraryNotFound as e:
        return None, None, str(e)
    except (RuntimeError, ImportError) as e:  # torch refused it (another torch's ABI)
        return None, None, "libnorma_torch could not be loaded into this torch: %s" % e
    ops = torch.ops.norma
    mine = ctypes.cast(_lib.lib().norma_version, ctypes.c_void_p).value
    theirs = int(ops.library_address())
    if mine != theirs:
        return None, path, (
            "%s is bound to another libnorma (%s) than the one norma loaded (%s); point "
            "NORMA_LIBRARY and NORMA_TORCH_LIBRARY at the same build"
            % (path, ", ".join(_lib.loaded_copies("norma")) or "?", _lib.library_path()))
    return ops, path, None


def _resolve():
    with _LOCK:
        if _STATE:
            return _STATE
        want = os.environ.get("NORMA_TORCH_BACKEND", "auto").strip().lower() or "auto"
        if want not in ("auto", "extension", "ctypes"):
            raise ValueError("NORMA_TORCH_BACKEND must be auto, extension or ctypes (got %r)"
                             % want)
        if want == "ctypes":
            ops, path, why = None, None, "NORMA_TORCH_BACKEND=ctypes"
        else:
            ops, path, why = _load_extension()
            if ops is None and want == "extension":
                raise _lib.NormaLibraryNotFound("NORMA_TORCH_BACKEND=extension: " + why)
        _STATE.update(ops=ops if ops is not None else _Fallback(), path=path, reason=why,
                      backend="extension" if ops is not None else "ctypes")
        return _STATE


def ops():
    """The operators of the chosen backend (torch.ops.norma, or the ctypes fallback)."""
    s = _STATE or _resolve()
    return s["ops"]


def backend():
    """"extension" (libnorma_torch, torch.ops.norma) or "ctypes" (the fallback)."""
    return (_STATE or _resolve())["backend"]


def extension_status():
    """A dict: backend, path (of libnorma_torch when loaded), reason (why the fallback is
    used; None with the extension)."""
    s = _STATE or _resolve()
    return {"backend": s["backend"], "path": s["path"], "reason": s["reason"]}


def fallback():
    """The ctypes backend itself (tests run both backends side by side)."""
    from . import _fallback
    return _fallback


def extension_ops():
    """torch.ops.norma when the extension is loaded, else None."""
    s = _STATE or _resolve()
    return s["ops"] if s["backend"] == "extension" else None


def raise_norma_error(e):
    """A RuntimeError from an operator of the extension whose text starts with a status name
    ("NORMA_ERR_...: detail") as norma.NormaError; other errors unchanged."""
    text = str(e)
    for code, name in _lib.STATUS_NAMES.items():
        if code and text.startswith(name + ": "):
            detail = text[len(name) + 2:].split("\nException raised from")[0].strip()
            raise _lib.NormaError(code, name, detail) from None
    raise e


class use_backend:
    """Context manager that makes norma.torch use `name` ("extension" or "ctypes") inside it
    (tests run both side by side).  "extension" raises NormaLibraryNotFound when it is not
    loaded."""

    def __init__(self, name):
        if name not in ("extension", "ctypes"):
            raise ValueError("backend must be 'extension' or 'ctypes' (got %r)" % (name,))
        self.name = name
        self.saved = None

    def __enter__(self):
        s = _STATE or _resolve()
        self.saved = dict(s)
        if self.name == "ctypes":
            s.update(ops=_Fallback(), backend="ctypes")
        elif self.saved["backend"] != "extension":
            raise _lib.NormaLibraryNotFound("the extension is not loaded: %s"
                                            % self.saved["reason"])
        return self

    def __exit__(self, *exc):
        _STATE.update(self.saved)
        return False
