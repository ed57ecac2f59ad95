#!/usr/bin/python3
"""peer_torch.py - the PyTorch worker of norma-bench.

Same command line, case syntax, output and methodology as the C workers
(tools/bench/worker_common.h):

    peer_torch.py [--threads N] [--warmup W] [--reps R] [--budget-s S] [--info]
                  [--min-warmup-ms MS] [--min-time-ms MS]
                  [--case 'OP LAYOUT DTYPE DIMS [key=value]...']... [--stdin]

prints one JSON line per case: {"type": "result", "lib": "torch", "op": ..., "status": "ok",
"min_ms": ..., "median_ms": ..., "max_ms": ..., "reps": ..., "warmup": ..., "impl": ...}.

What is timed (PyTorch's own CPU kernels; forwards under torch.no_grad()):
BatchNorm (autograd disabled, torch.set_grad_enabled(False), as before):
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
The norm family, as users write it (eps = 1e-5, weight and bias of the normalized size):
  ln_fwd         F.layer_norm(x, (D,), w, b, eps)
  ln_res_fwd     h = x + r; y = F.layer_norm(h, (D,), w, b, eps)   (h is kept: the residual stream)
  rms_fwd        x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
  gn_fwd         F.group_norm(x, G, w, b, eps)
  gn_silu_fwd    F.silu(F.group_norm(x, G, w, b, eps))   (diffusers: norm, then nn.SiLU())
  in_fwd         F.instance_norm(x, None, None, w, b, use_input_stats=True, eps=eps)
  *_bwd          the forward above is recorded once with requires_grad inputs (untimed); the
                 timed call is torch.autograd.grad(y, (x, [r,] w[, b]), dy, retain_graph=True):
                 the autograd backward of the expression, every node of it (e.g. RMSNorm: mul,
                 rsqrt, mean, pow; GroupNorm + SiLU: SiluBackward then NativeGroupNormBackward),
                 including the engine's per-call cost (a few tens of microseconds).
                 ln_res_bwd: torch.autograd.grad((y, h), (x, r, w, b), (dy, dsum)): autograd adds
                 dsum (the gradient reaching h from the residual stream) to the LayerNorm's dx.
Channels-last uses torch.channels_last tensors (x, y, dy, residual).  bf16 / f16: x / y / dy /
residual in that type, weight / bias / running statistics f32 when PyTorch accepts the mix (as
norma's parameters are f32), else in the data type (said in "impl"); a type PyTorch's CPU
kernels do not take (f16 in 1.13) is reported n/a.

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
# the norm family: op -> (family, direction, variant)
FAMILY_OPS = {
    "ln_fwd": ("ln", "fwd", None), "ln_bwd": ("ln", "bwd", None),
    "ln_res_fwd": ("ln", "fwd", "res"), "ln_res_bwd": ("ln", "bwd", "res"),
    "rms_fwd": ("rms", "fwd", None), "rms_bwd": ("rms", "bwd", None),
    "gn_fwd": ("gn", "fwd", None), "gn_bwd": ("gn", "bwd", None),
    "gn_silu_fwd": ("gn", "fwd", "silu"), "gn_silu_bwd": ("gn", "bwd", "silu"),
    "in_fwd": ("in", "fwd", None), "in_bwd": ("in", "bwd", None),
}
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def parse_case(text):
    """-> (op, layout, dtype, shape, opts); opts: groups, reps, warmup (None when not given)."""
    parts = text.split()
    if len(parts) < 4:
        raise ValueError("case '%s': expected '<op> <layout> <dtype> N,C[,H[,W]]'" % text)
    op, layout, dtype, dims = parts[:4]
    if op not in OPS and op not in FAMILY_OPS:
        raise ValueError("unknown op '%s'" % op)
    if layout not in ("nchw", "nhwc", "nc", "rows"):
        raise ValueError("unknown layout '%s' (nchw, nhwc, nc, rows)" % layout)
    if dtype not in DTYPES:
        raise ValueError("unknown dtype '%s' (f32, bf16, f16)" % dtype)
    shape = [int(v) for v in dims.replace("x", ",").split(",")]
    if len(shape) < 2 or len(shape) > 4 or min(shape) < 1:
        raise ValueError("shape '%s': need 2 to 4 dimensions >= 1" % dims)
    family = FAMILY_OPS[op][0] if op in FAMILY_OPS else "bn"
    rowwise = family in ("ln", "rms")
    if rowwise != (layout == "rows"):
        raise ValueError("op '%s' takes layout 'rows'" % op if rowwise else
                         "layout 'rows' is for LayerNorm / RMSNorm ops, not '%s'" % op)
    opts = {"groups": 32 if family == "gn" else None, "reps": None, "warmup": None}
    for tok in parts[4:]:
        key, eq, val = tok.partition("=")
        if not eq or key not in opts:
            raise ValueError("case '%s': unknown option '%s' (groups, reps, warmup)" % (text, tok))
        opts[key] = int(val)
    if opts["groups"] is not None and family != "gn":
        raise ValueError("groups= is for GroupNorm ops")
    if rowwise:
        return op, layout, dtype, shape, opts
    if len(shape) == 2 and family == "bn":
        layout = "nc"
    else:
        while len(shape) < 4:
            shape.append(1)
        if layout == "nc":
            raise ValueError("layout nc needs a 2-D shape N,C" if family == "bn" else
                             "op '%s' needs N,C,H[,W] and layout nchw or nhwc" % op)
    if family == "gn" and shape[1] % opts["groups"]:
        raise ValueError("groups (%d) must divide C (%d)" % (opts["groups"], shape[1]))
    return op, layout, dtype, shape, opts


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


BUDGET_MS = 0.0  # --budget-s, as the C workers: warm-ups stop after a quarter, timed runs after it
# --min-warmup-ms, --min-time-ms, as the C workers: warm-ups and timed runs go on past --warmup,
# --reps runs until they have taken this long (at most MAX_REPS runs each)
MIN_WARM_MS, MIN_TIME_MS, MAX_REPS = 0.0, 0.0, 100000


def timeit(fn, warmup, reps):
    """-> min, median, max, 10th and 90th percentiles (ms, as the C workers), timed runs,
    warm-ups run."""
    spent, warm = 0.0, 0
    while warm < warmup or (spent < MIN_WARM_MS and warm < MAX_REPS):
        t0 = time.perf_counter_ns()
        fn()
        spent += (time.perf_counter_ns() - t0) * 1e-6
        warm += 1
        if BUDGET_MS > 0 and spent > 0.25 * BUDGET_MS:
            break
    ms, spent = [], 0.0
    while len(ms) < max(reps, 1) or (spent < MIN_TIME_MS and len(ms) < MAX_REPS):
        t0 = time.perf_counter_ns()
        fn()
        t1 = time.perf_counter_ns()
        ms.append((t1 - t0) * 1e-6)
        spent += ms[-1]
        if BUDGET_MS > 0 and spent > BUDGET_MS:
            break
    ms.sort()
    n = len(ms)
    med = ms[n // 2] if n % 2 else 0.5 * (ms[n // 2 - 1] + ms[n // 2])
    return ms[0], med, ms[-1], ms[(n - 1) // 10], ms[n - 1 - (n - 1) // 10], n, warm


def build(op, layout, dtype, shape, pdt):
    """Returns the closure that runs the case once (inputs and untimed setup done)."""
    direction, act = OPS[op]
    dt = DTYPES[dtype]
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


def build_family(op, layout, dtype, shape, pdt, groups):
    """The closure of a norm-family case (see the module doc); impl names what runs."""
    family, direction, variant = FAMILY_OPS[op]
    dt = DTYPES[dtype]
    gen = torch.Generator().manual_seed(1)
    tl = "nhwc" if layout == "nhwc" else "plain"
    x = tensor(shape, tl, dt, gen)
    c = shape[-1] if family in ("ln", "rms") else shape[1]
    w = torch.empty(c).uniform_(0.5, 1.5, generator=gen).to(pdt)
    b = torch.empty(c).uniform_(-0.5, 0.5, generator=gen).to(pdt)
    r = tensor(shape, tl, dt, gen) if variant == "res" else None
    bwd = direction == "bwd"
    if bwd:
        for t in (x, w, b) + ((r,) if r is not None else ()):
            t.requires_grad_(True)

    def forward():
        h = x + r if r is not None else x
        if family == "ln":
            y = F.layer_norm(h, (c,), w, b, EPS)
        elif family == "rms":
            y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS) * w
        elif family == "gn":
            y = F.group_norm(h, groups, w, b, EPS)
            if variant == "silu":
                y = F.silu(y)
        else:
            y = F.instance_norm(h, None, None, w, b, True, 0.1, EPS)
        return y, h

    if not bwd:
        def run():  # autograd is off in this worker (torch.set_grad_enabled(False))
            forward()
        return run, "aten"
    with torch.enable_grad():
        y, h = forward()  # recorded once, untimed
    dy = tensor(shape, tl, dt, gen)
    params = (w,) if family == "rms" else (w, b)
    if r is not None:
        dsum = tensor(shape, tl, dt, gen)
        outs, grads, inputs = (y, h), (dy, dsum), (x, r) + params
    else:
        outs, grads, inputs = (y,), (dy,), (x,) + params
    nodes, fn = [], y.grad_fn
    while fn is not None and len(nodes) < 8:  # the chain of autograd nodes, for "impl"
        nodes.append(type(fn).__name__)
        nxt = [f for f, _ in fn.next_functions if f is not None and
               type(f).__name__ != "AccumulateGrad"]
        fn = nxt[0] if nxt else None
    grad = torch.autograd.grad

    def run():
        grad(outs, inputs, grads, retain_graph=True)
    return run, "autograd: " + " > ".join(nodes)


def run_case(text, warmup, reps):
    try:
        op, layout, dtype, shape, opts = parse_case(text)
    except ValueError as e:
        return {"type": "result", "lib": "torch", "case": text, "status": "error", "reason": str(e)}
    if opts["warmup"] is not None:
        warmup = opts["warmup"]
    if opts["reps"] is not None:
        reps = opts["reps"]
    out = {"type": "result", "lib": "torch", "op": op, "layout": layout, "dtype": dtype,
           "shape": shape if layout != "nc" else shape[:2]}
    if opts["groups"] is not None:
        out["groups"] = opts["groups"]
    tshape = shape if layout != "nc" else shape[:2]
    # parameters f32 (like norma) when PyTorch takes 16-bit data with f32 parameters, else
    # in the data type
    pdts = [torch.float32] if dtype == "f32" else [torch.float32, DTYPES[dtype]]
    errors = []
    for pdt in pdts:
        try:
            if op in FAMILY_OPS:
                fn, impl = build_family(op, layout, dtype, tshape, pdt, opts["groups"])
            else:
                fn, impl = build(op, layout, dtype, tshape, pdt), "aten"
            fn()  # also checks that PyTorch accepts the combination
        except (RuntimeError, TypeError) as e:
            errors.append(str(e).splitlines()[0][:200])
            continue
        mn, med, mx, p10, p90, n, warm = timeit(fn, warmup, reps)
        if dtype != "f32":
            impl += " (params %s)" % ("f32" if pdt == torch.float32 else dtype)
        if op.startswith("add_relu"):
            impl += " unfused bn+add_+relu_" if not op.endswith("bwd") else " threshold_backward+bn_bwd"
        elif op.startswith("relu"):
            impl += " unfused bn+relu_" if not op.endswith("bwd") else " threshold_backward+bn_bwd"
        out.update(status="ok", min_ms=mn, median_ms=med, max_ms=mx, p10_ms=p10,
                   p90_ms=p90, reps=n, warmup=warm,
                   impl=impl)
        return out
    out.update(status="n/a", reason="PyTorch rejects this case: " + " | ".join(errors))
    return out


def main():
    ap = argparse.ArgumentParser(description="norma-bench PyTorch worker")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--budget-s", type=float, default=0.0)
    ap.add_argument("--min-warmup-ms", type=float, default=0.0)
    ap.add_argument("--min-time-ms", type=float, default=0.0)
    ap.add_argument("--info", action="store_true")
    ap.add_argument("--case", action="append", default=[])
    ap.add_argument("--stdin", action="store_true")
    a = ap.parse_args()
    global BUDGET_MS, MIN_WARM_MS, MIN_TIME_MS
    BUDGET_MS = 1e3 * a.budget_s
    MIN_WARM_MS, MIN_TIME_MS = a.min_warmup_ms, a.min_time_ms
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.set_grad_enabled(False)

    def emit(obj):
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    if a.info:
        emit({"type": "info", "lib": "torch", "version": torch.__version__,
              "threads": torch.get_num_threads(), "warmup": a.warmup, "reps": a.reps,
              "min_warmup_ms": a.min_warmup_ms, "min_time_ms": a.min_time_ms,
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
