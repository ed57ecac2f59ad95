#!/usr/bin/python3
"""Cost of one BatchNorm call from PyTorch: torch's nn.BatchNorm2d against norma's
(nt.convert) through the PyTorch operators ("ext") and through the ctypes binding ("ctypes"),
eval forward (no grad) and training forward + backward, per shape and memory format.

    examples/bench_bn_call.py --threads 1      # process CPU time per call (robust on a busy VM)
    examples/bench_bn_call.py --threads 2      # wall time per call

Every variant runs in rounds, interleaved with the others; medians of 9 rounds, microseconds.
"""

import argparse
import contextlib
import copy
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

import torch  # noqa: E402

import norma  # noqa: E402
import norma.torch as nt  # noqa: E402
from norma.torch import _ops  # noqa: E402


def timeit(fn, n, clock):
    t = clock()
    for _ in range(n):
        fn()
    return (clock() - t) / n * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--shapes", default="8x32x7x7,8x256x14x14,8x64x56x56")
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    norma.set_num_threads(args.threads)
    clock = time.process_time if args.threads == 1 else time.perf_counter
    variants = [("torch", None), ("ext", "extension"), ("ctypes", "ctypes")]
    if nt.backend() != "extension":
        variants = [v for v in variants if v[0] != "ext"]
    print("%d thread(s), %s, load %.1f; microseconds per call, median of %d rounds"
          % (args.threads, "process CPU time" if args.threads == 1 else "wall time",
             os.getloadavg()[0], args.rounds))
    for text in args.shapes.split(","):
        shape = tuple(int(v) for v in text.split("x"))
        for fmt in (torch.contiguous_format, torch.channels_last):
            tb = torch.nn.BatchNorm2d(shape[1])
            nb = nt.convert(copy.deepcopy(tb))
            x = torch.randn(shape).to(memory_format=fmt)
            xg = x.clone().requires_grad_()
            gy = torch.randn(shape).to(memory_format=fmt)
            n = max(20, min(4000, int(4e6 / x.numel())))
            res = {}
            for rep in range(args.rounds):
                for name, be in (variants if rep % 2 == 0 else variants[::-1]):
                    m = tb if name == "torch" else nb
                    with (_ops.use_backend(be) if be else contextlib.nullcontext()):
                        m.eval()
                        with torch.no_grad():
                            res.setdefault(name + " eval", []).append(
                                timeit(lambda: m(x), n, clock))
                        m.train()

                        def step():
                            m(xg).backward(gy)
                        res.setdefault(name + " train", []).append(
                            timeit(step, max(5, n // 4), clock))
            print("%-12s %-3s  " % (text, "cl" if fmt == torch.channels_last else "cf") +
                  "  ".join("%s %.1f" % (k, statistics.median(v)) for k, v in sorted(
                      res.items(), key=lambda kv: (kv[0].split()[1], kv[0]))), flush=True)


if __name__ == "__main__":
    main()
