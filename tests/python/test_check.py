"""norma-check (python/norma/check.py and the command tools/norma-check): the float64
reference itself, the metrics, that it detects errors (an injected one; bf16 vs f32 vs f64),
the command line (table, --json fields, --input file.npy, --strict, argument errors) and the
side-by-side PyTorch comparison."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import norma.check as nc
from conftest import REPO

TOOL = os.path.join(REPO, "tools", "norma-check")


def _cli(*args, check=True):
    r = subprocess.run([sys.executable, TOOL] + [str(a) for a in args], capture_output=True,
                       text=True, timeout=120)
    if check:
        assert r.returncode == 0, (r.returncode, r.stdout[-3000:], r.stderr[-3000:])
    return r


def _entry(result, impl, dtype):
    [e] = [e for e in result["results"] if e["impl"] == impl and e["dtype"] == dtype]
    return e


# ------------------------------------------------------------------------------------------
# the reference
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(6, 3), (4, 3, 7), (3, 4, 5, 6), (2, 3, 2, 3, 4)])
def test_reference_matches_torch_float64_autograd(shape):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape) * 3 + 5
    dy = rng.standard_normal(shape)
    c = shape[1]
    gamma, beta = rng.uniform(0.5, 1.5, c), rng.standard_normal(c)
    y, mean, var, invstd = nc.reference_forward(x, gamma, beta, 1e-5)
    dx, dg, db = nc.reference_backward(dy, x, gamma, mean, invstd)
    xt = torch.tensor(x, requires_grad=True)
    gt = torch.tensor(gamma, requires_grad=True)
    bt = torch.tensor(beta, requires_grad=True)
    yt = torch.nn.functional.batch_norm(xt, None, None, gt, bt, True, 0.1, 1e-5)
    yt.backward(torch.tensor(dy))
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dg, gt.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(db, bt.grad.numpy(), rtol=1e-10, atol=1e-12)
    # the drift definition: y has mean beta and std |gamma| sqrt(var / (var + eps))
    ax = (0,) + tuple(range(2, len(shape)))
    np.testing.assert_allclose(y.mean(axis=ax), beta, atol=1e-12)
    np.testing.assert_allclose(y.std(axis=ax), np.abs(gamma) * np.sqrt(var / (var + 1e-5)),
                               rtol=1e-12)


def test_reference_two_pass_keeps_large_mean_variance():
    x = 1e8 + np.random.default_rng(1).standard_normal((64, 2, 8))
    _, mean, var, _ = nc.reference_forward(x, np.ones(2), np.zeros(2), 0.0)
    naive = (x * x).mean(axis=(0, 2)) - x.mean(axis=(0, 2)) ** 2   # E[x^2] - E[x]^2
    exact = x.var(axis=(0, 2))
    np.testing.assert_allclose(var, exact, rtol=1e-9)
    assert np.abs(naive - exact).max() > 1e-3   # what a one-pass formula would lose


def test_synthetic_distributions():
    for dist in nc.DISTS:
        x = nc.make_input((64, 3, 16, 16), mean=5.0, std=2.0, dist=dist, seed=3)
        assert x.shape == (64, 3, 16, 16) and x.dtype == np.float64
        assert abs(x.mean() - 5.0) < 0.2, dist
        if dist != "outliers":
            assert abs(x.std() - 2.0) < 0.05, dist
    o = nc.make_input((64, 3, 16, 16), mean=0.0, std=1.0, dist="outliers", seed=3)
    per_channel_max = np.abs(o).max(axis=(0, 2, 3))
    assert (per_channel_max == 100.0).all()      # every channel has its outliers
    assert np.array_equal(nc.make_input((2, 3), seed=4), nc.make_input((2, 3), seed=4))


# ------------------------------------------------------------------------------------------
# run(): metrics and detection
# ------------------------------------------------------------------------------------------


def test_error_grows_with_narrower_dtypes():
    r = nc.run(shape=(16, 6, 9, 9), dtypes=("f16", "bf16", "f32", "f64"), mean=2.0, std=3.0)
    err = {e["dtype"]: e["outputs"]["y"]["normwise"] for e in r["results"]}
    assert err["f64"] < 1e-14 < err["f32"] < 1e-6 < err["f16"] < err["bf16"] < 1e-2, err
    for e in r["results"]:
        assert e["status"] == "ok" and e["pass"], (e["dtype"], e["channels_over"])
        # every error is within a small multiple of the dtype's unit roundoff
        assert e["outputs"]["y"]["normwise"] < 4 * nc.UNIT_ROUNDOFF[e["dtype"]], e["dtype"]
        assert set(e["outputs"]) == {"y", "save_mean", "save_invstd", "running_mean",
                                     "running_var"}
        assert e["plan"]["dram_passes"] in (1, 2)


def test_injected_error_is_found_in_its_channel_only():
    clean = nc.run(shape=(8, 5, 6, 6), dtypes=("f32",))
    assert _entry(clean, "norma", "f32")["pass"]
    bad = nc.run(shape=(8, 5, 6, 6), dtypes=("f32",), inject=(3, 1e-5))
    e = _entry(bad, "norma", "f32")
    assert e["pass"] is False
    assert e["outputs"]["y"]["channels_over"] == [3]
    assert e["outputs"]["y"]["worst_channel"] == 3
    assert e["outputs"]["y"]["worst_channel_error"] == pytest.approx(1e-5, rel=0.05)
    assert e["outputs"]["y"]["per_channel"]["std_drift"][3] == pytest.approx(1e-5, rel=0.05)
    assert e["outputs"]["save_mean"]["channels_over"] == []
    # backward: the injection goes into dx
    bad = nc.run(shape=(8, 5, 6, 6), op="backward", dtypes=("f32",), inject=(0, -1e-4))
    assert _entry(bad, "norma", "f32")["outputs"]["dx"]["channels_over"] == [0]


def test_threshold_option_and_default():
    assert nc.default_threshold("f32") == 16 * 2.0 ** -24
    r = nc.run(shape=(8, 4, 5, 5), dtypes=("bf16",), threshold=1e-9)
    e = _entry(r, "norma", "bf16")
    assert r["thresholds"] == {"bf16": 1e-9} and e["threshold"] == 1e-9
    assert e["pass"] is False and e["outputs"]["y"]["channels_over"] == [0, 1, 2, 3]


@pytest.mark.parametrize("op", ["forward_training", "inference", "backward"])
@pytest.mark.parametrize("layout", ["channels_first", "channels_last"])
@pytest.mark.parametrize("act", ["none", "relu", "add_relu"])
def test_ops_layouts_activations_pass_for_norma(op, layout, act):
    shape = (6, 5, 4, 3) if op != "inference" else (1, 5, 4, 3)
    r = nc.run(shape=shape, op=op, layout=layout, dtypes=("f16", "bf16", "f32"),
               relu=act == "relu", add_relu=act == "add_relu", mean=1.0, std=2.0)
    main = "dx" if op == "backward" else "y"
    for e in r["results"]:
        assert e["status"] == "ok", e
        assert e["pass"], (e["dtype"], {k: o["channels_over"] for k, o in e["outputs"].items()})
        assert main in e["outputs"]
        # drift is reported for y without activation only
        assert ("max_mean_drift" in e["outputs"][main]) == (main == "y" and act == "none")
    if op == "backward":
        assert set(_entry(r, "norma", "f32")["outputs"]) == {"dx", "dgamma", "dbeta"}


def test_shapes_2d_3d_5d_and_f64():
    for shape in [(7, 3), (5, 3, 11), (2, 3, 3, 4, 5)]:
        for layout in ("channels_first", "channels_last"):
            r = nc.run(shape=shape, layout=layout, dtypes=("f32", "f64"), op="backward")
            assert all(e["pass"] for e in r["results"]), (shape, layout)


def test_compare_torch_side_by_side():
    r = nc.run(shape=(8, 4, 6, 6), dtypes=("f16", "bf16", "f32"), compare_torch=True,
               mean=1e3, layout="channels_last")
    assert [(e["impl"], e["dtype"]) for e in r["results"]] == [
        ("norma", "f16"), ("torch", "f16"), ("norma", "bf16"), ("torch", "bf16"),
        ("norma", "f32"), ("torch", "f32")]
    t16 = _entry(r, "torch", "f16")
    assert t16["status"] == "unsupported" and "Half" in t16["error"]   # torch 1.13 CPU
    t32, n32 = _entry(r, "torch", "f32"), _entry(r, "norma", "f32")
    assert t32["status"] == "ok" and set(t32["outputs"]) == {"y", "running_mean",
                                                               "running_var"}
    # both are measured against the same reference; norma's f32 stays at rounding level
    assert n32["pass"]
    assert n32["outputs"]["y"]["normwise"] <= t32["outputs"]["y"]["normwise"]
    assert "plan" not in t32


def test_input_array_and_errors():
    x = np.random.default_rng(2).standard_normal((4, 3, 5)).astype(np.float32)
    r = nc.run(input=x, dtypes=("f32",))
    assert r["input"]["source"] == "array" and r["shape"] == [4, 3, 5]
    with pytest.raises(ValueError, match="shape"):
        nc.run(shape=(4,))
    with pytest.raises(ValueError, match="dtype"):
        nc.run(shape=(4, 3), dtypes=("f8",))
    with pytest.raises(ValueError, match="more than one value"):
        nc.run(shape=(1, 3))
    with pytest.raises(ValueError, match="op"):
        nc.run(shape=(4, 3), op="sideways")


# ------------------------------------------------------------------------------------------
# the command
# ------------------------------------------------------------------------------------------


def test_cli_table():
    r = _cli("--shape", "8,4,5,5", "--dtypes", "bf16,f32", "--compare-torch", "--mean", "3")
    out = r.stdout
    assert out.startswith("norma-check: forward_training [8,4,5,5] channels_first")
    for word in ("normwise", "max_abs", "mean_abs", "max_rel", "mean_drift", "std_drift",
                 "channels over threshold", "within threshold:", "norma plan"):
        assert word in out, word
    rows = [l.split() for l in out.splitlines() if l.startswith("y ")]
    assert [(row[1], row[2]) for row in rows] == [("bf16", "norma"), ("bf16", "torch"),
                                                   ("f32", "norma"), ("f32", "torch")]


def test_cli_json_fields():
    r = _cli("--shape", "6,3,4,4", "--op", "bwd", "--layout", "nhwc", "--dtypes",
             "f16,f32,f64", "--relu", "--json", "--seed", "5")
    d = json.loads(r.stdout)
    for k in ("tool", "date", "library", "version", "isa", "threads", "op", "shape", "layout",
              "eps", "momentum", "relu", "add_relu", "input", "reference", "thresholds",
              "results"):
        assert k in d, k
    assert d["op"] == "backward" and d["layout"] == "channels_last" and d["relu"] is True
    assert d["input"]["seed"] == 5 and d["input"]["dist"] == "normal"
    assert [e["dtype"] for e in d["results"]] == ["f16", "f32", "f64"]
    for e in d["results"]:
        assert e["impl"] == "norma" and e["status"] == "ok" and e["pass"] is True
        for name in ("dx", "dgamma", "dbeta"):
            o = e["outputs"][name]
            for k in ("normwise", "max_abs", "mean_abs", "max_rel", "channels_over",
                      "worst_channel", "worst_channel_error", "finite"):
                assert k in o, (name, k)
            assert "per_channel" not in o          # only with --per-channel
    d = json.loads(_cli("--shape", "6,3", "--dtypes", "f32", "--json",
                        "--per-channel").stdout)
    y = d["results"][0]["outputs"]["y"]
    assert len(y["per_channel"]["normwise"]) == 3 and len(y["per_channel"]["std_drift"]) == 3


def test_cli_input_file_strict_and_usage_errors(tmp_path):
    path = tmp_path / "act.npy"
    np.save(path, (np.random.default_rng(0).standard_normal((5, 4, 3, 3)) + 50).astype(
        np.float32))
    d = json.loads(_cli("--input", path, "--dtypes", "f32", "--json").stdout)
    assert d["input"]["source"] == str(path) and d["shape"] == [5, 4, 3, 3]
    assert d["input"]["data_mean"] == pytest.approx(50, abs=0.5)
    # --strict: exit 1 when norma is over the threshold (here: an injected error)
    assert _cli("--input", path, "--dtypes", "f32", "--strict").returncode == 0
    r = _cli("--input", path, "--dtypes", "f32", "--strict", "--inject", "1:1e-4", check=False)
    assert r.returncode == 1, r.stdout
    assert "1 > " in r.stdout and "injected" in r.stdout
    r = _cli("--shape", "4", check=False)
    assert r.returncode == 2 and "norma-check: error:" in r.stderr
    r = _cli("--input", tmp_path / "missing.npy", check=False)
    assert r.returncode == 2
    r = _cli(check=False)   # neither --shape nor --input
    assert r.returncode == 2 and "required" in r.stderr
