"""Precise BatchNorm statistics: the running statistics replaced by the exact population
statistics of the layers' inputs over many batches.

The running statistics of a trained model are an exponential average of the last ~1/momentum
batches, taken while the weights were still moving: at evaluation they do not match the
population the layer sees, and validation results fluctuate from checkpoint to checkpoint.
recompute_bn_stats runs the model over the given batches (no gradients) with every BatchNorm
normalizing with its batch statistics, as in training, collects the moments (count, mean,
m2 = sum of squared deviations) of each layer's input with norma (norma_bn_moments: in double,
exact for large means), merges them exactly with Chan's formula (norma_bn_moments_merge; over
the ranks too for synchronized layers), and writes mean and m2 / (count - 1) into
running_mean and running_var.
"""

import torch
from torch import nn

from . import _ops
from ._ops import HEADER, H_COUNT
from .modules import SyncBatchNorm


def _batches(batches, num_batches):
    for i, b in enumerate(batches):
        if num_batches is not None and i >= num_batches:
            return
        yield b


def _run(model, batch):
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


@torch.no_grad()
def recompute_bn_stats(model, batches, num_batches=None, input_of=None):
    """Replaces the running statistics of every BatchNorm of `model` (norma's, and torch's
    _BatchNorm layers with running statistics) with the exact statistics of the layer's inputs
    over `batches` (an iterable of model inputs: a tensor, a tuple of positional arguments or
    a dict of keyword arguments; `input_of(batch)` maps each item to that when the iterable
    yields e.g. (input, target) pairs), the first `num_batches` of them when given.

    During the passes every BatchNorm normalizes with its batch statistics (training mode;
    synchronized layers over their group), other modules keep their mode, and nothing else
    changes: parameters, num_batches_tracked and the training flags are restored.  For layers
    that synchronize (norma's SyncBatchNorm on a group of several processes) the moments are
    merged across the ranks too: every rank of the group must call this with the same number
    of batches.  With count-weighted statistics, running_count becomes the number of values
    seen per channel.

    Returns {layer name: values per channel seen} (0 for a layer that no batch reached; its
    statistics are left alone).
    """
    ops = _ops.ops()
    layers = [(n, m) for n, m in model.named_modules()
              if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
    saved = []
    acc = {}
    handles = []
    for name, m in layers:
        saved.append((m, m.training, m.momentum, m.num_batches_tracked.clone()
                      if m.num_batches_tracked is not None else None,
                      m.running_mean.clone(), m.running_var.clone()))
        m.train()
        m.momentum = 0.0  # the passes must not move the running statistics (they are rewritten)

        def hook(mod, inputs, _name=name):
            x = inputs[0]
            rec = ops.bn_record_forward(x.detach(), mod.eps, 0)
            if float(rec[0]) != 0:
                from .. import _lib
                raise _lib.NormaError(int(rec[0]), _lib.STATUS_NAMES.get(int(rec[0]), "?"),
                                      _lib.last_error(), "recompute_bn_stats")
            prev = acc.get(_name)
            acc[_name] = rec if prev is None else ops.bn_merge_records(torch.stack([prev, rec]))

        handles.append(m.register_forward_pre_hook(hook))
    try:
        for batch in _batches(batches, num_batches):
            _run(model, input_of(batch) if input_of is not None else batch)
    finally:
        for h in handles:
            h.remove()
        for m, training, momentum, nbt, rm, rv in saved:
            m.train(training)
            m.momentum = momentum
            if nbt is not None:
                m.num_batches_tracked.copy_(nbt)
            m.running_mean.copy_(rm)
            m.running_var.copy_(rv)
    out = {}
    for name, m in layers:
        rec = acc.get(name)
        c = m.num_features
        if isinstance(m, SyncBatchNorm) and m.sync:
            group = m.group()
            if group.size > 1:
                if rec is None:
                    rec = torch.zeros(HEADER + 2 * c, dtype=torch.float64)
                rec = ops.bn_merge_records(group.allgather(rec))
        count = int(rec[H_COUNT]) if rec is not None else 0
        out[name] = count
        if count == 0:
            continue
        mean = rec[HEADER:HEADER + c]
        m2 = rec[HEADER + c:HEADER + 2 * c]
        var = m2 / (count - 1) if count > 1 else torch.zeros_like(m2)
        m.running_mean.copy_(mean.to(m.running_mean.dtype))
        m.running_var.copy_(var.to(m.running_var.dtype))
        rc = m._buffers.get("running_count")
        if rc is not None:
            rc.fill_(float(count))
    return out


__all__ = ["recompute_bn_stats"]
