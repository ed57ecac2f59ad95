"""The functional API on numpy arrays (and torch tensors without autograd) against the float64
reference of bn_reference.py and against torch.nn.functional.batch_norm."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import norma
import bn_reference as ref

NP_DTYPES = {"float32": np.float32, "float64": np.float64, "float16": np.float16}

# shapes hitting tails: C in {1, 3, 17}, spatial in {1, 7, 49}, N in {2, 5}; 2-D to 5-D
SPATIAL = [(), (1,), (7,), (7, 7), (1, 7, 7)]
TRAIN_SHAPES = [(n, c) + sp for n in (2, 5) for c in (1, 3, 17) for sp in SPATIAL]
EVAL_SHAPES = TRAIN_SHAPES + [(1, c) + sp for c in (1, 3, 17) for sp in [(), (1,), (7, 7)]]


def _ids(shapes):
    return ["x".join(map(str, s)) for s in shapes]


def _data(rng, shape, dtype, mean=0.0):
    x = (rng.standard_normal(shape) * 1.5 + mean).astype(dtype)
    c = shape[1]
    g = rng.standard_normal(c).astype(np.float64 if dtype == np.float64 else np.float32)
    b = rng.standard_normal(c).astype(g.dtype)
    return x, g, b


def _m(shape):
    return shape[0] * int(math.prod(shape[2:]))


# ---- training forward ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", list(NP_DTYPES))
@pytest.mark.parametrize("shape", TRAIN_SHAPES, ids=_ids(TRAIN_SHAPES))
def test_forward_training_numpy(shape, dtype, rng):
    x, g, b = _data(rng, shape, NP_DTYPES[dtype])
    c = shape[1]
    pdt = g.dtype
    rm0 = rng.standard_normal(c).astype(pdt)
    rv0 = (rng.random(c) + 0.5).astype(pdt)
    rm, rv = rm0.copy(), rv0.copy()
    y, sm, si = norma.batch_norm_forward_training(x, g, b, 1e-5, rm, rv, 0.1)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert sm.dtype == pdt and si.dtype == pdt and sm.shape == (c,)
    yr, mean, var, invstd = ref.forward_train(x, g, b, 1e-5)
    pname = "float64" if dtype == "float64" else "float32"
    ref.assert_close(y, yr, dtype, what="y")
    ref.assert_close(sm, mean, pname, what="save_mean")
    ref.assert_close(si, invstd, pname, what="save_invstd")
    m = _m(shape)
    ref.assert_close(rm, 0.9 * rm0 + 0.1 * mean, pname, what="running_mean")
    ref.assert_close(rv, 0.9 * rv0 + 0.1 * var * m / (m - 1), pname, what="running_var")


@pytest.mark.parametrize("momentum", [0.0, 0.1, 0.5, 1.0])
@pytest.mark.parametrize("biased", [False, True])
def test_running_stats_momentum(momentum, biased, rng):
    shape = (5, 17, 7)
    x, g, b = _data(rng, shape, np.float32, mean=3.0)
    rm0 = rng.standard_normal(17).astype(np.float32)
    rv0 = (rng.random(17) + 0.5).astype(np.float32)
    rm, rv = rm0.copy(), rv0.copy()
    norma.batch_norm_forward_training(x, g, b, 1e-3, rm, rv, momentum,
                                      biased_running_var=biased)
    _, mean, var, _ = ref.forward_train(x, g, b, 1e-3)
    m = _m(shape)
    bvar = var if biased else var * m / (m - 1)
    if momentum == 0.0:
        assert np.array_equal(rm, rm0) and np.array_equal(rv, rv0)
    ref.assert_close(rm, (1 - momentum) * rm0 + momentum * mean, "float32", what="running_mean")
    ref.assert_close(rv, (1 - momentum) * rv0 + momentum * bvar, "float32", what="running_var")


def test_running_stats_of_other_dtype_and_only_one(rng):
    # float64 running statistics for float32 data go through a temporary and are copied back
    x, g, b = _data(rng, (4, 3, 7), np.float32)
    rm = np.zeros(3)
    _, mean, var, _ = ref.forward_train(x)
    norma.batch_norm_forward_training(x, running_mean=rm, momentum=1.0)
    ref.assert_close(rm, mean, "float32")
    rv = np.ones(3, np.float32)[::1]
    norma.batch_norm_forward_training(x, running_var=rv, momentum=1.0)
    ref.assert_close(rv, var * 28 / 27, "float32")


@pytest.mark.parametrize("eps", [0.0, 1e-5, 0.1, 10.0])
def test_eps(eps, rng):
    x, g, b = _data(rng, (3, 5, 7), np.float64)
    y, sm, si = norma.batch_norm_forward_training(x, g, b, eps)
    yr, mean, var, invstd = ref.forward_train(x, g, b, eps)
    ref.assert_close(y, yr, "float64")
    ref.assert_close(si, invstd, "float64")


def test_large_mean_is_accurate(rng):
    x = (1e4 + rng.standard_normal((5, 3, 49))).astype(np.float32)
    y, sm, si = norma.batch_norm_forward_training(x)
    yr, mean, var, invstd = ref.forward_train(x)
    # float32 x of magnitude 1e4 has ulp ~1e-3; the stats must not cancel catastrophically
    np.testing.assert_allclose(si, invstd, rtol=1e-4)
    np.testing.assert_allclose(y, yr, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("shape", [(2, 3, 7, 7), (5, 17, 1, 7, 7), (5, 17, 7), (2, 1, 49)],
                         ids=_ids([(2, 3, 7, 7), (5, 17, 1, 7, 7), (5, 17, 7), (2, 1, 49)]))
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_numpy_channels_last(shape, dtype, rng):
    x, g, b = _data(rng, shape, NP_DTYPES[dtype])
    r = (rng.standard_normal(shape)).astype(x.dtype)
    x_cl = np.ascontiguousarray(np.moveaxis(x, 1, -1))   # [N, *spatial, C]
    r_cl = np.ascontiguousarray(np.moveaxis(r, 1, -1))
    y, sm, si = norma.batch_norm_forward_training(x_cl, g, b, layout="channels_last", relu=True,
                                                  residual=r_cl)
    assert y.shape == x_cl.shape
    yr, mean, var, invstd = ref.forward_train(x, g, b, residual=r)
    ref.assert_close(np.moveaxis(y, -1, 1), yr, dtype, what="y")
    ref.assert_close(si, invstd, "float32")
    dy = rng.standard_normal(shape).astype(x.dtype)
    dy_cl = np.ascontiguousarray(np.moveaxis(dy, 1, -1))
    dx, dg, db, dres = norma.batch_norm_backward(dy_cl, x_cl, sm, si, g, b, y=y,
                                                 layout="channels_last", add_relu=True)
    dxr, dgr, dbr, gr = ref.backward(dy, x, mean, invstd, g, y=np.moveaxis(y, -1, 1))
    s = math.sqrt(_m(shape))
    ref.assert_close(np.moveaxis(dx, -1, 1), dxr, dtype, what="dx")
    ref.assert_close(np.moveaxis(dres, -1, 1), gr, dtype, what="dresidual")
    ref.assert_close(dg, dgr, "float32", scale=s, what="dgamma")
    ref.assert_close(db, dbr, "float32", scale=s, what="dbeta")
    # inference too
    rv = (rng.random(shape[1]) + 0.5).astype(np.float32)
    yi = norma.batch_norm_inference(x_cl, mean, rv, g, b, layout="channels_last")
    ref.assert_close(np.moveaxis(yi, -1, 1), ref.forward_infer(x, mean, rv, g, b), dtype)


def test_non_contiguous_numpy_input(rng):
    big = rng.standard_normal((5, 6, 14)).astype(np.float32)
    x = big[:, ::2, ::2]   # strided view: copied to dense
    y, sm, si = norma.batch_norm_forward_training(x)
    ref.assert_close(y, ref.forward_train(x)[0], "float32")


# ---- inference ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", list(NP_DTYPES))
@pytest.mark.parametrize("shape", EVAL_SHAPES, ids=_ids(EVAL_SHAPES))
def test_forward_inference_numpy(shape, dtype, rng):
    x, g, b = _data(rng, shape, NP_DTYPES[dtype])
    mean = rng.standard_normal(shape[1]).astype(g.dtype)
    var = (rng.random(shape[1]) + 0.2).astype(g.dtype)
    y = norma.batch_norm_inference(x, mean, var, g, b, eps=1e-5)
    ref.assert_close(y, ref.forward_infer(x, mean, var, g, b, 1e-5), dtype, what="y")
    y = norma.batch_norm_inference(x, mean, var, relu=True)
    ref.assert_close(y, ref.forward_infer(x, mean, var, relu=True), dtype, what="y relu")
    r = rng.standard_normal(shape).astype(x.dtype)
    y = norma.batch_norm_inference(x, mean, var, g, b, relu=True, residual=r)
    ref.assert_close(y, ref.forward_infer(x, mean, var, g, b, residual=r), dtype,
                     what="y add_relu")
    # F.batch_norm's argument order
    y2 = norma.batch_norm(x, mean, var, g, b, False, 0.1, 1e-5)
    ref.assert_close(y2, ref.forward_infer(x, mean, var, g, b, 1e-5), dtype, what="batch_norm")


# ---- backward -----------------------------------------------------------------------------


BWD_SHAPES = [(n, c) + sp for n in (2, 5) for c in (1, 3, 17) for sp in [(), (7,), (7, 7)]]


@pytest.mark.parametrize("act", ["none", "relu", "add_relu"])
@pytest.mark.parametrize("dtype", list(NP_DTYPES))
@pytest.mark.parametrize("shape", BWD_SHAPES, ids=_ids(BWD_SHAPES))
def test_backward_numpy(shape, dtype, act, rng):
    x, g, b = _data(rng, shape, NP_DTYPES[dtype])
    r = rng.standard_normal(shape).astype(x.dtype) if act == "add_relu" else None
    y, sm, si = norma.batch_norm_forward_training(x, g, b, relu=act != "none", residual=r)
    dy = rng.standard_normal(shape).astype(x.dtype)
    out = norma.batch_norm_backward(dy, x, sm, si, g, b, y=y, relu=act == "relu",
                                    add_relu=act == "add_relu")
    _, mean, var, invstd = ref.forward_train(x, g, b)
    dxr, dgr, dbr, gr = ref.backward(dy, x, mean, invstd, g, y=y if act != "none" else None)
    s = math.sqrt(_m(shape))
    pname = "float64" if dtype == "float64" else "float32"
    assert len(out) == (4 if act == "add_relu" else 3)
    dx, dg, db = out[:3]
    assert dx.dtype == x.dtype and dg.dtype == g.dtype
    ref.assert_close(dx, dxr, dtype, scale=2, what="dx")
    ref.assert_close(dg, dgr, pname, scale=s, what="dgamma")
    ref.assert_close(db, dbr, pname, scale=s, what="dbeta")
    if act == "add_relu":
        ref.assert_close(out[3], gr, dtype, what="dresidual")
        assert np.array_equal(out[3], np.where(y > 0, dy, 0).astype(x.dtype))


@pytest.mark.parametrize("dtype", list(NP_DTYPES))
@pytest.mark.parametrize("shape", [(2, 3), (5, 17, 7), (2, 3, 7, 7)],
                         ids=_ids([(2, 3), (5, 17, 7), (2, 3, 7, 7)]))
def test_backward_without_x(shape, dtype, rng):
    """x == NULL: x_hat recovered from y (memory-saving path)."""
    x, g, b = _data(rng, shape, NP_DTYPES[dtype])
    g = np.where(np.abs(g) < 0.3, 0.5, g).astype(g.dtype)  # recoverable: no gamma near 0
    y, sm, si = norma.batch_norm_forward_training(x, g, b)
    dy = rng.standard_normal(shape).astype(x.dtype)
    dx, dg, db = norma.batch_norm_backward(dy, None, sm, si, g, b, y=y)
    dx1, dg1, db1 = norma.batch_norm_backward(dy, x, sm, si, g, b)
    _, mean, var, invstd = ref.forward_train(x, g, b)
    dxr, dgr, dbr, _ = ref.backward(dy, x, mean, invstd, g)
    s = math.sqrt(_m(shape))
    # recovering x_hat from a rounded y costs up to one rounding of y
    lowp = dtype in ("float16",)
    ref.assert_close(dx, dxr, dtype, scale=4 if lowp else 2, what="dx")
    ref.assert_close(dg, dgr, dtype if lowp else ("float64" if dtype == "float64" else
                                                   "float32"), scale=s, what="dgamma")
    ref.assert_close(db, dbr, "float64" if dtype == "float64" else "float32", scale=s,
                     what="dbeta")
    ref.assert_close(dx1, dxr, dtype, scale=2, what="dx with x")


def test_backward_global_stats(rng):
    shape = (5, 3, 7, 7)
    x, g, b = _data(rng, shape, np.float32)
    mean = rng.standard_normal(3).astype(np.float32)
    var = (rng.random(3) + 0.5).astype(np.float32)
    invstd = (1 / np.sqrt(var.astype(np.float64) + 1e-5)).astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    dx, dg, db = norma.batch_norm_backward(dy, x, mean, invstd, g, b, global_stats=True)
    dxr, dgr, dbr, _ = ref.backward(dy, x, mean, invstd.astype(np.float64), g,
                                    global_stats=True)
    ref.assert_close(dx, dxr, "float32", what="dx")
    ref.assert_close(dg, dgr, "float32", scale=15, what="dgamma")
    ref.assert_close(db, dbr, "float32", scale=15, what="dbeta")
    # n * spatial == 1 is allowed with global statistics
    dx1, _, _ = norma.batch_norm_backward(dy[:1, :, :1, :1], x[:1, :, :1, :1], mean, invstd, g,
                                          global_stats=True)
    ref.assert_close(dx1, dxr[:1, :, :1, :1], "float32")


def test_backward_without_param_grads(rng):
    x, g, b = _data(rng, (4, 3, 5), np.float32)
    y, sm, si = norma.batch_norm_forward_training(x, g, b)
    dx, dg, db = norma.batch_norm_backward(np.ones_like(x), x, sm, si, g, b,
                                           compute_param_grads=False)
    assert dg is None and db is None
    _, mean, var, invstd = ref.forward_train(x, g, b)
    ref.assert_close(dx, ref.backward(np.ones_like(x), x, mean, invstd, g)[0], "float32")


# ---- torch tensors through the functional API ----------------------------------------------


TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64,
                "bfloat16": torch.bfloat16, "float16": torch.float16}


@pytest.mark.parametrize("dtype", list(TORCH_DTYPES))
@pytest.mark.parametrize("fmt", ["contiguous", "channels_last"])
@pytest.mark.parametrize("shape", [(5, 17, 7, 7), (2, 3, 1, 7, 7), (2, 1, 7, 1)],
                         ids=_ids([(5, 17, 7, 7), (2, 3, 1, 7, 7), (2, 1, 7, 1)]))
def test_functional_torch_matches_torch(shape, fmt, dtype, rng):
    tdt = TORCH_DTYPES[dtype]
    x = torch.from_numpy(rng.standard_normal(shape)).to(tdt)
    if fmt == "channels_last":
        x = x.to(memory_format=torch.channels_last if len(shape) == 4 else
                 torch.channels_last_3d)
    c = shape[1]
    pdt = torch.float64 if dtype == "float64" else torch.float32
    g = torch.from_numpy(rng.standard_normal(c)).to(pdt)
    b = torch.from_numpy(rng.standard_normal(c)).to(pdt)
    rm, rv = torch.zeros(c, dtype=pdt), torch.ones(c, dtype=pdt)
    y, sm, si = norma.batch_norm_forward_training(x, g, b, 1e-5, rm, rv, 0.1)
    assert y.dtype == tdt and sm.dtype == pdt and isinstance(y, torch.Tensor)
    if fmt == "channels_last":
        assert not y.is_contiguous() or shape[1] == 1
        assert y.permute(0, *range(2, len(shape)), 1).is_contiguous()
    else:
        assert y.is_contiguous()
    # torch has no float16 BatchNorm on CPU: compare with float32 then rounded
    xt = x.float() if dtype == "float16" else x
    rm2, rv2 = torch.zeros(c, dtype=pdt), torch.ones(c, dtype=pdt)
    yt = F.batch_norm(xt, rm2, rv2, g, b, True, 0.1, 1e-5).to(tdt)
    ref.assert_close(y.double().numpy(), yt.double().numpy(), dtype, what="y vs torch")
    yr = ref.forward_train(x.double().numpy(), g.double().numpy(), b.double().numpy())[0]
    ref.assert_close(y.double().numpy(), yr, dtype, what="y vs reference")
    pname = "float64" if dtype == "float64" else "float32"
    ref.assert_close(rm.numpy(), rm2.numpy(), pname, what="running_mean")
    ref.assert_close(rv.numpy(), rv2.numpy(), pname, what="running_var")
    yi = norma.batch_norm_inference(x, rm, rv, g, b)
    yti = F.batch_norm(xt, rm, rv, g, b, False, 0.1, 1e-5).to(tdt)
    ref.assert_close(yi.double().numpy(), yti.double().numpy(), dtype, what="inference")
    assert yi.stride() == y.stride()


def test_functional_torch_explicit_layout_converts(rng):
    x = torch.from_numpy(rng.standard_normal((2, 3, 7, 7))).float()  # NCHW contiguous
    y, _, _ = norma.batch_norm_forward_training(x, layout="channels_last")
    assert y.is_contiguous(memory_format=torch.channels_last) and not y.is_contiguous()
    y2, _, _ = norma.batch_norm_forward_training(x)
    ref.assert_close(y.numpy(), y2.numpy(), "float32")
    # a 3-D tensor stored [N, L, C]
    x3 = torch.from_numpy(rng.standard_normal((2, 7, 3))).float().transpose(1, 2)
    y3, _, _ = norma.batch_norm_forward_training(x3)
    assert y3.stride() == x3.stride()
    ref.assert_close(y3.numpy(), ref.forward_train(x3.numpy())[0], "float32")
    # a non-dense view falls back to a channels-first copy
    xs = torch.from_numpy(rng.standard_normal((4, 3, 8, 8))).float()[:, :, ::2, ::2]
    ys, _, _ = norma.batch_norm_forward_training(xs)
    assert ys.is_contiguous()
    ref.assert_close(ys.numpy(), ref.forward_train(xs.numpy())[0], "float32")


def test_functional_torch_updates_running_stats_in_place_other_dtype(rng):
    x = torch.from_numpy(rng.standard_normal((4, 3, 5))).to(torch.bfloat16)
    rm = torch.zeros(3, dtype=torch.bfloat16)   # updated through a float32 temporary
    rv = torch.ones(6, dtype=torch.float32)[::2]  # non-contiguous view
    norma.batch_norm_forward_training(x, running_mean=rm, running_var=rv, momentum=1.0)
    _, mean, var, _ = ref.forward_train(x.double().numpy())
    np.testing.assert_allclose(rm.double().numpy(), mean, rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(rv.numpy(), var * 20 / 19, rtol=1e-5)


# ---- folding, moments --------------------------------------------------------------------


def test_bn_fold_and_fold_into_weights(rng):
    c = 17
    g = rng.standard_normal(c).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    mean = rng.standard_normal(c).astype(np.float32)
    var = (rng.random(c) + 0.1).astype(np.float32)
    scale, shift = norma.bn_fold(mean, var, g, b, 1e-3)
    sref = g.astype(np.float64) / np.sqrt(var.astype(np.float64) + 1e-3)
    ref.assert_close(scale, sref, "float32")
    ref.assert_close(shift, b - mean.astype(np.float64) * sref, "float32")
    s1, h1 = norma.bn_fold(mean, var)
    ref.assert_close(s1, 1 / np.sqrt(var.astype(np.float64) + 1e-5), "float32")
    w = rng.standard_normal((c, 3, 3, 3)).astype(np.float32)
    bias = rng.standard_normal(c).astype(np.float32)
    w0, bias0 = w.copy(), bias.copy()
    norma.fold_into_weights(w, bias, mean, var, g, b, 1e-3)
    ref.assert_close(w, w0 * sref[:, None, None, None], "float32")
    ref.assert_close(bias, (bias0 - mean) * sref + b, "float32")
    with pytest.raises(norma.NormaError, match="var"):
        norma.bn_fold(mean, -np.ones(c, np.float32), eps=0.0)


@pytest.mark.parametrize("layout", ["channels_first", "channels_last"])
def test_moments(layout, rng):
    x = rng.standard_normal((5, 17, 7)).astype(np.float32)
    xa = x if layout == "channels_first" else np.ascontiguousarray(np.moveaxis(x, 1, -1))
    count, mean, m2 = norma.moments(xa, layout=layout)
    assert np.all(count == 35)
    x64 = x.astype(np.float64)
    # float32 data are summed in float32 within blocks (block partials in double)
    np.testing.assert_allclose(mean, x64.mean(axis=(0, 2)), rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(m2, ((x64 - x64.mean(axis=(0, 2), keepdims=True)) ** 2)
                               .sum(axis=(0, 2)), rtol=1e-5)


def test_large_mean_backward_keeps_accuracy(rng):
    """norma.h: the backward removes the rounding of a stored mean, so dx and dgamma keep full
    accuracy on data whose mean is large against its spread."""
    x = (1e4 + rng.standard_normal((8, 4, 1024))).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    y, sm, si = norma.batch_norm_forward_training(x, eps=0.0)
    dx, dg, db = norma.batch_norm_backward(dy, x, sm, si, eps=0.0)
    _, mean, var, invstd = ref.forward_train(x, eps=0.0)
    dxr, dgr, dbr, _ = ref.backward(dy, x, mean, invstd)
    ref.assert_close(si, invstd, "float32", what="save_invstd")
    ref.assert_close(dx, dxr, "float32", scale=2, what="dx")
    ref.assert_close(dg, dgr, "float32", scale=math.sqrt(8192), what="dgamma")


def test_variance_accurate_when_first_value_is_an_outlier():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 1, 10 ** 6)).astype(np.float32)
    x[0, 0, 0] = 1000.0
    _, _, si = norma.batch_norm_forward_training(x, eps=0.0)
    _, _, _, invstd = ref.forward_train(x, eps=0.0)
    np.testing.assert_allclose(si, invstd, rtol=1e-5)
