"""norma.torch.SyncBatchNorm over torch.distributed (gloo), inside DistributedDataParallel:
1 to 4 processes on this machine (init_method file://), uneven local batches and an empty
rank, both memory formats, against one process on the global batch (tests/python/
dist_sync_worker.py asserts; here every rank's exit status and "OK" line are checked).  A
timeout ends a job that would hang.  Plus what runs in this process: the sync policies of
convert(), SyncBatchNorm without torch.distributed, the example's argument handling.
"""

import os
import subprocess
import sys

import pytest
import torch
from torch import nn

import norma.torch as nt
from conftest import REPO, PYDIR

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dist_sync_worker.py")
TIMEOUT = 240


def _run(sizes, tmp_path, checks=None, backend="auto"):
    world = len(sizes.split(","))
    init = "file://" + str(tmp_path / ("rendezvous-%s" % sizes.replace(",", "_")))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=PYDIR)
    procs = []
    for rank in range(world):
        cmd = [sys.executable, WORKER, "--rank", str(rank), "--world", str(world), "--init",
               init, "--sizes", sizes, "--backend", backend]
        if checks:
            cmd += ["--checks", checks]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, env=env, cwd=REPO))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=TIMEOUT)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    text = "\n".join("--- rank %d (exit %s)\n%s" % (r, p.returncode, o[-4000:])
                     for r, (p, o) in enumerate(zip(procs, outs)))
    assert all(p.returncode == 0 for p in procs), text
    for rank in range(world):
        assert "OK rank %d of %d" % (rank, world) in outs[rank], text
    return outs


@pytest.mark.parametrize("sizes", ["3,5", "4,0,3", "2,1,0,3"],
                         ids=["2ranks-uneven", "3ranks-empty-rank", "4ranks"])
def test_sync_batchnorm_ddp(sizes, tmp_path):
    """Every check of the worker: SyncBatchNorm modules (float32 / float64 / bfloat16, 2-D to
    5-D, fused ReLU and add+ReLU, both param_grads, count-weighted), collective errors, DDP
    training in both memory formats (with count-weighted statistics too), sync policies,
    recompute_bn_stats across ranks."""
    _run(sizes, tmp_path)


def test_sync_batchnorm_ddp_ctypes_backend(tmp_path):
    """The same through the ctypes fallback (no libnorma_torch)."""
    _run("4,0,3", tmp_path, checks="module,ddp,counted", backend="ctypes")


def test_one_process_group(tmp_path):
    """A group of one: plain BatchNorm, no exchange."""
    _run("6", tmp_path, checks="module,ddp,recompute")


# -- in this process -----------------------------------------------------------------------


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4), nn.ReLU())
        self.b = nn.Sequential(nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4), nn.ReLU())
        self.c = nn.Sequential(nn.Flatten(), nn.Linear(4 * 4, 3), nn.BatchNorm1d(3))

    def forward(self, x):
        return self.c(self.b(self.a(x)))


def test_sync_policies_choose_layers():
    assert nt.synchronized_layers(nt.convert(_Net(), sync=True)) == ["a.1", "b.1", "c.2"]
    assert nt.synchronized_layers(nt.convert(_Net(), sync=False)) == []
    m = nt.convert(_Net(), sync=nt.deepest(2))
    assert nt.synchronized_layers(m) == ["b.1", "c.2"]
    assert type(m.a[1]) is nt.BatchNorm2d          # the others: norma's local BatchNorm
    assert nt.synchronized_layers(nt.convert(_Net(), sync=nt.deepest(0))) == []
    assert nt.synchronized_layers(nt.convert(_Net(), sync=nt.deepest(9))) == ["a.1", "b.1",
                                                                              "c.2"]
    pred = nt.convert(_Net(), sync=lambda name, mod: mod.num_features == 3)
    assert nt.synchronized_layers(pred) == ["c.2"]
    assert nt.synchronized_layers(nt.convert(_Net(), sync=nt.where(
        lambda name, mod: name.startswith("a")))) == ["a.1"]
    with pytest.raises(TypeError, match="sync must be"):
        nt.convert(_Net(), sync="deepest")
    # the state is kept: same keys, same objects
    base = _Net()
    keys = list(base.state_dict().keys())
    w = base.b[1].weight
    conv = nt.convert(base, sync=nt.deepest(1))
    assert list(conv.state_dict().keys()) == keys and conv.b[1].weight is w


def test_sync_batchnorm_is_not_torch_syncbatchnorm():
    """DistributedDataParallel rejects nn.SyncBatchNorm (subclasses too) in CPU modules; norma's
    is a _BatchNorm with SyncBatchNorm's constructor, keys and convert_sync_batchnorm."""
    bn = nt.SyncBatchNorm(4, process_group=None, param_grads="sum", count_weighted=True)
    assert isinstance(bn, nn.modules.batchnorm._BatchNorm)
    assert not isinstance(bn, nn.SyncBatchNorm)
    assert "running_count" in bn.state_dict()
    assert list(nt.SyncBatchNorm(4).state_dict()) == list(nn.SyncBatchNorm(4).state_dict())
    # eval mode needs no group at all
    bn.eval()
    y = bn(torch.randn(2, 4, 3, 3))
    assert y.shape == (2, 4, 3, 3)
    # sync=False: a local layer in training too
    loc = nt.SyncBatchNorm(4, sync=False)
    ref = nn.BatchNorm2d(4)
    x = torch.randn(3, 4, 5, 5)
    torch.testing.assert_close(loc(x), ref(x), rtol=1e-5, atol=1e-5)
    assert "sync=False" in repr(loc)
