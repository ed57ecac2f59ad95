#!/usr/bin/env python3
"""Cost model of norma's SyncBatchNorm exchange for 8-1024 ranks (docs/distributed.md).

    python3 bench/mpi/cost_model.py [--bench FILE] [--shapes shared/shapes/resnet50.txt]

FILE is the output of `mpirun -np 1 bench_syncbn` (one rank): its "local" forward / backward
times at 1 and 4 images per rank are the measured compute of this machine, and its
"combine per channel" line gives gamma.  Prints markdown tables.

Model (alpha: latency per message, beta: seconds per byte, gamma: seconds per channel to
combine two records; L = ceil(log2 P)):
  record bytes      fwd 48 + 16 C (count, mean, m2 per channel), bwd 48 + 24 C
  allreduce (non-commutative, recursive doubling, what Open MPI and MPICH pick for it):
                    L * (alpha + bytes * beta + C * gamma)
  allgather (recursive doubling / Bruck), then P - 1 merges on every rank:
                    L * alpha + (P - 1) * bytes * beta + (P - 1) * C * gamma
"""
import argparse
import math
import os
import re

NETS = {  # name: (alpha s, beta s/B, what)
    "IB": (2e-6, 1 / 20e9, "InfiniBand HDR/NDR, MPI small-message latency 2 us, 20 GB/s"),
    "25GbE": (25e-6, 1 / 2.8e9, "25 Gb/s Ethernet, TCP, 25 us, 2.8 GB/s"),
}
FAST_RANK_BW = 100e9  # a rank that owns a socket: ~100 GB/s of BN streaming
FAST_RANK_OVERHEAD = 5e-6


def read_shapes(path):
    shapes = []
    for line in open(path):
        line = line.split("#")[0].split()
        if len(line) >= 6:
            n, c, h, w, k = map(int, line[:5])
            shapes.append((c, h * w, k, line[5]))
    return shapes


def read_bench(path):
    """{(n, c, s): (fwd_us, bwd_us)} and gamma (fwd, bwd) in seconds."""
    local, gamma = {}, (4e-9, 1e-9)
    if not path or not os.path.exists(path):
        return local, gamma
    for line in open(path):
        m = re.search(r"moments merge ([\d.]+) ns, backward sums ([\d.]+) ns", line)
        if m:
            gamma = (float(m.group(1)) * 1e-9, float(m.group(2)) * 1e-9)
        m = re.match(r"\s*1\s+(\d+)x(\d+)x(\d+)\s+\| fwd local\s+([\d.]+).*\| bwd local\s+([\d.]+)", line)
        if m:
            n, c, s = int(m.group(1)), int(m.group(2)), int(m.group(3))
            local[(n, c, s)] = (float(m.group(4)), float(m.group(5)))
    return local, gamma


def t_allreduce(p, c, rb, net, g):
    a, b = NETS[net][:2]
    return math.ceil(math.log2(p)) * (a + rb * b + c * g)


def t_allgather(p, c, rb, net, g):
    a, b = NETS[net][:2]
    return math.ceil(math.log2(p)) * a + (p - 1) * (rb * b + c * g)


def exchange(p, c, net, gamma, algo):
    f = t_allreduce if algo == "ar" else t_allgather
    return f(p, c, 48 + 16 * c, net, gamma[0]) + f(p, c, 48 + 24 * c, net, gamma[1])


def fast_local(b, c, s):
    """fwd + bwd of one layer on a socket-sized rank: 5 passes of b*c*s floats."""
    return 2 * FAST_RANK_OVERHEAD + 5 * 4 * b * c * s / FAST_RANK_BW


def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--bench", default=None)
    ap.add_argument("--shapes", default=os.path.join(here, "..", "..", "..", "shared", "shapes", "resnet50.txt"))
    args = ap.parse_args()
    shapes = read_shapes(args.shapes)
    local, gamma = read_bench(args.bench)
    ps = [8, 16, 64, 256, 1024]
    us = 1e6

    print(f"gamma: moments merge {gamma[0]*1e9:.1f} ns/channel, backward sums {gamma[1]*1e9:.1f} ns/channel\n")
    print("### Exchange per BN layer, forward + backward (us)\n")
    print("| C | net | " + " | ".join(f"P={p} allreduce / allgather" for p in ps) + " |")
    print("|---|---|" + "---|" * len(ps))
    for c in sorted({s[0] for s in shapes}):
        for net in NETS:
            cells = [f"{exchange(p, c, net, gamma, 'ar')*us:.0f} / {exchange(p, c, net, gamma, 'ag')*us:.0f}" for p in ps]
            print(f"| {c} | {net} | " + " | ".join(cells) + " |")

    print("\n### Per layer at 1 image per rank: local compute vs exchange (allreduce), IB (us)\n")
    print("| layer (C x HW) | local here, 1 thread (measured) | local, socket-sized rank (model) | " +
          " | ".join(f"exchange P={p}" for p in ps) + " |")
    print("|---|---|---|" + "---|" * len(ps))
    for c, s, k, name in shapes:
        m = local.get((1, c, s))
        meas = f"{m[0]+m[1]:.0f}" if m else "-"
        print(f"| {name} ({c} x {s}) | {meas} | {fast_local(1, c, s)*us:.0f} | " +
              " | ".join(f"{exchange(p, c, 'IB', gamma, 'ar')*us:.0f}" for p in ps) + " |")

    print("\n### ResNet-50, all 53 BN layers, one training step (fwd + bwd), per rank (ms)\n")
    print("| images per rank | local here (measured) | local, socket rank (model) | net | " +
          " | ".join(f"exchange P={p} (share, socket rank)" for p in ps) + " |")
    print("|---|---|---|---|" + "---|" * len(ps))
    for b in [1, 2, 4, 8, 32]:
        # measured at 1 and 4 images per rank; other batches scaled from the nearest (BN is
        # memory-bound: time ~ bytes)
        base = 1 if b < 4 else 4
        meas, have = 0.0, True
        for c, s, k, name in shapes:
            if (base, c, s) in local:
                meas += k * sum(local[(base, c, s)]) * 1e-6 * b / base
            else:
                have = False
        fl = sum(k * fast_local(b, c, s) for c, s, k, name in shapes)
        for net in NETS:
            cells = []
            for p in ps:
                ex = sum(k * exchange(p, c, net, gamma, "ar") for c, s, k, name in shapes)
                cells.append(f"{ex*1e3:.2f} ({100*ex/(ex+fl):.0f}%)")
            mcell = (f"{meas*1e3:.1f}" + ("" if b == base else " (scaled)")) if have else "-"
            print(f"| {b} | {mcell} | {fl*1e3:.2f} | {net} | " + " | ".join(cells) + " |")

    print("\n### Where allgather stops paying: extra bytes of allgather over allreduce, (P - 1 - L) records\n")
    print("| P | fwd record limit for 32 KiB extra | largest C on the allgather path (fwd / bwd) |")
    print("|---|---|---|")
    for p in [2, 3, 4, 8, 16, 64, 256, 1024]:
        extra = p - 1 - math.ceil(math.log2(p))
        if extra == 0:
            print(f"| {p} | any | any |")
            continue
        lim = 32768 // extra
        cf = max(0, (lim - 48) // 16)
        cb = max(0, (lim - 48) // 24)
        print(f"| {p} | {lim} B | {cf} / {cb} |")


if __name__ == "__main__":
    main()
