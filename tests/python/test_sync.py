"""norma.torch.SyncBatchNorm and norma.mpi over libnorma_mpi: mpirun -n 2 and -n 3 on
tests/python/mpi_sync_worker.py, with uneven local batches and an empty rank, against
single-process BatchNorm on the concatenated batch (the worker asserts; here the exit status
and every rank's "OK" line are checked).  Plus what runs without mpirun: a single-rank
SyncBatchNorm, convert(sync=True), convert_sync_batchnorm, deepcopy, argument checks.

Skipped, with the reason, only when mpirun, mpi4py or libnorma_mpi is absent.
"""

import copy
import importlib.util
import os
import shutil
import subprocess
import sys

import pytest
import torch
from torch import nn

import norma.torch as nt
from conftest import REPO, PYDIR

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mpi_sync_worker.py")


def _mpi_available():
    if importlib.util.find_spec("mpi4py") is None:
        return False, "mpi4py is not installed (pip install mpi4py, or python3-mpi4py)"
    # ask a child process: importing mpi4py.MPI initializes MPI in this process otherwise
    code = ("import sys; sys.path.insert(0, %r); import norma.mpi as m; ok, w = m.available(); "
            "print(w); sys.exit(0 if ok else 3)" % PYDIR)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60)
    if r.returncode != 0:
        return False, "libnorma_mpi not loadable: %s" % (r.stdout + r.stderr).strip()[-400:]
    return True, r.stdout.strip()


_OK, _WHY = _mpi_available()
needs_mpi = pytest.mark.skipif(not _OK, reason=_WHY)


def _mpirun_command(n):
    mpirun = shutil.which("mpirun") or shutil.which("mpiexec")
    if mpirun is None:
        pytest.skip("mpirun / mpiexec not found on PATH")
    cmd = [mpirun]
    version = subprocess.run([mpirun, "--version"], capture_output=True, text=True).stdout
    if "Open MPI" in version or "OpenRTE" in version:
        cmd += ["--oversubscribe"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd += ["--allow-run-as-root"]
    return cmd + ["-n", str(n)]


@needs_mpi
@pytest.mark.parametrize("sizes", ["3,5", "4,0,3"], ids=["2ranks-uneven", "3ranks-empty-rank"])
def test_sync_batchnorm_mpirun(sizes):
    n = len(sizes.split(","))
    cmd = _mpirun_command(n) + [sys.executable, "-m", "mpi4py", WORKER, "--sizes", sizes]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=PYDIR)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    out = r.stdout + r.stderr
    assert r.returncode == 0, "mpirun exit status %d:\n%s" % (r.returncode, out[-6000:])
    for rank in range(n):
        assert "OK rank %d of %d" % (rank, n) in out, out[-6000:]


@needs_mpi
def test_single_rank_sync_batchnorm_is_batchnorm():
    """On a one-rank communicator (this pytest process) SyncBatchNorm gives BatchNorm2d's
    results; convert(sync=True), convert_sync_batchnorm, deepcopy and state_dict work."""
    torch.manual_seed(0)
    ref = nn.BatchNorm2d(4)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5)
        ref.bias.uniform_(-1, 1)
    sbn = nt.SyncBatchNorm(4)
    # torch's _BatchNorm, not nn.SyncBatchNorm: DistributedDataParallel refuses those on CPU
    assert isinstance(sbn, nn.modules.batchnorm._BatchNorm)
    assert not isinstance(sbn, nn.SyncBatchNorm)
    assert list(sbn.state_dict().keys()) == list(ref.state_dict().keys())
    sbn.load_state_dict(ref.state_dict())
    x = torch.randn(3, 4, 5, 5) * 2 + 1
    gy = torch.randn(3, 4, 5, 5)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = ref(xa), sbn(xb)
    ya.backward(gy)
    yb.backward(gy)
    torch.testing.assert_close(yb, ya, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xb.grad, xa.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sbn.weight.grad, ref.weight.grad, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(sbn.running_var, ref.running_var)

    # the synchronized function itself on a one-rank communicator
    from mpi4py import MPI
    xc = x.clone().requires_grad_()
    yc = nt.sync_batch_norm(xc, None, None, ref.weight, ref.bias, comm=MPI.COMM_SELF)
    yc.backward(gy)
    torch.testing.assert_close(yc, ya, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xc.grad, xa.grad, rtol=1e-5, atol=1e-5)

    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4), nn.ReLU(),
                          nn.Flatten(), nn.Linear(4 * 4, 3), nn.BatchNorm1d(3))
    model[1].eval()
    keys = list(model.state_dict().keys())
    w = model[1].weight
    conv = nt.convert(model, sync=True, process_group=MPI.COMM_SELF)
    assert conv is model
    assert isinstance(model[1], nt.SyncBatchNorm) and isinstance(model[5], nt.SyncBatchNorm)
    assert model[1].weight is w and model[1].training is False
    assert model[1].process_group is MPI.COMM_SELF
    assert list(model.state_dict().keys()) == keys
    dup = copy.deepcopy(model)  # communicators are shared, not copied
    assert dup[1].process_group is MPI.COMM_SELF and dup[1].weight is not w
    bare = nt.SyncBatchNorm.convert_sync_batchnorm(nt.BatchNorm2d(4, fuse_relu=True))
    assert isinstance(bare, nt.SyncBatchNorm) and bare.fuse_relu and bare.process_group is None
    assert "param_grads='sum'" in repr(nt.SyncBatchNorm(2, param_grads="sum"))
    with pytest.raises(ValueError, match="param_grads"):
        nt.SyncBatchNorm(2, param_grads="avg")
    with pytest.raises(ValueError, match="at least 2D"):
        nt.SyncBatchNorm(2)(torch.randn(4))
