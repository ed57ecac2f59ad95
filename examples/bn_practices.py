#!/usr/bin/python3
"""The practices around BatchNorm that norma.torch supports, each run on a small problem with
its effect measured.  One process, CPU, seconds each:

    examples/bn_practices.py counted     count-weighted running statistics, uneven batches
    examples/bn_practices.py precise     recompute_bn_stats: the eval-vs-train gap it closes
    examples/bn_practices.py nonfinite   detect_nonfinite on three injected faults
    examples/bn_practices.py clip        AdaptiveGradClip against gradient spikes
    examples/bn_practices.py streaming   StreamingBatchNorm on a drifting stream
    examples/bn_practices.py autocast    bfloat16 autocast: loss and step time
    examples/bn_practices.py all

Everything is seeded: the numbers of docs/python.md come from these commands.
"""

import argparse
import copy
import math
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


def small_cnn(classes=10, dropout=0.0):
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(dropout), nn.Linear(32, classes))


def task(n, seed, classes=10, size=16, noise=1.2):
    g = torch.Generator().manual_seed(seed)
    templates = torch.randn(classes, 3, size, size, generator=torch.Generator().manual_seed(7))
    y = torch.randint(0, classes, (n,), generator=g)
    x = 1.5 * (templates[y] + noise * torch.randn(n, 3, size, size, generator=g)) + 0.5
    return x, y


# ------------------------------------------------------------------------------------------


def counted():
    """A stream of uneven batches (an epoch's last batch short, a sampler that varies the
    batch size): the running mean after each epoch, against the true mean of the data, with
    torch's update (every batch weighs the same) and with count_weighted=True."""
    print("== count-weighted running statistics (uneven batches)")
    torch.manual_seed(0)
    sizes = [64, 64, 64, 2] * 25            # epochs of 194 samples ending with a batch of 2
    g = torch.Generator().manual_seed(1)
    # the short batches come from another part of the data (the tail of a sorted dataset)
    batches = []
    for s in sizes:
        shift = 3.0 if s == 2 else 0.0
        batches.append(torch.randn(s, 4, 8, 8, generator=g) + shift)
    every = torch.cat([b.transpose(0, 1).reshape(4, -1) for b in batches], 1)
    true_mean = every.mean(1)
    for momentum in (0.1, 0.01, None):
        errs = {}
        for cw in (False, True):
            bn = nt.BatchNorm2d(4, momentum=momentum, count_weighted=cw)
            with torch.no_grad():
                for b in batches:
                    bn(b)
            errs[cw] = (bn.running_mean - true_mean).abs().mean().item()
        print("momentum %-5s  |running_mean - mean of the data|: torch's rule %.4f, "
              "count-weighted %.4f" % (momentum, errs[False], errs[True]))
    print("(mean of the data per channel %.4f; the batches of 2 samples have mean ~3)"
          % true_mean.mean().item())


def precise():
    """Train the small CNN with a high learning rate on a noisy task (the weights move fast,
    the running statistics, an average over the last ~10 batches, lag behind them) and
    evaluate every 10 steps on 1024 held-out images: the loss in eval mode with the running
    statistics, in eval mode after recompute_bn_stats over 16 training batches of 32, and in
    training mode (batch statistics of the evaluation batch itself) as the reference."""
    print("== precise statistics: recompute_bn_stats")
    torch.manual_seed(0)
    model = nt.convert(small_cnn())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    xv, yv = task(1024, 99, noise=3.0)
    rows = []
    for step in range(150):
        model.train()
        x, y = task(32, step, noise=3.0)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 10 == 9:
            probe = copy.deepcopy(model)
            with torch.no_grad():
                probe.train()
                lt = nn.functional.cross_entropy(probe(xv), yv).item()
                probe.eval()
                out = probe(xv)
                lr = nn.functional.cross_entropy(out, yv).item()
                ar = (out.argmax(1) == yv).float().mean().item()
                nt.recompute_bn_stats(probe, [task(32, 5000 + i, noise=3.0)[0]
                                              for i in range(16)])
                out = probe(xv)
                lp = nn.functional.cross_entropy(out, yv).item()
                ap = (out.argmax(1) == yv).float().mean().item()
            rows.append((lt, lr, lp, ar, ap))
            print("step %3d  validation loss: train-mode %.4f | eval, running stats %.4f "
                  "(acc %.3f) | eval, recomputed %.4f (acc %.3f)" % (step + 1, lt, lr, ar, lp,
                                                                    ap))
    gap_r = statistics.mean(abs(r[1] - r[0]) for r in rows)
    gap_p = statistics.mean(abs(r[2] - r[0]) for r in rows)
    # fluctuation: how much the eval loss jumps from one checkpoint to the next
    jump_r = statistics.mean(abs(a[1] - b[1]) for a, b in zip(rows, rows[1:]))
    jump_p = statistics.mean(abs(a[2] - b[2]) for a, b in zip(rows, rows[1:]))
    print("mean |eval - train-mode| loss gap: running statistics %.4f, recomputed %.4f; mean "
          "change of the eval loss between checkpoints: %.4f -> %.4f"
          % (gap_r, gap_p, jump_r, jump_p))


def nonfinite():
    """Three faults injected into a converted CNN; detect_nonfinite names each one; the cost of
    the scan on a training step."""
    print("== non-finite diagnosis: detect_nonfinite")
    x, y = task(16, 3)

    def model():
        torch.manual_seed(0)
        return nt.convert(small_cnn())

    m = model()
    with torch.no_grad():
        m[3].weight[5, 2, 1, 1] = float("inf")      # a conv weight that diverged (Inf x 0 = NaN)
    with nt.detect_nonfinite(m, raise_error=False) as found:
        m(x)
    print("1.", found.first)
    m = model()
    with torch.no_grad():
        m[4].running_var[7] = 0.0
        m[4].eps = 0.0
    m.eval()
    with nt.detect_nonfinite(m, raise_error=False) as found:
        m(torch.zeros_like(x))
    print("2.", found.first)
    bn = nt.BatchNorm2d(16)                           # float16 activations (norma takes them)
    with torch.no_grad():
        bn.weight[3] = 3e4                            # fine in float32, not in float16
    with nt.detect_nonfinite(bn, raise_error=False) as found:
        bn(torch.randn(16, 16, 8, 8, generator=torch.Generator().manual_seed(5)).half())
    print("3.", found.first)
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)

    def step():
        loss = nn.functional.cross_entropy(m(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    plain, watched = [], []
    for _ in range(15):
        t = time.perf_counter()
        step()
        plain.append(time.perf_counter() - t)
        t = time.perf_counter()
        with nt.detect_nonfinite(m):
            step()
        watched.append(time.perf_counter() - t)
    print("cost: a training step %.2f ms plain, %.2f ms inside detect_nonfinite (median of 15)"
          % (1e3 * statistics.median(plain), 1e3 * statistics.median(watched)))


def clip():
    """Gradient spikes: every 25 steps a batch whose loss is 100 times too large (a corrupted
    batch, a loss-scale accident); 200 SGD steps of the small CNN, 3 seeds, with and without
    AdaptiveGradClip (default factor 2, alpha 0.05); the validation accuracy at the end."""
    print("== adaptive clip of BatchNorm's parameter gradients: AdaptiveGradClip")
    for use in (False, True):
        accs, losses, clipped = [], [], []
        for seed in range(3):
            torch.manual_seed(seed)
            model = nt.convert(small_cnn())
            opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
            clipper = nt.AdaptiveGradClip(model) if use else None
            for step in range(200):
                x, y = task(32, step + 1000 * seed)
                loss = nn.functional.cross_entropy(model(x), y)
                if step % 25 == 24:
                    loss = loss * 100.0
                opt.zero_grad()
                loss.backward()
                if clipper:
                    clipper.step()
                opt.step()
            model.eval()
            xv, yv = task(512, 99)
            with torch.no_grad():
                out = model(xv)
            losses.append(nn.functional.cross_entropy(out, yv).item())
            accs.append((out.argmax(1) == yv).float().mean().item())
            clipped.append(clipper.clipped if clipper else 0)
        print("%-14s validation accuracy %s (mean %.3f), loss %s%s"
              % ("with the clip:" if use else "without:", " ".join("%.3f" % a for a in accs),
                 statistics.mean(accs), " ".join("%.2f" % v for v in losses),
                 ", steps clipped %s of 200" % "/".join(map(str, clipped)) if use else ""))


def streaming():
    """A stream whose brightness and contrast drift (a video): per-frame normalization error
    against the frame's own ideal normalization (its exact statistics), for BatchNorm in eval
    mode (statistics of the start), and StreamingBatchNorm with alpha 0.05, 0.2, 0.5."""
    print("== streaming normalization: StreamingBatchNorm")
    g = torch.Generator().manual_seed(4)
    frames = []
    for t in range(400):
        gain = 1.0 + 0.8 * math.sin(t / 40.0)
        offset = 2.0 * math.sin(t / 90.0) + t / 200.0
        frames.append(gain * torch.randn(1, 8, 12, 12, generator=g) + offset)
    video = torch.cat(frames)

    def ideal(f):
        m = f.mean(dim=(2, 3), keepdim=True)
        v = f.var(dim=(2, 3), unbiased=False, keepdim=True)
        return (f - m) / torch.sqrt(v + 1e-5)

    target = ideal(video)
    bn = nt.BatchNorm2d(8, affine=False)
    with torch.no_grad():
        bn.train()
        bn(video[:20])  # statistics of the first frames, as a model trained on them would have
        bn.momentum = 0.0
        bn.eval()
        err = (bn(video) - target).abs().mean().item()
    print("BatchNorm, eval mode (statistics of the start)  mean |error| %.4f" % err)
    for alpha in (0.05, 0.2, 0.5):
        s = nt.StreamingBatchNorm(8, alpha=alpha, affine=False)
        with torch.no_grad():
            out = torch.cat([s(video[i:i + 16]) for i in range(0, 400, 16)])
        err = (out - target).abs().mean().item()
        print("StreamingBatchNorm alpha %-4s (chunks of 16)   mean |error| %.4f" % (alpha, err))


def autocast():
    """A training step of the small CNN at batch 64, 32x32, float32 and under
    torch.autocast("cpu", bfloat16), torch's BatchNorm and norma's: step time and loss after
    30 steps."""
    print("== mixed precision: torch.autocast(\"cpu\", dtype=torch.bfloat16)")
    for name in ("torch", "norma"):
        for bf16 in (False, True):
            torch.manual_seed(0)
            model = small_cnn()
            if name == "norma":
                model = nt.convert(model)
            model = model.to(memory_format=torch.channels_last)
            opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
            times = []
            for step in range(30):
                x, y = task(64, step, size=32)
                x = x.contiguous(memory_format=torch.channels_last)
                t = time.perf_counter()
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    loss = nn.functional.cross_entropy(model(x).float(), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                times.append(time.perf_counter() - t)
            print("%-5s %-8s step %.2f ms (median), loss after 30 steps %.4f"
                  % (name, "bfloat16" if bf16 else "float32", 1e3 * statistics.median(times[5:]),
                     loss.item()))


def main():
    cmds = {"counted": counted, "precise": precise, "nonfinite": nonfinite, "clip": clip,
            "streaming": streaming, "autocast": autocast}
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=sorted(cmds) + ["all"])
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    norma.set_num_threads(args.threads)
    print("norma.torch backend: %s, %d thread(s)" % (nt.backend(), args.threads))
    for name, fn in cmds.items():
        if args.what in (name, "all"):
            fn()
            print()


if __name__ == "__main__":
    main()
