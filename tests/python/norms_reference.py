"""float64 references of the norm family (torch autograd in float64) and the comparison the
norm tests share: every element within tol * max|reference| (tol by storage dtype)."""

import torch
import torch.nn.functional as F

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
DTYPE_IDS = ["f32", "f64", "bf16", "f16"]
# every element: |got - want| <= TOL * max|want| (+ a tiny floor for all-zero references)
TOL = {torch.float32: 5e-5, torch.float64: 1e-11, torch.bfloat16: 1.6e-2, torch.float16: 2e-3}


def close(got, want, dtype, what="", tol=None, scale=0.0):
    """got (any dtype) against the float64 reference want, every element: within
    tol * max(max|want|, scale) (scale: the size of the terms that cancel into want)."""
    tol = TOL[dtype] if tol is None else tol
    assert got is not None and want is not None, what
    assert tuple(got.shape) == tuple(want.shape), (what, tuple(got.shape), tuple(want.shape))
    g = got.detach().double()
    w = want.detach().double()
    scale = max(float(w.abs().max()) if w.numel() else 0.0, scale)
    lim = tol * scale + 1e-300
    err = (g - w).abs()
    if not bool((err <= lim).all()):
        i = int(torch.argmax(err.reshape(-1)))
        raise AssertionError("%s (%s): %d of %d elements off; worst %g at flat %d (got %r, "
                             "want %r), limit %g = %g * max|want|"
                             % (what, dtype, int((~(err <= lim)).sum()), err.numel(),
                                float(err.reshape(-1)[i]), i, float(g.reshape(-1)[i]),
                                float(w.reshape(-1)[i]), lim, tol))


def rounded(t, dtype):
    """t rounded to dtype in the forward, the identity for the gradient."""
    return t + (t.detach().to(dtype).double() - t.detach())


def layer_norm(x, ns, w, b, eps, residual=None, dtype=None, rms=False):
    """(y, h) in float64; h = x + residual rounded to the storage dtype (as norma stores it)."""
    h = x
    if residual is not None:
        h = rounded(x + residual, dtype) if dtype is not None else x + residual
    dims = tuple(range(h.dim() - len(ns), h.dim()))
    if rms:
        y = h * torch.rsqrt((h * h).mean(dims, keepdim=True) + eps)
    else:
        mu = h.mean(dims, keepdim=True)
        var = ((h - mu) ** 2).mean(dims, keepdim=True)
        y = (h - mu) / torch.sqrt(var + eps)
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    return y, h


def group_norm(x, groups, w, b, eps, activation=None):
    n, c = x.shape[:2]
    xr = x.reshape(n, groups, -1)
    mu = xr.mean(-1, keepdim=True)
    var = ((xr - mu) ** 2).mean(-1, keepdim=True)
    y = ((xr - mu) / torch.sqrt(var + eps)).reshape(x.shape)
    shape = (1, c) + (1,) * (x.dim() - 2)
    if w is not None:
        y = y * w.reshape(shape)
    if b is not None:
        y = y + b.reshape(shape)
    if activation == "relu":
        y = F.relu(y)
    elif activation == "silu":
        y = F.silu(y)
    return y


def instance_stats(x):
    """Per (sample, channel): mean and biased variance over the spatial positions."""
    n, c = x.shape[:2]
    xr = x.reshape(n, c, -1)
    mu = xr.mean(-1)
    return mu, ((xr - mu[..., None]) ** 2).mean(-1), xr.shape[-1]


def grads(outs, ins, gouts):
    """d(outs)/d(ins) with output gradients gouts (None entries: no gradient asked)."""
    req = [t for t in ins if t is not None]
    got = list(torch.autograd.grad(outs, req, gouts, allow_unused=True))
    return [got.pop(0) if t is not None else None for t in ins]


def gn_terms(x, groups, w, gy, eps):
    """max |gamma * dy| * invstd of GroupNorm: the size of the terms of dx, which cancel to
    almost nothing in groups of two values."""
    n, c = x.shape[:2]
    xr = x.detach().double().reshape(n, groups, -1)
    inv = torch.rsqrt(xr.var(-1, unbiased=False) + eps).max()
    g = gy.double().abs().max() * (w.detach().double().abs().max() if w is not None else 1.0)
    return float(g * inv)
