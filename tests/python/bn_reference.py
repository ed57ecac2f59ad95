"""Float64 numpy reference of BatchNorm (channels-first arrays), written from the formulas of
include/norma.h, and the tolerances used by the tests."""

import numpy as np

# (rtol, atol) per storage dtype name, for O(1) outputs
TOL = {
    "float64": (1e-10, 1e-10),
    "float32": (1e-5, 2e-5),
    "float16": (2e-3, 2e-3),    # one f16 ulp (2^-10 relative) plus a little
    "bfloat16": (1.6e-2, 1e-2),  # two bf16 ulps (2^-7 relative)
}


def _axes(x):
    return tuple(i for i in range(x.ndim) if i != 1)


def _b(v, ndim):
    return v.reshape([1, -1] + [1] * (ndim - 2))


def forward_train(x, gamma=None, beta=None, eps=1e-5, relu=False, residual=None):
    """Returns y, mean, biased var, invstd (float64)."""
    x = np.asarray(x, np.float64)
    c = x.shape[1]
    gamma = np.ones(c) if gamma is None else np.asarray(gamma, np.float64)
    beta = np.zeros(c) if beta is None else np.asarray(beta, np.float64)
    ax = _axes(x)
    mean = x.mean(axis=ax)
    var = ((x - _b(mean, x.ndim)) ** 2).mean(axis=ax)
    invstd = 1.0 / np.sqrt(var + eps)
    y = (x - _b(mean, x.ndim)) * _b(invstd * gamma, x.ndim) + _b(beta, x.ndim)
    if residual is not None:
        y = np.maximum(y + np.asarray(residual, np.float64), 0.0)
    elif relu:
        y = np.maximum(y, 0.0)
    return y, mean, var, invstd


def forward_infer(x, mean, var, gamma=None, beta=None, eps=1e-5, relu=False, residual=None):
    x = np.asarray(x, np.float64)
    c = x.shape[1]
    gamma = np.ones(c) if gamma is None else np.asarray(gamma, np.float64)
    beta = np.zeros(c) if beta is None else np.asarray(beta, np.float64)
    invstd = 1.0 / np.sqrt(np.asarray(var, np.float64) + eps)
    y = (x - _b(np.asarray(mean, np.float64), x.ndim)) * _b(invstd * gamma, x.ndim) + \
        _b(beta, x.ndim)
    if residual is not None:
        y = np.maximum(y + np.asarray(residual, np.float64), 0.0)
    elif relu:
        y = np.maximum(y, 0.0)
    return y


def backward(dy, x, mean, invstd, gamma=None, y=None, global_stats=False):
    """dx, dgamma, dbeta, g (the masked dy: pass y for the ReLU mask)."""
    dy = np.asarray(dy, np.float64)
    x = np.asarray(x, np.float64)
    c = x.shape[1]
    gamma = np.ones(c) if gamma is None else np.asarray(gamma, np.float64)
    g = dy if y is None else np.where(np.asarray(y, np.float64) > 0, dy, 0.0)
    ax = _axes(x)
    m = x.size // c
    xhat = (x - _b(mean, x.ndim)) * _b(invstd, x.ndim)
    dbeta = g.sum(axis=ax)
    dgamma = (g * xhat).sum(axis=ax)
    if global_stats:
        dx = _b(gamma * invstd, x.ndim) * g
    else:
        dx = _b(gamma * invstd, x.ndim) * (g - _b(dbeta / m, x.ndim) - xhat * _b(dgamma / m,
                                                                                 x.ndim))
    return dx, dgamma, dbeta, g


def assert_close(got, want, dtype_name, scale=1.0, what=""):
    """Every element: |got - want| <= atol * scale + rtol * |want|."""
    rtol, atol = TOL[dtype_name]
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    assert got.shape == want.shape, "%s: shape %s != %s" % (what, got.shape, want.shape)
    err = np.abs(got - want)
    lim = atol * scale + rtol * np.abs(want)
    bad = ~(err <= lim)
    if bad.any():
        i = np.unravel_index(np.argmax(np.where(bad, err - lim, -np.inf)), got.shape)
        raise AssertionError(
            "%s (%s): %d of %d elements out of tolerance; worst at %s: got %r, want %r "
            "(rtol %g, atol %g)" % (what, dtype_name, int(bad.sum()), got.size, i, got[i],
                                     want[i], rtol, atol * scale))
