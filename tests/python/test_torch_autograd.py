"""norma.torch's autograd functions against torch.nn.functional.batch_norm (forward, backward,
running statistics), fused ReLU / add+ReLU against the composed torch ops, gradcheck."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import norma
import norma.torch as nt
import bn_reference as ref

# every test runs with the extension's operators and with the ctypes fallback
pytestmark = pytest.mark.usefixtures("torch_backend")

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
          "float16": torch.float16}

SHAPES = [(n, c) + sp for n in (2, 5) for c in (1, 3, 17) for sp in [(), (7,), (7, 7)]] + \
         [(2, 3, 1, 7, 7), (5, 17, 1, 1)]
EVAL_SHAPES = SHAPES + [(1, 3), (1, 17, 7, 7), (1, 1, 1, 1, 1)]


def _ids(shapes):
    return ["x".join(map(str, s)) for s in shapes]


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _make(shape, dtype, seed=0, fmt=None):
    g = _gen(seed)
    tdt = DTYPES[dtype]
    pdt = torch.float64 if dtype == "float64" else torch.float32
    c = shape[1]
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 1.3 + 0.5).to(tdt)
    if fmt == "channels_last":
        x = x.to(memory_format=torch.channels_last if len(shape) == 4 else
                 torch.channels_last_3d)
    w = torch.randn(c, generator=g, dtype=torch.float64).to(pdt)
    b = torch.randn(c, generator=g, dtype=torch.float64).to(pdt)
    gy = torch.randn(shape, generator=g, dtype=torch.float64).to(tdt)
    r = torch.randn(shape, generator=g, dtype=torch.float64).to(tdt)
    if fmt == "channels_last":
        r = r.to(memory_format=torch.channels_last if len(shape) == 4 else
                 torch.channels_last_3d)
    return x, w, b, gy, r


def _leaf(t):
    return t.detach().clone().requires_grad_(True)


def _np(t):
    return t.detach().double().numpy()


def _torch_ref(x, w, b, rm, rv, training, momentum, eps, act, r, dtype):
    """torch's composed ops; float16 (no CPU BatchNorm in torch) computed in float32."""
    xx = x.float() if dtype == "float16" else x
    rr = (r.float() if dtype == "float16" else r) if r is not None else None
    y = F.batch_norm(xx, rm, rv, w, b, training, momentum, eps)
    if act == "add_relu":
        y = torch.relu(y + rr)
    elif act == "relu":
        y = torch.relu(y)
    return y.to(x.dtype) if dtype == "float16" else y


def _check_grads(got, want, shape, dtype, names, grad_tol_dtype=None):
    m = shape[0] * int(math.prod(shape[2:]))
    for name, a, e in zip(names, got, want):
        if e is None:
            assert a is None, name
            continue
        assert a is not None, name
        assert a.dtype == e.dtype, (name, a.dtype, e.dtype)
        if name in ("dweight", "dbias"):
            # per-channel sums of m terms (float32 sums of low-precision products)
            dn = "float64" if dtype == "float64" else grad_tol_dtype or "float32"
            ref.assert_close(_np(a), _np(e), dn, scale=math.sqrt(m) * 2, what=name)
        else:
            ref.assert_close(_np(a), _np(e), dtype, scale=2, what=name)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("shape", SHAPES, ids=_ids(SHAPES))
def test_training_forward_backward_vs_torch(shape, dtype):
    x, w, b, gy, _ = _make(shape, dtype, seed=hash(shape) % 1000)
    c = shape[1]
    pdt = w.dtype
    rm0 = torch.randn(c, generator=_gen(7), dtype=pdt)
    rv0 = torch.rand(c, generator=_gen(8), dtype=pdt) + 0.5
    xa, wa, ba = _leaf(x), _leaf(w), _leaf(b)
    rma, rva = rm0.clone(), rv0.clone()
    y = nt.batch_norm(xa, rma, rva, wa, ba, True, 0.1, 1e-5)
    y.backward(gy)
    xb, wb, bb = _leaf(x), _leaf(w), _leaf(b)
    rmb, rvb = rm0.clone(), rv0.clone()
    if dtype == "float16":
        xb32 = xb.float()
        yt = F.batch_norm(xb32, rmb, rvb, wb, bb, True, 0.1, 1e-5)
        yt.backward(gy.float())
        yt = yt.half()
    else:
        yt = F.batch_norm(xb, rmb, rvb, wb, bb, True, 0.1, 1e-5)
        yt.backward(gy)
    assert y.dtype == x.dtype and y.shape == x.shape
    ref.assert_close(_np(y), _np(yt), dtype, what="y")
    pname = "float64" if dtype == "float64" else "float32"
    ref.assert_close(rma.numpy(), rmb.numpy(), pname, what="running_mean")
    ref.assert_close(rva.numpy(), rvb.numpy(), pname, what="running_var")
    dxb = xb.grad if dtype != "float16" else xb.grad.half()
    # bfloat16: torch's own bf16 gradient carries bf16 rounding of its intermediates, so the
    # comparison with torch is loose; the float64 reference below is the tight one.
    _check_grads((xa.grad, wa.grad, ba.grad), (dxb, wb.grad, bb.grad), shape, dtype,
                 ("dx", "dweight", "dbias"), grad_tol_dtype="bfloat16" if dtype == "bfloat16"
                 else None)
    # against the float64 reference on the same (rounded) data
    _, mean, var, invstd = ref.forward_train(_np(x), _np(w), _np(b))
    dxr, dgr, dbr, _ = ref.backward(_np(gy), _np(x), mean, invstd, _np(w))
    m = shape[0] * int(math.prod(shape[2:]))
    ref.assert_close(_np(xa.grad), dxr, dtype, scale=2, what="dx vs reference")
    ref.assert_close(_np(wa.grad), dgr, pname, scale=math.sqrt(m) * 2, what="dw vs reference")
    ref.assert_close(_np(ba.grad), dbr, pname, scale=math.sqrt(m) * 2, what="db vs reference")


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("shape", EVAL_SHAPES, ids=_ids(EVAL_SHAPES))
def test_eval_forward_backward_vs_torch(shape, dtype):
    x, w, b, gy, _ = _make(shape, dtype, seed=3 + hash(shape) % 1000)
    c = shape[1]
    rm = torch.randn(c, generator=_gen(9), dtype=w.dtype)
    rv = torch.rand(c, generator=_gen(10), dtype=w.dtype) + 0.5
    rm0, rv0 = rm.clone(), rv.clone()
    xa, wa, ba = _leaf(x), _leaf(w), _leaf(b)
    y = nt.batch_norm(xa, rm, rv, wa, ba, False, 0.1, 1e-3)
    y.backward(gy)
    assert torch.equal(rm, rm0) and torch.equal(rv, rv0)
    xb, wb, bb = _leaf(x), _leaf(w), _leaf(b)
    xx = xb.float() if dtype == "float16" else xb
    yt = F.batch_norm(xx, rm, rv, wb, bb, False, 0.1, 1e-3)
    yt.backward(gy.to(yt.dtype))
    ref.assert_close(_np(y), _np(yt.to(x.dtype)), dtype, what="y")
    _check_grads((xa.grad, wa.grad, ba.grad), (xb.grad, wb.grad, bb.grad), shape, dtype,
                 ("dx", "dweight", "dbias"), grad_tol_dtype="bfloat16" if dtype == "bfloat16"
                 else None)


@pytest.mark.parametrize("act", ["relu", "add_relu"])
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "float16"])
@pytest.mark.parametrize("shape,fmt", [((5, 17, 7, 7), None), ((2, 3, 7), None),
                                       ((2, 3, 7, 7), "channels_last"),
                                       ((2, 17, 1, 7, 7), "channels_last"), ((5, 1), None)])
def test_fused_vs_composed_torch(shape, fmt, dtype, training, act):
    x, w, b, gy, r = _make(shape, dtype, seed=11, fmt=fmt)
    c = shape[1]
    rm = torch.randn(c, generator=_gen(1), dtype=w.dtype) * 0.1
    rv = torch.rand(c, generator=_gen(2), dtype=w.dtype) + 0.5
    xa, wa, ba, ra = _leaf(x), _leaf(w), _leaf(b), _leaf(r)
    rma, rva = rm.clone(), rv.clone()
    if act == "relu":
        y = nt.batch_norm_relu(xa, rma, rva, wa, ba, training, 0.1, 1e-5)
    else:
        y = nt.batch_norm_add_relu(xa, ra, rma, rva, wa, ba, training, 0.1, 1e-5)
    y.backward(gy)
    if fmt == "channels_last":
        assert y.permute(0, *range(2, len(shape)), 1).is_contiguous()
        assert xa.grad.permute(0, *range(2, len(shape)), 1).is_contiguous()
    xb, wb, bb, rb = _leaf(x), _leaf(w), _leaf(b), _leaf(r)
    rmb, rvb = rm.clone(), rv.clone()
    yt = _torch_ref(xb, wb, bb, rmb, rvb, training, 0.1, 1e-5, act, rb, dtype)
    yt.backward(gy)
    ref.assert_close(_np(y), _np(yt), dtype, what="y")
    assert torch.equal(y > 0, yt > 0) or dtype in ("bfloat16", "float16")
    pname = "float64" if dtype == "float64" else "float32"
    ref.assert_close(rma.numpy(), rmb.numpy(), pname, what="running_mean")
    ref.assert_close(rva.numpy(), rvb.numpy(), pname, what="running_var")
    if dtype in ("bfloat16", "float16"):
        # the ReLU mask of a rounded y may differ where y is within a rounding of 0: compare
        # the gradients with the float64 reference that uses norma's own mask
        mask_y = y.detach()
        if training:
            _, mean, var, invstd = ref.forward_train(_np(x), _np(w), _np(b))
        else:
            mean, invstd = _np(rm), 1 / np.sqrt(_np(rv) + 1e-5)
        dxr, dgr, dbr, gr = ref.backward(_np(gy), _np(x), mean, invstd, _np(w), y=_np(mask_y),
                                         global_stats=not training)
        m = shape[0] * int(math.prod(shape[2:]))
        ref.assert_close(_np(xa.grad), dxr, dtype, scale=2, what="dx")
        ref.assert_close(_np(wa.grad), dgr, "float32", scale=math.sqrt(m) * 2, what="dweight")
        ref.assert_close(_np(ba.grad), dbr, "float32", scale=math.sqrt(m) * 2, what="dbias")
        if act == "add_relu":
            assert torch.equal(ra.grad, torch.where(mask_y > 0, gy, torch.zeros_like(gy)))
        return
    names = ("dx", "dweight", "dbias", "dresidual")
    got = (xa.grad, wa.grad, ba.grad, ra.grad if act == "add_relu" else None)
    want = (xb.grad, wb.grad, bb.grad, rb.grad if act == "add_relu" else None)
    _check_grads(got, want, shape, dtype, names)


def _away_from_kinks(shape, act, training):
    """float64 data whose BN output (+ residual) stays >= 0.05 away from 0."""
    for seed in range(200):
        x, w, b, gy, r = _make(shape, "float64", seed=seed)
        if training:
            y = F.batch_norm(x, None, None, w, b, True)
        else:
            y = F.batch_norm(x, torch.zeros(shape[1], dtype=torch.float64),
                             torch.ones(shape[1], dtype=torch.float64), w, b, False)
        if act == "add_relu":
            y = y + r
        if act == "none" or y.abs().min() > 0.05:
            return x, w, b, r
    raise AssertionError("no seed gives data away from the ReLU kink")


@pytest.mark.parametrize("act", ["none", "relu", "add_relu"])
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("shape,fmt", [((3, 2, 4), None), ((2, 3, 2, 2), "channels_last"),
                                       ((4, 2), None)])
def test_gradcheck(shape, fmt, training, act):
    x, w, b, r = _away_from_kinks(shape, act, training)
    if fmt == "channels_last":
        x = x.to(memory_format=torch.channels_last)
    c = shape[1]
    rm = torch.randn(c, generator=_gen(5), dtype=torch.float64) * 0.1
    rv = torch.rand(c, generator=_gen(6), dtype=torch.float64) + 0.5
    xa, wa, ba, ra = _leaf(x), _leaf(w), _leaf(b), _leaf(r)

    def fn(x, w, b, r):
        return nt.batch_norm(x, None if training else rm, None if training else rv, w, b,
                             training, 0.1, 1e-5, relu=act != "none",
                             residual=r if act == "add_relu" else None)

    inputs = (xa, wa, ba, ra)
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-6, rtol=1e-5)


def test_gradcheck_save_output_path():
    x, w, b, _ = _away_from_kinks((3, 2, 5), "none", True)
    xa, wa, ba = _leaf(x), _leaf(w), _leaf(b)
    assert torch.autograd.gradcheck(
        lambda x, w, b: nt.batch_norm(x, None, None, w, b, True, save_output=True),
        (xa, wa, ba), eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
def test_save_output_memory_path_matches(dtype):
    """save_output=True keeps y (not x) and recovers x_hat from it (x == NULL in C)."""
    shape = (5, 17, 7, 7)
    x, w, b, gy, _ = _make(shape, dtype, seed=21)
    w = torch.where(w.abs() < 0.3, torch.full_like(w, 0.7), w)
    out = []
    for save_output in (False, True):
        xa, wa, ba = _leaf(x), _leaf(w), _leaf(b)
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t,
                                                      lambda t: t):
            y = nt.batch_norm(xa, None, None, wa, ba, True, save_output=save_output)
        # x is among the saved tensors, or (save_output) not: that is the point
        assert any(t.data_ptr() == xa.data_ptr() for t in saved) != save_output
        y.backward(gy)
        out.append((y, xa.grad, wa.grad, ba.grad))
    m = 5 * 49
    # bfloat16: x_hat recovered from a rounded y: one more rounding
    tol = "bfloat16" if dtype == "bfloat16" else dtype
    ref.assert_close(_np(out[1][1]), _np(out[0][1]), tol, scale=4, what="dx")
    ref.assert_close(_np(out[1][2]), _np(out[0][2]), tol if dtype == "bfloat16" else
                     ("float64" if dtype == "float64" else "float32"), scale=math.sqrt(m),
                     what="dweight")
    assert torch.equal(out[1][0], out[0][0])


def test_save_output_with_zero_weight_falls_back_to_x():
    x, w, b, gy, _ = _make((4, 3, 5), "float32", seed=2)
    w[1] = 0
    xa, wa, ba = _leaf(x), _leaf(w), _leaf(b)
    nt.batch_norm(xa, None, None, wa, ba, True, save_output=True).backward(gy)
    xb, wb, bb = _leaf(x), _leaf(w), _leaf(b)
    F.batch_norm(xb, None, None, wb, bb, True).backward(gy)
    ref.assert_close(xa.grad.numpy(), xb.grad.numpy(), "float32", scale=2)
    ref.assert_close(wa.grad.numpy(), wb.grad.numpy(), "float32", scale=10)


def test_inplace_modification_of_saved_input_is_detected():
    x, w, b, gy, _ = _make((4, 3, 5), "float32")
    xa = _leaf(x)
    h = xa * 1.0
    y = nt.batch_norm(h, None, None, w, b, True)
    h.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward(gy)


def test_momentum_extremes_and_no_grad_inputs():
    x, w, b, _, _ = _make((5, 3, 7), "float32")
    rm0 = torch.randn(3, generator=_gen(3))
    rv0 = torch.rand(3, generator=_gen(4)) + 0.5
    for mom in (0.0, 1.0, 0.3):
        rm, rv = rm0.clone(), rv0.clone()
        rmt, rvt = rm0.clone(), rv0.clone()
        with torch.no_grad():
            y = nt.batch_norm(x, rm, rv, w, b, True, mom)
        F.batch_norm(x, rmt, rvt, w, b, True, mom)
        assert not y.requires_grad
        if mom == 0.0:
            assert torch.equal(rm, rm0) and torch.equal(rv, rv0)
        ref.assert_close(rm.numpy(), rmt.numpy(), "float32")
        ref.assert_close(rv.numpy(), rvt.numpy(), "float32")


def test_only_some_inputs_require_grad():
    x, w, b, gy, r = _make((4, 3, 5), "float32")
    wa = _leaf(w)  # x, b, residual without grad
    nt.batch_norm(x, None, None, wa, b, True, relu=True, residual=r).backward(gy)
    wb = _leaf(w)
    torch.relu(F.batch_norm(x, None, None, wb, b, True) + r).backward(gy)
    ref.assert_close(wa.grad.numpy(), wb.grad.numpy(), "float32", scale=10)
    # no affine parameters at all
    xa, xb = _leaf(x), _leaf(x)
    nt.batch_norm(xa, None, None, None, None, True).backward(gy)
    F.batch_norm(xb, None, None, None, None, True).backward(gy)
    ref.assert_close(xa.grad.numpy(), xb.grad.numpy(), "float32", scale=2)


def test_non_contiguous_grad_output():
    x, w, b, _, _ = _make((2, 3, 7, 7), "float32", fmt="channels_last")
    xa, wa, ba = _leaf(x), _leaf(w), _leaf(b)
    nt.batch_norm(xa, None, None, wa, ba, True).sum().backward()  # expanded (stride-0) grad
    xb, wb, bb = _leaf(x), _leaf(w), _leaf(b)
    F.batch_norm(xb, None, None, wb, bb, True).sum().backward()
    ref.assert_close(xa.grad.numpy(), xb.grad.numpy(), "float32", scale=2)
    ref.assert_close(ba.grad.numpy(), bb.grad.numpy(), "float32", scale=10)


def test_errors_through_torch():
    x, w, b, _, _ = _make((1, 3, 1, 1), "float32")
    with pytest.raises(ValueError, match="Expected more than 1 value per channel"):
        nt.batch_norm(x, None, None, w, b, True)
    x, w, b, _, _ = _make((4, 3, 5), "float32")
    with pytest.raises(norma.NormaError, match="eps") as ei:
        nt.batch_norm(x, None, None, w, b, True, eps=-1.0)
    assert ei.value.status_name == "NORMA_ERR_INVALID_ARGUMENT"
    with pytest.raises(ValueError, match="(weight|gamma) must have 3 elements"):
        nt.batch_norm(x, None, None, torch.ones(4), b, True)
    with pytest.raises(ValueError, match="evaluation mode"):
        nt.batch_norm(x, None, None, w, b, False)
    with pytest.raises(TypeError, match="dtype"):
        nt.batch_norm(x.int(), None, None, w, b, True)
    assert norma.torch is nt
    # the top-level F.batch_norm-style function dispatches torch tensors to autograd
    xa = _leaf(x)
    y = norma.batch_norm(xa, None, None, w, b, True)
    assert y.requires_grad and y.grad_fn is not None
