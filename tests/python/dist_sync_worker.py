"""Worker of tests/python/test_distributed.py: one process of a torch.distributed (gloo) job,
started once per rank by the test (or by torchrun: the rank, world size and rendezvous then
come from the environment):

    python3 tests/python/dist_sync_worker.py --rank R --world P --init file:///tmp/x \\
        --sizes 4,0,3 [--checks module,ddp,...]

--sizes gives each rank's local batch size (0: an empty local batch).  Every rank builds the
same global batch (seeded), takes its slice, runs norma's SyncBatchNorm over the default
process group and compares with single-process BatchNorm on the whole batch (torch's, or
norma's with the same options): y and dx of its slice, parameter gradients, running
statistics, losses and weights of a DistributedDataParallel training, and checks that the
per-channel results are bitwise identical on every rank.  A failed check raises (exit status 1,
the traceback names the rank); "OK rank <r> of <P>" is printed at the end.
"""

import argparse
import copy
import datetime
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import norma  # noqa: E402
import norma.torch as nt  # noqa: E402

RANK = SIZE = None
TOL = {torch.float32: (2e-5, 2e-5), torch.float64: (1e-11, 1e-11),
       torch.bfloat16: (2e-2, 2e-2)}


def close(a, b, what, dtype=torch.float32, scale=1.0):
    rtol, atol = TOL[dtype]
    a = torch.as_tensor(a).detach().double()
    b = torch.as_tensor(b).detach().double()
    assert a.shape == b.shape, (what, a.shape, b.shape)
    torch.testing.assert_close(a, b, rtol=rtol, atol=atol * scale,
                               msg=lambda m: "rank %d: %s: %s" % (RANK, what, m))


def same_on_every_rank(t, what):
    """Bitwise identity of a per-channel result across ranks."""
    mine = t.detach().contiguous().view(-1).view(torch.uint8)
    every = [torch.empty_like(mine) for _ in range(SIZE)]
    dist.all_gather(every, mine)
    assert all(torch.equal(e, every[0]) for e in every), \
        "rank %d: %s differs between ranks" % (RANK, what)


def slice_of(sizes):
    off = sum(sizes[:RANK])
    return off, off + sizes[RANK]


def global_batch(n, c, spatial, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((n, c) + spatial, generator=g, dtype=torch.float64)
    shift = torch.linspace(-2, 3, c, dtype=torch.float64)
    shift[-1] = 1000.0  # a channel with a large mean: the merge must keep its variance
    scale = torch.linspace(0.5, 2, c, dtype=torch.float64)
    view = (1, c) + (1,) * len(spatial)
    x = x * scale.reshape(view) + shift.reshape(view)
    gy = torch.randn((n, c) + spatial, generator=g, dtype=torch.float64)
    return x.to(dtype), gy.to(dtype)


def my_format(t, fmt=None):
    """Odd ranks use channels_last (4-D / 5-D) unless fmt says: layouts may differ."""
    cl = (RANK % 2 == 1) if fmt is None else fmt == "channels_last"
    if cl and t.dim() == 4:
        return t.contiguous(memory_format=torch.channels_last)
    if cl and t.dim() == 5:
        return t.contiguous(memory_format=torch.channels_last_3d)
    return t.contiguous()


def init_params(bn, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        bn.weight.copy_(torch.rand(bn.num_features, generator=g) + 0.5)
        bn.bias.copy_(torch.randn(bn.num_features, generator=g))
        bn.running_mean.copy_(torch.randn(bn.num_features, generator=g))
        bn.running_var.copy_(torch.rand(bn.num_features, generator=g) + 0.5)


# ------------------------------------------------------------------------------------------
# SyncBatchNorm against single-process BatchNorm
# ------------------------------------------------------------------------------------------


def check_module(sizes, spatial, dtype, fuse_relu=False, param_grads="mean", steps=2,
                 momentum=0.1, count_weighted=False, seed=0):
    c = 5
    n = sum(sizes)
    lo, hi = slice_of(sizes)
    pdt = torch.float64 if dtype == torch.float64 else torch.float32
    cls = {0: nt.BatchNorm1d, 1: nt.BatchNorm1d, 2: nt.BatchNorm2d, 3: nt.BatchNorm3d}
    ref = cls[len(spatial)](c, momentum=momentum, fuse_relu=fuse_relu,
                            count_weighted=count_weighted).to(pdt)
    init_params(ref, seed)
    sbn = nt.SyncBatchNorm(c, momentum=momentum, fuse_relu=fuse_relu, param_grads=param_grads,
                           count_weighted=count_weighted).to(pdt)
    sbn.load_state_dict(ref.state_dict())
    what = "module %s spatial=%s sizes=%s relu=%s %s counted=%s" % (
        dtype, spatial, sizes, fuse_relu, param_grads, count_weighted)
    for step in range(steps):
        x, gy = global_batch(n, c, spatial, seed + 100 + step, dtype)
        res = global_batch(n, c, spatial, seed + 200 + step, dtype)[0] if fuse_relu else None
        xr = x.clone().requires_grad_()
        yr = ref(xr, res) if fuse_relu else ref(xr)
        yr.backward(gy)
        if not fuse_relu and not count_weighted and dtype != torch.bfloat16:
            # norma's single-process layer itself against torch's
            tref = nn.BatchNorm2d(c, momentum=momentum).to(pdt) if len(spatial) == 2 else None
            if tref is not None:
                tref.load_state_dict({k: v for k, v in ref.state_dict().items()})
                with torch.no_grad():
                    tref.running_mean.copy_(sbn.running_mean)
                    tref.running_var.copy_(sbn.running_var)
                close(tref(x), yr, what + " norma vs torch y", dtype, scale=10)
        xl = my_format(x[lo:hi].clone()).requires_grad_()
        rl = my_format(res[lo:hi].clone()).requires_grad_() if fuse_relu else None
        yl = sbn(xl, rl) if fuse_relu else sbn(xl)
        assert yl.shape == xl.shape
        if hi > lo and xl.dim() >= 4:
            assert yl.stride() == xl.stride(), (what, yl.stride(), xl.stride())
        yl.backward(my_format(gy[lo:hi].clone()))
        close(yl, yr[lo:hi], what + " y", dtype, scale=10)
        close(xl.grad, xr.grad[lo:hi], what + " dx", dtype)
        if fuse_relu:
            close(rl.grad, (gy * (yr > 0))[lo:hi], what + " dresidual", dtype)
        factor = SIZE if param_grads == "mean" else 1
        close(sbn.weight.grad * factor, ref.weight.grad, what + " dweight", dtype, scale=n)
        close(sbn.bias.grad * factor, ref.bias.grad, what + " dbias", dtype, scale=n)
        names = ["running_mean", "running_var"] + (["running_count"] if count_weighted else [])
        for name in names:
            close(getattr(sbn, name), getattr(ref, name), what + " " + name,
                  torch.float64 if name == "running_count" else pdt)
            same_on_every_rank(getattr(sbn, name), what + " " + name)
        same_on_every_rank(sbn.weight.grad, what + " dweight")
        assert int(sbn.num_batches_tracked) == step + 1
        for m in (ref, sbn):
            m.weight.grad = None
            m.bias.grad = None
    if count_weighted:
        # the rule itself, from the global counts: N' = (1-u) N + u B
        cnt = 0.0
        per = 1
        for s in spatial:
            per *= s
        for step in range(steps):
            u = momentum if momentum is not None else 1.0 / (step + 1)  # cumulative average
            cnt = (1 - u) * cnt + u * n * per
        assert abs(float(sbn.running_count) - cnt) <= 1e-9 * cnt, (what, sbn.running_count, cnt)


def check_errors(sizes):
    """An argument that must agree (eps) differs on one rank: every rank raises NormaError and
    nothing is written; then a global batch of one value: every rank raises too."""
    c = 3
    lo, hi = slice_of(sizes)
    x, _ = global_batch(sum(sizes), c, (4,), 11, torch.float32)
    bn = nt.SyncBatchNorm(c, eps=1e-3 if RANK == SIZE - 1 else 1e-5)
    rm = bn.running_mean.clone()
    try:
        bn(x[lo:hi].contiguous())
    except norma.NormaError as e:
        assert e.status_name == "NORMA_ERR_INVALID_ARGUMENT", e
        assert "eps" in e.detail, e.detail
    else:
        raise AssertionError("rank %d: mismatched eps was not rejected" % RANK)
    assert torch.equal(bn.running_mean, rm), "running_mean written on error"
    one = torch.randn(1 if RANK == 0 else 0, c)
    try:
        nt.SyncBatchNorm(c)(one)
    except norma.NormaError as e:
        assert "more than 1 value per channel" in e.detail, e.detail
    else:
        raise AssertionError("rank %d: a global batch of 1 value was not rejected" % RANK)


# ------------------------------------------------------------------------------------------
# DistributedDataParallel training against one process on the global batch
# ------------------------------------------------------------------------------------------


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8),
                                  nn.ReLU())
        self.block = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8),
                                   nn.ReLU(), nn.Conv2d(8, 12, 3, stride=2, bias=False),
                                   nn.BatchNorm2d(12), nn.ReLU())
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(12, 10),
                                  nn.BatchNorm1d(10), nn.ReLU(), nn.Linear(10, 4))

    def forward(self, x):
        return self.head(self.block(self.stem(x)))


def check_ddp(sizes, fmt, steps=4, sync=True, count_weighted=None):
    """convert(model, sync=...) inside DistributedDataParallel, trained with SGD (momentum,
    weight decay) on uneven local batches, against the single-process model on the global
    batch: the global loss at every step, then every weight and running statistic."""
    torch.manual_seed(5)
    base = Net()
    single = copy.deepcopy(base).to(memory_format=torch.channels_last
                                    if fmt == "channels_last" else torch.contiguous_format)
    local = nt.convert(copy.deepcopy(base), sync=sync, count_weighted=count_weighted)
    if count_weighted:
        single = nt.convert(single, count_weighted=True)
    if fmt == "channels_last":
        local = local.to(memory_format=torch.channels_last)
    n_sync = len(nt.synchronized_layers(local))
    model = DDP(local)
    lo, hi = slice_of(sizes)
    n = sum(sizes)
    opt_s = torch.optim.SGD(single.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    opt_d = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    g = torch.Generator().manual_seed(9)
    what = "ddp %s sync=%s sizes=%s counted=%s" % (fmt, sync, sizes, count_weighted)
    for step in range(steps):
        x = torch.randn(n, 3, 10, 10, generator=g) * 1.5 + 0.5
        t = torch.randint(0, 4, (n,), generator=g)
        xf = my_format(x, fmt)
        loss_ref = nn.functional.cross_entropy(single(xf), t)
        opt_s.zero_grad()
        loss_ref.backward()
        opt_s.step()
        # each rank's share of the global mean, times P (DDP averages the gradients)
        xin = my_format(x[lo:hi], fmt)
        out = model(xin)
        loss = nn.functional.cross_entropy(out, t[lo:hi], reduction="sum") * SIZE / n
        opt_d.zero_grad()
        loss.backward()
        opt_d.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        total = float(total) / SIZE
        assert abs(total - loss_ref.item()) <= 2e-5 * abs(loss_ref.item()), \
            (what, RANK, step, total, loss_ref.item())
    state = local.state_dict()
    for k, b in single.state_dict().items():
        a = state[k]
        if a.is_floating_point():
            close(a, b, what + " " + k, a.dtype if a.dtype != torch.float32 else torch.float32,
                  scale=50)
            if "running" in k and n_sync:
                same_on_every_rank(a, what + " " + k)
        else:
            assert torch.equal(a, b), (what, k, a, b)
    return local


def check_policy(sizes):
    """sync=deepest(2): the two deepest BN layers synchronize (their running statistics come
    out identical on every rank), the others keep local statistics (they differ between ranks
    that saw different data); a predicate does the same."""
    torch.manual_seed(3)
    model = nt.convert(Net(), sync=nt.deepest(2))
    names = nt.synchronized_layers(model)
    assert names == ["block.4", "head.3"], names
    model2 = nt.convert(Net(), sync=lambda name, m: name.startswith("head"))
    assert nt.synchronized_layers(model2) == ["head.3"]
    assert isinstance(model.stem[1], nt.BatchNorm2d) and not isinstance(model.stem[1],
                                                                        nt.SyncBatchNorm)
    lo, hi = slice_of(sizes)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(sum(sizes), 3, 10, 10, generator=g)
    model(x[lo:hi]).sum().backward()  # every rank runs it: the synchronized layers are
    for name in names:                 # collectives (an empty rank too)
        same_on_every_rank(dict(model.named_modules())[name].running_mean, "policy " + name)


def check_recompute(sizes):
    """recompute_bn_stats over synchronized layers: the exact statistics of the global
    batches, merged across the ranks, equal those of one process on the whole data."""
    torch.manual_seed(11)
    base = Net()
    single = nt.convert(copy.deepcopy(base))
    synced = nt.convert(copy.deepcopy(base), sync=True)
    lo, hi = slice_of(sizes)
    g = torch.Generator().manual_seed(12)
    batches = [torch.randn(sum(sizes), 3, 10, 10, generator=g) * 2 + 1 for _ in range(3)]
    seen_s = nt.recompute_bn_stats(single, batches)
    seen_d = nt.recompute_bn_stats(synced, [b[lo:hi] for b in batches])
    assert seen_s == seen_d, (seen_s, seen_d)
    for (k, a), (_, b) in zip(synced.state_dict().items(), single.state_dict().items()):
        if "running" in k:
            close(a, b, "recompute " + k, torch.float32, scale=10)
            same_on_every_rank(a, "recompute " + k)


CHECKS = ("module", "errors", "ddp", "policy", "counted", "recompute")


def main():
    global RANK, SIZE
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, default=int(os.environ.get("RANK", "0")))
    ap.add_argument("--world", type=int, default=int(os.environ.get("WORLD_SIZE", "1")))
    ap.add_argument("--init", default="env://", help="init_method of init_process_group")
    ap.add_argument("--sizes", required=True, help="local batch size of each rank, e.g. 4,0,3")
    ap.add_argument("--checks", default=",".join(CHECKS))
    ap.add_argument("--backend", choices=("auto", "extension", "ctypes"), default="auto")
    args = ap.parse_args()
    if args.backend != "auto":
        os.environ["NORMA_TORCH_BACKEND"] = args.backend
    dist.init_process_group("gloo", init_method=args.init, rank=args.rank,
                            world_size=args.world, timeout=datetime.timedelta(seconds=90))
    RANK, SIZE = dist.get_rank(), dist.get_world_size()
    sizes = [int(s) for s in args.sizes.split(",")]
    assert len(sizes) == SIZE, "--sizes needs %d values, got %s" % (SIZE, sizes)
    torch.set_num_threads(1)
    norma.set_num_threads(1)
    checks = args.checks.split(",")
    assert nt.default_group() is dist.group.WORLD
    if "module" in checks:
        for dtype in (torch.float32, torch.float64, torch.bfloat16):
            check_module(sizes, (3, 4), dtype)
        check_module(sizes, (3, 4), torch.float32, param_grads="sum", momentum=None)
        check_module(sizes, (3, 4), torch.float32, fuse_relu=True)
        check_module(sizes, (), torch.float32)          # BatchNorm1d on [N, C]
        check_module(sizes, (2, 3, 2), torch.float32)   # [N, C, D, H, W]
    if "counted" in checks:
        check_module(sizes, (3, 4), torch.float32, count_weighted=True, steps=3)
        check_module(sizes, (3, 4), torch.float64, count_weighted=True, momentum=None)
    if "errors" in checks:
        check_errors(sizes)
    if "ddp" in checks:
        check_ddp(sizes, "contiguous")
        # torch 1.13's channels_last convolution cannot take an empty batch: no empty rank
        check_ddp([s if s else 2 for s in sizes], "channels_last")
        if "counted" in checks:
            check_ddp(sizes, "contiguous", steps=2, count_weighted=True)
    if "policy" in checks:
        check_policy(sizes)
    if "recompute" in checks:
        check_recompute(sizes)
    dist.barrier()
    print("OK rank %d of %d (local batch %d, %s backend)"
          % (RANK, SIZE, sizes[RANK], nt.backend()), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
