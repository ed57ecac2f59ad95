"""Worker of tests/python/test_sync.py, run by mpirun on every rank:

    mpirun -n 3 python3 -m mpi4py tests/python/mpi_sync_worker.py --sizes 4,0,3

--sizes gives each rank's local batch size (0: an empty local batch).  Every rank builds the same
global batch (seeded), takes its slice, runs norma's SyncBatchNorm on it and compares with
norma's / torch's single-process BatchNorm on the whole (concatenated) batch: y and dx of its
slice, dweight / dbias, running statistics, num_batches_tracked, and checks that the per-channel
results are bitwise identical on every rank.  Any failed assertion raises, and `python -m
mpi4py` then aborts the whole job with a non-zero exit status.  Prints "OK rank <r>" at the end.
"""

import argparse
import copy
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from mpi4py import MPI  # noqa: E402

import norma  # noqa: E402
import norma.mpi  # noqa: E402
import norma.torch as nt  # noqa: E402

COMM = MPI.COMM_WORLD
RANK = COMM.Get_rank()
SIZE = COMM.Get_size()

TOL = {torch.float32: (2e-5, 2e-5), torch.float64: (1e-11, 1e-11),
       torch.bfloat16: (2e-2, 2e-2)}


def close(a, b, what, dtype=torch.float32, scale=1.0):
    rtol, atol = TOL[dtype]
    a = torch.as_tensor(a).double()
    b = torch.as_tensor(b).double()
    assert a.shape == b.shape, (what, a.shape, b.shape)
    torch.testing.assert_close(a, b, rtol=rtol, atol=atol * scale,
                               msg=lambda m: "rank %d: %s: %s" % (RANK, what, m))


def same_on_every_rank(t, what):
    """Bitwise identity of a per-channel result across ranks."""
    mine = t.detach().contiguous().numpy().tobytes()
    every = COMM.allgather(mine)
    assert all(e == every[0] for e in every), "rank %d: %s differs between ranks" % (RANK, what)


def slice_of(sizes):
    off = sum(sizes[:RANK])
    return off, off + sizes[RANK]


def global_batch(n, c, spatial, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((n, c) + spatial, generator=g, dtype=torch.float64)
    # per-channel offsets and scales, one channel with a large mean (accuracy of the merge)
    shift = torch.linspace(-2, 3, c, dtype=torch.float64)
    shift[-1] = 1000.0
    scale = torch.linspace(0.5, 2, c, dtype=torch.float64)
    view = (1, c) + (1,) * len(spatial)
    x = x * scale.reshape(view) + shift.reshape(view)
    gy = torch.randn((n, c) + spatial, generator=g, dtype=torch.float64)
    return x.to(dtype), gy.to(dtype)


def my_format(t):
    """4-D inputs channels_last, 5-D channels-first, on every rank: libnorma_mpi requires the
    same layout on every rank whose tensor has data (norma_mpi.h; a rank whose batch is empty
    matches any)."""
    if t.dim() == 4:
        return t.contiguous(memory_format=torch.channels_last)
    return t.contiguous()


def init_params(bn, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        if bn.weight is not None:
            bn.weight.copy_(torch.rand(bn.num_features, generator=g) + 0.5)
            bn.bias.copy_(torch.randn(bn.num_features, generator=g))
        bn.running_mean.copy_(torch.randn(bn.num_features, generator=g))
        bn.running_var.copy_(torch.rand(bn.num_features, generator=g) + 0.5)


def check_module(sizes, spatial, dtype, fuse_relu=False, param_grads="mean", steps=2,
                 momentum=0.1, seed=0, count_weighted=False):
    """SyncBatchNorm vs single-process BatchNorm (norma's and torch's) on the global batch."""
    c = 5
    n = sum(sizes)
    lo, hi = slice_of(sizes)
    pdt = torch.float64 if dtype == torch.float64 else torch.float32
    cls = {0: nt.BatchNorm1d, 1: nt.BatchNorm1d, 2: nt.BatchNorm2d, 3: nt.BatchNorm3d}
    tcls = {0: nn.BatchNorm1d, 1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}
    ref = cls[len(spatial)](c, momentum=momentum, fuse_relu=fuse_relu,
                            count_weighted=count_weighted).to(pdt)
    init_params(ref, seed)
    tref = tcls[len(spatial)](c, momentum=momentum).to(pdt)
    tref.load_state_dict({k: v for k, v in ref.state_dict().items() if k != "running_count"})
    sbn = nt.SyncBatchNorm(c, momentum=momentum, fuse_relu=fuse_relu,
                           param_grads=param_grads, count_weighted=count_weighted).to(pdt)
    sbn.load_state_dict(ref.state_dict())
    what = "module %s spatial=%s sizes=%s relu=%s %s" % (dtype, spatial, sizes, fuse_relu,
                                                          param_grads)
    for step in range(steps):
        x, gy = global_batch(n, c, spatial, seed + 100 + step, dtype)
        res = global_batch(n, c, spatial, seed + 200 + step, dtype)[0] if fuse_relu else None
        # single process, whole batch
        xr = x.clone().requires_grad_()
        yr = ref(xr, res) if fuse_relu else ref(xr)
        yr.backward(gy)
        if not fuse_relu and dtype != torch.float16 and not count_weighted:
            xt = x.clone().requires_grad_()
            yt = tref(xt)
            yt.backward(gy)
            close(yr, yt, what + " norma vs torch y", dtype, scale=10)
        # this rank's slice
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
            # dresidual = dy masked by y > 0
            close(rl.grad, (gy * (yr > 0))[lo:hi], what + " dresidual", dtype)
        factor = SIZE if param_grads == "mean" else 1
        close(sbn.weight.grad * factor, ref.weight.grad, what + " dweight", dtype, scale=n)
        close(sbn.bias.grad * factor, ref.bias.grad, what + " dbias", dtype, scale=n)
        for name in ("running_mean", "running_var") + (("running_count",) if count_weighted
                                                       else ()):
            close(getattr(sbn, name), getattr(ref, name), what + " " + name, pdt)
            same_on_every_rank(getattr(sbn, name), what + " " + name)
        same_on_every_rank(sbn.weight.grad, what + " dweight")
        same_on_every_rank(sbn.bias.grad, what + " dbias")
        assert int(sbn.num_batches_tracked) == step + 1
        for m in (ref, sbn):
            m.weight.grad = None
            m.bias.grad = None
    # eval mode: local, no communication (ranks with an empty batch skip it: no deadlock)
    sbn.eval()
    ref.eval()
    x, _ = global_batch(max(n, 1), c, spatial, seed + 999, dtype)
    if hi > lo:
        with torch.no_grad():
            close(sbn(my_format(x[lo:hi])), ref(x)[lo:hi], what + " eval y", dtype, scale=10)


def check_functional(sizes):
    """norma.mpi on numpy float64 (and an empty rank) vs norma's single-process functions."""
    c, spatial = 4, (3, 2)
    n = sum(sizes)
    lo, hi = slice_of(sizes)
    x, gy = global_batch(n, c, spatial, 7, torch.float64)
    x, gy = x.numpy(), gy.numpy()
    rng = np.random.default_rng(3)
    gamma, beta = rng.random(c) + 0.5, rng.standard_normal(c)
    rm_ref, rv_ref = np.zeros(c), np.ones(c)
    rm, rv = rm_ref.copy(), rv_ref.copy()
    y_ref, sm_ref, si_ref = norma.batch_norm_forward_training(x, gamma, beta, 1e-5, rm_ref,
                                                              rv_ref, 0.3)
    dx_ref, dg_ref, db_ref = norma.batch_norm_backward(gy, x, sm_ref, si_ref, gamma, beta)
    xl, gyl = np.ascontiguousarray(x[lo:hi]), np.ascontiguousarray(gy[lo:hi])
    y, sm, si = norma.mpi.batch_norm_forward_training(xl, gamma, beta, 1e-5, rm, rv, 0.3,
                                                      comm=COMM)
    dx, dg, db = norma.mpi.batch_norm_backward(gyl, xl, sm, si, gamma, beta, comm=COMM)
    w = "functional f64"
    close(y, y_ref[lo:hi], w + " y", torch.float64, 10)
    close(dx, dx_ref[lo:hi], w + " dx", torch.float64)
    close(sm, sm_ref, w + " save_mean", torch.float64, 1000)
    close(si, si_ref, w + " save_invstd", torch.float64)
    close(dg, dg_ref, w + " dgamma", torch.float64, n)
    close(db, db_ref, w + " dbeta", torch.float64, n)
    close(rm, rm_ref, w + " running_mean", torch.float64, 100)
    close(rv, rv_ref, w + " running_var", torch.float64, 100)
    for a, nm in ((sm, "save_mean"), (si, "save_invstd"), (dg, "dgamma"), (rm, "rm")):
        same_on_every_rank(torch.from_numpy(np.ascontiguousarray(a)), w + " " + nm)


def check_functional_counted(sizes):
    """norma.mpi with a running count (norma_bn_forward_training_counted_mpi): the
    count-weighted update with the global count, against the single-process counted call and
    against the rule written out; a negative count is started by the global batch; a mismatch
    of the flag between ranks is rejected on every rank."""
    c, spatial = 3, (5,)
    n = sum(sizes)
    lo, hi = slice_of(sizes)
    rm_ref, rv_ref, rc_ref = np.zeros(c), np.ones(c), np.array([0.0])
    rm, rv, rc = rm_ref.copy(), rv_ref.copy(), rc_ref.copy()
    u = 0.25
    count = 0.0
    mean_rule, var_rule = np.zeros(c), np.ones(c)
    for step in range(3):
        x, _ = global_batch(n, c, spatial, 40 + step, torch.float64)
        x = x.numpy()
        norma.batch_norm_forward_training(x, eps=1e-5, running_mean=rm_ref, running_var=rv_ref,
                                          momentum=u, running_count=rc_ref)
        norma.mpi.batch_norm_forward_training(np.ascontiguousarray(x[lo:hi]), eps=1e-5,
                                              running_mean=rm, running_var=rv, momentum=u,
                                              running_count=rc, comm=COMM)
        b = n * 5
        new = (1 - u) * count + u * b
        xm = x.transpose(1, 0, 2).reshape(c, -1)
        mean_rule = ((1 - u) * count * mean_rule + u * b * xm.mean(1)) / new
        var_rule = ((1 - u) * count * var_rule + u * b * xm.var(1, ddof=1)) / new
        count = new
    w = "functional counted"
    close(rc, [count], w + " running_count", torch.float64, 10)
    close(rc_ref, [count], w + " running_count (single process)", torch.float64, 10)
    close(rm, rm_ref, w + " running_mean", torch.float64, 1000)
    close(rv, rv_ref, w + " running_var", torch.float64, 1000)
    close(rm, mean_rule, w + " running_mean (rule)", torch.float64, 1e6)
    close(rv, var_rule, w + " running_var (rule)", torch.float64, 1e6)
    same_on_every_rank(torch.from_numpy(rm), w + " running_mean")
    # unknown count (-1): the global batch starts it, which is PyTorch's update
    rm2, rc2 = np.zeros(c), np.array([-1.0])
    x, _ = global_batch(n, c, spatial, 50, torch.float64)
    norma.mpi.batch_norm_forward_training(np.ascontiguousarray(x.numpy()[lo:hi]),
                                          running_mean=rm2, momentum=u, running_count=rc2,
                                          comm=COMM)
    assert rc2[0] == n * 5, rc2
    close(rm2, u * x.numpy().transpose(1, 0, 2).reshape(c, -1).mean(1), w + " unknown count",
          torch.float64, 1000)
    # the flag must agree between ranks
    rm3 = np.zeros(c)
    try:
        if RANK == 0:
            norma.mpi.batch_norm_forward_training(np.ascontiguousarray(x.numpy()[lo:hi]),
                                                  running_mean=rm3, running_count=np.zeros(1),
                                                  comm=COMM)
        else:
            norma.mpi.batch_norm_forward_training(np.ascontiguousarray(x.numpy()[lo:hi]),
                                                  running_mean=rm3, comm=COMM)
    except norma.NormaError as e:
        assert e.status_name == "NORMA_ERR_INVALID_ARGUMENT", e
    else:
        raise AssertionError("rank %d: a count-weighted rank among plain ones was not rejected"
                             % RANK)
    assert not rm3.any(), "written on error"


def check_collective_error(sizes):
    """An argument that must agree (eps) differs on one rank: every rank raises NormaError
    and nothing is written."""
    c = 3
    lo, hi = slice_of(sizes)
    x, _ = global_batch(sum(sizes), c, (4,), 11, torch.float32)
    xl = x[lo:hi].contiguous()
    rm = torch.zeros(c)
    eps = 1e-3 if RANK == SIZE - 1 else 1e-5
    try:
        norma.mpi.batch_norm_forward_training(xl, eps=eps, running_mean=rm, comm=COMM)
    except norma.NormaError as e:
        assert e.status_name == "NORMA_ERR_INVALID_ARGUMENT", e
        assert "eps" in e.detail or "rank" in e.detail, e.detail
    else:
        raise AssertionError("rank %d: mismatched eps was not rejected" % RANK)
    assert torch.count_nonzero(rm) == 0, "running_mean written on error"


def check_training(sizes, steps=3):
    """A small conv net converted with convert(sync=True) and trained data-parallel (gradients
    summed over the ranks by an allreduce, as a DDP-like loop would) gives the single-process
    run on the whole batch, step by step; convert_sync_batchnorm does the same."""
    torch.manual_seed(5)
    base = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1, bias=False), nn.BatchNorm2d(6),
                         nn.ReLU(), nn.Conv2d(6, 6, 3, padding=1, bias=False),
                         nn.BatchNorm2d(6), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 4))
    single = nt.convert(copy.deepcopy(base))
    dist = nt.convert(copy.deepcopy(base), sync=True)
    dist2 = nt.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(base), COMM)
    assert sum(isinstance(m, nt.SyncBatchNorm) for m in dist.modules()) == 3
    assert sum(isinstance(m, nt.SyncBatchNorm) for m in dist2.modules()) == 3
    assert list(dist.state_dict().keys()) == list(base.state_dict().keys())
    lo, hi = slice_of(sizes)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (single, dist, dist2)]
    g = torch.Generator().manual_seed(9)
    for step in range(steps):
        x = torch.randn(sum(sizes), 3, 6, 6, generator=g) + 1.0
        t = torch.randint(0, 4, (sum(sizes),), generator=g)
        loss_ref = nn.functional.cross_entropy(single(x), t, reduction="sum")
        opts[0].zero_grad()
        loss_ref.backward()
        opts[0].step()
        for model, opt in zip((dist, dist2), opts[1:]):
            loss = nn.functional.cross_entropy(model(my_format(x[lo:hi])), t[lo:hi],
                                               reduction="sum")
            opt.zero_grad()
            loss.backward()
            for p in model.parameters():
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                p.grad.copy_(torch.from_numpy(COMM.allreduce(p.grad.numpy(), op=MPI.SUM)))
            opt.step()
            total = COMM.allreduce(loss.item(), op=MPI.SUM)
            assert abs(total - loss_ref.item()) <= 1e-4 * abs(loss_ref.item()), \
                (RANK, step, total, loss_ref.item())
    for model in (dist, dist2):
        for (k, a), (_, b) in zip(model.state_dict().items(), single.state_dict().items()):
            close(a, b, "training state " + k, a.dtype if a.is_floating_point() else
                  torch.float64, scale=10)
    # folding works on the synchronized model too (eval mode: local)
    folded = nt.fold_bn(dist)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in folded.modules())
    dist.eval()
    xe = torch.randn(3, 3, 6, 6, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(folded(xe), dist(xe), rtol=1e-4, atol=1e-4)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", required=True, help="local batch size of each rank, e.g. 4,0,3")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    assert len(sizes) == SIZE, "--sizes needs %d values, got %s" % (SIZE, sizes)
    torch.set_num_threads(1)
    norma.set_num_threads(1)
    ok, where = norma.mpi.available()
    assert ok, where

    check_functional(sizes)
    check_functional_counted(sizes)
    check_collective_error(sizes)
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        check_module(sizes, (3, 4), dtype)
    check_module(sizes, (3, 4), torch.float32, param_grads="sum", momentum=None)
    check_module(sizes, (3, 4), torch.float32, fuse_relu=True)
    check_module(sizes, (3, 4), torch.float32, count_weighted=True, steps=3)
    check_module(sizes, (3, 4), torch.float64, count_weighted=True, momentum=None)
    check_module(sizes, (), torch.float32)          # BatchNorm1d on [N, C]
    check_module(sizes, (7,), torch.float32)        # [N, C, L]
    check_module(sizes, (2, 3, 2), torch.float32)   # [N, C, D, H, W]
    check_training(sizes)
    COMM.Barrier()
    print("OK rank %d of %d (local batch %d)" % (RANK, SIZE, sizes[RANK]), flush=True)


if __name__ == "__main__":
    main()
