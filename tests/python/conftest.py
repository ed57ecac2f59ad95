"""pytest setup for the Python binding: puts <repo>/python on sys.path (no install needed) and
ends the run as failed (exit status 1, the loader's message) when libnorma cannot be loaded."""

import collections
import contextlib
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYDIR = os.path.join(REPO, "python")
if PYDIR not in sys.path:
    sys.path.insert(0, PYDIR)
HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import norma  # noqa: E402
from norma import _lib  # noqa: E402


def _torch_backend_line():
    try:
        from norma.torch import _ops
    except ImportError as e:
        return "norma.torch: not importable (%s)" % e
    s = _ops.extension_status()
    if s["backend"] == "extension":
        return "norma.torch: PyTorch operators from %s (the ctypes fallback is tested too)" % (
            s["path"])
    return ("norma.torch: extension NOT loaded, ctypes fallback only (%s); the tests of the "
            "extension are skipped" % s["reason"])


def pytest_report_header(config):
    try:
        return ["norma: %s (libnorma %s, isa %s, %d threads)" % (
            _lib.library_path(), norma.version(), norma.get_isa(), norma.get_num_threads()),
            _torch_backend_line()]
    except Exception as e:  # pytest_sessionstart ends the run
        return "norma: library NOT loaded: %s" % e


def pytest_sessionstart(session):
    """Fail (not skip) the run, once and clearly, when the library is missing."""
    try:
        _lib.lib()
    except _lib.NormaLibraryNotFound as e:
        pytest.exit("libnorma could not be loaded, so the Python binding cannot be tested: %s"
                    % e, returncode=1)


@pytest.fixture(params=["extension", "ctypes"])
def torch_backend(request):
    """Runs a test with each backend of norma.torch: libnorma_torch's operators, and the ctypes
    fallback.  Without the extension its runs are skipped, saying why."""
    from norma.torch import _ops
    if request.param == "extension" and _ops.backend() != "extension":
        why = (_ops.extension_status()["reason"] or "").split(". ")[0]
        pytest.skip("norma's PyTorch operators are not loaded (%s); this ran on the ctypes "
                    "fallback only" % why)
    with _ops.use_backend(request.param):
        yield request.param


@pytest.fixture
def rng():
    import numpy as np
    return np.random.default_rng(1234)


@contextlib.contextmanager
def count_norma_calls():
    """Counts norma's BatchNorm forwards and backwards inside the block, from the events of
    torch's profiler (the operator norma::batch_norm and norma's autograd nodes, or the ctypes
    backend's autograd functions): proves that norma computed them, not a torch fallback.
    The counts ({"forward": n, "backward": n}) are filled when the block ends."""
    import torch
    from norma import profiling
    counts = collections.Counter()
    with torch.autograd.profiler.profile() as prof:
        yield counts
    for e in prof.function_events:
        kinds = profiling._OWNERS.get(e.name)
        if kinds:
            counts["backward" if kinds == ("bn_backward",) else "forward"] += 1
