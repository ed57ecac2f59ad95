"""convert(model): torch's BatchNorm layers replaced by norma's (optionally synchronized, layer
by layer); fold_bn(model): an inference copy with BatchNorm folded into the producers."""

import copy

import torch
from torch import nn

from .. import _core
from .modules import BatchNorm1d, BatchNorm2d, BatchNorm3d, SyncBatchNorm, _NormaBatchNorm
from . import norms as _norms

_LOCAL = {nn.BatchNorm1d: BatchNorm1d, nn.BatchNorm2d: BatchNorm2d, nn.BatchNorm3d: BatchNorm3d,
          BatchNorm1d: BatchNorm1d, BatchNorm2d: BatchNorm2d, BatchNorm3d: BatchNorm3d}
_TORCH_BN = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
_SYNC_SOURCES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm,
                 BatchNorm1d, BatchNorm2d, BatchNorm3d, SyncBatchNorm)


# ------------------------------------------------------------------------------------------
# Sync policies
# ------------------------------------------------------------------------------------------


class SyncPolicy:
    """Chooses the BatchNorm layers that synchronize their statistics.  choose(layers) gets
    the candidate layers as a list of (name, module) in the order of model.named_modules()
    (for torchvision's models and most others: the order of the forward, shallow to deep) and
    returns the set of names to synchronize."""

    def choose(self, layers):
        raise NotImplementedError


class where(SyncPolicy):
    """The layers for which predicate(name, module) is true."""

    def __init__(self, predicate):
        self.predicate = predicate

    def choose(self, layers):
        return {n for n, m in layers if self.predicate(n, m)}

    def __repr__(self):
        return "where(%r)" % (self.predicate,)


class deepest(SyncPolicy):
    """The k deepest BatchNorm layers (the last k in module order): local statistics in the
    shallow layers, where a rank's batch has many values per channel and the exchange would
    cost most relative to its use, synchronized ones in the deep layers, whose few values per
    channel make local statistics noisy.  k <= 0: none."""

    def __init__(self, k):
        self.k = int(k)

    def choose(self, layers):
        return {n for n, _ in layers[len(layers) - self.k:]} if self.k > 0 else set()

    def __repr__(self):
        return "deepest(%d)" % self.k


def _policy(sync):
    if isinstance(sync, SyncPolicy):
        return sync
    if callable(sync):
        return where(sync)
    raise TypeError("sync must be True, False, a predicate (name, module) -> bool or a "
                    "SyncPolicy such as norma.torch.deepest(k) (got %r)" % (sync,))


# ------------------------------------------------------------------------------------------
# convert
# ------------------------------------------------------------------------------------------


def convert_one(m, cls=None, process_group=None, count_weighted=None, sync=True):
    """A norma module replacing BatchNorm m (a new object sharing m's Parameter and buffer
    objects, training flag, hooks): cls None gives norma's BatchNorm of m's dimension, else
    cls (SyncBatchNorm)."""
    p = m.weight if m.weight is not None else m.running_mean
    factory = dict(device=p.device if p is not None else None,
                   dtype=p.dtype if p is not None and p.is_floating_point() else None)
    fuse_relu = getattr(m, "fuse_relu", False)
    if count_weighted is None:
        count_weighted = getattr(m, "count_weighted", False)
    if cls is None:
        new = _LOCAL[type(m)](m.num_features, m.eps, m.momentum, m.affine,
                              m.track_running_stats, fuse_relu=fuse_relu,
                              count_weighted=count_weighted, **factory)
    else:
        new = cls(m.num_features, m.eps, m.momentum, m.affine, m.track_running_stats,
                  process_group, fuse_relu=fuse_relu, count_weighted=count_weighted,
                  sync=sync, **factory)
    # the same Parameter and buffer objects: optimizers and references stay valid
    for name, t in m._parameters.items():
        new._parameters[name] = t
    for name, t in m._buffers.items():
        if name != "running_count" or (t is not None and new._buffers.get(name) is not None):
            new._buffers[name] = t
    if count_weighted and new._buffers.get("running_count") is not None and \
            m._buffers.get("running_count") is None and m.num_batches_tracked is not None and \
            int(m.num_batches_tracked) > 0:
        new.running_count.fill_(-1.0)  # trained without a count: the next batch starts it
    new._non_persistent_buffers_set = set(m._non_persistent_buffers_set)
    new.train(m.training)
    new._forward_pre_hooks.update(m._forward_pre_hooks)
    new._forward_hooks.update(m._forward_hooks)
    if hasattr(m, "qconfig"):
        new.qconfig = m.qconfig
    if isinstance(m, _NormaBatchNorm):
        new.check_finite = m.check_finite
    return new


def convert_tree(model, match, make):
    """Replaces every module for which match(name, module) holds by make(module); the model
    is modified in place; a matching model itself is returned replaced."""
    if match("", model):
        return make(model)
    for pname, parent in list(model.named_modules()):
        for name, child in list(parent._modules.items()):
            full = "%s.%s" % (pname, name) if pname else name
            if child is not None and match(full, child):
                parent._modules[name] = make(child)
    return model


# ------------------------------------------------------------------------------------------
# The norm family
# ------------------------------------------------------------------------------------------

KINDS = ("batch", "layer", "group", "instance", "rms")
DEFAULT_KINDS = ("batch", "layer", "group", "instance")
_INSTANCE = {nn.InstanceNorm1d: _norms.InstanceNorm1d, nn.InstanceNorm2d: _norms.InstanceNorm2d,
             nn.InstanceNorm3d: _norms.InstanceNorm3d}


def _parse_kinds(kinds):
    if kinds is None:
        return frozenset(DEFAULT_KINDS)
    if isinstance(kinds, str):
        kinds = KINDS if kinds == "all" else (kinds,)
    out = frozenset(kinds)
    bad = sorted(k for k in out if k not in KINDS)
    if bad:
        raise ValueError("unknown kind(s) %s: convert's kinds are %s (or 'all')"
                         % (", ".join(repr(k) for k in bad), ", ".join(KINDS)))
    return out


def _is_rms(m):
    """torch.nn.RMSNorm (PyTorch 2.4+) or a user module of that name and shape: a class named
    RMSNorm with weight (or none) and eps, and a normalized_shape or a weight to take it from."""
    if isinstance(m, _norms.RMSNorm) or type(m).__name__ != "RMSNorm":
        return False
    if not hasattr(m, "eps") or "weight" not in m._parameters:
        return False
    w = m._parameters["weight"]
    return getattr(m, "normalized_shape", None) is not None or w is not None


def _norm_kind(m):
    t = type(m)
    if t is nn.LayerNorm:
        return "layer"
    if t is nn.GroupNorm:
        return "group"
    if t in _INSTANCE:
        return "instance"
    if _is_rms(m):
        return "rms"
    return None


def _share_state(m, new):
    for name, t in m._parameters.items():
        new._parameters[name] = t
    for name, t in m._buffers.items():
        new._buffers[name] = t
    new._non_persistent_buffers_set = set(m._non_persistent_buffers_set)
    new.train(m.training)
    new._forward_pre_hooks.update(m._forward_pre_hooks)
    new._forward_hooks.update(m._forward_hooks)
    new._state_dict_hooks.update(m._state_dict_hooks)
    new._load_state_dict_pre_hooks.update(m._load_state_dict_pre_hooks)
    return new


def convert_norm(m):
    """norma's module replacing the torch LayerNorm / GroupNorm / InstanceNorm*d / RMSNorm m:
    a new object sharing m's Parameter and buffer objects, training flag and hooks."""
    kind = _norm_kind(m)
    if kind == "layer":
        new = _norms.LayerNorm(m.normalized_shape, m.eps, elementwise_affine=False)
        new.elementwise_affine = m.elementwise_affine
    elif kind == "group":
        new = _norms.GroupNorm(m.num_groups, m.num_channels, m.eps, affine=False)
        new.affine = m.affine
    elif kind == "instance":
        new = _INSTANCE[type(m)](m.num_features, m.eps, m.momentum, affine=False,
                                 track_running_stats=False)
        new.affine = m.affine
        new.track_running_stats = m.track_running_stats
    elif kind == "rms":
        w = m._parameters["weight"]
        ns = getattr(m, "normalized_shape", None)
        ns = tuple(w.shape) if ns is None else ns
        new = _norms.RMSNorm(ns, m.eps, elementwise_affine=False)
        new.elementwise_affine = w is not None
    else:
        raise TypeError("not a norm layer norma converts: %s" % type(m).__name__)
    return _share_state(m, new)


def _convert_norms(model, kinds):
    want = kinds - {"batch"}
    if not want:
        return model
    return convert_tree(model, lambda n, m: _norm_kind(m) in want, convert_norm)


def convert(model, sync=False, process_group=None, count_weighted=None, kinds=None,
            fuse=False):
    """Returns `model` with every torch.nn.BatchNorm1d/2d/3d, LayerNorm, GroupNorm and
    InstanceNorm1d/2d/3d (exactly those types; subclasses with their own forward are left
    alone) replaced by norma's, sharing the same parameters and buffers (so state_dict,
    optimizers, requires_grad, device, dtype and the training flag carry over).  The model is
    modified in place; a bare norm module is returned converted.

    kinds: which kinds of layer to convert, a collection of "batch", "layer", "group",
    "instance", "rms" (or the string "all", or one kind as a string); None (default) means
    ("batch", "layer", "group", "instance").  "rms" converts torch.nn.RMSNorm (PyTorch 2.4+)
    and user modules whose class is named RMSNorm with a weight and eps (and a
    normalized_shape, else the weight's shape): they must compute
    x * rsqrt(mean(x^2) + eps) * weight.  An unknown kind is a ValueError.  The options below
    concern BatchNorm only.

    sync: which layers synchronize their statistics across processes (norma's SyncBatchNorm):
      - False: none;
      - True: every BatchNorm1d/2d/3d, torch's and norma's SyncBatchNorm;
      - a predicate (name, module) -> bool, or a SyncPolicy (norma.torch.deepest(k),
        norma.torch.where(predicate)): those layers; the others get local statistics.
    process_group: a torch.distributed process group or an mpi4py communicator (None: the
    default group of torch.distributed when it is initialized, else MPI.COMM_WORLD).
    count_weighted: True / False sets the option on every converted layer (None keeps that of
    norma's layers, off for torch's).
    fuse: True also fuses each BatchNorm with the ReLU, or the residual add and ReLU, after it
    (norma.torch.fuse_bn_relu): the result is then a torch.fx.GraphModule with the model's
    submodules and state_dict keys, not the model's own class; the model must be traceable by
    torch.fx (its errors propagate).
    """
    kinds = _parse_kinds(kinds)
    if "batch" in kinds:
        model = _convert_batch(model, sync, process_group, count_weighted)
    model = _convert_norms(model, kinds)
    if fuse:
        from .fuse import fuse_bn_relu
        model = fuse_bn_relu(model)
    return model


def _convert_batch(model, sync, process_group, count_weighted):
    if sync is False or sync is None:
        def match(name, m):
            if type(m) in _TORCH_BN:
                return True
            return (count_weighted is not None and type(m) in _LOCAL and
                    m.count_weighted != bool(count_weighted))
        return convert_tree(model, match, lambda m: convert_one(m, None, None, count_weighted))
    if sync is True:
        chosen = None
    else:
        policy = _policy(sync)
        layers = [(n, m) for n, m in model.named_modules() if type(m) in _SYNC_SOURCES]
        chosen = policy.choose(layers)

    def make_for(name):
        def make(m):
            on = chosen is None or name in chosen
            if on or type(m) not in _LOCAL:
                return convert_one(m, SyncBatchNorm, process_group, count_weighted, sync=on)
            return convert_one(m, None, None, count_weighted)
        return make

    if type(model) in _SYNC_SOURCES:
        return make_for("")(model)
    for pname, parent in list(model.named_modules()):
        for name, child in list(parent._modules.items()):
            full = "%s.%s" % (pname, name) if pname else name
            if child is not None and type(child) in _SYNC_SOURCES:
                parent._modules[name] = make_for(full)(child)
    return model


def synchronized_layers(model):
    """Names of the layers of `model` that synchronize their statistics (norma's
    SyncBatchNorm with sync=True)."""
    return [n for n, m in model.named_modules() if isinstance(m, SyncBatchNorm) and m.sync]


# ------------------------------------------------------------------------------------------
# fold_bn
# ------------------------------------------------------------------------------------------

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
