#!/usr/bin/python3
"""Data-parallel training on CPUs with synchronized BatchNorm: torchrun, gloo,
DistributedDataParallel, norma.torch.SyncBatchNorm.

    cmake -S . -B build && cmake --build build -j          # libnorma (+ its PyTorch operators)
    PYTHONPATH=$PWD/python OMP_NUM_THREADS=1 \\
        torchrun --standalone --nproc_per_node=3 examples/ddp_syncbn.py --steps 20

(as root, nothing more is needed; torchrun is /usr/bin/torchrun from python3-torch, or
`/usr/bin/python3 -m torch.distributed.run`).  Options:

    --sync all | none | deepest:K     which BatchNorm layers synchronize (default all)
    --timings                         per synchronized layer: collective vs compute, in µs
    --count-weighted                  count-weighted running statistics
    --channels-last                   the channels_last memory format
    --precise N                       recompute the BN statistics over N batches at the end

Each rank trains on its own shard of every global batch; the shards are uneven on purpose (a
global batch of 8·P images is split 1, 2, ... images apart) — SyncBatchNorm computes the
statistics of the whole global batch, as one process would.  The loss of each rank is its
share of the global mean (sum over its images × P / global batch), so that DDP's average of
the gradients is the gradient of the global mean.  torch 1.13's own nn.SyncBatchNorm refuses
CPU tensors; norma's runs here.
"""

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import norma  # noqa: E402
import norma.torch as nt  # noqa: E402


def make_model(classes=10):
    """A small ResNet-style CNN: stem, two stages of conv-BN-ReLU pairs, a BN'd head."""
    def block(cin, cout, stride):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout),
                             nn.ReLU(inplace=True), nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
                             nn.BatchNorm2d(cout), nn.ReLU(inplace=True))
    return nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16),
                         nn.ReLU(inplace=True), block(16, 32, 2), block(32, 64, 2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 64),
                         nn.BatchNorm1d(64), nn.ReLU(inplace=True), nn.Linear(64, classes))


def shard_sizes(global_batch, world):
    """Uneven shards: rank r gets about its share, with a skew of -1, +1, ..."""
    base = [global_batch // world] * world
    for r in range(world - 1):
        d = (r % 2) * 2 - 1  # -1, +1, -1 ...
        base[r] += d
        base[r + 1] -= d
    base[-1] += global_batch - sum(base)
    return base


def data(step, n, size, classes=10):
    """The global batch of a step (every rank makes the same one: seeded by the step)."""
    g = torch.Generator().manual_seed(1000 + step)
    templates = torch.randn(classes, 3, size, size, generator=torch.Generator().manual_seed(7))
    y = torch.randint(0, classes, (n,), generator=g)
    x = 1.5 * (templates[y] + torch.randn(n, 3, size, size, generator=g)) + 0.5
    return x, y


def policy(arg):
    if arg == "all":
        return True
    if arg == "none":
        return False
    if arg.startswith("deepest:"):
        return nt.deepest(int(arg.split(":", 1)[1]))
    raise SystemExit("--sync must be all, none or deepest:K")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--per-rank", type=int, default=8, help="images per rank (on average)")
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--sync", default="all")
    ap.add_argument("--timings", action="store_true")
    ap.add_argument("--count-weighted", action="store_true")
    ap.add_argument("--channels-last", action="store_true")
    ap.add_argument("--precise", type=int, default=0)
    ap.add_argument("--lr", type=float, default=0.05)
    args = ap.parse_args()

    dist.init_process_group("gloo")  # torchrun's environment: RANK, WORLD_SIZE, MASTER_*
    rank, world = dist.get_rank(), dist.get_world_size()
    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    torch.set_num_threads(threads)
    norma.set_num_threads(threads)
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format

    torch.manual_seed(0)  # the same initial weights on every rank (DDP also broadcasts them)
    model = nt.convert(make_model(), sync=policy(args.sync),
                       count_weighted=True if args.count_weighted else None)
    model = model.to(memory_format=fmt)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    sizes = shard_sizes(args.per_rank * world, world)
    lo = sum(sizes[:rank])
    hi = lo + sizes[rank]
    n = sum(sizes)
    if rank == 0:
        print("%d processes (gloo), local batches %s, norma.torch backend %s, synchronized "
              "layers: %d of %d" % (world, sizes, nt.backend(),
                                    len(nt.synchronized_layers(model)),
                                    sum(isinstance(m, nn.modules.batchnorm._BatchNorm)
                                        for m in model.modules())), flush=True)
    timings = nt.sync_timings(model) if args.timings else None
    if timings:
        timings.__enter__()
    t0 = time.perf_counter()
    step_times = []
    for step in range(args.steps):
        x, y = data(step, n, args.size)
        ts = time.perf_counter()
        out = ddp(x[lo:hi].contiguous(memory_format=fmt))
        loss = nn.functional.cross_entropy(out, y[lo:hi], reduction="sum") * world / n
        opt.zero_grad()
        loss.backward()
        opt.step()
        step_times.append(time.perf_counter() - ts)
        total = loss.detach().clone()
        dist.all_reduce(total)
        if rank == 0 and (step % 5 == 0 or step == args.steps - 1):
            print("step %3d  loss %.5f" % (step, float(total) / world), flush=True)
    elapsed = time.perf_counter() - t0
    if timings:
        timings.__exit__(None, None, None)
        if rank == 0:
            print("\nper synchronized layer (rank 0):")
            print(timings.table(), flush=True)
    if args.precise:
        batches = [data(10_000 + i, n, args.size)[0][lo:hi].contiguous(memory_format=fmt)
                   for i in range(args.precise)]
        nt.recompute_bn_stats(model, batches)
    model.eval()
    x, y = data(99_999, 64, args.size)
    with torch.no_grad():
        acc = (model(x.contiguous(memory_format=fmt)).argmax(1) == y).float().mean().item()
    # the running statistics of the synchronized layers are the same on every rank, bit for
    # bit (the local layers' differ after the last step: DDP broadcasts rank 0's buffers at
    # the start of each forward)
    same = True
    for name in nt.synchronized_layers(model):
        rm = dict(model.named_modules())[name].running_var.clone()
        every = [torch.empty_like(rm) for _ in range(world)]
        dist.all_gather(every, rm)
        same = same and all(torch.equal(e, rm) for e in every)
    if rank == 0:
        warm = step_times[3:] or step_times
        print("\n%d steps in %.2f s (median step %.1f ms); eval accuracy %.3f; running "
              "statistics of the synchronized layers identical on every rank: %s"
              % (args.steps, elapsed, 1e3 * sorted(warm)[len(warm) // 2], acc, same))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
