#!/usr/bin/python3
"""Step time of torchvision models with torch's BatchNorm and with norma's (nt.convert), side by
side in one process: training steps (forward, backward, SGD) and inference forwards, in both
memory formats.  Random weights (no download).  The variants run interleaved, round after
round (the order alternating), so that the load of a shared machine hits them alike.  Each
row gives a variant's median step time and its speed against torch: the ratio of the medians,
and 'paired', the median over the rounds of torch's step time over the variant's in the same
round, with its quartiles [q1, q3] (the spread of that ratio on this machine).

    examples/bench_torchvision.py --models resnet18,resnet50,mobilenet_v2 --batch 8 --size 112 \\
        --threads 2 --rounds 15

Variants: torch (the model as torchvision builds it), norma (nt.convert: the extension's
operators, or the ctypes binding when libnorma_torch is not built), with --fuse also
norma+fuse (nt.convert(model, fuse=True): BatchNorm fused with the ReLU / add + ReLU after
it), and with --ctypes norma through the ctypes binding.  Also checks that the converted model gives torch's loss
(to float32 rounding) on the first step.
"""

import argparse
import copy
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

import torch  # noqa: E402
import torchvision  # noqa: E402

import norma  # noqa: E402
import norma.torch as nt  # noqa: E402
from norma.torch import _ops  # noqa: E402


def build(name):
    torch.manual_seed(0)
    return getattr(torchvision.models, name)(num_classes=100)


class Variant:
    def __init__(self, name, model, fmt, backend, train):
        self.name = name
        self.model = model.to(memory_format=fmt)
        self.backend = backend
        self.train = train
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3, momentum=0.9)
        self.seed = 0
        self.times = []
        self.cpu = []
        self.model.train(train)

    def step(self, x, y):
        ctx = _ops.use_backend(self.backend) if self.backend else _Null()
        if self.train:  # the same dropout masks for every variant of a round
            torch.manual_seed(self.seed)
        with ctx:
            c0 = time.process_time()
            t0 = time.perf_counter()
            if self.train:
                loss = torch.nn.functional.cross_entropy(self.model(x), y)
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                self.opt.step()
            else:
                with torch.no_grad():
                    loss = torch.nn.functional.cross_entropy(self.model(x), y)
            dt = time.perf_counter() - t0
            self.last_cpu = time.process_time() - c0
        return dt, float(loss)


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def run(args):
    torch.set_num_threads(args.threads)
    norma.set_num_threads(args.threads)
    results = []
    for name in args.models.split(","):
        for fmt_name in args.formats.split(","):
            fmt = torch.channels_last if fmt_name == "channels_last" else torch.contiguous_format
            for mode in args.modes.split(","):
                train = mode == "train"
                base = build(name)
                variants = [Variant("torch", copy.deepcopy(base), fmt, None, train),
                            Variant("norma", nt.convert(copy.deepcopy(base)), fmt, None, train)]
                if args.fuse:
                    variants.append(Variant("norma+fuse", nt.convert(copy.deepcopy(base),
                                                                     fuse=True), fmt, None,
                                            train))
                if args.ctypes:
                    variants.append(Variant("norma-ctypes", nt.convert(copy.deepcopy(base)),
                                            fmt, "ctypes", train))
                g = torch.Generator().manual_seed(1)
                x = torch.randn(args.batch, 3, args.size, args.size, generator=g)
                x = x.contiguous(memory_format=fmt)
                y = torch.randint(0, 100, (args.batch,), generator=g)
                first = [v.step(x, y)[1] for v in variants]  # the same loss: same seed, weights
                for _ in range(args.warmup - 1):
                    for v in variants:
                        v.step(x, y)
                for r in range(args.rounds):
                    order = variants if r % 2 == 0 else variants[::-1]
                    for v in order:
                        v.seed = r
                        v.times.append(v.step(x, y)[0])
                        v.cpu.append(v.last_cpu)
                t = statistics.median(variants[0].times)
                row = {"model": name, "format": fmt_name, "mode": mode, "batch": args.batch,
                       "size": args.size, "threads": args.threads,
                       "loss_first": first}
                tc = statistics.median(variants[0].cpu)
                for v in variants:
                    row[v.name + "_ms"] = 1e3 * statistics.median(v.times)
                    row[v.name + "_min_ms"] = 1e3 * min(v.times)
                    row[v.name + "_speedup"] = t / statistics.median(v.times)
                    row[v.name + "_cpu_ms"] = 1e3 * statistics.median(v.cpu)
                    row[v.name + "_cpu_speedup"] = tc / statistics.median(v.cpu)
                    # paired: torch's step over this variant's step in the same round (the
                    # two ran back to back, so the machine's drift cancels); median and
                    # quartiles over the rounds
                    pr = sorted(a / b for a, b in zip(variants[0].times, v.times))
                    q = statistics.quantiles(pr, n=4) if len(pr) > 1 else [pr[0]] * 3
                    row[v.name + "_paired"] = statistics.median(pr)
                    row[v.name + "_paired_q1"], row[v.name + "_paired_q3"] = q[0], q[2]
                results.append(row)
                print("%-13s %-13s %-5s " % (name, fmt_name, mode) + "  ".join(
                    "%s %.1f ms (%.3fx, paired %.3fx [%.3f, %.3f])" % (
                        v.name, row[v.name + "_ms"], row[v.name + "_speedup"],
                        row[v.name + "_paired"], row[v.name + "_paired_q1"],
                        row[v.name + "_paired_q3"]) for v in variants[1:]) +
                    "  torch %.1f ms   first loss %s" % (
                        row["torch_ms"], " / ".join("%.6f" % f for f in first)), flush=True)
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="resnet18,resnet50,mobilenet_v2")
    ap.add_argument("--formats", default="contiguous,channels_last")
    ap.add_argument("--modes", default="train,eval")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--size", type=int, default=112)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--ctypes", action="store_true", help="also time the ctypes backend")
    ap.add_argument("--fuse", action="store_true",
                    help="also time nt.convert(model, fuse=True) (BatchNorm + ReLU fused)")
    ap.add_argument("--json", help="write the rows to this file")
    args = ap.parse_args()
    print("torch %s, torchvision %s, libnorma %s, norma.torch backend: %s, %d threads, "
          "load %.1f" % (torch.__version__, torchvision.__version__, norma.version(),
                         nt.backend(), args.threads, os.getloadavg()[0]), flush=True)
    rows = run(args)
    print("load %.1f at the end" % os.getloadavg()[0])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
