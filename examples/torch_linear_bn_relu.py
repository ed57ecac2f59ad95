#!/usr/bin/python3
"""torch_linear_bn_relu.py - the PyTorch side of the producer-side statistics benchmark.

Times the training block  Linear(K, C, bias=False) -> BatchNorm1d(C) -> ReLU(inplace=True)  on
X [N, K] in PyTorch, forward and forward + backward, on the shapes of
examples/fused_linear_bn_relu.c (same model: no Linear bias, since a training BN right after
it removes any per-channel constant; eps 1e-5, momentum 0.1; the backward gives dX, dW, dgamma,
dbeta from a fixed dY).

    torch_linear_bn_relu.py [--shape N,K,C]... [--reps R] [--warmup W] [--threads T]
                            [--norma] [--json FILE]

Variants (one JSON line per variant, shape and pass on stdout, and appended to --json FILE):
  torch          nn.Linear -> nn.BatchNorm1d -> nn.ReLU(inplace=True), autograd
  torch_norma    the same with norma.torch.BatchNorm1d(C, fuse_relu=True) in place of
                 BatchNorm1d + ReLU (--norma; skipped with a note when norma.torch does not
                 import: PYTHONPATH=python, NORMA_LIBRARY=<build>/libnorma.so)

Passes: "fwd" is the training forward with autograd recording (what a training step runs),
"fwd+bwd" the forward then y.backward(dY).  Gradients are set to None before each run (not
timed), so the backward writes them fresh as the C example does.  Methodology as the C example:
warm-up runs, then the median (and min / max) of the timed runs, the variants interleaved run by
run.

Threads: torch.set_num_threads(T) for PyTorch's own kernels; the GEMMs run in the BLAS PyTorch
is linked with (Debian: OpenBLAS, the same library as the C example), whose thread pool is
sized by OPENBLAS_NUM_THREADS at load time: run_fusion_bench.sh sets it to T.  PyTorch
allocates every output: preload jemalloc (run_fusion_bench.sh does when it is installed) so
that large outputs reuse already-faulted pages instead of being mmapped on every call.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
from torch import nn

DEFAULT_SHAPES = [(64, 1024, 1024), (64, 2048, 2048), (64, 4096, 4096), (128, 4096, 4096),
                  (4096, 1024, 1024)]


def parse_shape(text):
    v = [int(t) for t in text.replace("x", ",").split(",")]
    if len(v) != 3 or v[0] < 2 or v[1] < 1 or v[2] < 1:
        raise argparse.ArgumentTypeError("shape '%s': expected N,K,C" % text)
    return tuple(v)


def make_block(k, c, use_norma):
    lin = nn.Linear(k, c, bias=False)
    if use_norma:
        import norma.torch as nt
        return nn.Sequential(lin, nt.BatchNorm1d(c, fuse_relu=True))
    return nn.Sequential(lin, nn.BatchNorm1d(c), nn.ReLU(inplace=True))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", type=parse_shape, action="append")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--norma", action="store_true",
                    help="also time norma.torch.BatchNorm1d(fuse_relu=True)")
    ap.add_argument("--json", default=None, help="append the JSON lines to this file")
    a = ap.parse_args()
    shapes = a.shape or DEFAULT_SHAPES
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)

    variants = [("torch", False)]
    if a.norma:
        try:
            import norma.torch  # noqa: F401
            variants.append(("torch_norma", True))
        except Exception as e:  # a missing library, a missing module: a note, not a failure
            print("note: norma.torch not available (%s: %s); torch_norma skipped"
                  % (type(e).__name__, e), file=sys.stderr)

    out = open(a.json, "a") if a.json else None
    info = {"torch": torch.__version__, "threads": torch.get_num_threads(),
            "openblas_num_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
            "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE"),
            "jemalloc": "jemalloc" in os.environ.get("LD_PRELOAD", "")}
    print("# " + json.dumps(info), file=sys.stderr)

    for (n, k, c) in shapes:
        x = torch.empty(n, k).uniform_(-1, 1).requires_grad_(True)
        dy = torch.empty(n, c).uniform_(-1, 1)
        blocks = []
        for name, use_norma in variants:
            torch.manual_seed(1)
            m = make_block(k, c, use_norma)
            m.train()
            blocks.append((name, m))
        times = {(name, p): [] for name, _ in blocks for p in ("fwd", "fwd+bwd")}

        def run(m, backward):
            x.grad = None
            for p in m.parameters():
                p.grad = None
            t0 = time.perf_counter()
            y = m(x)
            if backward:
                y.backward(dy)
            return time.perf_counter() - t0

        # check that the variants agree (same parameters, same input): y and dx
        if len(blocks) > 1:
            ys, dxs = [], []
            for _, m in blocks:
                x.grad = None
                y = m(x)
                y.backward(dy)
                ys.append(y.detach().clone())
                dxs.append(x.grad.clone())
            for i in range(1, len(blocks)):
                ey = float((ys[i] - ys[0]).abs().max() / ys[0].abs().max())
                ex = float((dxs[i] - dxs[0]).abs().max() / dxs[0].abs().max())
                print("# check %s vs torch N=%d K=%d C=%d: y %.1e dx %.1e" %
                      (blocks[i][0], n, k, c, ey, ex), file=sys.stderr)

        for r in range(-a.warmup, a.reps):
            order = blocks[r % len(blocks):] + blocks[:r % len(blocks)] if r >= 0 else blocks
            for name, m in order:
                for p, bw in (("fwd", False), ("fwd+bwd", True)):
                    t = run(m, bw)
                    if r >= 0:
                        times[(name, p)].append(t)
        for name, _ in blocks:
            for p in ("fwd", "fwd+bwd"):
                ts = times[(name, p)]
                rec = {"impl": name, "n": n, "k": k, "c": c, "pass": p,
                       "threads": torch.get_num_threads(), "reps": a.reps,
                       "min_ms": 1e3 * min(ts), "median_ms": 1e3 * statistics.median(ts),
                       "max_ms": 1e3 * max(ts)}
                line = json.dumps(rec)
                print(line, flush=True)
                if out:
                    out.write(line + "\n")
                    out.flush()
    if out:
        out.close()


if __name__ == "__main__":
    main()
