#!/usr/bin/python3
"""Per-call time of norma's norm-family modules (norma.torch.LayerNorm, RMSNorm, GroupNorm,
InstanceNorm2d) against PyTorch's own (nn.LayerNorm, the RMSNorm expression
x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w, nn.GroupNorm, nn.InstanceNorm2d):
forward without autograd ("fwd") and training forward + backward ("fwd+bwd").

    examples/bench_norms.py                  # the table of docs/python.md (2 threads)
    examples/bench_norms.py --small          # tiny shapes, one round (a smoke run)

Wall time, milliseconds per call; every variant runs in rounds interleaved with the others,
after a warm-up; the median over the rounds is printed.  norma runs through the backend the
package chose (the extension's operators when built; see --backend).
"""

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import norma  # noqa: E402
import norma.torch as nt  # noqa: E402
from norma.torch import _ops  # noqa: E402


class RMSExpr(nn.Module):
    """PyTorch's RMSNorm as an expression (torch 1.13 has no nn.RMSNorm)."""

    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def cases(small):
    s = (lambda big, tiny: tiny) if small else (lambda big, tiny: big)
    ln1 = s((8, 128, 768), (2, 4, 64))
    ln2 = s((32, 512, 1024), (2, 8, 128))
    rms = s((2048, 4096), (16, 256))
    gn = s((2, 320, 64, 64), (2, 64, 8, 8))
    inn = s((1, 64, 256, 256), (1, 8, 16, 16))
    return [
        ("LayerNorm", ln1, None, lambda: nn.LayerNorm(ln1[-1]), lambda: nt.LayerNorm(ln1[-1])),
        ("LayerNorm", ln2, None, lambda: nn.LayerNorm(ln2[-1]), lambda: nt.LayerNorm(ln2[-1])),
        ("RMSNorm", rms, None, lambda: RMSExpr(rms[-1]), lambda: nt.RMSNorm(rms[-1], eps=1e-6)),
        ("GroupNorm(32)", gn, torch.contiguous_format, lambda: nn.GroupNorm(32, gn[1]),
         lambda: nt.GroupNorm(32, gn[1])),
        ("GroupNorm(32)", gn, torch.channels_last, lambda: nn.GroupNorm(32, gn[1]),
         lambda: nt.GroupNorm(32, gn[1])),
        ("InstanceNorm2d", inn, None, lambda: nn.InstanceNorm2d(inn[1], affine=True),
         lambda: nt.InstanceNorm2d(inn[1], affine=True)),
    ]


def per_call(fn, target_s):
    """Milliseconds per call of fn, over enough calls to last about target_s."""
    t = time.perf_counter()
    fn()
    one = time.perf_counter() - t
    n = max(1, int(target_s / max(one, 1e-6)))
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--target", type=float, default=0.15,
                    help="seconds per measurement (default 0.15)")
    ap.add_argument("--backend", choices=["auto", "extension", "ctypes"], default="auto")
    ap.add_argument("--small", action="store_true", help="tiny shapes, one round")
    args = ap.parse_args()
    if args.small:
        args.rounds, args.target = 1, 0.005
    torch.set_num_threads(args.threads)
    norma.set_num_threads(args.threads)
    backend = _ops.backend() if args.backend == "auto" else args.backend
    print("%d thread(s), wall time, norma backend %s, load %.1f; milliseconds per call, median "
          "of %d rounds after a warm-up" % (args.threads, backend, os.getloadavg()[0],
                                            args.rounds))
    print("%-15s %-18s %-9s %-8s %9s %9s %7s" % ("module", "shape", "format", "pass", "torch",
                                                 "norma", "ratio"))
    with _ops.use_backend(backend):
        for name, shape, fmt, make_t, make_n in cases(args.small):
            torch.manual_seed(0)
            tm, nm = make_t(), make_n()
            x = torch.randn(shape)
            gy = torch.randn(shape)
            if fmt is not None:
                x, gy = x.contiguous(memory_format=fmt), gy.contiguous(memory_format=fmt)
            xg = x.clone().requires_grad_()

            def fwd(m):
                def run():
                    with torch.no_grad():
                        m(x)
                return run

            def fwd_bwd(m):
                def run():
                    m(xg).backward(gy)
                return run

            for label, mk in (("fwd", fwd), ("fwd+bwd", fwd_bwd)):
                fns = {"torch": mk(tm), "norma": mk(nm)}
                for f in fns.values():  # warm-up
                    f()
                    f()
                times = {k: [] for k in fns}
                for _ in range(args.rounds):
                    for k, f in fns.items():
                        times[k].append(per_call(f, args.target))
                med = {k: statistics.median(v) for k, v in times.items()}
                fmt_name = {None: "-", torch.contiguous_format: "NCHW",
                            torch.channels_last: "NHWC"}[fmt]
                print("%-15s %-18s %-9s %-8s %9.3f %9.3f %6.2fx" % (
                    name, "x".join(map(str, shape)), fmt_name, label, med["torch"],
                    med["norma"], med["torch"] / med["norma"]), flush=True)


if __name__ == "__main__":
    main()
