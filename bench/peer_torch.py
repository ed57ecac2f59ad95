#!/usr/bin/python3
"""peer_torch.py - the PyTorch worker of norma-bench.

Same command line, case syntax, output and methodology as the C workers
(tools/bench/worker_common.h):

    peer_torch.py [--threads N] [--warmup W] [--reps R] [--info]
                  [--case 'OP LAYOUT DTYPE N,C[,H,W]']... [--stdin]

prints one JSON line per case: {"type": "result", "lib": "torch", "op": ..., "status": "ok",
"min_ms": ..., "median_ms": ..., "max_ms": ..., "reps": ..., "warmup": ..., "impl": ...}.

What is timed (PyTorch's own CPU kernels, autograd disabled: torch.set_grad_enabled(False)):
  fwd            torch.nn.functional.batch_norm(x, running_mean, running_var, weight, bias,
                 training=True, momentum=0.1, eps=1e-5)   (updates the running statistics)
  infer          the same with training=False
  relu_*         the batch_norm above, then torch.relu_ (ResNet's nn.ReLU(inplace=True))
  add_relu_*     the batch_norm above, then y.add_(residual), then y.relu_()
                 (torchvision ResNet: out += identity; out = relu(out)) - unfused, as PyTorch runs it
  bwd            torch.ops.aten.native_batch_norm_backward(dy, x, weight, running_mean,
                 running_var, save_mean, save_invstd, True, eps, [True, True, True]) - the call
                 autograd's NativeBatchNormBackward makes (dx, dweight, dbias)
  relu_bwd       g = torch.ops.aten.threshold_backward(dy, y, 0) (autograd's ReluBackward on the
                 saved result), then native_batch_norm_backward(g, ...)
  add_relu_bwd   as relu_bwd; dresidual is g itself (autograd hands the same tensor to both
                 branches of the add: no copy)
Channels-last uses torch.channels_last tensors (x, y, dy, residual).  bf16: x / y / dy /
residual bf16, weight / bias / running statistics f32 when PyTorch accepts the mix (as
norma's parameters are f32), else bf16 (said in "impl").

Outputs are not preallocated by the caller in PyTorch's API: every call allocates its result.
Run this worker with jemalloc (LD_PRELOAD, MALLOC_CONF=retain:true,...; the driver does it) so
that the allocation reuses retained, already-faulted pages: then no page fault is timed, as
in the C workers where outputs are allocated and touched before timing.  With glibc malloc a
fresh >32 MB output is mmapped and faulted in on every call (~0.5 ms per MB).
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

EPS = 1e-5
OPS = {
    "fwd": ("fwd", None), "infer": ("infer", None), "bwd": ("bwd", None),
    "relu_fwd": ("fwd", "relu"), "relu_infer": ("infer", "relu"), "relu_bwd": ("bwd", "relu"),
    "add_relu_fwd": ("fwd", "add_relu"), "add_relu_infer": ("infer", "add_relu"),
    "add_relu_bwd": ("bwd", "add_relu"),
}


def parse_case(text):
    parts = text.split()
    if len(parts) != 4:
        raise ValueError("case '%s': expected '<op> <layout> <dtype> N,C[,H[,W]]'" % text)
    op, layout, dtype, dims = parts
    if op not in OPS:
        raise ValueError("unknown op '%s'" % op)
    if layout not in ("nchw", "nhwc", "nc"):
        raise ValueError("unknown layout '%s' (nchw, nhwc, nc)" % layout)
    if dtype not in ("f32", "bf16"):
        raise ValueError("unknown dtype '%s' (f32, bf16)" % dtype)
    shape = [int(v) for v in dims.replace("x", ",").split(",")]
    if len(shape) < 2 or len(shape) > 4 or min(shape) < 1:
        raise ValueError("shape '%s': need N,C[,H[,W]] >= 1" % dims)
    if len(shape) == 2:
        layout = "nc"
    else:
        while len(shape) < 4:
            shape.append(1)
        if layout == "nc":
            raise ValueError("layout nc needs a 2-D shape N,C")
    return op, layout, dtype, shape


def jemalloc_loaded():
    try:
        with open("/proc/self/maps") as f:
            return any("jemalloc" in line for line in f)
    except OSError:
        return False


FILL_BLOCK = 65521  # as the C workers: a block of random values (a prime) repeated


def tensor(shape, layout, dt, gen, lo=-1.0, hi=1.0):
    numel = 1
    for d in shape:
        numel *= d
    block = torch.empty(min(numel, FILL_BLOCK)).uniform_(lo, hi, generator=gen).to(dt)
    flat = block.repeat(-(-numel // block.numel()))[:numel]
    if layout == "nhwc":  # physical order N, H, W, C viewed as a channels_last N, C, H, W
        n, c, h, w = shape
        t = flat.view(n, h, w, c).permute(0, 3, 1, 2)
        assert t.is_contiguous(memory_format=torch.channels_last)
    else:
        t = flat.view(shape)
    return t.clone(memory_format=torch.preserve_format)  # its own, exactly-sized storage


def timeit(fn, warmup, reps):
    for _ in range(warmup):
        fn()
    ms = []
    for _ in range(max(reps, 1)):
        t0 = time.perf_counter_ns()
        fn()
        t1 = time.perf_counter_ns()
        ms.append((t1 - t0) * 1e-6)
    ms.sort()
    n = len(ms)
    med = ms[n // 2] if n % 2 else 0.5 * (ms[n // 2 - 1] + ms[n // 2])
    return ms[0], med, ms[-1], n


def build(op, layout, dtype, shape, pdt):
    """Returns the closure that runs the case once (inputs and untimed setup done)."""
    direction, act = OPS[op]
    dt = torch.bfloat16 if dtype == "bf16" else torch.float32
    gen = torch.Generator().manual_seed(1)
    c = shape[1]
    x = tensor(shape, layout, dt, gen)
    w = torch.empty(c).uniform_(0.5, 1.5, generator=gen).to(pdt)
    b = torch.empty(c).uniform_(-0.5, 0.5, generator=gen).to(pdt)
    rm = torch.empty(c).uniform_(-0.1, 0.1, generator=gen).to(pdt)
    rv = torch.empty(c).uniform_(0.25, 0.5, generator=gen).to(pdt)
    res = tensor(shape, layout, dt, gen) if act == "add_relu" else None

    if direction in ("fwd", "infer"):
        training = direction == "fwd"

        if act is None:
            def run():
                F.batch_norm(x, rm, rv, w, b, training, 0.1, EPS)
        elif act == "relu":
            def run():
                y = F.batch_norm(x, rm, rv, w, b, training, 0.1, EPS)
                torch.relu_(y)
        else:
            def run():
                y = F.batch_norm(x, rm, rv, w, b, training, 0.1, EPS)
                y.add_(res)
                y.relu_()
        return run

    # backward: one untimed training forward gives save_mean / save_invstd (and y for the mask)
    y, sm, si = torch.ops.aten.native_batch_norm(x, w, b, rm, rv, True, 0.1, EPS)
    if act == "add_relu":
        y.add_(res)
    if act is not None:
        y.relu_()
    dy = tensor(shape, layout, dt, gen)
    mask = [True, True, True]
    nbb = torch.ops.aten.native_batch_norm_backward
    if act is None:
        def run():
            nbb(dy, x, w, rm, rv, sm, si, True, EPS, mask)
    else:
        thb = torch.ops.aten.threshold_backward

        def run():
            g = thb(dy, y, 0.0)
            nbb(g, x, w, rm, rv, sm, si, True, EPS, mask)
    return run


def run_case(text, warmup, reps):
    try:
        op, layout, dtype, shape = parse_case(text)
    except ValueError as e:
        return {"type": "result", "lib": "torch", "case": text, "status": "error", "reason": str(e)}
    out = {"type": "result", "lib": "torch", "op": op, "layout": layout, "dtype": dtype,
           "shape": shape if layout != "nc" else shape[:2]}
    tshape = shape if layout != "nc" else shape[:2]
    # parameters f32 (like norma) when PyTorch takes bf16 data with f32 parameters, else bf16
    pdts = [torch.float32] if dtype == "f32" else [torch.float32, torch.bfloat16]
    errors = []
    for pdt in pdts:
        try:
            fn = build(op, layout, dtype, tshape, pdt)
            fn()  # also checks that PyTorch accepts the combination
        except (RuntimeError, TypeError) as e:
            errors.append(str(e).splitlines()[0][:200])
            continue
        mn, med, mx, n = timeit(fn, warmup, reps)
        impl = "aten"
        if dtype == "bf16":
            impl += " (params %s)" % ("f32" if pdt == torch.float32 else "bf16")
        if op.startswith("add_relu"):
            impl += " unfused bn+add_+relu_" if not op.endswith("bwd") else " threshold_backward+bn_bwd"
        elif op.startswith("relu"):
            impl += " unfused bn+relu_" if not op.endswith("bwd") else " threshold_backward+bn_bwd"
        out.update(status="ok", min_ms=mn, median_ms=med, max_ms=mx, reps=n, warmup=warmup,
                   impl=impl)
        return out
    out.update(status="n/a", reason="PyTorch rejects this case: " + " | ".join(errors))
    return out


def main():
    ap = argparse.ArgumentParser(description="norma-bench PyTorch worker")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--info", action="store_true")
    ap.add_argument("--case", action="append", default=[])
    ap.add_argument("--stdin", action="store_true")
    a = ap.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.set_grad_enabled(False)

    def emit(obj):
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    if a.info:
        emit({"type": "info", "lib": "torch", "version": torch.__version__,
              "threads": torch.get_num_threads(), "warmup": a.warmup, "reps": a.reps,
              "jemalloc": jemalloc_loaded(), "malloc_conf": os.environ.get("MALLOC_CONF", ""),
              "parallel": torch.__config__.parallel_info().splitlines()[-1].strip()})
    for c in a.case:
        emit(run_case(c, a.warmup, a.reps))
    if a.stdin:
        for line in sys.stdin:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if line == "quit":
                break
            emit(run_case(line, a.warmup, a.reps))


if __name__ == "__main__":
    main()
