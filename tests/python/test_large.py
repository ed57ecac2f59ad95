"""Shapes big enough for the library's parallel paths (more than 32768 values), streaming stores
(outputs of 8 MiB and more) and both schedules (NORMA_SCHEDULE=fused|split), against torch and
the float64 reference."""

import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import norma
import norma.torch as nt
import bn_reference as ref
from conftest import PYDIR

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "float64": torch.float64}


@pytest.fixture(autouse=True)
def _two_threads():
    """Two threads for norma in every test here (a test may set its own): importing torch
    leaves OpenMP's default at torch's thread count, one on a 2-vCPU machine, and these
    shapes are here for the parallel paths."""
    norma.set_num_threads(2)
    yield
    norma.set_num_threads(0)

# (shape, memory format)
CASES = [
    ((4, 67, 15, 15), None),                      # 60k values, C = 64 + 3
    ((4, 67, 15, 15), torch.channels_last),
    ((2, 3, 160, 160), torch.channels_last),      # few channels, many rows
    ((2, 5, 6, 40, 40), torch.channels_last_3d),
    ((3, 19, 1201), None),                        # odd runs
]


def _ids():
    return ["x".join(map(str, s)) + ("-cl" if f is not None else "") for s, f in CASES]


def _np(t):
    return t.detach().double().numpy()


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("shape,fmt", CASES, ids=_ids())
def test_medium_training_vs_torch_and_reference(shape, fmt, dtype):
    g = torch.Generator().manual_seed(42)
    tdt = DTYPES[dtype]
    pdt = torch.float64 if dtype == "float64" else torch.float32
    c = shape[1]
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 2 + 1).to(tdt)
    gy = torch.randn(shape, generator=g, dtype=torch.float64).to(tdt)
    if fmt is not None:
        x = x.to(memory_format=fmt)
        gy = gy.to(memory_format=fmt)
    w = (torch.rand(c, generator=g, dtype=torch.float64) + 0.5).to(pdt)
    b = torch.randn(c, generator=g, dtype=torch.float64).to(pdt)
    xa, wa, ba = (t.clone().requires_grad_() for t in (x, w, b))
    rm, rv = torch.zeros(c, dtype=pdt), torch.ones(c, dtype=pdt)
    y = nt.batch_norm(xa, rm, rv, wa, ba, True, 0.1, 1e-5)
    y.backward(gy)
    if fmt is not None:
        assert y.is_contiguous(memory_format=fmt) and xa.grad.is_contiguous(memory_format=fmt)
    m = shape[0] * int(math.prod(shape[2:]))
    pname = "float64" if dtype == "float64" else "float32"
    # reference on the same (rounded) data
    yr, mean, var, invstd = ref.forward_train(_np(x), _np(w), _np(b))
    dxr, dgr, dbr, _ = ref.backward(_np(gy), _np(x), mean, invstd, _np(w))
    ref.assert_close(_np(y), yr, dtype, scale=2, what="y")
    ref.assert_close(_np(xa.grad), dxr, dtype, scale=2, what="dx")
    ref.assert_close(_np(wa.grad), dgr, pname, scale=math.sqrt(m) * 4, what="dweight")
    ref.assert_close(_np(ba.grad), dbr, pname, scale=math.sqrt(m) * 4, what="dbias")
    ref.assert_close(_np(rm), 0.1 * mean, pname, what="running_mean")
    ref.assert_close(_np(rv), 0.9 + 0.1 * var * m / (m - 1), pname, what="running_var")
    if dtype in ("float32", "float64"):
        xb, wb, bb = (t.clone().requires_grad_() for t in (x, w, b))
        yt = F.batch_norm(xb, None, None, wb, bb, True, 0.1, 1e-5)
        yt.backward(gy)
        ref.assert_close(_np(y), _np(yt), dtype, scale=2, what="y vs torch")
        ref.assert_close(_np(xa.grad), _np(xb.grad), dtype, scale=4, what="dx vs torch")
        ref.assert_close(_np(wa.grad), _np(wb.grad), pname, scale=math.sqrt(m) * 4,
                         what="dweight vs torch")
    # inference with the running statistics
    yi = nt.batch_norm(x, rm, rv, w, b, False, 0.1, 1e-5)
    ref.assert_close(_np(yi), ref.forward_infer(_np(x), _np(rm), _np(rv), _np(w), _np(b)),
                     dtype, scale=2, what="inference")


def test_streaming_store_sized_output_and_threads():
    """A 9 MiB float32 output (written around the cache) in both layouts, and bitwise equal
    results for 1 and 2 threads on a parallel-sized problem."""
    g = torch.Generator().manual_seed(3)
    for fmt in (None, torch.channels_last):
        x = torch.randn(8, 32, 96, 96, generator=g)
        dy = torch.randn(8, 32, 96, 96, generator=g)
        if fmt is not None:
            x = x.to(memory_format=fmt)
            dy = dy.to(memory_format=fmt)
        w = torch.rand(32, generator=g) + 0.5
        xa, wa = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = nt.batch_norm(xa, None, None, wa, None, True)
        y.backward(dy)
        xb, wb = x.clone().requires_grad_(), w.clone().requires_grad_()
        yt = F.batch_norm(xb, None, None, wb, None, True)
        yt.backward(dy)
        ref.assert_close(_np(y), _np(yt), "float32", scale=2, what="y")
        ref.assert_close(_np(xa.grad), _np(xb.grad), "float32", scale=4, what="dx")
        ref.assert_close(_np(wa.grad), _np(wb.grad), "float32", scale=4 * 270, what="dw")
        rm, rv = torch.randn(32, generator=g), torch.rand(32, generator=g) + 0.5
        yi = norma.batch_norm_inference(x, rm, rv, w, relu=True)
        yti = torch.relu(F.batch_norm(x, rm, rv, w, None, False))
        ref.assert_close(_np(yi), _np(yti), "float32", scale=2, what="inference")
    x = torch.randn(4, 67, 15, 15, generator=g).to(memory_format=torch.channels_last)
    dy = torch.randn(4, 67, 15, 15, generator=g)
    outs = []
    try:
        for n in (1, 2):
            norma.set_num_threads(n)
            y, sm, si = norma.batch_norm_forward_training(x)
            dx, dg, db = norma.batch_norm_backward(dy, x, sm, si)
            outs.append((y, sm, si, dx, dg, db))
    finally:
        norma.set_num_threads(0)
    for a, b in zip(*outs):
        assert torch.equal(a, b)


@pytest.mark.parametrize("shape", [(16, 1344, 14, 14), (12, 640, 40, 40), (16, 576, 44, 44)],
                         ids=["16x1344x14x14", "12x640x40x40", "16x576x44x44"])
def test_wide_rows_beyond_the_caches_vs_torch(shape):
    """Channels-last tensors beyond the caches with wide rows: 16x14x14x1344 (16.9 MB, 3136
    rows in equal segments where 1024-row ones would share out unevenly), 12x40x40x640
    (49 MB, whose backward sums go by fours) and 16x44x44x576 (71 MB, beyond 64 MiB: the f32
    backward's apply walks forwards there).  Training forward and backward with 1 thread and
    norma.torch's store policy (no streaming stores beyond 32 MiB), and with 2 threads and the
    library's (streaming stores: there the apply of the last two goes a row at a time),
    bitwise equal, against torch; dx also against the float64 reference."""
    g = torch.Generator().manual_seed(11)
    c = shape[1]
    x = (torch.randn(shape, generator=g) * 2 + 1).to(memory_format=torch.channels_last)
    dy = torch.randn(shape, generator=g).to(memory_format=torch.channels_last)
    w = torch.rand(c, generator=g) + 0.5
    b = torch.randn(c, generator=g)
    m = shape[0] * shape[2] * shape[3]
    runs = []
    for n in (1, 2):
        norma.set_num_threads(n)
        if n == 2:
            norma.set_streaming_stores(0)  # the library's range, not norma.torch's 32 MiB cap
        try:
            xa, wa, ba = (t.clone().requires_grad_() for t in (x, w, b))
            y = nt.batch_norm(xa, None, None, wa, ba, True)
            y.backward(dy)
        finally:
            nt._streaming_policy()  # the fixture restores the threads
        runs.append((y, xa.grad, wa.grad, ba.grad))
    for u, v in zip(*runs):
        assert torch.equal(u, v)
    xb, wb, bb = (t.clone().requires_grad_() for t in (x, w, b))
    yt = F.batch_norm(xb, None, None, wb, bb, True)
    yt.backward(dy)
    ref.assert_close(_np(y), _np(yt), "float32", scale=2, what="y")
    ref.assert_close(_np(xa.grad), _np(xb.grad), "float32", scale=4, what="dx")
    ref.assert_close(_np(wa.grad), _np(wb.grad), "float32", scale=math.sqrt(m) * 4, what="dw")
    ref.assert_close(_np(ba.grad), _np(bb.grad), "float32", scale=math.sqrt(m) * 4, what="db")
    _, mean, _, invstd = ref.forward_train(_np(x), _np(w), _np(b))
    dxr, _, _, _ = ref.backward(_np(dy), _np(x), mean, invstd, _np(w))
    ref.assert_close(_np(xa.grad), dxr, "float32", scale=2, what="dx vs reference")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_16bit_channels_last_backward_16_to_64_mib_vs_reference(dtype):
    """A 16-bit channels-last tensor of 23 MB with rows of 600 channels (not a multiple of the
    vector width), plain and with ReLU: on AVX-512 the backward's apply walks it forwards with
    the prefetch ahead (split_apply_rows).  dx against the float64 reference on the same
    rounded data, every element; 1 and 2 threads bitwise equal."""
    g = torch.Generator().manual_seed(17)
    tdt = DTYPES[dtype]
    shape, c = (20, 600, 31, 31), 600
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 2 + 1).to(tdt)
    x = x.to(memory_format=torch.channels_last)
    dy = torch.randn(shape, generator=g, dtype=torch.float64).to(tdt)
    dy = dy.to(memory_format=torch.channels_last)
    w = torch.rand(c, generator=g) + 0.5
    b = torch.randn(c, generator=g)
    m = shape[0] * shape[2] * shape[3]
    for relu in (False, True):
        grads = []
        for n in (1, 2):
            norma.set_num_threads(n)
            try:
                xa, wa, ba = (t.clone().requires_grad_() for t in (x, w, b))
                y = (nt.batch_norm_relu if relu else nt.batch_norm)(xa, None, None, wa, ba, True)
                y.backward(dy)
            finally:
                norma.set_num_threads(0)
            grads.append((xa.grad, wa.grad, ba.grad))
        for a, bb in zip(*grads):
            assert torch.equal(a, bb)
        dxn, dwn, dbn = grads[1]
        yr, mean, _, invstd = ref.forward_train(_np(x), _np(w), _np(b))
        g64 = _np(dy) * (yr > 0) if relu else _np(dy)
        dxr, dgr, dbr, _ = ref.backward(g64, _np(x), mean, invstd, _np(w))
        ref.assert_close(_np(dxn), dxr, dtype, scale=2, what="dx relu=%s" % relu)
        ref.assert_close(_np(dwn), dgr, "float32", scale=math.sqrt(m) * 4, what="dweight")
        ref.assert_close(_np(dbn), dbr, "float32", scale=math.sqrt(m) * 4, what="dbias")


_SCHEDULE_SCRIPT = r"""
import sys, numpy as np, norma
out = sys.argv[1]
rng = np.random.default_rng(7)
res = {}
for i, (shape, layout) in enumerate([((4, 67, 225), "channels_first"),
                                     ((4, 15, 15, 67), "channels_last"),
                                     ((2, 25600, 3), "channels_last"),
                                     ((3, 19, 1201), "channels_first"),
                                     # two chunks per run; runs two samples per segment,
                                     # an odd count of samples
                                     ((32, 3, 4500), "channels_first"),
                                     ((33, 5, 200), "channels_first"),
                                     # twelve samples, runs of 361 values
                                     ((12, 7, 361), "channels_first")]):
    for dt in (np.float32, np.float16):
        x = (rng.standard_normal(shape) * 2 + 1).astype(dt)
        dy = rng.standard_normal(shape).astype(dt)
        c = shape[1] if layout == "channels_first" else shape[-1]
        g = (rng.random(c) + 0.5).astype(np.float32)
        b = rng.standard_normal(c).astype(np.float32)
        y, sm, si = norma.batch_norm_forward_training(x, g, b, layout=layout)
        dx, dg, db = norma.batch_norm_backward(dy, x, sm, si, g, b, layout=layout)
        k = "%d_%s" % (i, np.dtype(dt).name)
        res.update({k + "_x": x, k + "_dy": dy, k + "_g": g, k + "_b": b, k + "_y": y,
                    k + "_sm": sm, k + "_si": si, k + "_dx": dx, k + "_dg": dg, k + "_db": db,
                    k + "_layout": np.array(layout)})
np.savez(out, **res)
"""


def test_fused_and_split_schedules_identical_and_correct(tmp_path):
    files = {}
    for sched in ("fused", "split"):
        env = dict(os.environ, NORMA_SCHEDULE=sched, PYTHONPATH=PYDIR,
                   NORMA_LIBRARY=os.path.abspath(norma.library_path()))
        out = str(tmp_path / ("%s.npz" % sched))
        r = subprocess.run([sys.executable, "-c", _SCHEDULE_SCRIPT, out], env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        files[sched] = np.load(out)
    a, b = files["fused"], files["split"]
    assert sorted(a.files) == sorted(b.files)
    for k in a.files:
        assert np.array_equal(a[k], b[k]), "fused and split schedules differ in %s" % k
    # and both are right
    for k in [f[:-2] for f in a.files if f.endswith("_y")]:
        layout = str(a[k + "_layout"])
        x, dy = a[k + "_x"], a[k + "_dy"]
        if layout == "channels_last":
            x, dy = np.moveaxis(x, -1, 1), np.moveaxis(dy, -1, 1)
            y, dx = np.moveaxis(a[k + "_y"], -1, 1), np.moveaxis(a[k + "_dx"], -1, 1)
        else:
            y, dx = a[k + "_y"], a[k + "_dx"]
        dname = "float16" if k.endswith("float16") else "float32"
        yr, mean, var, invstd = ref.forward_train(x, a[k + "_g"], a[k + "_b"])
        dxr, dgr, dbr, _ = ref.backward(dy, x, mean, invstd, a[k + "_g"])
        m = x.size // x.shape[1]
        ref.assert_close(y, yr, dname, scale=2, what=k + " y")
        ref.assert_close(dx, dxr, dname, scale=2, what=k + " dx")
        ref.assert_close(a[k + "_dg"], dgr, "float32", scale=4 * math.sqrt(m), what=k + " dg")
        ref.assert_close(a[k + "_db"], dbr, "float32", scale=4 * math.sqrt(m), what=k + " db")
