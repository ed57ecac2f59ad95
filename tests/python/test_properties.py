"""Property-based tests of the Python API (hypothesis): random shapes (2-D to 5-D), dtypes
(float32, float64, float16 numpy arrays; float32 / float64 / float16 / bfloat16 torch tensors),
layouts (channels-first, channels-last), strides (non-contiguous views), flags (ReLU, add+ReLU,
biased running variance, CHECK_FINITE, frozen statistics) and data (means far from the spread,
any sign) against the float64 reference of bn_reference.py; results that do not depend on the
thread count or on the input's strides (bitwise); and what must raise.

Run time: about a minute (hypothesis settings below; deadline off: the first call of a shape
may be slow)."""

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

import norma  # noqa: E402
from norma import NormaError  # noqa: E402
import bn_reference as ref  # noqa: E402

torch = pytest.importorskip("torch")

SETTINGS = settings(max_examples=300, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
INVALID = 1
NONFINITE = 4

NP_DTYPES = {"float32": np.float32, "float64": np.float64, "float16": np.float16}
TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
                "bfloat16": torch.bfloat16}


@st.composite
def problems(draw, min_values=2):
    """A BatchNorm input: (case dict).  x64 is the stored data as float64, channels-first."""
    ndim = draw(st.integers(2, 5))
    n = draw(st.integers(1, 4))
    c = draw(st.integers(1, 6))
    spatial = tuple(draw(st.integers(1, 4)) for _ in range(ndim - 2))
    if n * int(np.prod(spatial, dtype=np.int64)) < min_values:
        n = min_values
    kind = draw(st.sampled_from(["numpy", "torch"]))
    dts = ["float32", "float64", "float16"] + (["bfloat16"] if kind == "torch" else [])
    dtype = draw(st.sampled_from(dts))
    layout = draw(st.sampled_from(["channels_first", "channels_last"]))
    strided = draw(st.booleans())
    seed = draw(st.integers(0, 2**32 - 1))
    offset = draw(st.sampled_from([0.0, 1.0, -3.0, 20.0]))
    spread = draw(st.sampled_from([0.5, 1.0, 4.0]))
    rng = np.random.default_rng(seed)
    shape = (n, c) + spatial
    per_ch = offset + rng.uniform(-1, 1, size=c) * abs(offset) * 0.1
    data = per_ch.reshape((1, c) + (1,) * len(spatial)) + spread * rng.standard_normal(shape)
    return dict(shape=shape, kind=kind, dtype=dtype, layout=layout, strided=strided, rng=rng,
                data=data)


def realize(p, data64):
    """The object to pass (in p's kind, dtype, layout, strides), the layout argument, and the
    stored values as float64 channels-first."""
    shape = p["shape"]
    if p["kind"] == "torch":
        t = torch.tensor(data64, dtype=torch.float64).to(TORCH_DTYPES[p["dtype"]])
        if p["layout"] == "channels_last" and t.dim() >= 4:
            t = t.contiguous(memory_format=torch.channels_last if t.dim() == 4
                             else torch.channels_last_3d)
        if p["strided"]:
            big = torch.zeros(shape[:-1] + (2 * shape[-1],), dtype=t.dtype)
            big[..., ::2] = t
            t = big[..., ::2]  # a view with a stride of 2 in the last dimension
            assert not t.is_contiguous() or shape[-1] == 1
        return t, None, t.to(torch.float64).numpy()
    a = data64.astype(NP_DTYPES[p["dtype"]])
    stored = a.astype(np.float64)
    if p["layout"] == "channels_last":
        a = np.ascontiguousarray(np.moveaxis(a, 1, -1))
    if p["strided"]:
        big = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), dtype=a.dtype)
        big[..., ::2] = a
        a = big[..., ::2]
    return a, p["layout"], stored


def to64_cf(obj, p, layout_arg):
    """An output tensor as float64, channels-first logical shape."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to(torch.float64).numpy()
    a = np.asarray(obj, np.float64)
    if layout_arg == "channels_last":
        a = np.moveaxis(a, -1, 1)
    return a


def vec64(v):
    if isinstance(v, torch.Tensor):
        return v.detach().to(torch.float64).numpy()
    return np.asarray(v, np.float64)


def params(p, seed):
    """gamma, beta, running mean / var as arrays of the parameter type (float64 for float64
    data, float32 otherwise), in p's kind."""
    c = p["shape"][1]
    rng = np.random.default_rng(seed)
    pdt = np.float64 if p["dtype"] == "float64" else np.float32
    arrs = [rng.uniform(0.5, 1.5, c), rng.uniform(-1, 1, c), rng.uniform(-0.2, 0.2, c),
            rng.uniform(0.5, 2.0, c)]
    arrs = [a.astype(pdt) for a in arrs]
    if p["kind"] == "torch":
        arrs = [torch.from_numpy(a.copy()) for a in arrs]
    return arrs


def scale_of(a):
    return max(1.0, float(np.max(np.abs(a)))) if a.size else 1.0


@given(problems(), st.booleans(), st.booleans(), st.booleans(), st.integers(0, 1000))
@SETTINGS
def test_forward_training_matches_reference(p, relu, residual, biased, pseed):
    x, lay, x64 = realize(p, p["data"])
    gamma, beta, rm, rv = params(p, pseed)
    rm0, rv0 = vec64(rm).copy(), vec64(rv).copy()
    res = res64 = None
    if residual:
        res, _, res64 = realize(p, p["rng"].standard_normal(p["shape"]))
        relu = True
    x_before = to64_cf(x, p, lay).copy()
    y, sm, si = norma.batch_norm_forward_training(
        x, gamma, beta, eps=1e-5, running_mean=rm, running_var=rv, momentum=0.25, layout=lay,
        relu=relu, residual=res, biased_running_var=biased)
    assert np.array_equal(to64_cf(x, p, lay), x_before, equal_nan=True)  # input untouched
    g64, b64 = vec64(gamma), vec64(beta)
    yr, mean, var, invstd = ref.forward_train(x64, g64, b64, 1e-5, relu, res64)
    name = p["dtype"]
    ref.assert_close(to64_cf(y, p, lay), yr, name, scale_of(yr), "y")
    pname = "float64" if name == "float64" else "float32"
    ref.assert_close(vec64(sm), mean, pname, scale_of(mean), "save_mean")
    ref.assert_close(vec64(si), invstd, pname, scale_of(invstd), "save_invstd")
    m = x64.size // x64.shape[1]
    vr = var if biased else var * m / (m - 1)
    ref.assert_close(vec64(rm), 0.75 * rm0 + 0.25 * mean, pname, scale_of(mean), "running_mean")
    ref.assert_close(vec64(rv), 0.75 * rv0 + 0.25 * vr, pname, scale_of(vr), "running_var")


@given(problems(min_values=1), st.booleans(), st.integers(0, 1000))
@SETTINGS
def test_inference_matches_reference(p, relu, pseed):
    x, lay, x64 = realize(p, p["data"])
    gamma, beta, rm, rv = params(p, pseed)
    y = norma.batch_norm_inference(x, rm, rv, gamma, beta, eps=1e-3, layout=lay, relu=relu)
    yr = ref.forward_infer(x64, vec64(rm), vec64(rv), vec64(gamma), vec64(beta), 1e-3, relu)
    ref.assert_close(to64_cf(y, p, lay), yr, p["dtype"], scale_of(yr), "y")


@given(problems(), st.sampled_from(["none", "relu", "global", "from_y"]), st.integers(0, 1000))
@SETTINGS
def test_backward_matches_reference(p, mode, pseed):
    x, lay, x64 = realize(p, p["data"])
    gamma, beta, _, _ = params(p, pseed)
    relu = mode == "relu"
    y, sm, si = norma.batch_norm_forward_training(x, gamma, beta, layout=lay, relu=relu)
    dy, _, dy64 = realize(p, p["rng"].standard_normal(p["shape"]))
    y_in = y  # in the layout of x already
    mean64, inv64 = vec64(sm), vec64(si)
    if mode == "from_y":
        dx, dg, db = norma.batch_norm_backward(dy, None, sm, si, gamma, beta, y=y_in, layout=lay)
    else:
        dx, dg, db = norma.batch_norm_backward(dy, x, sm, si, gamma, beta, y=y_in, layout=lay,
                                               relu=relu, global_stats=mode == "global")
    y64 = to64_cf(y, p, lay)
    if mode == "from_y":  # x_hat from y: the reference's x is (y - beta) / gamma / invstd + mean
        xh = (y64 - ref._b(vec64(beta), y64.ndim)) / ref._b(vec64(gamma), y64.ndim)
        x_ref = xh / ref._b(inv64, y64.ndim) + ref._b(mean64, y64.ndim)
    else:
        x_ref = x64
    dxr, dgr, dbr, _ = ref.backward(dy64, x_ref, mean64, inv64, vec64(gamma),
                                    y64 if relu else None, global_stats=mode == "global")
    name = p["dtype"]
    # dx scales with gamma * invstd; the sums with the count
    m = x64.size // x64.shape[1]
    lowp = name in ("float16", "bfloat16")
    # 16-bit storage: x_hat (from x and a mean rounded to f32, or from a y rounded to 16 bits)
    # carries a few ulps of the storage type
    # dx is a difference of terms of size gamma * invstd * |dy|: errors scale with those
    dx_scale = max(scale_of(dxr), float(np.max(np.abs(vec64(gamma) * inv64))) *
                   float(np.max(np.abs(dy64))))
    ref.assert_close(to64_cf(dx, p, lay), dxr, name, dx_scale * (4 if lowp else 1), "dx")
    pname = "float64" if name == "float64" else "float32"
    sum_tol = "float32" if name == "float64" else name
    ref.assert_close(vec64(db), dbr, sum_tol, max(scale_of(dbr), np.sqrt(m)), "dbeta")
    ref.assert_close(vec64(dg), dgr, sum_tol if pname == "float32" else "float32",
                     max(scale_of(dgr), np.sqrt(m)) * (4 if lowp else 1), "dgamma")


@given(problems(), st.booleans())
@SETTINGS
def test_moments_match_numpy(p, check):
    x, lay, x64 = realize(p, p["data"])
    count, mean, m2 = norma.moments(x, layout=lay, check_finite=check)
    ax = tuple(i for i in range(x64.ndim) if i != 1)
    m = x64.size // x64.shape[1]
    assert (count == m).all()
    mr = x64.mean(axis=ax)
    m2r = ((x64 - ref._b(mr, x64.ndim)) ** 2).sum(axis=ax)
    ref.assert_close(mean, mr, "float64" if p["dtype"] == "float64" else "float32",
                     scale_of(mr), "mean")
    ref.assert_close(m2, m2r, "float64" if p["dtype"] == "float64" else "float32",
                     scale_of(m2r), "m2")


@given(problems(), st.integers(1, 4))
@SETTINGS
def test_bitwise_independent_of_threads_and_strides(p, threads):
    x, lay, x64 = realize(p, p["data"])
    gamma, beta, _, _ = params(p, 7)
    old = norma.get_num_threads()
    try:
        norma.set_num_threads(1)
        y1, sm1, si1 = norma.batch_norm_forward_training(x, gamma, beta, layout=lay)
        norma.set_num_threads(threads)
        y2, sm2, si2 = norma.batch_norm_forward_training(x, gamma, beta, layout=lay)
    finally:
        norma.set_num_threads(old)
    assert np.array_equal(to64_cf(y1, p, lay), to64_cf(y2, p, lay), equal_nan=True)
    assert np.array_equal(vec64(sm1), vec64(sm2)) and np.array_equal(vec64(si1), vec64(si2))
    # the same data, dense in the layout the binding chose for the view: the same bits
    # (different layouts run different kernels and may differ in the last bits)
    if isinstance(x, torch.Tensor):
        xd, layd, q = x.clone(), None, p  # dense; keeps a channels-last layout
    else:
        q = dict(p, strided=False)
        xd, layd, _ = realize(q, p["data"])
    y3, sm3, _ = norma.batch_norm_forward_training(xd, gamma, beta, layout=layd)
    assert np.array_equal(to64_cf(y1, p, lay), to64_cf(y3, q, layd), equal_nan=True)
    assert np.array_equal(vec64(sm1), vec64(sm3))


@given(problems(), st.sampled_from(["eps_negative", "eps_nan", "nan_checked", "one_value",
                                    "shape_1d", "residual_shape", "dy_dtype", "momentum",
                                    "relu_without_y", "fold_var", "gamma_zero_from_y"]))
@SETTINGS
def test_errors_raise(p, what):
    x, lay, x64 = realize(p, p["data"])
    if what == "eps_negative":
        with pytest.raises(NormaError) as e:
            norma.batch_norm_forward_training(x, eps=-1e-3, layout=lay)
        assert e.value.status == INVALID and "eps" in e.value.detail
    elif what == "eps_nan":
        with pytest.raises(NormaError) as e:
            norma.batch_norm_inference(x, np.zeros(p["shape"][1]), np.ones(p["shape"][1]),
                                       eps=float("nan"), layout=lay)
        assert e.value.status == INVALID
    elif what == "nan_checked":
        bad = p["data"].copy()
        bad.flat[p["rng"].integers(bad.size)] = np.nan
        xb, layb, _ = realize(p, bad)
        with pytest.raises(NormaError) as e:
            norma.batch_norm_forward_training(xb, layout=layb, check_finite=True)
        assert e.value.status == NONFINITE
        # without the check NaN propagates and the call succeeds
        norma.batch_norm_forward_training(xb, layout=layb)
    elif what == "one_value":
        q = dict(p, shape=(1, p["shape"][1]), strided=False, layout="channels_first")
        xo, layo, _ = realize(q, p["data"].reshape(-1)[: p["shape"][1]].reshape(1, -1))
        with pytest.raises(NormaError) as e:
            norma.batch_norm_forward_training(xo, layout=layo)
        assert e.value.status == INVALID and "more than 1 value" in e.value.detail
        norma.batch_norm_inference(xo, np.zeros(q["shape"][1]), np.ones(q["shape"][1]),
                                   layout=layo)  # allowed in inference
    elif what == "shape_1d":
        flat = np.asarray(p["data"], np.float32).reshape(-1)
        with pytest.raises(ValueError):
            norma.batch_norm_forward_training(flat)
    elif what == "residual_shape":
        q = dict(p, shape=(p["shape"][0] + 1,) + p["shape"][1:])
        r, _, _ = realize(q, np.zeros(q["shape"]))
        with pytest.raises(ValueError):
            norma.batch_norm_forward_training(x, layout=lay, relu=True, residual=r)
    elif what == "dy_dtype":
        other = "float64" if p["dtype"] != "float64" else "float32"
        y, sm, si = norma.batch_norm_forward_training(x, layout=lay)
        dy, _, _ = realize(dict(p, dtype=other), np.ones(p["shape"]))
        with pytest.raises(TypeError):
            norma.batch_norm_backward(dy, x, sm, si, layout=lay)
    elif what == "momentum":
        c = p["shape"][1]
        pdt = np.float64 if p["dtype"] == "float64" else np.float32
        rm, rv = np.zeros(c, pdt), np.ones(c, pdt)
        if p["kind"] == "torch":
            rm, rv = torch.from_numpy(rm), torch.from_numpy(rv)
        before = vec64(rm).copy()
        with pytest.raises(NormaError) as e:
            norma.batch_norm_forward_training(x, running_mean=rm, running_var=rv, momentum=1.5,
                                              layout=lay)
        assert e.value.status == INVALID and "momentum" in e.value.detail
        assert np.array_equal(vec64(rm), before)  # nothing written
    elif what == "relu_without_y":
        y, sm, si = norma.batch_norm_forward_training(x, layout=lay, relu=True)
        with pytest.raises(ValueError):
            norma.batch_norm_backward(y, x, sm, si, layout=lay, relu=True)
    elif what == "gamma_zero_from_y":
        gamma, beta, _, _ = params(p, 3)
        y, sm, si = norma.batch_norm_forward_training(x, gamma, beta, layout=lay)
        gamma[p["rng"].integers(p["shape"][1])] = 0
        with pytest.raises(NormaError) as e:
            norma.batch_norm_backward(y, None, sm, si, gamma, beta, y=y, layout=lay)
        assert e.value.status == INVALID and "gamma" in e.value.detail
    elif what == "fold_var":
        c = p["shape"][1]
        var = np.ones(c, np.float32)
        var[p["rng"].integers(c)] = -1.0
        with pytest.raises(NormaError) as e:
            norma.bn_fold(np.zeros(c, np.float32), var, eps=1e-5)
        assert e.value.status == INVALID and "var" in e.value.detail


@given(st.integers(1, 8), st.integers(1, 6), st.sampled_from([0.0, 1e-5, 1.0]),
       st.integers(0, 1000))
@SETTINGS
def test_fold_matches_formula(c, per, eps, seed):
    rng = np.random.default_rng(seed)
    mean = rng.uniform(-2, 2, c).astype(np.float32)
    var = rng.uniform(0.1, 3, c).astype(np.float32)
    gamma = rng.uniform(0.5, 1.5, c).astype(np.float32)
    beta = rng.uniform(-1, 1, c).astype(np.float32)
    scale, shift = norma.bn_fold(mean, var, gamma, beta, eps=eps)
    s = gamma.astype(np.float64) / np.sqrt(var.astype(np.float64) + eps)
    ref.assert_close(scale, s, "float32", 1.0, "scale")
    ref.assert_close(shift, beta - mean.astype(np.float64) * s, "float32", 1.0, "shift")
    w = rng.standard_normal((c, per)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    w0, b0 = w.astype(np.float64), b.astype(np.float64)
    norma.fold_into_weights(w, b, mean, var, gamma, beta, eps=eps)
    ref.assert_close(w, w0 * s[:, None], "float32", scale_of(w0 * s[:, None]), "weight")
    ref.assert_close(b, (b0 - mean) * s + beta, "float32", scale_of(b0 * s), "bias")
