"""norma.torch.LayerNorm / RMSNorm / GroupNorm / InstanceNorm1d/2d/3d and their functional
forms: every element of y and of the gradients (dx, dweight, dbias, the residual's) against a
float64 computation and against torch's modules, on both backends (the extension's operators
and the ctypes fallback), every dtype, both layouts, the shapes of the kernels' tails."""

import copy
import math

import pytest
import torch
from torch import nn

import norma
import norma.torch as nt
from norma.torch import _ops
import norms_reference as R
from norms_reference import DTYPES, DTYPE_IDS, close

CL = {4: torch.channels_last, 5: torch.channels_last_3d}
# against torch's modules (which have rounding errors of their own, e.g. LayerNorm of one value
# in float32), a looser bound than against the float64 reference
VS_TORCH = {torch.float32: 5e-4, torch.float64: 1e-9}


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _randn(shape, dtype, seed, mean=0.0, std=1.0):
    return (torch.randn(shape, generator=_gen(seed), dtype=torch.float64) * std + mean).to(dtype)


def _init_params(m, seed):
    g = _gen(seed)
    with torch.no_grad():
        for k, p in m.named_parameters():
            base = 1.0 if k == "weight" else 0.0
            p.copy_(base + 0.5 * torch.randn(p.shape, generator=g, dtype=torch.float64))


def _twin(p):
    return None if p is None else p.detach().double().requires_grad_(p.requires_grad)


# ------------------------------------------------------------------------------------------
# LayerNorm
# ------------------------------------------------------------------------------------------

LN_SHAPES = [((1, 1), (1,)), ((3, 17), (17,)), ((2, 3, 1000), (1000,)), ((2, 4097), (4097,)),
             ((2, 3, 5, 7), (5, 7)), ((1, 8), (8,))]
LN_IDS = ["d1", "d17", "d1000", "d4097", "d5x7", "n1d8"]


@pytest.mark.parametrize("affine", ["affine", "nobias", "none"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape,ns", LN_SHAPES, ids=LN_IDS)
def test_layer_norm_module(torch_backend, shape, ns, dtype, affine):
    m = nt.LayerNorm(ns, eps=1e-5, elementwise_affine=affine != "none",
                     bias=affine == "affine", dtype=dtype)
    _init_params(m, 1)
    x = _randn(shape, dtype, 2, mean=0.5).requires_grad_()
    gy = _randn(shape, dtype, 3)
    y = m(x)
    assert y.dtype == dtype and y.shape == x.shape
    got = R.grads(y, [x, m.weight, m.bias], gy)
    x64, w64, b64 = x.detach().double().requires_grad_(), _twin(m.weight), _twin(m.bias)
    y64, _ = R.layer_norm(x64, ns, w64, b64, 1e-5)
    want = R.grads(y64, [x64, w64, b64], gy.double())
    close(y, y64, dtype, "y")
    for a, b, k in zip(got, want, ("dx", "dweight", "dbias")):
        assert (a is None) == (b is None), k
        if a is not None:
            assert a.dtype == dtype, k
            close(a, b, dtype, k)
    if dtype in (torch.float32, torch.float64) and math.prod(ns) > 1:
        # torch's module, same parameters (with one value per row torch's y and dweight are
        # its rounding noise around the exact beta and 0, which norma gives)
        t = nn.LayerNorm(ns, eps=1e-5, elementwise_affine=affine != "none", dtype=dtype)
        if affine == "nobias":
            t.register_parameter("bias", None)
        t.load_state_dict(m.state_dict())
        xt = x.detach().clone().requires_grad_()
        yt = t(xt)
        tg = R.grads(yt, [xt, t.weight, t.bias], gy)
        close(y, yt.double(), dtype, "y vs torch", tol=VS_TORCH[dtype])
        for a, b, k in zip(got, tg, ("dx", "dweight", "dbias")):
            if a is not None:
                close(a, b.double(), dtype, k + " vs torch", tol=VS_TORCH[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", [(2, 17), (3, 2, 1000), (1, 4097)], ids=["d17", "d1000",
                                                                             "d4097"])
@pytest.mark.parametrize("rms", [False, True], ids=["ln", "rms"])
def test_residual_fused_form(torch_backend, shape, dtype, rms):
    d = shape[-1]
    x = _randn(shape, dtype, 4, mean=0.2).requires_grad_()
    r = _randn(shape, dtype, 5).requires_grad_()
    w = _randn((d,), dtype, 6, mean=1.0, std=0.3).requires_grad_()
    b = None if rms else _randn((d,), dtype, 7, std=0.3).requires_grad_()
    gy, gh = _randn(shape, dtype, 8), _randn(shape, dtype, 9)
    if rms:
        y, h = nt.rms_norm(x, (d,), w, eps=1e-6, residual=r)
    else:
        y, h = nt.layer_norm(x, (d,), w, b, eps=1e-5, residual=r)
    assert y.dtype == h.dtype == dtype
    got = R.grads((y, h), [x, r, w, b], (gy, gh))
    x64, r64, w64, b64 = (_twin(t) for t in (x, r, w, b))
    y64, h64 = R.layer_norm(x64, (d,), w64, b64, 1e-6 if rms else 1e-5, residual=r64,
                            dtype=dtype, rms=rms)
    want = R.grads((y64, h64), [x64, r64, w64, b64], (gy.double(), gh.double()))
    y64, _ = R.layer_norm(x64, (d,), w64, b64, 1e-6 if rms else 1e-5, residual=r64,
                          dtype=dtype, rms=rms)
    close(y, y64, dtype, "y")
    close(h, h64, dtype, "h")
    assert torch.equal(h, (x + r).detach()), "h is x + residual in the storage dtype"
    for a, bb, k in zip(got, want, ("dx", "dresidual", "dweight", "dbias")):
        if bb is not None:
            close(a, bb, dtype, k)
    # only y used: the residual stream's gradient is absent
    if rms:
        y2, _ = nt.rms_norm(x, (d,), w, eps=1e-6, residual=r)
    else:
        y2, _ = nt.layer_norm(x, (d,), w, b, eps=1e-5, residual=r)
    gx2, = torch.autograd.grad(y2, [x], gy)
    gx64, = torch.autograd.grad(y64, [x64], gy.double())
    close(gx2, gx64, dtype, "dx (y only)")


# ------------------------------------------------------------------------------------------
# RMSNorm
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("eps", [None, 1e-6])
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape,ns", LN_SHAPES, ids=LN_IDS)
def test_rms_norm_module(torch_backend, shape, ns, dtype, affine, eps):
    m = nt.RMSNorm(ns, eps=eps, elementwise_affine=affine, dtype=dtype)
    _init_params(m, 11)
    x = _randn(shape, dtype, 12, mean=0.3).requires_grad_()
    gy = _randn(shape, dtype, 13)
    y = m(x)
    assert y.dtype == dtype
    got = R.grads(y, [x, m.weight], gy)
    e = torch.finfo(dtype).eps if eps is None else eps
    x64, w64 = x.detach().double().requires_grad_(), _twin(m.weight)
    y64, _ = R.layer_norm(x64, ns, w64, None, e, rms=True)
    want = R.grads(y64, [x64, w64], gy.double())
    close(y, y64, dtype, "y")
    # dx = invrms * (g - x_hat * mean(g * x_hat)) cancels where |x_hat| is near 1 (one value per
    # row): its error is relative to the size of its terms, |g| * invrms
    g64 = gy.double() * (w64.detach() if w64 is not None else 1.0)
    dims = tuple(range(x.dim() - len(ns), x.dim()))
    inv = torch.rsqrt((x64.detach() ** 2).mean(dims, keepdim=True) + e)
    terms = float((g64 * inv).abs().max())
    for a, b, k in zip(got, want, ("dx", "dweight")):
        if b is not None:
            assert a.dtype == dtype
            if k == "dx":
                lim = R.TOL[dtype] * max(terms, float(b.abs().max()))
                assert float((a.double() - b).abs().max()) <= lim, k
            else:
                close(a, b, dtype, k)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_rms_norm_eps_none_is_finfo_eps_of_the_input(torch_backend, dtype):
    # rows of tiny values: the eps term dominates, so another eps would show
    x = _randn((4, 16), dtype, 14, std=1e-2 if dtype in (torch.float32, torch.float64) else 0.1)
    m = nt.RMSNorm(16, dtype=dtype)
    assert m.eps is None and "eps=None" in repr(m)
    e = torch.finfo(dtype).eps
    y = m(x)
    x64 = x.double()
    want = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + e)
    close(y, want, dtype, "y")
    other = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 10 * e)
    assert float((y.double() - other).abs().max()) > float((y.double() - want).abs().max())
    # the explicit value gives the same bits
    assert torch.equal(y, nt.rms_norm(x, 16, m.weight, eps=e))


def test_rms_norm_matches_torch_expression_and_torch_module():
    x = _randn((8, 64), torch.float32, 15)
    w = _randn((64,), torch.float32, 16, mean=1.0)
    eps = 1e-6
    want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
    close(nt.rms_norm(x, 64, w, eps=eps), want.double(), torch.float32)
    if hasattr(nn, "RMSNorm"):  # PyTorch 2.4+
        t = nn.RMSNorm(64, eps=eps)
        n = nt.RMSNorm(64, eps=eps)
        n.load_state_dict(t.state_dict())
        close(n(x), t(x).double(), torch.float32)


# ------------------------------------------------------------------------------------------
# GroupNorm
# ------------------------------------------------------------------------------------------

# (shape, groups): G = 1, G = C, groups of 3 and 5 channels, spatial 1 / 7 / 49, N = 1 / 2,
# no spatial dimension, 3-D and 6-D inputs
GN_CASES = [((2, 6, 7), 1), ((2, 6, 7, 7), 6), ((1, 15, 7, 7), 5), ((2, 10, 1, 1), 2),
            ((2, 64, 3, 5), 32), ((1, 12, 3, 3, 3), 4), ((2, 6), 3), ((2, 4, 2, 2, 2, 2), 2),
            ((2, 35, 7), 7)]
GN_IDS = ["G1", "GeqC", "g3", "s1", "g2x32", "3d", "nospatial", "6d", "g5"]


GN_LAYOUT = [(case, layout) for case in zip(GN_CASES, GN_IDS) for layout in ("cf", "cl")
             if layout == "cf" or len(case[0][0]) in CL]  # channels_last: 4-D and 5-D


@pytest.mark.parametrize("act", [None, "relu", "silu"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("case,layout", GN_LAYOUT, ids=[c[1] + "-" + l for c, l in GN_LAYOUT])
def test_group_norm_module(torch_backend, case, layout, dtype, act):
    (shape, groups), _ = case
    c = shape[1]
    m = nt.GroupNorm(groups, c, eps=1e-5, dtype=dtype, activation=act)
    _init_params(m, 21)
    x = _randn(shape, dtype, 22, mean=0.4)
    gy = _randn(shape, dtype, 23)
    if layout == "cl":
        x, gy = x.contiguous(memory_format=CL[len(shape)]), gy.contiguous(
            memory_format=CL[len(shape)])
    x.requires_grad_()
    y = m(x)
    assert y.dtype == dtype and y.shape == x.shape
    if layout == "cl":
        assert y.is_contiguous(memory_format=CL[len(shape)]), "channels_last kept"
    got = R.grads(y, [x, m.weight, m.bias], gy)
    x64, w64, b64 = x.detach().double().requires_grad_(), _twin(m.weight), _twin(m.bias)
    y64 = R.group_norm(x64, groups, w64, b64, 1e-5, act)
    want = R.grads(y64, [x64, w64, b64], gy.double())
    close(y, y64, dtype, "y")
    terms = R.gn_terms(x, groups, m.weight, gy, 1e-5)
    for a, b, k in zip(got, want, ("dx", "dweight", "dbias")):
        assert a.dtype == dtype
        close(a, b, dtype, k, scale=terms if k == "dx" else 0.0)
    if dtype in (torch.float32, torch.float64) and act is None:
        t = nn.GroupNorm(groups, c, eps=1e-5, dtype=dtype)
        t.load_state_dict(m.state_dict())
        xt = x.detach().clone().requires_grad_()
        yt = t(xt)
        tg = R.grads(yt, [xt, t.weight, t.bias], gy)
        close(y, yt.double(), dtype, "y vs torch", tol=VS_TORCH[dtype])
        for a, b, k in zip(got, tg, ("dx", "dweight", "dbias")):
            close(a, b.double(), dtype, k + " vs torch", tol=VS_TORCH[dtype],
                  scale=terms if k == "dx" else 0.0)


def test_group_norm_no_affine_and_repr(torch_backend):
    m, t = nt.GroupNorm(2, 4, affine=False), nn.GroupNorm(2, 4, affine=False)
    assert m.weight is None and repr(m) == repr(t)
    assert "activation='silu'" in repr(nt.GroupNorm(2, 4, activation="silu"))
    with pytest.raises(ValueError):
        nt.GroupNorm(2, 4, activation="gelu")
    x = _randn((2, 4, 5), torch.float32, 24)
    close(m(x), t(x).double(), torch.float32)


# ------------------------------------------------------------------------------------------
# InstanceNorm
# ------------------------------------------------------------------------------------------

IN_CASES = [(nt.InstanceNorm1d, nn.InstanceNorm1d, (2, 3, 7)),
            (nt.InstanceNorm1d, nn.InstanceNorm1d, (5, 49)),          # unbatched
            (nt.InstanceNorm2d, nn.InstanceNorm2d, (1, 6, 7, 7)),
            (nt.InstanceNorm2d, nn.InstanceNorm2d, (2, 5, 1, 7)),
            (nt.InstanceNorm2d, nn.InstanceNorm2d, (3, 4, 5)),           # unbatched
            (nt.InstanceNorm3d, nn.InstanceNorm3d, (2, 3, 2, 3, 5)),
            (nt.InstanceNorm3d, nn.InstanceNorm3d, (3, 2, 2, 7))]        # unbatched
IN_IDS = ["1d", "1d-unbatched", "2d", "2d-s7", "2d-unbatched", "3d", "3d-unbatched"]


_RANK = {nt.InstanceNorm1d: 3, nt.InstanceNorm2d: 4, nt.InstanceNorm3d: 5}
# channels_last: batched 4-D and 5-D inputs
IN_LAYOUT = [(case, layout) for case in zip(IN_CASES, IN_IDS) for layout in ("cf", "cl")
             if layout == "cf" or (len(case[0][2]) in CL and len(case[0][2]) == _RANK[case[0][0]])]


@pytest.mark.parametrize("mode", ["plain", "affine", "track", "track-eval"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("case,layout", IN_LAYOUT, ids=[c[1] + "-" + l for c, l in IN_LAYOUT])
def test_instance_norm_module(torch_backend, case, layout, dtype, mode):
    (ncls, tcls, shape), _ = case
    c = shape[1] if len(shape) == {nt.InstanceNorm1d: 3, nt.InstanceNorm2d: 4,
                                   nt.InstanceNorm3d: 5}[ncls] else shape[0]
    affine = mode != "plain"
    track = mode.startswith("track")
    m = ncls(c, eps=1e-5, momentum=0.2, affine=affine, track_running_stats=track, dtype=dtype)
    _init_params(m, 31)
    if track:
        with torch.no_grad():
            m.running_mean.copy_(_randn((c,), torch.float64, 32, std=0.3))
            m.running_var.copy_(_randn((c,), torch.float64, 33, std=0.3).abs() + 0.5)
    t = tcls(c, eps=1e-5, momentum=0.2, affine=affine, track_running_stats=track, dtype=dtype)
    t.load_state_dict(m.state_dict())
    if mode == "track-eval":
        m.eval()
        t.eval()
    x = _randn(shape, dtype, 34, mean=0.4)
    gy = _randn(shape, dtype, 35)
    if layout == "cl":
        x, gy = x.contiguous(memory_format=CL[len(shape)]), gy.contiguous(
            memory_format=CL[len(shape)])
    x.requires_grad_()
    rm0 = m.running_mean.clone() if track else None
    rv0 = m.running_var.clone() if track else None
    y = m(x)
    assert y.dtype == dtype and y.shape == x.shape
    if layout == "cl":
        assert y.is_contiguous(memory_format=CL[len(shape)])
    got = R.grads(y, [x, m.weight, m.bias], gy)
    # the float64 reference
    x64, w64, b64 = x.detach().double().requires_grad_(), _twin(m.weight), _twin(m.bias)
    unbatched = x.dim() == {nt.InstanceNorm1d: 2, nt.InstanceNorm2d: 3,
                            nt.InstanceNorm3d: 4}[ncls]
    xb = x64.unsqueeze(0) if unbatched else x64
    if mode == "track-eval":
        shp = (1, c) + (1,) * (xb.dim() - 2)
        y64 = (xb - rm0.double().reshape(shp)) / torch.sqrt(rv0.double().reshape(shp) + 1e-5)
        if affine:
            y64 = y64 * w64.reshape(shp) + b64.reshape(shp)
    else:
        y64 = R.group_norm(xb, c, w64, b64, 1e-5)
    if unbatched:
        y64 = y64.squeeze(0)
    want = R.grads(y64, [x64, w64, b64], gy.double())
    close(y, y64, dtype, "y")
    for a, b, k in zip(got, want, ("dx", "dweight", "dbias")):
        if b is not None:
            assert a.dtype == dtype
            close(a, b, dtype, k)
    if mode == "track":
        mu, var, s = R.instance_stats(xb.detach())
        rm = 0.8 * rm0.double() + 0.2 * mu.mean(0)
        rv = 0.8 * rv0.double() + 0.2 * (var * s / (s - 1)).mean(0)
        pt = torch.float64 if dtype == torch.float64 else dtype
        close(m.running_mean, rm, pt, "running_mean")
        close(m.running_var, rv, pt, "running_var")
    if dtype in (torch.float32, torch.float64):
        # torch 1.13's InstanceNorm backward is wrong for channels_last inputs (dx differs from
        # its own channels-first result): torch runs on the channels-first copy
        xt = x.detach().contiguous().requires_grad_()
        yt = t(xt)
        close(y, yt.double(), dtype, "y vs torch", tol=VS_TORCH[dtype])
        tg = R.grads(yt, [xt, t.weight, t.bias], gy.contiguous())
        for a, b, k in zip(got, tg, ("dx", "dweight", "dbias")):
            if b is not None:
                close(a, b.double(), dtype, k + " vs torch", tol=VS_TORCH[dtype])
        for k, bt in t.named_buffers():
            bn = dict(m.named_buffers())[k]
            if bt.dtype == torch.long:
                assert torch.equal(bn, bt), k
            else:
                close(bn, bt.double(), dtype, k + " vs torch", tol=VS_TORCH[dtype])


@pytest.mark.parametrize("fmt", [None, torch.channels_last])
def test_instance_norm_running_stats_follow_torch_over_steps(torch_backend, fmt):
    m = nt.InstanceNorm2d(6, momentum=0.3, affine=True, track_running_stats=True)
    t = nn.InstanceNorm2d(6, momentum=0.3, affine=True, track_running_stats=True)
    t.load_state_dict(m.state_dict())
    opt_m = torch.optim.SGD(m.parameters(), lr=0.1)
    opt_t = torch.optim.SGD(t.parameters(), lr=0.1)
    for step in range(5):
        x = _randn((3, 6, 5, 4), torch.float32, 40 + step, mean=step, std=1 + step)
        if fmt is not None:
            x = x.contiguous(memory_format=fmt)
        for mod, opt in ((m, opt_m), (t, opt_t)):
            opt.zero_grad()
            (mod(x) * torch.arange(120.0).reshape(6, 5, 4)).sum().backward()
            opt.step()
    for (k, a), (_, b) in zip(m.state_dict().items(), t.state_dict().items()):
        if b.dtype == torch.long:
            assert torch.equal(a, b), k
        else:
            close(a, b.double(), torch.float32, k, tol=1e-4)
    m.eval()
    t.eval()
    x = _randn((2, 6, 5, 4), torch.float32, 50)
    close(m(x), t(x).double(), torch.float32, "eval with running stats")


def test_functional_instance_norm_matches_torch(torch_backend):
    x = _randn((2, 3, 9), torch.float64, 51)
    rm, rv = torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
    rm2, rv2 = rm.clone(), rv.clone()
    y = nt.instance_norm(x, rm, rv, use_input_stats=True, momentum=0.5)
    yt = torch.nn.functional.instance_norm(x, rm2, rv2, use_input_stats=True, momentum=0.5)
    close(y, yt, torch.float64)
    close(rm, rm2, torch.float64)
    close(rv, rv2, torch.float64)
    close(nt.instance_norm(x, rm, rv, use_input_stats=False),
          torch.nn.functional.instance_norm(x, rm2, rv2, use_input_stats=False),
          torch.float64)


def test_functional_group_norm_activation(torch_backend):
    x = _randn((2, 8, 5, 5), torch.float32, 52).requires_grad_()
    w = _randn((8,), torch.float32, 53, mean=1.0).requires_grad_()
    b = _randn((8,), torch.float32, 54).requires_grad_()
    for act, f in (("silu", torch.nn.functional.silu), ("relu", torch.relu)):
        y = nt.group_norm(x, 4, w, b, activation=act)
        yt = f(torch.nn.functional.group_norm(x, 4, w, b))
        close(y, yt.double(), torch.float32)
        g = _randn((2, 8, 5, 5), torch.float32, 55)
        for a, bb in zip(R.grads(y, [x, w, b], g), R.grads(yt, [x, w, b], g)):
            close(a, bb.double(), torch.float32, tol=1e-4)


# ------------------------------------------------------------------------------------------
# Numerics: data whose mean is large against its spread
# ------------------------------------------------------------------------------------------


def _rel(a, b):
    return float((a.double() - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("kind", ["ln", "gn-cf", "gn-cl"])
def test_large_mean_numerics(torch_backend, kind):
    if kind == "ln":
        shape = (16, 1024)
    else:
        shape = (2, 32, 16, 16)
    x = _randn(shape, torch.float32, 60, mean=1e4, std=0.1)
    gy = _randn(shape, torch.float32, 61)
    if kind == "gn-cl":
        x, gy = x.contiguous(memory_format=torch.channels_last), gy.contiguous(
            memory_format=torch.channels_last)
    c = shape[-1] if kind == "ln" else shape[1]
    w = _randn((c,), torch.float32, 62, mean=1.0, std=0.2).requires_grad_()
    b = _randn((c,), torch.float32, 63, std=0.2).requires_grad_()
    x.requires_grad_()
    if kind == "ln":
        y = nt.layer_norm(x, (c,), w, b)
    else:
        y = nt.group_norm(x, 8, w, b)
    dx, dw, db = R.grads(y, [x, w, b], gy)
    x64, w64, b64 = (_twin(t) for t in (x, w, b))
    if kind == "ln":
        y64, _ = R.layer_norm(x64, (c,), w64, b64, 1e-5)
    else:
        y64 = R.group_norm(x64, 8, w64, b64, 1e-5)
    dx64, dw64, db64 = R.grads(y64, [x64, w64, b64], gy.double())
    for a, r, k in ((y, y64, "y"), (dx, dx64, "dx"), (dw, dw64, "dgamma"), (db, db64, "dbeta")):
        assert _rel(a, r) <= 1e-4, (k, _rel(a, r))


# ------------------------------------------------------------------------------------------
# Determinism across thread counts
# ------------------------------------------------------------------------------------------


def _all_outputs():
    torch.manual_seed(0)
    out = []
    x = _randn((64, 2048), torch.float32, 70, mean=3.0).requires_grad_()
    r = _randn((64, 2048), torch.float32, 71).requires_grad_()
    w = _randn((2048,), torch.float32, 72, mean=1.0).requires_grad_()
    b = _randn((2048,), torch.float32, 73).requires_grad_()
    g = _randn((64, 2048), torch.float32, 74)
    y, h = nt.layer_norm(x, 2048, w, b, residual=r)
    out += [y, h] + R.grads((y, h), [x, r, w, b], (g, g))
    y = nt.rms_norm(x, 2048, w)
    out += [y] + R.grads(y, [x, w], g)
    for fmt in (torch.contiguous_format, torch.channels_last):
        xg = _randn((2, 64, 32, 32), torch.float32, 75, mean=2.0).contiguous(
            memory_format=fmt).requires_grad_()
        gg = _randn((2, 64, 32, 32), torch.float32, 76).contiguous(memory_format=fmt)
        wg = _randn((64,), torch.float32, 77, mean=1.0).requires_grad_()
        bg = _randn((64,), torch.float32, 78).requires_grad_()
        y = nt.group_norm(xg, 8, wg, bg, activation="silu")
        out += [y] + R.grads(y, [xg, wg, bg], gg)
        rm, rv = torch.zeros(64), torch.ones(64)
        y = nt.instance_norm(xg, rm, rv, wg, bg)
        out += [y, rm, rv] + R.grads(y, [xg, wg, bg], gg)
    return [t.detach() for t in out]


def test_bitwise_identical_for_1_and_2_threads(torch_backend):
    saved = norma.get_num_threads()
    try:
        norma.set_num_threads(1)
        one = _all_outputs()
        norma.set_num_threads(2)
        two = _all_outputs()
    finally:
        norma.set_num_threads(saved)
    assert len(one) == len(two)
    for i, (a, b) in enumerate(zip(one, two)):
        assert a.dtype == b.dtype and torch.equal(a, b), i


# ------------------------------------------------------------------------------------------
# state_dict, constructor arguments, repr
# ------------------------------------------------------------------------------------------

STATE_PAIRS = [
    (lambda **k: nn.LayerNorm((4, 5), **k), lambda **k: nt.LayerNorm((4, 5), **k),
     [{}, {"elementwise_affine": False}, {"eps": 1e-3}]),
    (lambda **k: nn.GroupNorm(2, 6, **k), lambda **k: nt.GroupNorm(2, 6, **k),
     [{}, {"affine": False}, {"eps": 1e-3}]),
    (lambda **k: nn.InstanceNorm1d(3, **k), lambda **k: nt.InstanceNorm1d(3, **k),
     [{}, {"affine": True}, {"track_running_stats": True}, {"affine": True, "momentum": 0.3,
                                                           "track_running_stats": True}]),
    (lambda **k: nn.InstanceNorm2d(3, **k), lambda **k: nt.InstanceNorm2d(3, **k),
     [{}, {"affine": True, "track_running_stats": True}]),
    (lambda **k: nn.InstanceNorm3d(3, **k), lambda **k: nt.InstanceNorm3d(3, **k),
     [{}, {"affine": True, "track_running_stats": True}]),
]


@pytest.mark.parametrize("i", range(len(STATE_PAIRS)), ids=["ln", "gn", "in1d", "in2d", "in3d"])
def test_state_dict_parameters_buffers_repr_match_torch(i):
    tmake, nmake, kws = STATE_PAIRS[i]
    for kw in kws:
        t, n = tmake(**kw), nmake(**kw)
        assert isinstance(n, type(t))
        assert list(n.state_dict().keys()) == list(t.state_dict().keys())
        assert [k for k, _ in n.named_parameters()] == [k for k, _ in t.named_parameters()]
        assert [k for k, _ in n.named_buffers()] == [k for k, _ in t.named_buffers()]
        assert repr(n)[len(type(n).__name__):] == repr(t)[len(type(t).__name__):]
        t.load_state_dict(n.state_dict())
        n.load_state_dict(t.state_dict())
    m = nmake(device="cpu", dtype=torch.float64)
    assert all(p.dtype == torch.float64 for p in m.parameters())


def test_layer_norm_bias_false_and_rms_state():
    m = nt.LayerNorm(8, bias=False)
    assert m.bias is None and list(m.state_dict()) == ["weight"]
    r = nt.RMSNorm([3, 4], eps=1e-6, dtype=torch.float64)
    assert list(r.state_dict()) == ["weight"] and r.weight.shape == (3, 4)
    assert r.weight.dtype == torch.float64 and torch.equal(r.weight, torch.ones(3, 4).double())
    assert repr(r) == "RMSNorm((3, 4), eps=1e-06, elementwise_affine=True)"
    assert list(nt.RMSNorm(4, elementwise_affine=False).state_dict()) == []
    if hasattr(nn, "RMSNorm"):
        t = nn.RMSNorm([3, 4], eps=1e-6)
        assert list(t.state_dict()) == list(r.state_dict())
        t.load_state_dict(r.state_dict())
        r.load_state_dict(t.state_dict())
        assert repr(t) == repr(r)
    # a state dict of the same shape loads; another shape does not
    r.load_state_dict({"weight": torch.full((3, 4), 2.0)})
    assert float(r.weight[0, 0]) == 2.0
    with pytest.raises(RuntimeError):
        r.load_state_dict({"weight": torch.ones(12)})


# ------------------------------------------------------------------------------------------
# Errors, fallbacks
# ------------------------------------------------------------------------------------------


def test_errors_are_exceptions(torch_backend):
    x = torch.randn(2, 6, 5)
    with pytest.raises((ValueError, RuntimeError)):
        nt.LayerNorm(4)(x)  # normalized_shape does not match
    with pytest.raises((ValueError, RuntimeError)):
        nt.LayerNorm((6, 4))(x)
    with pytest.raises((ValueError, RuntimeError)):
        nt.RMSNorm(3)(x)
    with pytest.raises((ValueError, RuntimeError)):
        nt.layer_norm(x, 5, torch.ones(4))  # weight of the wrong size
    with pytest.raises((ValueError, RuntimeError)):
        nt.layer_norm(x, 5, residual=torch.randn(2, 6, 4))
    with pytest.raises((ValueError, RuntimeError)):
        nt.group_norm(x, 4)  # 6 channels, 4 groups
    with pytest.raises(ValueError):
        nt.GroupNorm(4, 6)
    with pytest.raises((ValueError, RuntimeError)):
        nt.GroupNorm(2, 4)(x)  # wrong number of channels
    with pytest.raises((ValueError, RuntimeError)):
        nt.InstanceNorm1d(4, affine=True)(x)  # wrong number of channels
    with pytest.raises((ValueError, RuntimeError)):
        nt.InstanceNorm1d(6)(torch.randn(2, 6, 1))  # one spatial value in training
    with pytest.raises((ValueError, RuntimeError)):
        nt.InstanceNorm2d(6)(x[0])  # wrong rank
    with pytest.raises((ValueError, RuntimeError)):
        nt.group_norm(x, 2, activation="tanh")
    # the module still works afterwards
    assert nt.LayerNorm(5)(x).shape == x.shape


def test_fallbacks_to_torch(torch_backend):
    # empty tensors: torch's own result
    e = torch.randn(0, 8)
    assert nt.LayerNorm(8)(e).shape == (0, 8)
    assert nt.RMSNorm(8)(e).shape == (0, 8)
    y, h = nt.layer_norm(e, 8, residual=torch.randn(0, 8))
    assert y.shape == h.shape == (0, 8)
    # a dtype norma does not take: torch's error, not norma's crash
    with pytest.raises(RuntimeError):
        nt.LayerNorm(8)(torch.ones(2, 8, dtype=torch.int32))
    # a residual of another dtype (autocast): the add in torch, then norma
    x, r = torch.randn(3, 8, dtype=torch.bfloat16), torch.randn(3, 8)
    y, h = nt.layer_norm(x, 8, residual=r)
    assert h.dtype == torch.float32
    close(y, torch.nn.functional.layer_norm(x + r, (8,)).double(), torch.float32)


def test_meta_device_falls_back():
    m = nt.LayerNorm(8, device="meta")
    y = m(torch.empty(2, 8, device="meta"))
    assert y.device.type == "meta" and y.shape == (2, 8)
    y = nt.rms_norm(torch.empty(2, 8, device="meta"), 8)
    assert y.device.type == "meta"


def test_autocast_bfloat16(torch_backend):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nt.LayerNorm(32), nn.Linear(32, 24),
                          nt.RMSNorm(24), nn.Unflatten(1, (6, 4)), nt.GroupNorm(3, 6),
                          nt.InstanceNorm1d(6, affine=True))
    x = torch.randn(5, 16)
    want = model(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = model(x)
    assert y.dtype == torch.bfloat16
    close(y, want.double(), torch.bfloat16, tol=6e-2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = model(x.requires_grad_())
    y.float().sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters())


# ------------------------------------------------------------------------------------------
# convert
# ------------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """A user RMSNorm (the torch 2.4 shape)."""

    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.normalized_shape = (d,)
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.gn = nn.GroupNorm(4, 8)
        self.inorm = nn.InstanceNorm2d(8, affine=True, track_running_stats=True)
        self.ln = nn.LayerNorm(8 * 6 * 6)
        self.fc = nn.Linear(8 * 6 * 6, 16)
        self.rms = RMSNorm(16)

    def forward(self, x):
        x = self.inorm(self.gn(self.bn(self.conv(x))))
        return self.rms(self.fc(self.ln(x.flatten(1))))


def _randomize(model):
    g = _gen(80)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))


KIND_TYPES = {"batch": nt.BatchNorm2d, "group": nt.GroupNorm, "instance": nt.InstanceNorm2d,
              "layer": nt.LayerNorm, "rms": nt.RMSNorm}
ATTR = {"batch": "bn", "group": "gn", "instance": "inorm", "layer": "ln", "rms": "rms"}


@pytest.mark.parametrize("kinds", [None, "all", ("layer",), ("group", "instance"), ("rms",),
                                   ("batch", "layer", "group", "instance", "rms")])
def test_convert_kinds_outputs_and_state(torch_backend, kinds):
    torch.manual_seed(1)
    orig = Block().double()
    _randomize(orig)
    orig.ln.weight.requires_grad_(False)
    model = copy.deepcopy(orig)
    params = {k: p for k, p in model.named_parameters()}
    conv = nt.convert(model, kinds=kinds)
    assert conv is model
    want = ("batch", "layer", "group", "instance") if kinds is None else (
        ("batch", "layer", "group", "instance", "rms") if kinds == "all" else kinds)
    for kind, attr in ATTR.items():
        mod = getattr(conv, attr)
        assert isinstance(mod, KIND_TYPES[kind]) == (kind in want), (kind, type(mod))
    # the same Parameter objects, flags, dtype, state dict
    for k, p in conv.named_parameters():
        assert p is params[k] and p.dtype == torch.float64
    assert not conv.ln.weight.requires_grad
    assert list(conv.state_dict()) == list(orig.state_dict())
    for (k, a), (_, b) in zip(conv.state_dict().items(), orig.state_dict().items()):
        assert torch.equal(a, b), k
    x = _randn((4, 3, 6, 6), torch.float64, 81)
    for mode in ("train", "eval", "train"):
        for m in (orig, conv):
            m.train(mode == "train")
        a, b = orig(x), conv(x)
        close(b, a, torch.float64, mode, tol=1e-9)
        assert conv.training == (mode == "train")
    for (k, a), (_, b) in zip(conv.state_dict().items(), orig.state_dict().items()):
        if b.dtype == torch.long:
            assert torch.equal(a, b), k
        else:
            close(a, b, torch.float64, k, tol=1e-9)
    # gradients agree too
    proj = _randn((4, 16), torch.float64, 82)
    ga = torch.autograd.grad((orig(x) * proj).sum(),
                             [p for p in orig.parameters() if p.requires_grad])
    gb = torch.autograd.grad((conv(x) * proj).sum(),
                             [p for p in conv.parameters() if p.requires_grad])
    top = max(float(a.abs().max()) for a in ga)  # some are 0 in theory (conv bias before BN)
    for a, b in zip(ga, gb):
        assert float((a - b).abs().max()) <= 1e-9 * top


def test_convert_arguments():
    m = Block()
    with pytest.raises(ValueError):
        nt.convert(m, kinds=("layer", "weight"))
    with pytest.raises(ValueError):
        nt.convert(m, kinds="batchnorm")
    # a bare module comes back converted; sync / count_weighted still work
    ln = nt.convert(nn.LayerNorm(4))
    assert type(ln) is nt.LayerNorm
    m = nt.convert(Block(), sync=False, count_weighted=True)
    assert m.bn.count_weighted and isinstance(m.ln, nt.LayerNorm)
    m = nt.convert(Block(), sync=True, kinds=("batch",))
    assert isinstance(m.bn, nt.SyncBatchNorm) and type(m.ln) is nn.LayerNorm
    # already converted: unchanged
    again = nt.convert(m)
    assert isinstance(again.ln, nt.LayerNorm) and isinstance(again.bn, nt.SyncBatchNorm)
    # subclasses of torch's modules with their own forward are left alone
    class MyLN(nn.LayerNorm):
        def forward(self, x):
            return super().forward(x) * 2
    seq = nt.convert(nn.Sequential(MyLN(4)))
    assert type(seq[0]) is MyLN


# ------------------------------------------------------------------------------------------
# TorchScript
# ------------------------------------------------------------------------------------------


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.gn = nn.GroupNorm(2, 8)
        self.inorm = nn.InstanceNorm2d(8, affine=True, track_running_stats=True)
        self.ln = nn.LayerNorm(8)
        self.rms = RMSNorm(8)

    def forward(self, x):
        x = self.inorm(self.gn(self.conv(x)))
        return self.rms(self.ln(x.permute(0, 2, 3, 1)))


def test_torchscript_script_and_trace():
    if _ops.backend() != "extension":
        pytest.skip("TorchScript needs the extension: %s" % _ops.extension_status()["reason"])
    torch.manual_seed(2)
    model = nt.convert(Small(), kinds="all")
    assert isinstance(model.rms, nt.RMSNorm)
    model.eval()
    x = torch.randn(2, 3, 5, 5)
    want = model(x)
    scripted = torch.jit.script(model)
    graph = str(scripted.inlined_graph)
    for op in ("norma::group_norm", "norma::instance_norm", "norma::layer_norm",
               "norma::rms_norm"):
        assert op in graph, op
    assert torch.equal(scripted(x), want)
    import io
    buf = io.BytesIO()
    torch.jit.save(scripted, buf)
    buf.seek(0)
    assert torch.equal(torch.jit.load(buf)(x), want)
    traced = torch.jit.trace(model, x)
    assert "norma::layer_norm" in str(traced.inlined_graph)
    assert torch.equal(traced(x), want)
    # training mode through the script: running statistics and gradients
    model.train()
    scripted = torch.jit.script(model)
    xs = x.clone().requires_grad_()
    ref_model = copy.deepcopy(model)
    y = scripted(xs)
    y.sum().backward()
    xr = x.clone().requires_grad_()
    ref_model(xr).sum().backward()
    close(xs.grad, xr.grad.double(), torch.float32, "dx")
    close(model.inorm.running_mean, ref_model.inorm.running_mean.double(), torch.float32)


def test_trace_with_ctypes_backend():
    with _ops.use_backend("ctypes"):
        model = nt.convert(Small(), kinds="all").eval()
        x = torch.randn(2, 3, 5, 5)
        traced = torch.jit.trace(model, x, check_trace=False)
        close(traced(x), model(x).double(), torch.float32)


def test_bench_norms_small_run():
    """examples/bench_norms.py --small finishes and prints its table (no timing asserted)."""
    import os
    import subprocess
    import sys
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, os.path.join(repo, "examples", "bench_norms.py"),
                          "--small", "--threads", "1"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    rows = [l for l in out.stdout.splitlines() if l.split()[:1] and l.split()[0] in (
        "LayerNorm", "RMSNorm", "GroupNorm(32)", "InstanceNorm2d")]
    assert len(rows) == 12, out.stdout


# ------------------------------------------------------------------------------------------
# The C calls as operators (no autograd)
# ------------------------------------------------------------------------------------------


def _bitwise(a, b, what):
    if a is None or b is None:
        assert a is None and b is None, what
        return
    assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), what


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_raw_operators_equal_the_autograd_ones(torch_backend, dtype):
    o = _ops.ops()
    # LayerNorm with a residual
    x = _randn((3, 4, 33), dtype, 90).requires_grad_()
    r = _randn((3, 4, 33), dtype, 91).requires_grad_()
    w = _randn((4, 33), torch.float32, 92, mean=1.0).requires_grad_()
    b = _randn((4, 33), torch.float32, 93).requires_grad_()
    gy, gh = _randn((3, 4, 33), dtype, 94), _randn((3, 4, 33), dtype, 95)
    y, h = nt.layer_norm(x, (4, 33), w, b, residual=r)
    dx, dr, dw, db = R.grads((y, h), [x, r, w, b], (gy, gh))
    y2, h2, sm, si = o.ln_forward(x.detach(), r.detach(), [4, 33], w.detach(), b.detach(), 1e-5,
                                  0)
    _bitwise(y2, y.detach(), "ln y")
    _bitwise(h2, h.detach(), "ln h")
    assert sm.shape == si.shape == (3,)  # one row per sample of [3, (4, 33)]
    dx2, dw2, db2 = o.ln_backward(h2, gy, gh, [4, 33], w.detach(), sm, si, 0, True)
    _bitwise(dx2, dx, "ln dx")
    _bitwise(dx2, dr, "ln dresidual")
    _bitwise(dw2, dw, "ln dweight")
    _bitwise(db2, db, "ln dbias")
    y3, h3, _, _ = o.ln_forward(x.detach(), None, [4, 33], None, None, 1e-5, 0)
    assert h3 is None and y3.shape == x.shape
    # RMSNorm
    y = nt.rms_norm(x, 33, w[0], eps=None)
    dx, dw = R.grads(y, [x, w], gy)
    y2, h2, si = o.rms_forward(x.detach(), None, [33], w[0].detach(), None, 0)
    assert h2 is None
    _bitwise(y2, y.detach(), "rms y")
    dx2, dw2 = o.rms_backward(x.detach(), gy, None, [33], w[0].detach(), si, 0, True)
    _bitwise(dx2, dx, "rms dx")
    _bitwise(dw2, dw[0], "rms dweight")
    # GroupNorm (channels_last, fused SiLU)
    xg = _randn((2, 12, 5, 3), dtype, 96).contiguous(memory_format=torch.channels_last)
    xg.requires_grad_()
    gg = _randn((2, 12, 5, 3), dtype, 97).contiguous(memory_format=torch.channels_last)
    wg = _randn((12,), torch.float32, 98, mean=1.0).requires_grad_()
    bg = _randn((12,), torch.float32, 99).requires_grad_()
    for act, flag in (("silu", 32), ("relu", 1)):
        y = nt.group_norm(xg, 4, wg, bg, activation=act)
        dx, dw, db = R.grads(y, [xg, wg, bg], gg)
        y2, sm, si = o.gn_forward(xg.detach(), 4, wg.detach(), bg.detach(), 1e-5, flag)
        _bitwise(y2, y.detach(), "gn y")
        assert y2.is_contiguous(memory_format=torch.channels_last)
        dx2, dw2, db2 = o.gn_backward(xg.detach(), y2, gg, 4, wg.detach(), bg.detach(), sm, si,
                                      flag, True)
        _bitwise(dx2, dx, "gn dx")
        _bitwise(dw2, dw, "gn dweight")
        _bitwise(db2, db, "gn dbias")
    # InstanceNorm: training with running statistics, inference, backward
    rm, rv = torch.zeros(12), torch.ones(12)
    rm2, rv2 = rm.clone(), rv.clone()
    y = nt.instance_norm(xg, rm, rv, wg, bg, use_input_stats=True, momentum=0.3)
    dx, dw, db = R.grads(y, [xg, wg, bg], gg)
    y2, sm, si = o.in_forward_training(xg.detach(), wg.detach(), bg.detach(), rm2, rv2, 0.3,
                                       1e-5, 0)
    _bitwise(y2, y.detach(), "in y")
    _bitwise(rm2, rm, "in running_mean")
    _bitwise(rv2, rv, "in running_var")
    dx2, dw2, db2 = o.in_backward(xg.detach(), None, gg, wg.detach(), bg.detach(), sm, si, 0,
                                  True)
    _bitwise(dx2, dx, "in dx")
    _bitwise(dw2, dw, "in dweight")
    _bitwise(db2, db, "in dbias")
    y = nt.instance_norm(xg.detach(), rm, rv, wg.detach(), bg.detach(), use_input_stats=False)
    _bitwise(o.in_forward_inference(xg.detach(), wg.detach(), bg.detach(), rm, rv, 1e-5, 0), y,
             "in inference")
    with pytest.raises((ValueError, RuntimeError)):
        o.gn_forward(xg.detach(), 5, None, None, 1e-5, 0)
    with pytest.raises((ValueError, RuntimeError)):
        o.ln_forward(x.detach(), None, [32], None, None, 1e-5, 0)


def test_backends_give_identical_bits():
    if _ops.backend() != "extension":
        pytest.skip("one backend only: %s" % _ops.extension_status()["reason"])
    outs = {}
    for be in ("extension", "ctypes"):
        with _ops.use_backend(be):
            outs[be] = _all_outputs()
    for i, (a, b) in enumerate(zip(outs["extension"], outs["ctypes"])):
        assert a.dtype == b.dtype and torch.equal(a, b), i


# ------------------------------------------------------------------------------------------
# Double backward (create_graph=True): the first-order gradients by torch's ops
# ------------------------------------------------------------------------------------------

F_ = torch.nn.functional


def _second_order(fn, ins):
    ins = [t.detach().clone().requires_grad_() for t in ins]
    out = fn(*ins)
    outs = out if isinstance(out, tuple) else (out,)
    loss = sum((t * torch.linspace(-1, 1, t.numel(), dtype=t.dtype).view(t.shape)).pow(2).sum()
               for t in outs)
    first = torch.autograd.grad(loss, ins, create_graph=True)
    sum((g * g).sum() for g in first).backward()
    return [t.grad for t in ins]


def _dd_cases():
    d = torch.float64
    x, r = _randn((3, 5, 8), d, 100), _randn((3, 5, 8), d, 101)
    w, b = _randn((8,), d, 102, mean=1.0), _randn((8,), d, 103)
    xg, wg, bg = _randn((2, 6, 4, 4), d, 104), _randn((6,), d, 105, mean=1.0), \
        _randn((6,), d, 106)
    rm, rv = _randn((6,), d, 107), _randn((6,), d, 108).abs() + 0.5
    cl = torch.channels_last
    return {
        "ln": (lambda x, w, b: nt.layer_norm(x, 8, w, b),
               lambda x, w, b: F_.layer_norm(x, (8,), w, b), [x, w, b]),
        "ln-residual": (lambda x, r, w, b: nt.layer_norm(x, 8, w, b, residual=r),
                        lambda x, r, w, b: (F_.layer_norm(x + r, (8,), w, b), x + r),
                        [x, r, w, b]),
        "rms": (lambda x, w: nt.rms_norm(x, 8, w, eps=1e-6),
                lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w,
                [x, w]),
        "rms-residual": (lambda x, r, w: nt.rms_norm(x, 8, w, eps=1e-6, residual=r),
                         lambda x, r, w: ((x + r) * torch.rsqrt((x + r).pow(2).mean(
                             -1, keepdim=True) + 1e-6) * w, x + r), [x, r, w]),
        "gn-silu": (lambda x, w, b: nt.group_norm(x, 3, w, b, activation="silu"),
                    lambda x, w, b: F_.silu(F_.group_norm(x, 3, w, b)), [xg, wg, bg]),
        "gn-relu-cl": (lambda x, w, b: nt.group_norm(x.contiguous(memory_format=cl), 3, w, b,
                                                     activation="relu"),
                       lambda x, w, b: F_.relu(F_.group_norm(x, 3, w, b)), [xg, wg, bg]),
        "in": (lambda x, w, b: nt.instance_norm(x, None, None, w, b),
               lambda x, w, b: F_.instance_norm(x, None, None, w, b), [xg, wg, bg]),
        "in-eval": (lambda x, w, b: nt.instance_norm(x, rm, rv, w, b, use_input_stats=False),
                    lambda x, w, b: F_.instance_norm(x, rm, rv, w, b, use_input_stats=False),
                    [xg, wg, bg]),
    }


@pytest.mark.parametrize("case", list(_dd_cases()))
def test_double_backward_matches_torch(torch_backend, case):
    fn, ref, ins = _dd_cases()[case]
    got = _second_order(fn, ins)
    want = _second_order(ref, ins)
    for i, (a, b) in enumerate(zip(got, want)):
        close(a, b, torch.float64, "second-order gradient of input %d" % i, tol=1e-9)


def test_double_backward_float32(torch_backend):
    m, t = nt.LayerNorm(16), nn.LayerNorm(16)
    x = _randn((4, 16), torch.float32, 110)
    a = _second_order(lambda x, w, b: nt.layer_norm(x, 16, w, b), [x, m.weight, m.bias])
    b = _second_order(lambda x, w, b: F_.layer_norm(x, (16,), w, b), [x, t.weight, t.bias])
    for p, q in zip(a, b):
        close(p, q.double(), torch.float32, tol=1e-4)
