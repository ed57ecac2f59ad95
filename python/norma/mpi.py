"""SyncBatchNorm over MPI: the ctypes binding of libnorma_mpi (include/norma_mpi.h) for mpi4py
communicators, and a functional API on numpy arrays and CPU torch tensors.

    from mpi4py import MPI
    import norma.mpi
    y, save_mean, save_invstd = norma.mpi.batch_norm_forward_training(
        x_local, gamma, beta, running_mean=rm, running_var=rv, comm=MPI.COMM_WORLD)
    dx, dgamma, dbeta = norma.mpi.batch_norm_backward(dy_local, x_local, save_mean,
                                                      save_invstd, gamma, beta)

Every rank of the communicator calls, with its own local batch (its size may differ between
ranks and may be 0); the statistics, save_mean / save_invstd, the running statistics, dgamma
and dbeta are those of the global batch (the local batches concatenated in rank order) and are
bitwise identical on every rank; y and dx are the rank's own.  dgamma / dbeta are the global
sums here (norma.torch.SyncBatchNorm scales them for data-parallel training, see there).

The library is looked up, on first use, in this order: the environment variable
``NORMA_MPI_LIBRARY`` (that file or an error); the folder of the loaded libnorma (so that both
come from the same build); beside this package; the checkout's build trees (``build/``, then
``build-*/``, most recently built first); ``ctypes.util.find_library("norma_mpi")`` and the
usual prefixes.  It is loaded with RTLD_GLOBAL after mpi4py has initialized MPI, and after
libnorma, which it then shares (one copy of the library and of its settings).
"""

import ctypes
import os
import threading

from . import _core
from . import _lib
from ._lib import NormaError, NormaLibraryNotFound, BnDesc

__all__ = [
    "batch_norm_forward_training", "batch_norm_backward", "lib", "library_path",
    "comm_handle", "default_comm", "available",
]

_LOCK = threading.Lock()
_LIB = None
_LIB_PATH = None


def _mpi():
    """mpi4py's MPI module (importing it initializes MPI)."""
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise NormaLibraryNotFound("norma.mpi needs mpi4py (pip install mpi4py, or the "
                                   "python3-mpi4py package): %s" % e) from None
    if not MPI.Is_initialized():
        raise NormaError(_lib.ERR_COMMUNICATION, "NORMA_ERR_COMMUNICATION",
                         "MPI is not initialized (mpi4py.rc.initialize = False?): call "
                         "MPI.Init() first")
    if MPI.Is_finalized():
        raise NormaError(_lib.ERR_COMMUNICATION, "NORMA_ERR_COMMUNICATION",
                         "MPI is already finalized")
    return MPI


def default_comm():
    """MPI.COMM_WORLD."""
    return _mpi().COMM_WORLD


def _comm_type(MPI):
    # Open MPI: MPI_Comm is a pointer; MPICH and derivatives: an int.
    size = MPI._sizeof(MPI.Comm)
    if size == ctypes.sizeof(ctypes.c_void_p):
        return ctypes.c_void_p
    if size == ctypes.sizeof(ctypes.c_int):
        return ctypes.c_int
    raise NormaLibraryNotFound("unexpected MPI_Comm size %d bytes" % size)


def comm_handle(comm):
    """The C handle (MPI_Comm) of an mpi4py communicator, as the ctypes value to pass."""
    MPI = _mpi()
    if comm is None:
        comm = MPI.COMM_WORLD
    if not isinstance(comm, MPI.Comm):
        raise TypeError("comm must be an mpi4py communicator (mpi4py.MPI.Comm), got %s"
                        % type(comm).__name__)
    if comm == MPI.COMM_NULL:
        raise ValueError("comm is MPI.COMM_NULL")
    return _comm_type(MPI)(MPI._handleof(comm))


def candidate_paths():
    """The files tried after NORMA_MPI_LIBRARY, in order (those that exist): the folder of the
    loaded libnorma first (the same build), then as for libnorma (norma._lib)."""
    return _lib.candidate_paths("norma_mpi", _libnorma_dir()) + \
        _lib.install_candidates("norma_mpi")


def _libnorma_dir():
    base = _lib.library_path()
    return [os.path.dirname(os.path.abspath(base))] if base and os.path.sep in base else []


def _declare(dll, comm_t):
    pd = ctypes.POINTER(BnDesc)
    vp = ctypes.c_void_p
    st = ctypes.c_int
    protos = {
        # (comm, d, x, residual, gamma, beta, y, save_mean, save_invstd, running_mean,
        #  running_var, momentum)
        "norma_bn_forward_training_mpi": (st, [comm_t, pd] + [vp] * 9 + [ctypes.c_double]),
        # ... running_var, running_count[double], momentum
        "norma_bn_forward_training_counted_mpi": (st, [comm_t, pd] + [vp] * 10 +
                                                  [ctypes.c_double]),
        # (comm, d, x, y, dy, gamma, beta, save_mean, save_invstd, dx, dresidual, dgamma, dbeta)
        "norma_bn_backward_mpi": (st, [comm_t, pd] + [vp] * 11),
        "norma_mpi_last_error": (ctypes.c_char_p, []),
    }
    for name, (restype, argtypes) in protos.items():
        try:
            fn = getattr(dll, name)
        except AttributeError:
            raise NormaLibraryNotFound("%s does not export %s: not libnorma_mpi, or older than "
                                       "this package" % (dll._name, name)) from None
        fn.restype = restype
        fn.argtypes = argtypes


def _load():
    global _LIB, _LIB_PATH
    MPI = _mpi()
    _lib.lib()  # libnorma first: libnorma_mpi then binds to this copy (same soname)
    mode = getattr(os, "RTLD_GLOBAL", ctypes.RTLD_GLOBAL)
    dll, path = _lib.find_library(
        "norma_mpi", "NORMA_MPI_LIBRARY", lambda p: ctypes.CDLL(p, mode=mode),
        first=_libnorma_dir(), what="libnorma_mpi",
        hint="It is built beside libnorma when CMake finds MPI (-DNORMA_WITH_MPI=ON). ")
    copies = _lib.loaded_copies("norma")
    if len(copies) > 1:
        raise NormaLibraryNotFound(
            "two copies of libnorma are loaded (%s): %s links another libnorma than the one "
            "norma loaded (%s); point NORMA_LIBRARY and NORMA_MPI_LIBRARY at the same build"
            % (", ".join(copies), path, _lib.library_path()))
    comm_t = _comm_type(MPI)
    _declare(dll, comm_t)
    _LIB = dll
    _LIB_PATH = path
    return dll


def lib():
    """The loaded libnorma_mpi CDLL (imports mpi4py, loads on first call)."""
    if _LIB is not None:
        return _LIB
    with _LOCK:
        if _LIB is not None:
            return _LIB
        return _load()


def library_path():
    lib()
    return _LIB_PATH


def available():
    """(True, path) when mpi4py and libnorma_mpi can be loaded, else (False, reason)."""
    try:
        return True, library_path()
    except (NormaLibraryNotFound, NormaError, OSError) as e:
        return False, str(e)


def _check(status, function):
    if status != _lib.OK:
        L = lib()
        detail = L.norma_mpi_last_error()
        detail = detail.decode("utf-8", "replace") if detail else ""
        inner = _lib.last_error()
        if inner and inner not in detail:
            detail = "%s (norma: %s)" % (detail, inner) if detail else inner
        raise NormaError(status, _lib.STATUS_NAMES.get(status, _lib.status_string(status)),
                         detail, function)
    return status


def invoker(name, comm):
    """invoke(*args) calling the MPI function `name` on `comm` (NormaError on failure)."""
    L = lib()
    fn = getattr(L, name)
    handle = comm_handle(comm)

    def invoke(*args):
        return _check(fn(handle, *args), name)
    return invoke


def batch_norm_forward_training(x, gamma=None, beta=None, eps=1e-5, running_mean=None,
                                running_var=None, momentum=0.1, layout=None, relu=False,
                                residual=None, biased_running_var=False, check_finite=False,
                                comm=None, running_count=None):
    """norma.batch_norm_forward_training with the statistics of the global batch split over
    the ranks of `comm` (default MPI.COMM_WORLD).  Collective: every rank calls.  x may be an
    empty local batch ([0, C, ...]).  ``running_count`` (the same on every rank) makes the
    running statistics count-weighted with the global count
    (norma_bn_forward_training_counted_mpi).  Returns (y, save_mean, save_invstd)."""
    total = None
    if (running_mean is not None or running_var is not None) and \
            _core.count_unknown(running_count):
        total = global_count(x, layout, comm)
    return _core.forward_training_with(
        invoker("norma_bn_forward_training_mpi", comm), x, gamma, beta, eps, running_mean,
        running_var, momentum, layout, relu, residual, biased_running_var, check_finite,
        running_count, invoker("norma_bn_forward_training_counted_mpi", comm)
        if running_count is not None else None, total)


def global_count(x, layout=None, comm=None):
    """Values per channel of the global batch (an allreduce of n * spatial over comm): what an
    unknown running count starts from (one more collective, once per layer)."""
    X = _core.prepare(x, layout)
    return (comm or default_comm()).allreduce(int(X.n * X.spatial))


def batch_norm_backward(dy, x, save_mean, save_invstd, gamma=None, beta=None, y=None,
                        eps=1e-5, layout=None, relu=False, add_relu=False, global_stats=False,
                        check_finite=False, compute_param_grads=True, comm=None):
    """norma.batch_norm_backward over the global batch: dx is local, dgamma and dbeta are the
    sums over every rank's values (identical on every rank).  Collective."""
    return _core.backward_with(
        invoker("norma_bn_backward_mpi", comm), dy, x, save_mean, save_invstd, gamma, beta, y,
        eps, layout, relu, add_relu, global_stats, check_finite, compute_param_grads)
