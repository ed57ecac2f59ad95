#!/usr/bin/python3
"""Times a whole training step (forward, backward, optimizer step) of a ResNet-style CNN with
PyTorch's BatchNorm and with norma's (norma.torch.convert on a copy of the same model), in
both memory formats.

    examples/train_step.py                               # batch 16, 112x112 input, 2 stages
    examples/train_step.py --threads 2 --batch 32 --steps 20
    examples/train_step.py --profile                     # + time spent in BN, per impl.

The model: a stem (conv 3x3 stride 2 + BN + ReLU: 112x112 -> 56x56), then residual stages of
basic blocks (conv-BN-ReLU-conv-BN + identity or conv1x1-BN shortcut, ReLU): --width channels
at 56x56, 2x width at 28x28 (and more with --stages 3), global average pooling, Linear-BN1d-ReLU
and a Linear classifier.  SGD with momentum, cross-entropy on fixed random data.

Method: both models start from the same weights; the steps of torch and norma alternate (torch,
norma, torch, norma...: warm-up steps first, then timed ones) so that the noise of a shared
machine hits both alike; the table gives the median (and min / max) wall-clock time over
--steps steps of each, and the speedup = torch's median / norma's median, also for the
process CPU time of a step (less sensitive to other processes on a loaded machine).  The losses
of the two runs are printed (they agree to float32 rounding at first; the same fixed batch is
trained on, so they then drift apart slowly as any two float32 runs do).
"""

import argparse
import copy
import datetime
import json
import os
import platform
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import norma  # noqa: E402
import norma.torch as nt  # noqa: E402


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = None
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.shortcut is None else self.shortcut(x)
        return self.relu(out + identity)


class ResNetish(nn.Module):
    def __init__(self, width=32, stages=2, blocks=2, classes=100):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 2, 1, bias=False),
                                  nn.BatchNorm2d(width), nn.ReLU(inplace=True))
        layers = []
        cin = width
        for s in range(stages):
            cout = width * 2 ** s
            for b in range(blocks):
                layers.append(BasicBlock(cin, cout, 2 if (b == 0 and s > 0) else 1))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Sequential(nn.Linear(cin, 256), nn.BatchNorm1d(256), nn.ReLU(inplace=True),
                                  nn.Linear(256, classes))

    def forward(self, x):
        x = self.pool(self.layers(self.stem(x)))
        return self.head(torch.flatten(x, 1))


class FusedBasicBlock(nn.Module):
    """A BasicBlock computed with norma's fusions: bn1 + ReLU in one pass, and
    bn2 + residual add + ReLU in one pass (norma BatchNorm2d with fuse_relu=True)."""

    def __init__(self, block):
        super().__init__()
        self.conv1 = block.conv1
        self.bn1 = _fused_bn(block.bn1)
        self.conv2 = block.conv2
        self.bn2 = _fused_bn(block.bn2)
        self.shortcut = block.shortcut

    def forward(self, x):
        out = self.bn1(self.conv1(x))
        identity = x if self.shortcut is None else self.shortcut(x)
        return self.bn2(self.conv2(out), identity)


def _fused_bn(bn):
    """norma's BN with fuse_relu=True sharing bn's parameters and buffers."""
    cls = nt.BatchNorm1d if isinstance(bn, nn.BatchNorm1d) else nt.BatchNorm2d
    new = cls(bn.num_features, bn.eps, bn.momentum, bn.affine, bn.track_running_stats,
              fuse_relu=True)
    new._parameters.update(bn._parameters)
    new._buffers.update(bn._buffers)
    new.train(bn.training)
    return new


def fuse(model):
    """The ResNetish model with every BN + ReLU (and BN + add + ReLU) fused by norma; the
    same parameters and buffers (state_dict keys differ only where a ReLU was dropped)."""
    model.stem = nn.Sequential(model.stem[0], _fused_bn(model.stem[1]))
    model.layers = nn.Sequential(*[FusedBasicBlock(b) for b in model.layers])
    model.head = nn.Sequential(model.head[0], _fused_bn(model.head[1]), model.head[3])
    return model


def bn_shapes(model, x):
    """The input shapes of the BN layers (for the report)."""
    shapes = []
    hooks = [m.register_forward_hook(lambda m, i, o: shapes.append(tuple(i[0].shape)))
             for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return shapes


def make_step(model, x, target, lr=0.01):
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)
    loss_fn = nn.CrossEntropyLoss()

    def step():
        c0 = time.process_time()
        t0 = time.perf_counter()
        loss = loss_fn(model(x), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        t1 = time.perf_counter()
        return t1 - t0, time.process_time() - c0, loss.item()
    return step


def profile_bn(step, steps=3):
    """(BN ms, BN + ReLU ms, total ms) per step from torch.profiler (self CPU time, forward +
    backward), and the BN ops: aten::native_batch_norm* for torch, norma's autograd Functions
    for norma; the ReLU ops are aten::relu(_) and aten::threshold_backward (what norma's fused
    variant folds into its BN)."""
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    bn = relu = 0.0
    rows = {}
    for ev in prof.key_averages():
        name = ev.key
        ms = ev.self_cpu_time_total / 1e3 / steps
        if name in ("aten::native_batch_norm", "aten::native_batch_norm_backward") or (
                name.endswith("BatchNormTrainFunction") or
                name.endswith("BatchNormTrainFunctionBackward")) and "evaluate" not in name:
            rows[name] = ms
            bn += ms
        elif name in ("aten::relu", "aten::relu_", "aten::threshold_backward",
                      "aten::clamp_min", "aten::clamp_min_"):
            relu += ms
    total = sum(ev.self_cpu_time_total for ev in prof.key_averages()) / 1e3 / steps
    return bn, bn + relu, total, rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=0,
                    help="threads for torch and norma (default: torch's default)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--size", type=int, default=112, help="input height = width (default 112)")
    ap.add_argument("--width", type=int, default=32, help="channels of the first stage")
    ap.add_argument("--stages", type=int, default=2, help="residual stages (default 2)")
    ap.add_argument("--blocks", type=int, default=2, help="blocks per stage (default 2)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per implementation")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--formats", default="contiguous,channels_last")
    ap.add_argument("--fused", action="store_true",
                    help="also time norma with its fusions (BN+ReLU, BN+add+ReLU in one pass: "
                         "a model change, see FusedBasicBlock)")
    ap.add_argument("--profile", action="store_true",
                    help="also measure the time spent in BN with torch.profiler")
    ap.add_argument("--json", default=None, help="write the results to this file")
    args = ap.parse_args(argv)

    if args.threads > 0:
        torch.set_num_threads(args.threads)
        norma.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    torch.manual_seed(0)
    base = ResNetish(args.width, args.stages, args.blocks)
    g = torch.Generator().manual_seed(1)
    x0 = torch.randn(args.batch, 3, args.size, args.size, generator=g)
    target = torch.randint(0, 100, (args.batch,), generator=g)
    shapes = bn_shapes(copy.deepcopy(base).eval(), x0)

    print("train_step: %s, batch %d, input 3x%dx%d, width %d, %d stages x %d blocks, %d BN "
          "layers" % (type(base).__name__, args.batch, args.size, args.size, args.width,
                      args.stages, args.blocks, len(shapes)))
    print("  torch %s (%d threads), norma %s (%s, %d threads), %s, %s" % (
        torch.__version__, threads, norma.version(), norma.get_isa(), norma.get_num_threads(),
        platform.processor() or platform.machine(), datetime.date.today().isoformat()))
    print("  BN inputs: %s" % ", ".join("x".join(str(d) for d in s[1:]) for s in
                                        sorted(set(shapes), key=shapes.index)))
    print()
    results = []
    for fmt_name in args.formats.split(","):
        fmt = {"contiguous": torch.contiguous_format,
               "channels_last": torch.channels_last}[fmt_name.strip()]
        x = x0.contiguous(memory_format=fmt)
        tmodel = copy.deepcopy(base).to(memory_format=fmt)
        nmodel = nt.convert(copy.deepcopy(base).to(memory_format=fmt))
        steps = {"torch": make_step(tmodel, x, target), "norma": make_step(nmodel, x, target)}
        if args.fused:
            fmodel = fuse(nt.convert(copy.deepcopy(base))).to(memory_format=fmt)
            steps["norma_fused"] = make_step(fmodel, x, target)
        impls = list(steps)
        times = {n: [] for n in impls}
        cpu = {n: [] for n in impls}
        losses = {n: [] for n in impls}
        for i in range(args.warmup + args.steps):
            for name, s in steps.items():
                t, c, loss = s()
                losses[name].append(loss)
                if i >= args.warmup:
                    times[name].append(t * 1e3)
                    cpu[name].append(c * 1e3)
        row = {"format": fmt_name.strip(), "impls": impls}
        for name in impls:
            row[name] = {"median_ms": statistics.median(times[name]),
                         "min_ms": min(times[name]), "max_ms": max(times[name]),
                         "cpu_median_ms": statistics.median(cpu[name]),
                         "times_ms": times[name], "cpu_ms": cpu[name],
                         "losses": losses[name]}
        row["speedup"] = row["torch"]["median_ms"] / row["norma"]["median_ms"]
        row["cpu_speedup"] = row["torch"]["cpu_median_ms"] / row["norma"]["cpu_median_ms"]
        row["loss_first_step"] = (losses["torch"][0], losses["norma"][0])
        row["max_loss_abs_diff"] = max(abs(a - b) for a, b in zip(losses["norma"],
                                                                  losses["torch"]))
        if args.fused:
            row["fused_speedup"] = row["torch"]["median_ms"] / row["norma_fused"]["median_ms"]
            row["fused_cpu_speedup"] = (row["torch"]["cpu_median_ms"] /
                                        row["norma_fused"]["cpu_median_ms"])
            row["fused_loss_first_step"] = losses["norma_fused"][0]
        if args.profile:
            # one profiled step of each implementation in turn, 5 rounds; medians per step
            prof = {n: [] for n in impls}
            for _ in range(5):
                for name, s in steps.items():
                    prof[name].append(profile_bn(s, steps=1))
            for name in impls:
                p = prof[name]
                row[name]["bn_ms"] = statistics.median(v[0] for v in p)
                row[name]["bn_relu_ms"] = statistics.median(v[1] for v in p)
                row[name]["profiled_step_ms"] = statistics.median(v[2] for v in p)
                row[name]["bn_ops"] = {k: statistics.median(v[3].get(k, 0.0) for v in p)
                                       for k in p[0][3]}
        results.append(row)

    hdr = "%-14s %27s %27s %8s %17s" % ("memory format", "torch BN: median [min-max] ms",
                                        "norma BN: median [min-max] ms", "speedup",
                                        "CPU-time speedup")
    print(hdr)
    print("-" * len(hdr))
    for r in results:
        cells = ["%8.1f [%6.1f-%6.1f]" % (r[n]["median_ms"], r[n]["min_ms"], r[n]["max_ms"])
                 for n in ("torch", "norma")]
        print("%-14s %27s %27s %7.3fx %16.3fx" % (r["format"], cells[0], cells[1],
                                                 r["speedup"], r["cpu_speedup"]))
        if "norma_fused" in r:
            f = r["norma_fused"]
            print("%-14s %27s %27s %7.3fx %16.3fx" % (
                "  + fused", "", "%8.1f [%6.1f-%6.1f]" % (f["median_ms"], f["min_ms"],
                                                         f["max_ms"]),
                r["fused_speedup"], r["fused_cpu_speedup"]))
    print()
    print("wall-clock medians of %d steps each (alternating torch / norma) after %d warm-up "
          "steps; CPU-time speedup: the same with the process CPU time of each step (less "
          "sensitive to other processes)." % (args.steps, args.warmup))
    print("loss at step 1 (torch / norma%s) and largest |difference| torch - norma over the %d "
          "steps: %s" % ((" / norma fused" if args.fused else ""), args.warmup + args.steps,
                         "; ".join("%s %.6f / %.6f%s, %.1e" % (
                             r["format"], r["loss_first_step"][0], r["loss_first_step"][1],
                             (" / %.6f" % r["fused_loss_first_step"]) if args.fused else "",
                             r["max_loss_abs_diff"]) for r in results)))
    if args.profile:
        print()
        print("time in BN (and BN + ReLU) per step, torch.profiler self CPU time, forward + "
              "backward, median of 5 profiled steps of each (a profiled step is slower than an "
              "unprofiled one):")
        for r in results:
            for n in r["impls"]:
                print("  %-14s %-11s BN %6.1f ms, BN+ReLU %6.1f ms of %6.1f ms (%4.1f%%)  %s" % (
                    r["format"], n, r[n]["bn_ms"], r[n]["bn_relu_ms"], r[n]["profiled_step_ms"],
                    100 * r[n]["bn_relu_ms"] / r[n]["profiled_step_ms"],
                    ", ".join("%s %.1f" % (k.replace("aten::native_", "").replace(
                        "BatchNormTrainFunction", "norma"), v)
                        for k, v in sorted(r[n]["bn_ops"].items()))))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"argv": sys.argv, "date": datetime.datetime.now().isoformat(),
                       "threads": threads, "torch": torch.__version__,
                       "norma": norma.version(), "isa": norma.get_isa(),
                       "bn_shapes": shapes, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
