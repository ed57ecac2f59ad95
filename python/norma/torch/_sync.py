"""Synchronized BatchNorm: the statistics of a batch split across processes.

Two kinds of groups of processes:

- a torch.distributed process group (gloo on CPU; the default group when
  torch.distributed is initialized): each rank computes its moments with norma
  (norma::bn_record_forward), one ``all_gather`` moves every rank's record to every rank, and
  each rank merges them in rank order (Chan's merge, norma_bn_moments_merge) and normalizes
  its own values (norma::bn_sync_forward).  The backward is the same with the sums of
  norma_bn_backward_reduce.  One collective per direction; every rank combines the same bytes
  in the same order, so the statistics are bitwise identical on every rank.
- an mpi4py communicator: libnorma_mpi does the same in C (norma_bn_forward_training_mpi /
  norma_bn_backward_mpi, one MPI collective per call).

Errors are collective: each rank's record carries its status, so a rank whose arguments were
rejected makes every rank raise instead of leaving them blocked.
"""

import time

import torch

from .. import _core
from .. import _lib
from .._lib import NormaError, BN_RELU, BN_ADD_RELU, CHECK_FINITE
from . import _ops
from ._ops import HEADER, H_STATUS, H_COUNT, H_EPS, H_FP

_ACT = BN_RELU | BN_ADD_RELU


# ------------------------------------------------------------------------------------------
# Groups
# ------------------------------------------------------------------------------------------


def _is_mpi_comm(g):
    mod = type(g).__module__ or ""
    return mod.startswith("mpi4py")


def _dist():
    import torch.distributed as dist
    return dist if dist.is_available() else None


def default_group():
    """The group SyncBatchNorm uses with process_group=None: torch.distributed's default
    group when torch.distributed is initialized, else MPI.COMM_WORLD (mpi4py)."""
    dist = _dist()
    if dist is not None and dist.is_initialized():
        return dist.group.WORLD
    from .. import mpi as _mpi
    return _mpi.default_comm()


class Group:
    """A group of processes, torch.distributed or MPI: size, rank, all-gather of records."""

    __slots__ = ("handle", "kind", "size", "rank")

    def __init__(self, handle):
        self.handle = handle
        if _is_mpi_comm(handle):
            self.kind = "mpi"
            self.size = handle.Get_size()
            self.rank = handle.Get_rank()
        else:
            dist = _dist()
            if dist is None or not dist.is_initialized():
                raise ValueError("process_group %r is not an mpi4py communicator and "
                                 "torch.distributed is not initialized" % (handle,))
            self.kind = "torch"
            self.size = dist.get_world_size(handle)
            self.rank = dist.get_rank(handle)

    def barrier(self):
        if self.kind == "torch":
            _dist().barrier(group=self.handle)
        else:
            self.handle.Barrier()

    def allgather(self, rec):
        """[size, len(rec)] float64: every rank's record, in rank order."""
        out = torch.empty((self.size, rec.numel()), dtype=torch.float64)
        if self.kind == "torch":
            _dist().all_gather(list(out.unbind(0)), rec, group=self.handle)
        else:
            self.handle.Allgather(rec.numpy(), out.numpy())
        return out


def group_of(process_group):
    return Group(process_group if process_group is not None else default_group())


# ------------------------------------------------------------------------------------------
# Records: the collective verdict
# ------------------------------------------------------------------------------------------


def local_message(rec):
    """This rank's error text after a record op failed (norma_last_error of this thread)."""
    return _lib.last_error() if float(rec[H_STATUS]) != 0 else ""


def verdict(records, group, what, local_detail, need_two, backward=False):
    """Raises, on every rank alike, when a rank failed, the ranks disagree, or the global
    batch has fewer than 2 values per channel.  Returns the global count."""
    h = records[:, :HEADER].tolist()
    failed = [r for r, row in enumerate(h) if row[H_STATUS] != 0]
    if failed:
        mine = int(h[group.rank][H_STATUS])
        if mine:
            raise NormaError(mine, _lib.STATUS_NAMES.get(mine, str(mine)), local_detail, what)
        r = failed[0]
        st = int(h[r][H_STATUS])
        name = _lib.STATUS_NAMES.get(st, str(st))
        raise NormaError(st, name, "%s: rank %d of %d failed (%s; the exception on that rank "
                         "has the detail); nothing written" % (what, r, group.size, name), what)
    key = (lambda row: row[H_FP]) if backward else (lambda row: (row[H_EPS], row[H_FP]))
    for r, row in enumerate(h):
        if key(row) != key(h[0]):
            raise NormaError(_lib.ERR_INVALID_ARGUMENT, "NORMA_ERR_INVALID_ARGUMENT",
                             "%s: the arguments of rank %d differ from those of rank 0 in eps, "
                             "the parameter type (float64 or not) or the statistics flags; they "
                             "must be the same on every rank; nothing written" % (what, r),
                             what)
    total = int(sum(row[H_COUNT] for row in h))
    if need_two and total < 2:
        raise NormaError(_lib.ERR_INVALID_ARGUMENT, "NORMA_ERR_INVALID_ARGUMENT",
                         "%s: expected more than 1 value per channel when training, got "
                         "n * spatial = %d summed over the %d ranks" % (what, total, group.size),
                         what)
    return total


# ------------------------------------------------------------------------------------------
# Timings (norma.torch.sync_timings)
# ------------------------------------------------------------------------------------------


class LayerTimes:
    """Seconds spent by one synchronized layer over `calls` forwards: local compute, the
    collective, and (measured by a barrier just before the collective, only while timing)
    the wait for the slowest rank, forward and backward."""

    __slots__ = ("calls", "fwd_compute", "fwd_comm", "fwd_wait", "bwd_compute", "bwd_comm",
                 "bwd_wait")

    def __init__(self):
        self.calls = 0
        self.fwd_compute = self.fwd_comm = self.bwd_compute = self.bwd_comm = 0.0
        self.fwd_wait = self.bwd_wait = 0.0


# ------------------------------------------------------------------------------------------
# The autograd function
# ------------------------------------------------------------------------------------------


class SyncBatchNormFunction(torch.autograd.Function):
    """Training BatchNorm with the statistics of the batch split across a group of processes.
    Collective in the forward and in the backward: every rank must run both, in the same
    order, an empty local batch too.

    apply(x, weight, bias, residual, running_mean, running_var, running_count, momentum, eps,
          flags, group, param_grad_scale, times) -> y

    group is a Group; dweight / dbias are the gradients of the global batch (identical on
    every rank) times param_grad_scale; times (a LayerTimes or None) accumulates timings.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, residual, running_mean, running_var, running_count,
                momentum, eps, flags, group, param_grad_scale, times):
        ctx.group = group
        ctx.param_grad_scale = float(param_grad_scale)
        ctx.times = times
        ctx.eps = float(eps)
        ctx.flags = flags & (_ACT | CHECK_FINITE)
        if group.kind == "mpi":
            y, sm, si = _forward_mpi(x, weight, bias, residual, running_mean, running_var,
                                     running_count, momentum, eps, flags, group, times)
        else:
            y, sm, si = _forward_dist(x, weight, bias, residual, running_mean, running_var,
                                      running_count, momentum, eps, flags, group, times)
        act = flags & _ACT
        ctx.save_for_backward(x, y if act else None, weight, bias, sm, si)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gy):
        x, y, weight, bias, sm, si = ctx.saved_tensors
        need = ctx.needs_input_grad
        if ctx.group.kind == "mpi":
            dx, dw, db, dres = _backward_mpi(ctx, gy, x, y, weight, bias, sm, si, need)
        else:
            dx, dw, db, dres = _backward_dist(ctx, gy, x, y, weight, bias, sm, si, need)
        s = ctx.param_grad_scale
        dw = _param_grad(dw, weight, s) if need[1] else None
        db = _param_grad(db, bias, s) if need[2] else None
        return (dx, dw, db, dres if need[3] else None) + (None,) * 9


def _param_grad(g, like, scale):
    if g is None or like is None:
        return None
    if scale != 1.0:
        g = g * scale
    return g if g.dtype == like.dtype else g.to(like.dtype)


def _forward_dist(x, weight, bias, residual, running_mean, running_var, running_count, momentum,
                  eps, flags, group, times):
    ops = _ops.ops()
    t0 = time.perf_counter()
    rec = ops.bn_record_forward(x, eps, flags)
    detail = local_message(rec)
    t1 = tw = time.perf_counter()
    if times is not None:
        group.barrier()
        tw = time.perf_counter()
    records = group.allgather(rec)
    t2 = time.perf_counter()
    verdict(records, group, "SyncBatchNorm forward", detail, True)
    merged = ops.bn_merge_records(records)
    out = ops.bn_sync_forward(x, residual, weight, bias, merged, running_mean, running_var,
                              running_count, momentum, eps, flags & 0xffff)
    if times is not None:
        t3 = time.perf_counter()
        times.calls += 1
        times.fwd_compute += (t1 - t0) + (t3 - t2)
        times.fwd_wait += tw - t1
        times.fwd_comm += t2 - tw
    return out


def _backward_dist(ctx, gy, x, y, weight, bias, sm, si, need):
    ops = _ops.ops()
    flags = ctx.flags
    t0 = time.perf_counter()
    rec = ops.bn_record_backward(x, y, gy, weight, bias, sm, si, flags)
    detail = local_message(rec)
    t1 = tw = time.perf_counter()
    if ctx.times is not None:
        ctx.group.barrier()
        tw = time.perf_counter()
    records = ctx.group.allgather(rec)
    t2 = time.perf_counter()
    verdict(records, ctx.group, "SyncBatchNorm backward", detail, True, backward=True)
    summed = ops.bn_sum_records(records)
    out = ops.bn_sync_backward(x, y, gy, weight, bias, sm, si, summed, flags & ~CHECK_FINITE,
                               bool(need[1] or need[2]))
    if ctx.times is not None:
        t3 = time.perf_counter()
        ctx.times.bwd_compute += (t1 - t0) + (t3 - t2)
        ctx.times.bwd_wait += tw - t1
        ctx.times.bwd_comm += t2 - tw
    return out


def _forward_mpi(x, weight, bias, residual, running_mean, running_var, running_count, momentum,
                 eps, flags, group, times):
    from .. import mpi as _mpi
    t0 = time.perf_counter()
    X = _core.prepare(x, None)
    total = None
    if (running_mean is not None or running_var is not None) and \
            _core.count_unknown(running_count):
        total = _mpi.global_count(x, None, group.handle)
    Y, sm, si = _core.train_prepared(
        X, residual, weight, bias, running_mean, running_var, running_count, momentum, eps,
        flags & 0xffff, _mpi.invoker("norma_bn_forward_training_mpi", group.handle),
        _mpi.invoker("norma_bn_forward_training_counted_mpi", group.handle)
        if running_count is not None else None, total)
    if times is not None:
        times.calls += 1
        times.fwd_compute += time.perf_counter() - t0  # collective included: one C call
    return Y.obj, sm.obj, si.obj


def _backward_mpi(ctx, gy, x, y, weight, bias, sm, si, need):
    from .. import mpi as _mpi
    t0 = time.perf_counter()
    ref = _core.prepare(x, None)
    DX, dg, db, DR = _core.backward_prepared(
        ref, True, y, gy, weight, bias, sm, si, ctx.eps, ctx.flags, need[1] or need[2],
        need[1] or need[2], need[3], _mpi.invoker("norma_bn_backward_mpi", ctx.group.handle))
    if ctx.times is not None:
        ctx.times.bwd_compute += time.perf_counter() - t0
    return DX.obj, dg.obj, db.obj, DR.obj if DR is not None else None


def sync_batch_norm(input, running_mean, running_var, weight=None, bias=None, momentum=0.1,
                    eps=1e-5, process_group=None, relu=False, residual=None,
                    biased_running_var=False, param_grad_scale=1.0, running_count=None,
                    check_finite=False, comm=None):
    """Training BatchNorm synchronized over `process_group` (a torch.distributed process group
    or an mpi4py communicator; None: the default group, see default_group), with autograd.
    Collective: every rank calls it (an empty local batch too) and runs its backward.  The
    parameter gradients are the global ones times param_grad_scale.  ``comm`` is the former
    name of process_group."""
    flags = _core.act_flags(relu, residual) | _core._flags(
        biased_running_var=biased_running_var, check_finite=check_finite,
        count_weighted=running_count is not None)
    group = group_of(process_group if process_group is not None else comm)
    return SyncBatchNormFunction.apply(input, weight, bias, residual, running_mean, running_var,
                                       running_count, momentum, eps, flags, group,
                                       param_grad_scale, None)


# ------------------------------------------------------------------------------------------
# Measuring what synchronization costs, layer by layer
# ------------------------------------------------------------------------------------------


class sync_timings:
    """Context manager: per synchronized BatchNorm layer of `model`, the time of its local
    compute (norma's moments, merge, normalization; forward and backward) against the time of
    its collective (the all-gather of the records), over the steps run inside it.

        with nt.sync_timings(model) as t:
            for x, y in batches: train_step(x, y)
        print(t.table())

    While timing, a barrier before each collective separates the wait for the slowest rank
    (skew: uneven batches, a busy core) from the exchange itself; the barrier adds one more
    collective per layer and direction, so time steps outside this context for throughput.
    rows() gives per layer: name, channels, calls, and microseconds per call of fwd_compute,
    fwd_comm, fwd_wait, bwd_compute, bwd_comm, bwd_wait, plus comm_share = exchange /
    (exchange + compute).  Over MPI communicators the exchange is inside one C call: only
    the totals are known there (reported as compute).
    """

    def __init__(self, model):
        self.model = model
        self.layers = []

    def __enter__(self):
        from .modules import SyncBatchNorm
        for name, m in self.model.named_modules():
            if isinstance(m, SyncBatchNorm) and m.sync:
                m._sync_times = LayerTimes()
                self.layers.append((name, m, m._sync_times))
        return self

    def __exit__(self, *exc):
        for _, m, _ in self.layers:
            m._sync_times = None
        return False

    _FIELDS = ("fwd_compute", "fwd_comm", "fwd_wait", "bwd_compute", "bwd_comm", "bwd_wait")

    def rows(self):
        out = []
        for name, m, t in self.layers:
            n = max(t.calls, 1)
            r = {"layer": name, "channels": m.num_features, "calls": t.calls}
            for f in self._FIELDS:
                r[f + "_us"] = 1e6 * getattr(t, f) / n
            comm = r["fwd_comm_us"] + r["bwd_comm_us"]
            comp = r["fwd_compute_us"] + r["bwd_compute_us"]
            r["comm_share"] = comm / (comm + comp) if comm + comp > 0 else 0.0
            out.append(r)
        return out

    def table(self):
        head = ("layer", "C", "calls", "fwd comp", "fwd coll", "fwd wait", "bwd comp",
                "bwd coll", "bwd wait", "coll %")
        fmt = "%-24s %5s %5s" + " %9s" * 6 + " %6s"
        lines = [fmt % head]
        tot = [0.0] * 6
        for r in self.rows():
            vals = [r[f + "_us"] for f in self._FIELDS]
            tot = [a + b for a, b in zip(tot, vals)]
            lines.append(fmt % ((r["layer"][:24], r["channels"], r["calls"]) +
                                tuple("%.1f" % v for v in vals) +
                                ("%.0f" % (100 * r["comm_share"]),)))
        comm, comp = tot[1] + tot[4], tot[0] + tot[3]
        lines.append(fmt % (("total per step", "", "") + tuple("%.1f" % v for v in tot) +
                            ("%.0f" % (100 * comm / (comm + comp) if comm + comp else 0),)))
        return "\n".join(lines) + "\n(microseconds per call: compute = norma's local work, " \
            "coll = the all-gather, wait = for the slowest rank)"
