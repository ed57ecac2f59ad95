"""pytest setup for the Python binding: puts <repo>/python on sys.path (no install needed) and
ends the run as failed (exit status 1, the loader's message) when libnorma cannot be loaded."""

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


def pytest_report_header(config):
    try:
        return "norma: %s (libnorma %s, isa %s, %d threads)" % (
            _lib.library_path(), norma.version(), norma.get_isa(), norma.get_num_threads())
    except Exception as e:  # pytest_sessionstart ends the run
        return "norma: library NOT loaded: %s" % e


def pytest_sessionstart(session):
    """Fail (not skip) the run, once and clearly, when the library is missing."""
    try:
        _lib.lib()
    except _lib.NormaLibraryNotFound as e:
        pytest.exit("libnorma could not be loaded, so the Python binding cannot be tested: %s"
                    % e, returncode=1)


@pytest.fixture
def rng():
    import numpy as np
    return np.random.default_rng(1234)
