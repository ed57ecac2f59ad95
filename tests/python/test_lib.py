"""The ctypes layer: loading, declarations, settings, error mapping."""

import ctypes
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import norma
from norma import _lib
from conftest import REPO, PYDIR

HEADER = os.path.join(REPO, "include", "norma.h")


def _header_functions():
    text = open(HEADER).read()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return sorted(set(re.findall(r"NORMA_API\s+[^;(]*?\b(norma_\w+)\s*\(", text)))


def test_every_header_function_is_declared_and_exported():
    names = _header_functions()
    assert len(names) >= 20, names
    assert set(names) == set(_lib.PROTOTYPES), (
        "declared in norma.h but not in _lib.PROTOTYPES: %s; in PROTOTYPES but not in the "
        "header: %s" % (sorted(set(names) - set(_lib.PROTOTYPES)),
                        sorted(set(_lib.PROTOTYPES) - set(names))))
    L = _lib.lib()
    missing = set(_lib.missing_functions())
    # only functions declared ahead of their implementation may be missing (the norm family)
    assert missing <= _lib.OPTIONAL, sorted(missing - _lib.OPTIONAL)
    for n in names:
        if n in missing:
            continue
        fn = getattr(L, n)
        assert fn.argtypes is not None, n
        assert fn.argtypes == _lib.PROTOTYPES[n][1], n
    if missing:
        print("declared in norma.h, not exported by %s yet: %s"
              % (_lib.library_path(), ", ".join(sorted(missing))))


def test_argument_counts_match_header():
    text = re.sub(r"/\*.*?\*/", "", open(HEADER).read(), flags=re.S)
    for name, (restype, argtypes) in _lib.PROTOTYPES.items():
        m = re.search(r"\b%s\s*\(([^)]*)\)" % name, text)
        assert m, name
        params = m.group(1).strip()
        count = 0 if params in ("", "void") else params.count(",") + 1
        assert count == len(argtypes), (name, params, argtypes)


def test_desc_layout_matches_c():
    # int64 n, c, spatial; int layout; int dtype; double eps; unsigned flags
    assert ctypes.sizeof(_lib.BnDesc) == 48
    assert _lib.BnDesc.eps.offset == 32 and _lib.BnDesc.flags.offset == 40


def test_version_and_status_strings():
    hdr = open(HEADER).read()
    ver = ".".join(re.search(r"#define NORMA_VERSION_%s (\d+)" % k, hdr).group(1)
                   for k in ("MAJOR", "MINOR", "PATCH"))
    assert norma.version() == ver
    for code, name in _lib.STATUS_NAMES.items():
        assert _lib.status_string(code) == name
    assert _lib.status_string(99) == "unknown status"


def test_threads_isa_reference_settings():
    old = norma.get_num_threads()
    try:
        norma.set_num_threads(1)
        assert norma.get_num_threads() == 1
    finally:
        norma.set_num_threads(0)
    assert norma.get_num_threads() >= 1
    assert norma.get_isa() in ("scalar", "avx2", "avx512")  # the best the CPU has
    with pytest.raises(ValueError):
        norma.set_max_isa("sse9")
    with pytest.raises(norma.NormaError) as ei:
        norma.set_max_isa(7)
    assert ei.value.status_name == "NORMA_ERR_INVALID_ARGUMENT"
    assert norma.get_use_reference() in (False, True)
    del old


def test_results_identical_across_threads_isa_and_reference(rng):
    x = rng.standard_normal((5, 17, 7, 7)).astype(np.float32)
    g = rng.standard_normal(17).astype(np.float32)
    b = rng.standard_normal(17).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    def run():
        y, sm, si = norma.batch_norm_forward_training(x, g, b)
        dx, dg, db = norma.batch_norm_backward(dy, x, sm, si, g, b)
        return y, sm, si, dx, dg, db
    isa = norma.get_isa()
    use_ref = norma.get_use_reference()
    try:
        norma.set_num_threads(1)
        one = run()
        norma.set_num_threads(2)
        two = run()
        for a, c in zip(one, two):  # bitwise, for any thread count
            assert np.array_equal(a, c)
        norma.set_max_isa("scalar")
        scal = run()
        norma.set_use_reference(True)
        ref = run()
    finally:
        norma.set_num_threads(0)
        norma.set_use_reference(use_ref)
        norma.set_max_isa(isa)
    assert norma.get_isa() == isa
    for a, c in zip(scal, ref):
        np.testing.assert_allclose(a, c, rtol=1e-5, atol=2e-5)
    for a, c in zip(one, ref):
        np.testing.assert_allclose(a, c, rtol=1e-5, atol=2e-5)


def _run_py(code, env):
    e = dict(os.environ)
    e.update(env)
    e["PYTHONPATH"] = PYDIR
    return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True,
                          timeout=60)


def test_norma_library_env_is_used():
    path = _lib.library_path()
    r = _run_py("import norma; from norma import _lib; print(_lib.library_path())",
                {"NORMA_LIBRARY": os.path.abspath(path) if os.path.exists(path) else path})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith(os.path.basename(path))


def test_bad_norma_library_raises_clearly():
    r = _run_py("import norma\ntry:\n    norma.version()\nexcept norma.NormaLibraryNotFound as e:"
                "\n    print('NOTFOUND', e)\n",
                {"NORMA_LIBRARY": "/nonexistent/libnorma.so"})
    assert r.returncode == 0, r.stderr
    assert "NOTFOUND" in r.stdout and "/nonexistent/libnorma.so" in r.stdout


def test_import_does_not_load_or_need_torch():
    r = _run_py("import sys, norma; print('torch' in sys.modules, norma._lib._LIB is None)", {})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "True"]


# ---- error mapping -----------------------------------------------------------------------


def test_error_carries_status_and_message():
    x = np.zeros((1, 3, 1), np.float32)  # one value per channel: no variance
    with pytest.raises(norma.NormaError) as ei:
        norma.batch_norm_forward_training(x)
    e = ei.value
    assert isinstance(e, RuntimeError)
    assert e.status == _lib.ERR_INVALID_ARGUMENT
    assert e.status_name == "NORMA_ERR_INVALID_ARGUMENT"
    assert e.function == "norma_bn_forward_training"
    assert "more than 1 value per channel" in e.detail
    assert "NORMA_ERR_INVALID_ARGUMENT" in str(e) and e.detail in str(e)


def test_negative_eps_and_bad_momentum_rejected_untouched():
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    rm = np.full(3, 7.0, np.float32)
    with pytest.raises(norma.NormaError, match=r"eps"):
        norma.batch_norm_forward_training(x, eps=-1.0)
    with pytest.raises(norma.NormaError, match=r"momentum"):
        norma.batch_norm_forward_training(x, running_mean=rm, momentum=1.5)
    assert np.all(rm == 7.0)


def test_zero_channels_rejected():
    with pytest.raises(norma.NormaError, match=r"c must be > 0"):
        norma.batch_norm_forward_training(np.zeros((4, 0, 3), np.float32))


def test_check_finite_maps_to_nonfinite_and_leaves_state():
    x = np.ones((4, 3, 5), np.float32)
    x[2, 1, 3] = np.nan
    rm = np.zeros(3, np.float32)
    rv = np.ones(3, np.float32)
    with pytest.raises(norma.NormaError) as ei:
        norma.batch_norm_forward_training(x, running_mean=rm, running_var=rv, check_finite=True)
    assert ei.value.status_name == "NORMA_ERR_NONFINITE"
    assert ei.value.detail
    assert np.all(rm == 0) and np.all(rv == 1)
    # without the check, NaN propagates into its channel only
    y, sm, si = norma.batch_norm_forward_training(x)
    assert np.isnan(y[:, 1]).all() and np.isfinite(y[:, [0, 2]]).all()


def test_memory_saving_backward_needs_nonzero_gamma():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 3, 5)).astype(np.float32)
    g = np.array([1.0, 0.0, 2.0], np.float32)
    y, sm, si = norma.batch_norm_forward_training(x, g)
    with pytest.raises(norma.NormaError, match=r"gamma\[1\]"):
        norma.batch_norm_backward(np.ones_like(x), None, sm, si, g, y=y)


def test_python_side_argument_errors():
    x = np.zeros((4, 3, 5), np.float32)
    with pytest.raises(ValueError, match="dimensions"):
        norma.batch_norm_forward_training(np.zeros(5, np.float32))
    with pytest.raises(ValueError, match="dimensions"):
        norma.batch_norm_forward_training(np.zeros((2, 2, 2, 2, 2, 2), np.float32))
    with pytest.raises(TypeError, match="dtype"):
        norma.batch_norm_forward_training(np.zeros((4, 3), np.int32))
    with pytest.raises(ValueError, match="gamma must have 3 elements"):
        norma.batch_norm_forward_training(x, np.ones(4, np.float32))
    with pytest.raises(ValueError, match="residual has shape"):
        norma.batch_norm_forward_training(x, relu=True, residual=np.zeros((4, 3, 4), np.float32))
    with pytest.raises(TypeError, match="residual has dtype"):
        norma.batch_norm_forward_training(x, relu=True, residual=np.zeros((4, 3, 5)))
    with pytest.raises(ValueError, match="relu=True"):
        norma.batch_norm_forward_training(x, residual=x)
    with pytest.raises(ValueError, match="layout"):
        norma.batch_norm_forward_training(x, layout="sideways")
    with pytest.raises(TypeError, match="in place"):
        norma.batch_norm_forward_training(x, running_mean=[0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="evaluation mode"):
        norma.batch_norm(x, None, None)


def test_lookup_order(tmp_path, monkeypatch):
    """beside the package, then <repo>/build, then <repo>/build-* newest first."""
    repo = tmp_path / "repo"
    (repo / "include").mkdir(parents=True)
    (repo / "include" / "norma.h").write_text("")
    pkg = repo / "python" / "norma"
    pkg.mkdir(parents=True)
    files = {}
    for i, d in enumerate(["build-old", "build-new", "build", "python/norma"]):
        (repo / d).mkdir(parents=True, exist_ok=True)
        f = repo / d / "libnorma.so"
        f.write_bytes(b"")
        os.utime(f, (1000 + i, 1000 + i))
        files[d] = str(f)
    monkeypatch.setattr(_lib, "_package_dir", lambda: str(pkg))
    assert _lib.candidate_paths() == [files["python/norma"], files["build"],
                                      files["build-new"], files["build-old"]]
    # not a checkout: no build tree is looked at
    (repo / "include" / "norma.h").unlink()
    assert _lib.candidate_paths() == [files["python/norma"]]


def test_streaming_store_range():
    """norma.set_streaming_stores narrows the outputs written around the cache (the plan says
    which); negative values are rejected; norma.torch caps the range at 32 MiB on import."""
    small = np.zeros((4, 64, 128, 256), np.float32)    # 32 MiB: streaming by default
    big = np.zeros((4, 64, 128, 257), np.float32)      # just above 32 MiB
    try:
        norma.set_streaming_stores(0)                  # the library's defaults
        assert norma.query_plan(small)["streaming_stores"] == 1
        assert norma.query_plan(big)["streaming_stores"] == 1
        norma.set_streaming_stores(0, 32 << 20)
        assert norma.query_plan(small)["streaming_stores"] == 1
        assert norma.query_plan(big)["streaming_stores"] == 0
        norma.set_streaming_stores(0, 0)               # none
        assert norma.query_plan(small)["streaming_stores"] == 0
        with pytest.raises(norma.NormaError):
            norma.set_streaming_stores(-1)
        norma.set_streaming_stores(0)
        code = ("import numpy as np, norma, norma.torch; "
                "print(norma.query_plan(np.zeros((4, 64, 128, 257), np.float32))"
                "['streaming_stores'])")
        path = _lib.library_path()
        r = _run_py(code, {"NORMA_LIBRARY": os.path.abspath(path), "NORMA_NT_MIN_BYTES": ""})
        assert r.returncode == 0, r.stderr
        out = r.stdout.split()
        assert out[-1] == "0"
    finally:
        norma.set_streaming_stores(0)


@pytest.mark.parametrize("op,shape,dtype,streams", [
    # the backward: three tensors over 16 MiB stream (dx of 4 MiB and more)
    ("backward", (32, 7, 7, 1024), np.float32, 1), ("backward", (32, 14, 14, 256), np.float32, 1),
    ("backward", (32, 7, 7, 2048), np.float16, 1), ("backward", (12, 7, 7, 2048), np.float32, 0),
    ("backward", (32, 7, 7, 512), np.float32, 0),
    # the training forward: rows of 4 KiB and more from 16 MiB, narrower rows from 32 MiB
    ("forward_training", (32, 7, 7, 2048), np.float32, 1),
    ("forward_training", (24, 7, 7, 2048), np.float32, 1),
    ("forward_training", (20, 7, 7, 2048), np.float32, 0),
    ("forward_training", (32, 28, 28, 128), np.float32, 0),
    ("forward_training", (32, 14, 14, 512), np.float32, 0),
    # the inference: rows of 4 KiB and more from 20 MiB, narrower rows from 32 MiB
    ("inference", (32, 7, 7, 2048), np.float32, 1), ("inference", (24, 7, 7, 2048), np.float32, 0),
    ("inference", (32, 28, 28, 128), np.float32, 0), ("inference", (64, 28, 28, 128), np.float32, 1)])
def test_streaming_store_footprint(op, shape, dtype, streams):
    """By default an output streams when the call's tensors exceed 32 MiB, or 16 MiB for the
    backward and for the training forward of rows of 4 KiB and more, 20 MiB for the inference
    of such rows (engine.h, NORM_NT_FOOTPRINT_TRAIN: there the LLC share of 2 vCPUs did not
    hold the tensors)."""
    x = np.zeros(shape, dtype)
    norma.set_streaming_stores(0)
    assert norma.query_plan(x, op, layout="nhwc")["streaming_stores"] == streams


@pytest.mark.parametrize("c,dtype,rows,streams", [
    (24, np.float32, 20000, 1), (24, np.float32, 20001, 0), (100, np.float32, 4000, 1),
    (100, np.float32, 4002, 0), (40, np.float16, 20000, 1), (40, np.float16, 20002, 0),
    (16, np.float32, 20001, 1), (48, np.float32, 10001, 1), (64, np.float32, 5001, 1),
    (520, np.float32, 1001, 1), (32, np.float16, 20001, 1), (1100, np.float16, 1001, 1)])
def test_streaming_stores_fill_whole_lines(c, dtype, rows, streams):
    """Streaming stores write whole cache lines only: a streaming store and an ordinary (row
    tail) store to the same line made channels-last tensors up to 16x slower
    (docs/performance.md).  Rows of whole lines or of 2 KiB and more stream; shorter rows that
    end inside a line stream through the wide view (k rows of whole lines) when k divides the
    rows, else they are written through the cache."""
    x = np.zeros((1, 1, rows, c), dtype)     # NHWC, over 1 MiB
    try:
        norma.set_streaming_stores(1 << 20)
        for op in ("forward_training", "inference", "backward"):
            assert norma.query_plan(x, op, layout="nhwc")["streaming_stores"] == streams, op
        # channels-first runs are unaffected: the same bytes in NCHW stream
        y = np.zeros((2, c, 1, (1 << 21) // (2 * c) + 512), dtype)
        assert norma.query_plan(y, "inference", layout="nchw")["streaming_stores"] == 1
    finally:
        norma.set_streaming_stores(0)


@pytest.mark.parametrize("n,h,w", [(64, 32, 32), (2, 7, 7), (3, 1, 49), (16, 300, 300)])
def test_one_channel_same_in_both_layouts(n, h, w):
    """A tensor with one channel has the same bytes in NCHW and NHWC, and runs the same way in
    both (channels-first, whose kernels split the long runs among the threads; rows of one value
    were up to 4x slower): the same plan for every op and bitwise the same outputs."""
    rng = np.random.default_rng(n * h + w)
    nhwc = (rng.standard_normal((n, h, w, 1)) * 3 + 1).astype(np.float32)
    nchw = nhwc.reshape(n, 1, h, w)
    dy = rng.standard_normal((n, h, w, 1)).astype(np.float32)
    for op in ("forward_training", "inference", "backward"):
        assert norma.query_plan(nhwc, op, layout="nhwc") == norma.query_plan(nchw, op, layout="nchw")
    g, b = np.array([1.5], np.float32), np.array([-0.25], np.float32)
    y1, m1, s1 = norma.batch_norm_forward_training(nhwc, g, b, layout="nhwc")
    y2, m2, s2 = norma.batch_norm_forward_training(nchw, g, b, layout="nchw")
    assert np.array_equal(np.asarray(y1).reshape(-1), np.asarray(y2).reshape(-1))
    assert np.array_equal(m1, m2) and np.array_equal(s1, s2)
    r1 = norma.batch_norm_backward(dy, nhwc, m1, s1, g, b, layout="nhwc")
    r2 = norma.batch_norm_backward(dy.reshape(n, 1, h, w), nchw, m2, s2, g, b, layout="nchw")
    assert np.array_equal(np.asarray(r1[0]).reshape(-1), np.asarray(r2[0]).reshape(-1))
    assert np.array_equal(r1[1], r2[1]) and np.array_equal(r1[2], r2[2])
    var = np.array([2.0], np.float32)
    i1 = norma.batch_norm_inference(nhwc, m1, var, g, b, layout="nhwc")
    i2 = norma.batch_norm_inference(nchw, m2, var, g, b, layout="nchw")
    assert np.array_equal(np.asarray(i1).reshape(-1), np.asarray(i2).reshape(-1))
    # and the values are right (float64 reference)
    xd = nhwc.astype(np.float64).reshape(-1)
    ref = (xd - xd.mean()) / np.sqrt(xd.var() + 1e-5) * 1.5 - 0.25
    np.testing.assert_allclose(np.asarray(y1).reshape(-1), ref, rtol=1e-5, atol=1e-5)
