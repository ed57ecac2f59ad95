"""norma-check: the precision of BatchNorm in f16 / bf16 / f32 / f64 against a float64
reference, for norma and (optionally) PyTorch on the same input.

    import norma.check
    r = norma.check.run(shape=(32, 64, 28, 28), op="forward_training", dtypes=("bf16", "f32"),
                        mean=100.0, std=1.0, compare_torch=True)
    print(norma.check.format_table(r))

and the command tools/norma-check (same options; ``--json`` prints this dict).

Method
------
* The input (synthetic, or an array of logical shape [N, C, ...] from a .npy file) is rounded
  once to each storage dtype; the reference is computed in float64 on exactly those rounded
  values (and on the parameters rounded to the parameter type: float32, or float64 for f64
  data), so that the errors reported are those of the computation and of the output's
  rounding, not of the input's.
* Reference (float64, two passes): mean = sum(x) / m; var = sum((x - mean)^2) / m (biased);
  invstd = 1 / sqrt(var + eps); y = (x - mean) * invstd * gamma + beta (then the activation);
  running statistics from momentum and the unbiased variance; backward:
  dbeta = sum(g), dgamma = sum(g * x_hat), dx = gamma * invstd * (g - dbeta / m -
  x_hat * dgamma / m), g = dy masked by y > 0 with an activation.
* Each implementation runs as a user would run it: the backward uses that implementation's own
  forward statistics (save_mean / save_invstd for norma, autograd for torch).

Metrics, per output tensor (y, or dx) and per per-channel output (statistics, dgamma, dbeta):
``normwise`` = ||out - ref||_2 / ||ref||_2; ``max_abs`` and ``mean_abs`` of out - ref;
``max_rel`` = max |out - ref| / |ref| over the elements with |ref| >= 1% of the RMS of ref (the
relative error is meaningless at zeros).  Per-channel outputs are judged by a scaled error per
channel: save_mean / running_mean against max(|mean|, std) of the channel, save_invstd /
running_var against themselves, dbeta / dgamma against the sum of the absolute values of their
terms (``max_scaled``).  For y without activation, per channel: ``mean_drift``
= (mean(y_c) - mean(ref_c)) / |gamma_c| and ``std_drift`` = std(y_c) / std(ref_c) - 1, where
the reference's mean is beta_c and its std is |gamma_c| * sqrt(var_c / (var_c + eps)), i.e.
|gamma_c| unless var_c is comparable to eps.  A channel is "over" the threshold when its
normwise error (over that channel), |mean_drift| or |std_drift| exceeds it.  The default
threshold is 16 units of roundoff of the storage dtype (f64 2^-49, f32 2^-20, f16 2^-7,
bf16 2^-4); ``threshold=`` sets one value for every dtype.
"""

import datetime
import json
import math
import sys

import numpy as np

from . import _core
from . import _lib

__all__ = ["run", "format_table", "make_input", "reference_forward", "reference_backward",
           "DTYPES", "OPS", "DISTS", "default_threshold", "main"]

DTYPES = ("f16", "bf16", "f32", "f64")
OPS = ("forward_training", "inference", "backward")
DISTS = ("normal", "uniform", "outliers")
UNIT_ROUNDOFF = {"f64": 2.0 ** -53, "f32": 2.0 ** -24, "f16": 2.0 ** -11, "bf16": 2.0 ** -8}
_NP = {"f16": np.float16, "f32": np.float32, "f64": np.float64}
_OP_ALIASES = {"fwd": "forward_training", "forward": "forward_training",
               "training": "forward_training", "train": "forward_training",
               "forward_training": "forward_training", "inference": "inference",
               "infer": "inference", "eval": "inference", "forward_inference": "inference",
               "bwd": "backward", "backward": "backward"}


def default_threshold(dtype):
    """16 units of roundoff of the storage dtype."""
    return 16.0 * UNIT_ROUNDOFF[dtype]


def _torch():
    try:
        import torch
        return torch
    except ImportError:
        return None


# ------------------------------------------------------------------------------------------
# Data
# ------------------------------------------------------------------------------------------


def make_input(shape, mean=0.0, std=1.0, dist="normal", seed=0, outlier_fraction=1e-3,
               outlier_scale=100.0):
    """A float64 array of logical shape [N, C, ...]: mean + std * noise, noise of unit variance
    ('normal', 'uniform'), or 'outliers': normal, with a fraction of the values (at least one
    per channel) replaced by mean +- outlier_scale * std."""
    if dist not in DISTS:
        raise ValueError("dist must be one of %s (got %r)" % (DISTS, dist))
    rng = np.random.default_rng(seed)
    shape = tuple(int(s) for s in shape)
    if dist == "uniform":
        z = rng.uniform(-math.sqrt(3.0), math.sqrt(3.0), size=shape)
    else:
        z = rng.standard_normal(size=shape)
    if dist == "outliers":
        c = shape[1]
        per_c = int(math.prod(shape)) // c
        k = max(1, int(round(outlier_fraction * per_c)))
        zc = np.moveaxis(z, 1, 0).reshape(c, per_c)   # a copy: channel-major
        for ch in range(c):
            idx = rng.choice(per_c, size=k, replace=False)
            zc[ch, idx] = outlier_scale * rng.choice([-1.0, 1.0], size=k)
        z = np.moveaxis(zc.reshape((c, shape[0]) + shape[2:]), 0, 1)
    return np.ascontiguousarray(mean + std * z, dtype=np.float64)


def _axes(ndim):
    return (0,) + tuple(range(2, ndim))


def _pshape(ndim):
    return (1, -1) + (1,) * (ndim - 2)


def reference_forward(x, gamma, beta, eps, relu=False, residual=None):
    """float64 two-pass training forward of x [N, C, ...]: (y, mean, var, invstd), var
    biased."""
    x = np.asarray(x, np.float64)
    ax = _axes(x.ndim)
    m = x.size // x.shape[1]
    mean = x.sum(axis=ax) / m
    d = x - mean.reshape(_pshape(x.ndim))
    var = (d * d).sum(axis=ax) / m
    with np.errstate(divide="ignore"):
        invstd = np.where(var + eps > 0, 1.0 / np.sqrt(var + eps), 0.0)
    y = d * (invstd * gamma).reshape(_pshape(x.ndim)) + beta.reshape(_pshape(x.ndim))
    if residual is not None:
        y = np.maximum(y + residual, 0.0)
    elif relu:
        y = np.maximum(y, 0.0)
    return y, mean, var, invstd


def reference_inference(x, gamma, beta, mean, var, eps, relu=False, residual=None):
    x = np.asarray(x, np.float64)
    invstd = 1.0 / np.sqrt(var + eps)
    y = (x - mean.reshape(_pshape(x.ndim))) * (invstd * gamma).reshape(_pshape(x.ndim)) + \
        beta.reshape(_pshape(x.ndim))
    if residual is not None:
        y = np.maximum(y + residual, 0.0)
    elif relu:
        y = np.maximum(y, 0.0)
    return y


def reference_backward(dy, x, gamma, mean, invstd, y=None, relu=False):
    """float64 backward of the training forward: (dx, dgamma, dbeta); with relu (or add+relu)
    g = dy where y > 0."""
    x = np.asarray(x, np.float64)
    ax = _axes(x.ndim)
    m = x.size // x.shape[1]
    g = np.where(y > 0, dy, 0.0) if relu else np.asarray(dy, np.float64)
    xhat = (x - mean.reshape(_pshape(x.ndim))) * invstd.reshape(_pshape(x.ndim))
    dbeta = g.sum(axis=ax)
    dgamma = (g * xhat).sum(axis=ax)
    dx = (gamma * invstd).reshape(_pshape(x.ndim)) * (
        g - (dbeta / m).reshape(_pshape(x.ndim)) - xhat * (dgamma / m).reshape(_pshape(x.ndim)))
    return dx, dgamma, dbeta


# ------------------------------------------------------------------------------------------
# Storage in a dtype and a layout
# ------------------------------------------------------------------------------------------


class _Store:
    """Rounds float64 data to a dtype and lays them out for norma (numpy for f16/f32/f64,
    torch for bf16) or for torch."""

    def __init__(self, dtype, layout, kind):
        self.dtype = dtype
        self.layout = layout      # "channels_first" / "channels_last"
        self.kind = kind          # "norma" / "torch"

    def uses_torch(self):
        return self.kind == "torch" or self.dtype == "bf16"

    def put(self, a64):
        """The stored object (logical [N, C, ...] for torch; numpy in the layout's axis
        order for norma's numpy path)."""
        if self.uses_torch():
            torch = _torch()
            tdt = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32,
                   "f64": torch.float64}[self.dtype]
            t = torch.from_numpy(np.ascontiguousarray(a64)).to(tdt)
            if self.layout == "channels_last":
                if t.dim() == 4:
                    t = t.contiguous(memory_format=torch.channels_last)
                elif t.dim() == 5:
                    t = t.contiguous(memory_format=torch.channels_last_3d)
                elif t.dim() == 3 and self.kind == "norma":
                    t = t.permute(0, 2, 1).contiguous().permute(0, 2, 1)
            return t
        a = np.asarray(a64).astype(_NP[self.dtype])
        if self.layout == "channels_last" and a.ndim > 2:
            a = np.ascontiguousarray(np.moveaxis(a, 1, -1))
        return a

    def get(self, obj):
        """float64 numpy array of logical shape [N, C, ...] from a stored object."""
        torch = sys.modules.get("torch")   # a torch tensor exists only if torch is loaded
        if torch is not None and isinstance(obj, torch.Tensor):
            return obj.detach().to(torch.float64).contiguous().numpy()
        a = np.asarray(obj)
        if self.layout == "channels_last" and a.ndim > 2:
            a = np.moveaxis(a, -1, 1)
        return np.ascontiguousarray(a, dtype=np.float64)

    def norma_layout(self):
        return self.layout

    def param_dtype(self):
        return np.float64 if self.dtype == "f64" else np.float32


# ------------------------------------------------------------------------------------------
# Metrics
# ------------------------------------------------------------------------------------------


def _finite(v):
    v = float(v)
    return v if math.isfinite(v) else (None if math.isnan(v) else
                                       (1e308 if v > 0 else -1e308))


def _tensor_metrics(out, ref):
    e = out - ref
    nref = float(np.sqrt((ref * ref).sum()))
    ne = float(np.sqrt((e * e).sum()))
    rms = nref / math.sqrt(max(ref.size, 1))
    mask = np.abs(ref) >= 0.01 * rms if rms > 0 else np.zeros(ref.shape, bool)
    max_rel = float((np.abs(e[mask]) / np.abs(ref[mask])).max()) if mask.any() else 0.0
    finite = bool(np.isfinite(out).all())
    return {
        "normwise": _finite(ne / nref) if nref > 0 else _finite(ne),
        "max_abs": _finite(np.abs(e).max()) if e.size else 0.0,
        "mean_abs": _finite(np.abs(e).mean()) if e.size else 0.0,
        "max_rel": _finite(max_rel),
        "finite": finite,
    }


def _per_channel(out, ref, ax):
    e = out - ref
    ne = np.sqrt((e * e).sum(axis=ax))
    nr = np.sqrt((ref * ref).sum(axis=ax))
    with np.errstate(divide="ignore", invalid="ignore"):
        err = np.where(nr > 0, ne / nr, ne)
    return err


def _drifts(y, ref, gamma, ax):
    with np.errstate(divide="ignore", invalid="ignore"):
        ag = np.abs(gamma)
        mean_drift = (y.mean(axis=ax) - ref.mean(axis=ax)) / np.where(ag > 0, ag, 1.0)
        sr = ref.std(axis=ax)
        std_drift = np.where(sr > 0, y.std(axis=ax) / sr - 1.0, y.std(axis=ax))
    return mean_drift, std_drift


def _output_entry(out, ref, threshold, gamma=None, drift=False, scale=None):
    """Metrics of one output; out/ref are float64 arrays ([N, C, ...] or [C]).  For a
    per-channel output, `scale` [C] is the magnitude its error is measured against (see
    _channel_scales)."""
    entry = _tensor_metrics(out, ref)
    if out.ndim >= 2:
        ax = _axes(out.ndim)
        err = _per_channel(out, ref, ax)
        worst = err.copy()
        pc = {"normwise": [_finite(v) for v in err]}
        if drift:
            md, sd = _drifts(out, ref, gamma, ax)
            pc["mean_drift"] = [_finite(v) for v in md]
            pc["std_drift"] = [_finite(v) for v in sd]
            entry["max_mean_drift"] = _finite(np.abs(md).max())
            entry["max_std_drift"] = _finite(np.abs(sd).max())
            worst = np.maximum(worst, np.maximum(np.abs(md), np.abs(sd)))
    else:
        if scale is None:
            scale = np.abs(ref)
        with np.errstate(divide="ignore", invalid="ignore"):
            worst = np.where(scale > 0, np.abs(out - ref) / scale, np.abs(out - ref))
        pc = {"scaled_error": [_finite(v) for v in worst]}
        entry["max_scaled"] = _finite(worst.max()) if worst.size else 0.0
    worst = np.where(np.isnan(worst), np.inf, worst)
    over = [int(i) for i in np.nonzero(worst > threshold)[0]]
    entry["channels_over"] = over
    entry["worst_channel"] = int(np.argmax(worst)) if worst.size else None
    entry["worst_channel_error"] = _finite(worst.max()) if worst.size else 0.0
    entry["per_channel"] = pc
    return entry


def _channel_scales(x, dy, mean, var, invstd, gamma, momentum, op, act_mask=None):
    """The magnitude each per-channel output's error is measured against: a mean against the
    larger of its magnitude and the channel's standard deviation (a stored mean cannot be more
    exact than its own rounding, nor needs to be much more exact than the spread it is
    subtracted from), invstd and variances against themselves, the sums dbeta = sum(g) and
    dgamma = sum(g * x_hat) against the sums of the absolute values of their terms (the scale
    of their rounding; the sums themselves may be ~0)."""
    mscale = np.maximum(np.sqrt(var), np.abs(mean))
    sc = {"save_mean": mscale, "running_mean": momentum * mscale,
          "save_invstd": np.abs(invstd)}
    if op == "backward":
        ax = _axes(x.ndim)
        mean = x.mean(axis=ax)
        g = np.asarray(dy) if act_mask is None else np.where(act_mask, dy, 0.0)
        xhat = (x - mean.reshape(_pshape(x.ndim))) * invstd.reshape(_pshape(x.ndim))
        sc["dbeta"] = np.abs(g).sum(axis=ax)
        sc["dgamma"] = np.abs(g * xhat).sum(axis=ax)
    return sc


# ------------------------------------------------------------------------------------------
# Running one implementation
# ------------------------------------------------------------------------------------------


def _run_norma(case, dtype, data):
    """Returns {name: float64 array} of norma's outputs for case on data (dict of rounded
    float64 arrays), plus the plan."""
    st = _Store(dtype, case["layout"], "norma")
    if st.uses_torch() and _torch() is None:
        raise RuntimeError("bfloat16 needs PyTorch (numpy has no bfloat16)")
    pdt = st.param_dtype()
    x = st.put(data["x"])
    gamma = data["gamma"].astype(pdt)
    beta = data["beta"].astype(pdt)
    lay = st.norma_layout() if (not st.uses_torch() or data["x"].ndim == 3) else None
    res = st.put(data["residual"]) if case["add_relu"] else None
    relu = case["relu"] or case["add_relu"]
    out = {}
    op = case["op"]
    plan = _core.query_plan(x, "backward" if op == "backward" else op, layout=lay,
                            relu=case["relu"] and not case["add_relu"],
                            add_relu=case["add_relu"], eps=case["eps"])
    if op == "inference":
        y = _core.batch_norm_inference(x, data["run_mean"].astype(pdt),
                                       data["run_var"].astype(pdt), gamma, beta, case["eps"],
                                       layout=lay, relu=relu, residual=res)
        out["y"] = st.get(y)
        return out, plan
    rm = np.zeros(data["x"].shape[1], pdt)
    rv = np.ones(data["x"].shape[1], pdt)
    y, sm, si = _core.batch_norm_forward_training(x, gamma, beta, case["eps"], rm, rv,
                                                  case["momentum"], layout=lay, relu=relu,
                                                  residual=res)
    if op == "forward_training":
        out["y"] = st.get(y)
        out["save_mean"] = np.asarray(sm, np.float64)
        out["save_invstd"] = np.asarray(si, np.float64)
        out["running_mean"] = rm.astype(np.float64)
        out["running_var"] = rv.astype(np.float64)
        return out, plan
    dy = st.put(data["dy"])
    r = _core.batch_norm_backward(dy, x, sm, si, gamma, beta, y=y if relu else None,
                                  eps=case["eps"], layout=lay, relu=case["relu"] and not
                                  case["add_relu"], add_relu=case["add_relu"])
    out["dx"] = st.get(r[0])
    out["dgamma"] = np.asarray(r[1], np.float64)
    out["dbeta"] = np.asarray(r[2], np.float64)
    return out, plan


def _run_torch(case, dtype, data):
    torch = _torch()
    if torch is None:
        raise RuntimeError("PyTorch is not installed")
    import torch.nn.functional as F
    st = _Store(dtype, case["layout"], "torch")
    pt = torch.float64 if dtype == "f64" else torch.float32
    x = st.put(data["x"])
    gamma = torch.from_numpy(data["gamma"]).to(pt)
    beta = torch.from_numpy(data["beta"]).to(pt)
    res = st.put(data["residual"]) if case["add_relu"] else None
    op = case["op"]
    out = {}

    def act(y):
        if res is not None:
            return torch.relu(y + res)
        return torch.relu(y) if case["relu"] else y

    if op == "inference":
        with torch.no_grad():
            y = act(F.batch_norm(x, torch.from_numpy(data["run_mean"]).to(pt),
                                 torch.from_numpy(data["run_var"]).to(pt), gamma, beta, False,
                                 0.0, case["eps"]))
        out["y"] = st.get(y)
        return out, None
    rm = torch.zeros(x.shape[1], dtype=pt)
    rv = torch.ones(x.shape[1], dtype=pt)
    xg = x.detach().requires_grad_(op == "backward")
    gamma.requires_grad_(op == "backward")
    beta.requires_grad_(op == "backward")
    with torch.set_grad_enabled(op == "backward"):
        y = act(F.batch_norm(xg, rm, rv, gamma, beta, True, case["momentum"], case["eps"]))
    if op == "forward_training":
        out["y"] = st.get(y)
        out["running_mean"] = rm.double().numpy()
        out["running_var"] = rv.double().numpy()
        return out, None
    y.backward(st.put(data["dy"]))
    out["dx"] = st.get(xg.grad)
    out["dgamma"] = gamma.grad.double().numpy()
    out["dbeta"] = beta.grad.double().numpy()
    return out, None


# ------------------------------------------------------------------------------------------
# The check
# ------------------------------------------------------------------------------------------


def _rounded(a64, dtype):
    """a64 rounded to dtype, back in float64."""
    if dtype == "bf16":
        torch = _torch()
        if torch is None:
            raise RuntimeError("bfloat16 needs PyTorch (numpy has no bfloat16)")
        return torch.from_numpy(np.ascontiguousarray(a64)).to(torch.bfloat16).double().numpy()
    return np.asarray(a64).astype(_NP[dtype]).astype(np.float64)


def _parse_shape(shape):
    if isinstance(shape, str):
        shape = [int(s) for s in shape.replace("x", ",").split(",") if s.strip()]
    shape = tuple(int(s) for s in shape)
    if len(shape) < 2 or len(shape) > 5 or min(shape) < 1:
        raise ValueError("shape must have 2 to 5 positive dimensions [N, C, ...] (got %s)"
                         % (shape,))
    return shape


def run(shape=None, op="forward_training", dtypes=("f16", "bf16", "f32"),
        layout="channels_first", input=None, mean=0.0, std=1.0, dist="normal", seed=0,
        eps=1e-5, momentum=0.1, relu=False, add_relu=False, affine="random",
        compare_torch=False, threshold=None, inject=None, outlier_fraction=1e-3,
        outlier_scale=100.0):
    """Runs the check; returns a JSON-serializable dict (see format_table and the module
    docstring).

    shape      [N, C, ...] of synthetic data (mean + std * noise of `dist`, seeded), or
    input      an array (or the path of a .npy file) of logical shape [N, C, ...]
    op         'forward_training', 'inference' (with the data's own statistics as the running
               statistics, rounded to the parameter type) or 'backward' (dy: standard normal)
    dtypes     any of 'f16', 'bf16', 'f32', 'f64'
    layout     'channels_first' or 'channels_last' (the memory layout the libraries run in)
    relu, add_relu   the fused activation (add_relu: a standard normal residual)
    affine     'random' (gamma in [0.5, 1.5], beta standard normal, seeded) or 'identity'
    threshold  one value for every dtype; default 16 units of roundoff of each dtype
    inject     (channel, rel): multiplies norma's main output of that channel by (1 + rel)
               after the call: a simulated kernel bug, to test the checker itself
    """
    op = _OP_ALIASES.get(op, op)
    if op not in OPS:
        raise ValueError("op must be one of %s (got %r)" % (OPS, op))
    layout = {"nchw": "channels_first", "ncdhw": "channels_first", "first": "channels_first",
              "nhwc": "channels_last", "ndhwc": "channels_last", "last": "channels_last"}.get(
                  str(layout).lower(), str(layout).lower())
    if layout not in ("channels_first", "channels_last"):
        raise ValueError("layout must be channels_first or channels_last (got %r)" % layout)
    dtypes = [dtypes] if isinstance(dtypes, str) else list(dtypes)
    for d in dtypes:
        if d not in DTYPES:
            raise ValueError("dtype must be one of %s (got %r)" % (DTYPES, d))
    if relu and add_relu:
        raise ValueError("relu and add_relu are exclusive")

    if input is not None:
        source = input if isinstance(input, str) else "array"
        x64 = np.load(input) if isinstance(input, str) else np.asarray(input)
        x64 = np.ascontiguousarray(x64, dtype=np.float64)
        _parse_shape(x64.shape)
        inp = {"source": source}
    else:
        if shape is None:
            raise ValueError("give shape (synthetic data) or input")
        shape = _parse_shape(shape)
        x64 = make_input(shape, mean, std, dist, seed, outlier_fraction, outlier_scale)
        inp = {"source": "synthetic", "dist": dist, "mean": mean, "std": std, "seed": seed}
        if dist == "outliers":
            inp.update(outlier_fraction=outlier_fraction, outlier_scale=outlier_scale)
    shape = tuple(x64.shape)
    c = shape[1]
    if op != "inference" and x64.size // c < 2:
        raise ValueError("training needs more than one value per channel (N * spatial >= 2)")
    inp.update(data_mean=_finite(x64.mean()), data_std=_finite(x64.std()),
               data_min=_finite(x64.min()), data_max=_finite(x64.max()))
    rng = np.random.default_rng(seed + 1)
    if affine == "identity":
        gamma64, beta64 = np.ones(c), np.zeros(c)
    elif affine == "random":
        gamma64, beta64 = rng.uniform(0.5, 1.5, c), rng.standard_normal(c)
    else:
        raise ValueError("affine must be 'random' or 'identity' (got %r)" % (affine,))
    residual64 = rng.standard_normal(shape) if add_relu else None
    dy64 = rng.standard_normal(shape) if op == "backward" else None
    act = relu or add_relu

    result = {
        "tool": "norma-check",
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "library": _lib.library_path(),
        "version": _core.version(),
        "isa": _core.get_isa(),
        "threads": _core.get_num_threads(),
        "op": op, "shape": list(shape), "layout": layout, "eps": eps, "momentum": momentum,
        "relu": bool(relu), "add_relu": bool(add_relu), "affine": affine, "input": inp,
        "reference": "float64 two-pass on the inputs rounded to each dtype",
        "thresholds": {d: (threshold if threshold is not None else default_threshold(d))
                       for d in dtypes},
        "results": [],
    }
    impls = ["norma"] + (["torch"] if compare_torch else [])
    for dtype in dtypes:
        thr = result["thresholds"][dtype]
        pdt = np.float64 if dtype == "f64" else np.float32
        try:
            xq = _rounded(x64, dtype)
            resq = _rounded(residual64, dtype) if add_relu else None
            dyq = _rounded(dy64, dtype) if dy64 is not None else None
        except RuntimeError as e:
            for impl in impls:
                result["results"].append({"impl": impl, "dtype": dtype, "status": "unsupported",
                                          "error": str(e)})
            continue
        gamma = gamma64.astype(pdt).astype(np.float64)
        beta = beta64.astype(pdt).astype(np.float64)
        data = {"x": xq, "gamma": gamma, "beta": beta, "residual": resq, "dy": dyq}
        ref = {}
        yref, bmean, bvar, binv = reference_forward(xq, gamma, beta, eps, relu, resq)
        m = xq.size // c
        if op == "inference":
            run_mean = bmean.astype(pdt).astype(np.float64)
            run_var = bvar.astype(pdt).astype(np.float64)
            data.update(run_mean=run_mean, run_var=run_var)
            ref["y"] = reference_inference(xq, gamma, beta, run_mean, run_var, eps, relu, resq)
        elif op == "forward_training":
            ref["y"] = yref
            ref["save_mean"] = bmean
            ref["save_invstd"] = binv
            ref["running_mean"] = momentum * bmean
            ref["running_var"] = (1 - momentum) + momentum * bvar * m / (m - 1)
        else:
            dx, dg, db = reference_backward(dyq, xq, gamma, bmean, binv, yref, act)
            ref.update(dx=dx, dgamma=dg, dbeta=db)
        scales = _channel_scales(xq, dyq, bmean, bvar, binv, gamma, momentum, op,
                                 (yref > 0) if act else None)
        case = {"op": op, "layout": layout, "eps": eps, "momentum": momentum,
                "relu": bool(relu), "add_relu": bool(add_relu)}
        for impl in impls:
            entry = {"impl": impl, "dtype": dtype, "threshold": thr}
            try:
                outs, plan = (_run_norma if impl == "norma" else _run_torch)(case, dtype, data)
            except Exception as e:  # unsupported dtype in torch, a NormaError...
                entry.update(status="unsupported" if impl == "torch" else "error",
                             error="%s: %s" % (type(e).__name__, e))
                result["results"].append(entry)
                continue
            if plan is not None:
                entry["plan"] = plan
            main_out = "dx" if op == "backward" else "y"
            if impl == "norma" and inject is not None:
                ch, rel = inject
                o = outs[main_out]
                o[:, int(ch)] = o[:, int(ch)] * (1.0 + float(rel))
                entry["injected"] = {"channel": int(ch), "rel": float(rel)}
            entry["status"] = "ok"
            entry["outputs"] = {}
            for name, val in outs.items():
                entry["outputs"][name] = _output_entry(
                    val, ref[name], thr, gamma, drift=(name == "y" and not act),
                    scale=scales.get(name))
            over = sorted({ch for o in entry["outputs"].values() for ch in o["channels_over"]})
            entry["channels_over"] = over
            entry["worst"] = max(o["worst_channel_error"] or 0.0
                                 for o in entry["outputs"].values())
            entry["pass"] = not over and all(o["finite"] for o in entry["outputs"].values())
            result["results"].append(entry)
    return result


# ------------------------------------------------------------------------------------------
# Output
# ------------------------------------------------------------------------------------------


def _g(v):
    if v is None:
        return "nan"
    if v == 0:
        return "0"
    return "%.2e" % v


def format_table(result, max_channels=8):
    """The human-readable report of run()'s result."""
    r = result
    lines = []
    inp = r["input"]
    if inp["source"] == "synthetic":
        src = "%s(mean=%g, std=%g) seed %d" % (inp["dist"], inp["mean"], inp["std"], inp["seed"])
    else:
        src = inp["source"]
    flags = " relu" if r["relu"] else (" add+relu" if r["add_relu"] else "")
    lines.append("norma-check: %s%s [%s] %s eps=%g momentum=%g, input %s" % (
        r["op"], flags, ",".join(str(s) for s in r["shape"]), r["layout"], r["eps"],
        r["momentum"], src))
    lines.append("  data: mean %.4g std %.4g min %.4g max %.4g" % (
        inp["data_mean"], inp["data_std"], inp["data_min"], inp["data_max"]))
    lines.append("  libnorma %s (%s, %d threads) %s" % (r["version"], r["isa"], r["threads"],
                                                        r["library"]))
    lines.append("  reference: %s" % r["reference"])
    lines.append("  worst_ch: the largest per-channel error (normwise over the channel; for "
                 "per-channel outputs scaled, see norma.check); drift: per-channel mean and std "
                 "of y against beta and |gamma|")
    lines.append("")
    hdr = ("%-12s %-5s %-6s %9s %9s %9s %9s %9s %10s %10s  %s" % (
        "output", "dtype", "impl", "normwise", "max_abs", "mean_abs", "max_rel", "worst_ch",
        "mean_drift", "std_drift", "channels over threshold"))
    lines.append(hdr)
    lines.append("-" * len(hdr))
    by_dtype = {}
    for e in r["results"]:
        by_dtype.setdefault(e["dtype"], []).append(e)
    notes = []
    for dtype, entries in by_dtype.items():
        names = []
        for e in entries:
            for n in e.get("outputs", {}):
                if n not in names:
                    names.append(n)
        for name in names:
            for e in entries:
                if e["status"] != "ok" or name not in e["outputs"]:
                    continue
                o = e["outputs"][name]
                over = o["channels_over"]
                if over:
                    shown = ",".join(str(c) for c in over[:max_channels])
                    more = "" if len(over) <= max_channels else ",... (%d)" % len(over)
                    ov = "%d > %s: %s%s" % (len(over), _g(e["threshold"]), shown, more)
                else:
                    ov = "0 (threshold %s)" % _g(e["threshold"])
                if not o["finite"]:
                    ov += "  NON-FINITE"
                lines.append("%-12s %-5s %-6s %9s %9s %9s %9s %9s %10s %10s  %s" % (
                    name, dtype, e["impl"], _g(o["normwise"]), _g(o["max_abs"]),
                    _g(o["mean_abs"]), _g(o["max_rel"]), _g(o["worst_channel_error"]),
                    _g(o["max_mean_drift"]) if "max_mean_drift" in o else "-",
                    _g(o["max_std_drift"]) if "max_std_drift" in o else "-", ov))
        for e in entries:
            if e["status"] != "ok":
                notes.append("%s %s: %s (%s)" % (dtype, e["impl"], e["status"], e["error"]))
            elif e.get("injected"):
                notes.append("%s norma: injected error %+g in channel %d" % (
                    dtype, e["injected"]["rel"], e["injected"]["channel"]))
        lines.append("")
    plans = [(e["dtype"], e["plan"]) for e in r["results"] if e.get("plan")]
    if plans:
        d, p = plans[0]
        lines.append("norma plan (%s): %d DRAM pass(es), %s schedule, %d thread(s), isa %s%s" % (
            d, p["dram_passes"], "fused" if p["fused"] else "split", p["threads"], p["isa"],
            ", streaming stores" if p["streaming_stores"] else ""))
    for n in notes:
        lines.append("note: " + n)
    verdict = [("%s %s" % (e["dtype"], e["impl"]), e.get("pass")) for e in r["results"]
               if e["status"] == "ok"]
    lines.append("within threshold: " + ", ".join(
        "%s %s" % (k, "yes" if v else "NO") for k, v in verdict))
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------


def _parser():
    import argparse
    p = argparse.ArgumentParser(
        prog="norma-check",
        description="Precision of BatchNorm (norma, and PyTorch with --compare-torch) in f16 / "
                    "bf16 / f32 / f64 against a float64 two-pass reference, on synthetic data or "
                    "a .npy file.",
        epilog="Examples:\n"
               "  norma-check --shape 32,64,28,28 --mean 100 --std 1 --compare-torch\n"
               "  norma-check --op backward --shape 16,32,14,14 --layout channels_last "
               "--dtypes bf16,f32\n"
               "  norma-check --input activations.npy --dtypes f16,f32 --json\n"
               "Exit status: 0, or 1 with --strict when a norma result is over the threshold.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--shape", help="synthetic data of shape N,C[,H[,W[,D]]] (logical "
                                     "[N, C, spatial...])")
    src.add_argument("--input", help=".npy file, logical shape [N, C, ...] (any float dtype)")
    p.add_argument("--op", default="forward_training",
                   help="forward_training (fwd), inference, backward (bwd); default fwd")
    p.add_argument("--dtypes", default="f16,bf16,f32",
                   help="comma-separated list of f16, bf16, f32, f64 (default f16,bf16,f32)")
    p.add_argument("--layout", default="channels_first",
                   help="channels_first (nchw) or channels_last (nhwc)")
    p.add_argument("--mean", type=float, default=0.0, help="synthetic data mean (default 0)")
    p.add_argument("--std", type=float, default=1.0, help="synthetic data std (default 1)")
    p.add_argument("--dist", default="normal", choices=DISTS,
                   help="synthetic noise: normal, uniform, outliers (normal plus a fraction of "
                        "values at +-outlier-scale * std)")
    p.add_argument("--outlier-fraction", type=float, default=1e-3)
    p.add_argument("--outlier-scale", type=float, default=100.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eps", type=float, default=1e-5)
    p.add_argument("--momentum", type=float, default=0.1)
    act = p.add_mutually_exclusive_group()
    act.add_argument("--relu", action="store_true", help="fused ReLU")
    act.add_argument("--add-relu", action="store_true", help="fused residual add + ReLU")
    p.add_argument("--affine", default="random", choices=("random", "identity"),
                   help="gamma/beta: random (seeded) or 1/0")
    p.add_argument("--threshold", type=float, default=None,
                   help="flag channels whose error exceeds this (default: 16 units of "
                        "roundoff of each dtype)")
    p.add_argument("--compare-torch", action="store_true",
                   help="also run PyTorch's CPU BatchNorm on the same data")
    p.add_argument("--threads", type=int, default=0, help="norma threads (default: library's)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--per-channel", action="store_true",
                   help="keep the per-channel arrays in the JSON (dropped by default)")
    p.add_argument("--strict", action="store_true",
                   help="exit status 1 when a norma result is over the threshold")
    p.add_argument("--inject", default=None, metavar="CHANNEL:REL",
                   help="testing the checker: scale norma's y (dx) of CHANNEL by 1+REL")
    return p


def main(argv=None):
    args = _parser().parse_args(argv)
    if args.threads:
        _core.set_num_threads(args.threads)
    inject = None
    if args.inject:
        ch, rel = args.inject.split(":")
        inject = (int(ch), float(rel))
    try:
        result = run(shape=args.shape, op=args.op, dtypes=[d.strip() for d in
                                                           args.dtypes.split(",") if d.strip()],
                     layout=args.layout, input=args.input, mean=args.mean, std=args.std,
                     dist=args.dist, seed=args.seed, eps=args.eps, momentum=args.momentum,
                     relu=args.relu, add_relu=args.add_relu, affine=args.affine,
                     compare_torch=args.compare_torch, threshold=args.threshold, inject=inject,
                     outlier_fraction=args.outlier_fraction, outlier_scale=args.outlier_scale)
    except (ValueError, OSError) as e:
        print("norma-check: error: %s" % e, file=sys.stderr)
        return 2
    if args.json:
        if not args.per_channel:
            for e in result["results"]:
                for o in e.get("outputs", {}).values():
                    o.pop("per_channel", None)
        print(json.dumps(result, indent=1))
    else:
        print(format_table(result))
    if args.strict and any(e["impl"] == "norma" and (e["status"] != "ok" or not e["pass"])
                           for e in result["results"]):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
