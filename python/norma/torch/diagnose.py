"""Where a NaN or an Inf comes from, and an adaptive clip of BatchNorm's parameter gradients.

    with nt.detect_nonfinite(model) as found:       # raises NonFiniteError at the first one
        loss = criterion(model(x), target)
        loss.backward()

names the first normalization layer (in execution order: the forward, then the backward)
whose input, parameters, statistics, output or gradient is not finite, the channel and sample,
and the likely cause:

- an input that is already Inf or NaN (made upstream: with float16 / bfloat16 activations an
  Inf is usually an overflow of the producer);
- Inf / NaN in the layer's weight, bias or running statistics (a previous step diverged);
- a negative running variance, or a zero variance with eps = 0 (1 / sqrt(0));
- a float16 / bfloat16 overflow of the output (|y| beyond the type's range although the math
  in float32 is finite);
- a gradient that arrives non-finite from the layers after (exploding gradients, a non-finite
  loss), or that this layer makes non-finite (a channel whose var + eps is ~0 multiplies the
  gradient by 1 / sqrt(var + eps)).

The scan of a norma layer's input, parameters and statistics is the C library's own finite
check (NORMA_CHECK_FINITE), which names the argument and the index; the index gives the channel
and the sample.

AdaptiveGradClip scales the gradients of the BatchNorm parameters down when their norm exceeds
`factor` times an exponential average of that norm.
"""

import functools
import math
import re

import torch
from torch import nn

from .. import _lib
from .._lib import NormaError
from . import _ops
from .modules import StreamingBatchNorm

NORM_TYPES = (nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm,
              nn.LayerNorm, nn.GroupNorm, StreamingBatchNorm)

_ARG = re.compile(r"(\w+)\[(\d+)\] is not finite \(([^)]*)\)")


class NonFiniteFinding:
    """One non-finite value found: layer (name), module (its type name), where ("input",
    "weight", "bias", "running_mean", "running_var", "output", "grad_output" — the gradient
    reaching the layer's output — or "grad_input"), sample and channel (None when they do
    not apply), value, shape, dtype, and cause (a sentence)."""

    __slots__ = ("layer", "module", "where", "sample", "channel", "value", "shape", "dtype",
                 "cause")

    def __init__(self, layer, module, where, sample, channel, value, shape, dtype, cause):
        self.layer, self.module, self.where = layer, module, where
        self.sample, self.channel, self.value = sample, channel, value
        self.shape, self.dtype, self.cause = shape, dtype, cause

    def as_dict(self):
        return {k: getattr(self, k) for k in self.__slots__}

    def __str__(self):
        pos = []
        if self.sample is not None:
            pos.append("sample %d" % self.sample)
        if self.channel is not None:
            pos.append("channel %d" % self.channel)
        return "layer %r (%s, %s %s): %s is not finite%s (%s); likely cause: %s" % (
            self.layer, self.module, "x".join(map(str, self.shape)), self.dtype, self.where,
            " at " + ", ".join(pos) if pos else "", self.value, self.cause)


class NonFiniteError(RuntimeError):
    """Raised by detect_nonfinite at the first non-finite value; .finding has the detail."""

    def __init__(self, finding):
        self.finding = finding
        super().__init__(str(finding))


def _dtype_name(t):
    return str(t.dtype).replace("torch.", "")


def _layout_channels_last(x):
    """The layout norma reads x in (norma_torch.h / _core: contiguous -> channels-first,
    dense in [N, spatial..., C] order -> channels-last, else a channels-first copy)."""
    if x.is_contiguous() or x.dim() < 3:
        return False
    perm = [0] + list(range(2, x.dim())) + [1]
    return x.permute(perm).is_contiguous()


def _position(x, index):
    """(sample, channel) of element `index` of x as norma scanned it."""
    n, c = x.shape[0], x.shape[1]
    spatial = max(1, x.numel() // max(1, n * c))
    if _layout_channels_last(x):
        return index // (spatial * c), index % c
    return index // (c * spatial), (index // spatial) % c


def _first_nonfinite_torch(t):
    """(flat index in x's norma order, value) of the first non-finite element, or None."""
    bad = ~torch.isfinite(t)
    if not bool(bad.any()):
        return None
    if _layout_channels_last(t):
        perm = [0] + list(range(2, t.dim())) + [1]
        flat = t.permute(perm).reshape(-1)
    else:
        flat = t.contiguous().reshape(-1)
    i = int((~torch.isfinite(flat)).nonzero()[0])
    return i, float(flat[i])


def _scan(x):
    """The first non-finite element of a [N, C, ...] tensor: (sample, channel, value) or None.
    norma's finite check (NORMA_CHECK_FINITE) where norma takes the tensor, torch otherwise."""
    if x.dim() >= 2 and x.numel() and x.device.type == "cpu" and x.dtype in (
            torch.float32, torch.float64, torch.float16, torch.bfloat16):
        rec = _ops.ops().bn_record_forward(x.detach(), 0.0, _lib.CHECK_FINITE)
        if float(rec[0]) == 0:
            return None
        m = _ARG.search(_lib.last_error())
        if m and float(rec[0]) == _lib.ERR_NONFINITE:
            s, c = _position(x, int(m.group(2)))
            return s, c, m.group(3)
    if x.dim() < 2:
        bad = ~torch.isfinite(x.detach())
        if not bool(bad.any()):
            return None
        i = int(bad.reshape(-1).nonzero()[0])
        return None, i if x.dim() == 1 else None, float(x.reshape(-1)[i])
    r = _first_nonfinite_torch(x.detach())
    if r is None:
        return None
    s, c = _position(x, r[0])
    return s, c, r[1]


def _upstream_cause(x, value):
    v = str(value).lower()
    if "nan" in v:
        return ("the input is already NaN: made upstream (0 / 0, Inf - Inf, Inf x 0, an invalid "
                "op) or by a diverged previous step")
    if x.dtype in (torch.float16, torch.bfloat16):
        return ("the input is already %s: with %s activations this is usually an overflow of "
                "the layer that produced it (|values| > %g)"
                % (value, _dtype_name(x), torch.finfo(x.dtype).max))
    return "the input is already %s: made upstream (an overflow or a division by 0)" % value


class detect_nonfinite:
    """Context manager that watches every normalization layer of `model` (BatchNorm, norma's
    modules, InstanceNorm, LayerNorm, GroupNorm) for NaN / Inf in its input, parameters,
    statistics, output and gradients.  raise_error=True (default) raises NonFiniteError at the
    first finding; with False the findings are collected in .findings (the first in .first)
    and the run goes on.  Slower than a normal step (every tensor is scanned): for diagnosis.
    """

    def __init__(self, model, raise_error=True):
        self.model = model
        self.raise_error = raise_error
        self.findings = []
        self._undo = []
        self._stats = {}

    @property
    def first(self):
        return self.findings[0] if self.findings else None

    def __bool__(self):
        return bool(self.findings)

    def __str__(self):
        if not self.findings:
            return "no non-finite value found"
        return "\n".join(str(f) for f in self.findings)

    def _found(self, name, mod, where, sample, channel, value, x, cause):
        f = NonFiniteFinding(name, type(mod).__name__, where, sample, channel, value,
                             tuple(x.shape), _dtype_name(x), cause)
        self.findings.append(f)
        if self.raise_error:
            raise NonFiniteError(f)

    def __enter__(self):
        for name, mod in self.model.named_modules():
            if isinstance(mod, NORM_TYPES):
                self._watch(name or type(mod).__name__, mod)
        return self

    def __exit__(self, *exc):
        for undo in reversed(self._undo):
            undo()
        self._undo = []
        return False

    # -- forward --------------------------------------------------------------------------

    def _watch(self, name, mod):
        orig = mod.__dict__.get("forward")
        inner = orig if orig is not None else functools.partial(type(mod).forward, mod)

        def forward(*args, **kw):
            x = args[0] if args else kw.get("input")
            self._check_params(name, mod, x)
            self._check_input(name, mod, x)
            if len(args) > 1 and isinstance(args[1], torch.Tensor):  # the fused residual
                self._check_input(name, mod, args[1], "residual")
            try:
                y = inner(*args, **kw)
            except NormaError as e:
                self._from_norma_error(name, mod, x, e)
                raise
            self._check_output(name, mod, x, y)
            self._watch_grads(name, mod, x, y)
            return y

        mod.forward = forward

        def undo(m=mod, o=orig):
            if o is None:
                m.__dict__.pop("forward", None)
            else:
                m.forward = o
        self._undo.append(undo)

    def _check_params(self, name, mod, x):
        for pname in ("weight", "bias", "running_mean", "running_var"):
            p = getattr(mod, pname, None)
            if not isinstance(p, torch.Tensor):
                continue
            bad = ~torch.isfinite(p.detach())
            if bool(bad.any()):
                c = int(bad.reshape(-1).nonzero()[0])
                self._found(name, mod, pname, None, c, float(p.reshape(-1)[c]), x,
                            "%s is not finite: a previous step diverged (exploding gradients: "
                            "clip them, lower the learning rate)" % pname)
        rv = getattr(mod, "running_var", None)
        if isinstance(rv, torch.Tensor) and not mod.training:
            neg = rv < 0
            if bool(neg.any()):
                c = int(neg.nonzero()[0])
                self._found(name, mod, "running_var", None, c, float(rv[c]), x,
                            "negative running variance (corrupt statistics): "
                            "recompute them (norma.torch.recompute_bn_stats)")

    def _check_input(self, name, mod, x, where="input"):
        if not isinstance(x, torch.Tensor):
            return
        r = _scan(x)
        if r is not None:
            cause = _upstream_cause(x, r[2])
            bad = self._nonfinite_parameters()
            if bad:
                cause += "; not finite in the model: %s" % ", ".join(bad)
            self._found(name, mod, where, r[0], r[1], r[2], x, cause)

    def _nonfinite_parameters(self, limit=3):
        out = []
        for pname, p in self.model.named_parameters():
            if not bool(torch.isfinite(p.detach()).all()):
                out.append("parameter %r" % pname)
                if len(out) == limit:
                    break
        return out

    def _from_norma_error(self, name, mod, x, e):
        m = _ARG.search(e.detail or "")
        if e.status != _lib.ERR_NONFINITE or not m:
            return
        arg, idx, value = m.group(1), int(m.group(2)), m.group(3)
        if arg in ("x", "residual"):
            s, c = _position(x, idx)
            where = "input" if arg == "x" else "residual"
            self._found(name, mod, where, s, c, value, x, _upstream_cause(x, value))
        else:
            self._found(name, mod, {"gamma": "weight", "beta": "bias"}.get(arg, arg), None,
                        idx, value, x, "%s is not finite: a previous step diverged" % arg)

    def _check_output(self, name, mod, x, y):
        if not isinstance(y, torch.Tensor):
            return
        r = _scan(y)
        if r is None:
            return
        s, c, value = r
        self._found(name, mod, "output", s, c, value, y, self._output_cause(mod, x, y, c))

    def _output_cause(self, mod, x, y, c):
        eps = float(getattr(mod, "eps", 0.0))
        stats = None
        if isinstance(mod, nn.modules.batchnorm._BatchNorm) and c is not None:
            uses_running = not mod.training and mod.running_var is not None
            if uses_running:
                mean, var = float(mod.running_mean[c]), float(mod.running_var[c])
            else:
                xc = x.detach().transpose(0, 1)[c].double()
                mean, var = float(xc.mean()), float(xc.var(unbiased=False))
            stats = (mean, var)
            if var + eps == 0.0:
                return ("zero variance with eps = 0 in channel %d (1 / sqrt(0)): the channel is "
                        "constant%s; use eps > 0" % (c, " in the running statistics"
                                                     if uses_running else ""))
            if var < 0:
                return "negative variance %g in channel %d" % (var, c)
        if y.dtype in (torch.float16, torch.bfloat16) and stats is not None:
            mean, var = stats
            w = float(mod.weight[c]) if getattr(mod, "weight", None) is not None else 1.0
            b = float(mod.bias[c]) if getattr(mod, "bias", None) is not None else 0.0
            xc = x.detach().transpose(0, 1)[c].double()
            y32 = (xc - mean) / math.sqrt(var + eps) * w + b
            big = float(y32.abs().max())
            if math.isfinite(big) and big > torch.finfo(y.dtype).max:
                return ("%s overflow: the normalized value reaches %.3g in float32, beyond %s's "
                        "%g (a large weight or an outlier far from the mean); keep this layer "
                        "in float32 or bound the weight"
                        % (_dtype_name(y), big, _dtype_name(y), torch.finfo(y.dtype).max))
        return ("inputs, parameters and statistics are finite: an overflow of the "
                "normalization in %s" % _dtype_name(y))

    # -- backward -------------------------------------------------------------------------

    def _watch_grads(self, name, mod, x, y):
        if not (isinstance(y, torch.Tensor) and y.requires_grad):
            return
        state = {"out_ok": True}

        def on_grad_output(g):
            r = _scan(g)
            if r is not None:
                state["out_ok"] = False
                self._found(name, mod, "grad_output", r[0], r[1], r[2], g,
                            "the gradient arrives non-finite from the layers after this one "
                            "(exploding gradients or a non-finite loss)")
            return None

        y.register_hook(on_grad_output)
        if isinstance(x, torch.Tensor) and x.requires_grad:
            xd = x.detach()

            def on_grad_input(g):
                if not state["out_ok"]:
                    return None
                r = _scan(g)
                if r is not None:
                    cause = "this layer made the gradient non-finite"
                    c = r[1]
                    if c is not None and isinstance(mod, nn.modules.batchnorm._BatchNorm):
                        xc = xd.transpose(0, 1)[c].double()
                        var = float(xc.var(unbiased=False))
                        cause += (": channel %d has var + eps = %.3g, so 1 / sqrt(var + eps) = "
                                  "%.3g multiplies its gradient; raise eps"
                                  % (c, var + float(mod.eps),
                                     1 / math.sqrt(var + float(mod.eps))
                                     if var + float(mod.eps) > 0 else float("inf")))
                    self._found(name, mod, "grad_input", r[0], c, r[2], g, cause)
                return None

            x.register_hook(on_grad_input)


# ------------------------------------------------------------------------------------------
# Adaptive clip of BatchNorm's parameter gradients
# ------------------------------------------------------------------------------------------


def bn_parameters(model):
    """The weights and biases of every normalization layer of `model`."""
    out = []
    for m in model.modules():
        if isinstance(m, NORM_TYPES):
            for p in (getattr(m, "weight", None), getattr(m, "bias", None)):
                if isinstance(p, nn.Parameter) and p.requires_grad:
                    out.append(p)
    return out


class AdaptiveGradClip:
    """Clips the gradients of BatchNorm's parameters with a threshold that follows them:

        g     = || gradients of the BN weights and biases ||   (one norm over all of them)
        limit = factor * ema
        if g > limit: the gradients are scaled by limit / g
        ema   = (1 - alpha) * ema + alpha * min(g, limit)

    The first `warmup` steps only fill the average (no clipping).  A step whose norm is not
    finite has its BN gradients zeroed (and counted in .skipped) instead of poisoning the
    weights.  Call step() after backward() and before optimizer.step(); it returns g.

        clip = nt.AdaptiveGradClip(model)            # model, or a list of parameters
        loss.backward(); clip.step(); opt.step()
    """

    def __init__(self, model_or_params, factor=2.0, alpha=0.05, warmup=10):
        if isinstance(model_or_params, nn.Module):
            self.params = bn_parameters(model_or_params)
        else:
            self.params = list(model_or_params)
        if not self.params:
            raise ValueError("no BatchNorm parameter to clip")
        self.factor = float(factor)
        self.alpha = float(alpha)
        self.warmup = int(warmup)
        self.ema = None
        self.steps = 0
        self.clipped = 0
        self.skipped = 0
        self.last_norm = None
        self.last_limit = None

    @torch.no_grad()
    def step(self):
        grads = [p.grad for p in self.params if p.grad is not None]
        if not grads:
            return 0.0
        g = float(torch.norm(torch.stack([q.detach().float().norm() for q in grads])))
        self.last_norm = g
        self.steps += 1
        if not math.isfinite(g):
            for q in grads:
                q.zero_()
            self.skipped += 1
            return g
        if self.ema is None:
            self.ema = g
            self.last_limit = None
            return g
        limit = self.factor * self.ema
        self.last_limit = limit
        used = g
        if self.steps > self.warmup and g > limit:
            for q in grads:
                q.mul_(limit / g)
            self.clipped += 1
            used = limit
        self.ema = (1.0 - self.alpha) * self.ema + self.alpha * used
        return g

    def state_dict(self):
        return {k: getattr(self, k) for k in ("factor", "alpha", "warmup", "ema", "steps",
                                              "clipped", "skipped")}

    def load_state_dict(self, d):
        for k, v in d.items():
            setattr(self, k, v)

