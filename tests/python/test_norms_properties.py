"""Property tests (hypothesis): LayerNorm, RMSNorm and GroupNorm of norma.torch over random
shapes, dtypes, layouts, affine options and residuals, forward and backward, every element
against a float64 computation, on both backends."""

import math

import torch
from hypothesis import given, settings, HealthCheck, strategies as st

import norma.torch as nt
from norma.torch import _ops
import norms_reference as R

BACKENDS = ["ctypes"] + (["extension"] if _ops.backend() == "extension" else [])
DTYPES = st.sampled_from(R.DTYPES)
SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def _data(shape, dtype, seed, mean, std):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * std + mean).to(dtype)


def _twin(t):
    return None if t is None else t.detach().double().requires_grad_(t.requires_grad)


@SETTINGS
@given(backend=st.sampled_from(BACKENDS), dtype=DTYPES,
       lead=st.lists(st.integers(1, 4), min_size=1, max_size=2),
       ns=st.lists(st.integers(1, 70), min_size=1, max_size=2).filter(
           lambda v: math.prod(v) >= 2),
       affine=st.sampled_from(["both", "weight", "none"]), rms=st.booleans(),
       residual=st.booleans(), mean=st.sampled_from([0.0, 3.0, -20.0]),
       std=st.sampled_from([0.5, 1.0, 4.0]), seed=st.integers(0, 2 ** 16))
def test_layer_and_rms_norm_property(backend, dtype, lead, ns, affine, rms, residual, mean, std,
                                     seed):
    shape = tuple(lead) + tuple(ns)
    x = _data(shape, dtype, seed, mean, std).requires_grad_()
    r = _data(shape, dtype, seed + 1, 0.0, 1.0).requires_grad_() if residual else None
    w = _data(ns, dtype, seed + 2, 1.0, 0.3).requires_grad_() if affine != "none" else None
    b = _data(ns, dtype, seed + 3, 0.0, 0.3).requires_grad_() \
        if affine == "both" and not rms else None
    eps = 1e-5
    gy = _data(shape, dtype, seed + 4, 0.0, 1.0)
    gh = _data(shape, dtype, seed + 5, 0.0, 1.0)
    with _ops.use_backend(backend):
        if rms:
            out = nt.rms_norm(x, ns, w, eps=eps, residual=r)
        else:
            out = nt.layer_norm(x, ns, w, b, eps=eps, residual=r)
    outs = out if residual else (out,)
    gouts = (gy, gh) if residual else (gy,)
    got = R.grads(outs, [x, r, w, b], gouts)
    x64, r64, w64, b64 = (_twin(t) for t in (x, r, w, b))
    y64, h64 = R.layer_norm(x64, ns, w64, b64, eps, residual=r64, dtype=dtype, rms=rms)
    outs64 = (y64, h64) if residual else (y64,)
    want = R.grads(outs64, [x64, r64, w64, b64], tuple(g.double() for g in gouts))
    for a, e, what in zip(outs, outs64, ("y", "h")):
        assert a.dtype == dtype
        R.close(a, e, dtype, what)
    # dx's terms cancel where a row has few values (|x_hat| near 1): error relative to them
    h = (h64 if residual else x64).detach()
    dims = tuple(range(len(lead), len(shape)))
    c = h if rms else h - h.mean(dims, keepdim=True)
    inv = torch.rsqrt((c * c).mean(dims, keepdim=True) + eps)
    terms = float((gy.double() * (w.detach().double() if w is not None else 1.0)).abs().max()
                  * inv.max())
    for a, e, what in zip(got, want, ("dx", "dresidual", "dweight", "dbias")):
        if e is not None:
            assert a.dtype == dtype, what
            R.close(a, e, dtype, what, scale=terms if what in ("dx", "dresidual") else 0.0)


@SETTINGS
@given(backend=st.sampled_from(BACKENDS), dtype=DTYPES, n=st.integers(1, 3),
       groups=st.integers(1, 6), per=st.integers(1, 7),
       spatial=st.lists(st.integers(1, 9), min_size=0, max_size=3),
       channels_last=st.booleans(), affine=st.booleans(),
       act=st.sampled_from([None, "relu", "silu"]), mean=st.sampled_from([0.0, 5.0, -30.0]),
       seed=st.integers(0, 2 ** 16))
def test_group_norm_property(backend, dtype, n, groups, per, spatial, channels_last, affine,
                             act, mean, seed):
    c = groups * per
    shape = (n, c) + tuple(spatial)
    if per * math.prod(spatial) < 2:  # a group of one value: give it two
        spatial = list(spatial) + [2]
        shape = (n, c) + tuple(spatial)
    x = _data(shape, dtype, seed, mean, 1.5)
    gy = _data(shape, dtype, seed + 1, 0.0, 1.0)
    if channels_last and len(shape) in (4, 5):
        fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
        x, gy = x.contiguous(memory_format=fmt), gy.contiguous(memory_format=fmt)
    x.requires_grad_()
    w = _data((c,), dtype, seed + 2, 1.0, 0.3).requires_grad_() if affine else None
    b = _data((c,), dtype, seed + 3, 0.0, 0.3).requires_grad_() if affine else None
    with _ops.use_backend(backend):
        y = nt.group_norm(x, groups, w, b, eps=1e-5, activation=act)
    assert y.dtype == dtype and y.stride() == x.stride()
    got = R.grads(y, [x, w, b], gy)
    x64, w64, b64 = (_twin(t) for t in (x, w, b))
    y64 = R.group_norm(x64, groups, w64, b64, 1e-5, act)
    want = R.grads(y64, [x64, w64, b64], gy.double())
    R.close(y, y64, dtype, "y")
    terms = R.gn_terms(x, groups, w, gy, 1e-5)
    for a, e, what in zip(got, want, ("dx", "dweight", "dbias")):
        if e is not None:
            assert a.dtype == dtype, what
            R.close(a, e, dtype, what, scale=terms if what == "dx" else 0.0)
