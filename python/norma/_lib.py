"""ctypes binding of the C library libnorma (include/norma.h).

The shared library is looked up, on first use, in this order:

1. the environment variable ``NORMA_LIBRARY`` (the path of the .so): when it is set, that file is
   loaded and nothing else is tried;
2. beside this package (``norma/libnorma.so*``), for wheels that ship the library;
3. the build tree of the checkout this package lives in (``<repo>/build/libnorma.so``, then
   ``<repo>/build-*/libnorma.so``, the most recently built first);
4. where ``cmake --install`` put it: ``ctypes.util.find_library("norma")``, then the usual
   prefixes (``sys.prefix/lib``, ``/usr/local/lib``, ``/usr/local/lib64``, ``/usr/lib``...).

Every function of norma.h gets its ``argtypes`` / ``restype`` here.  Data pointers (tensors and
per-channel arrays alike) are declared ``c_void_p`` so that integer addresses
(``tensor.data_ptr()``, ``ndarray.ctypes.data``) can be passed directly.

``find_library`` is the one implementation of that lookup; ``norma.mpi`` (libnorma_mpi) and
``norma.torch`` (libnorma_torch, the PyTorch operators) use it for their libraries too, which
are looked up first beside the loaded libnorma, so that all come from one build.
"""

import ctypes
import ctypes.util
import glob
import os
import sys
import threading

__all__ = [
    "NormaError",
    "NormaLibraryNotFound",
    "BnDesc",
    "BnPlan",
    "lib",
    "library_path",
    "check",
    "OK",
    "ERR_INVALID_ARGUMENT",
    "ERR_UNSUPPORTED",
    "ERR_OUT_OF_MEMORY",
    "ERR_NONFINITE",
    "ERR_COMMUNICATION",
]

# --- constants of norma.h ----------------------------------------------------------------------

OK = 0
ERR_INVALID_ARGUMENT = 1
ERR_UNSUPPORTED = 2
ERR_OUT_OF_MEMORY = 3
ERR_NONFINITE = 4
ERR_COMMUNICATION = 5

STATUS_NAMES = {
    OK: "NORMA_OK",
    ERR_INVALID_ARGUMENT: "NORMA_ERR_INVALID_ARGUMENT",
    ERR_UNSUPPORTED: "NORMA_ERR_UNSUPPORTED",
    ERR_OUT_OF_MEMORY: "NORMA_ERR_OUT_OF_MEMORY",
    ERR_NONFINITE: "NORMA_ERR_NONFINITE",
    ERR_COMMUNICATION: "NORMA_ERR_COMMUNICATION",
}

ISA_SCALAR = 0
ISA_AVX2 = 1
ISA_AVX512 = 2

F32 = 0
F64 = 1
F16 = 2
BF16 = 3

CHANNELS_FIRST = 0
CHANNELS_LAST = 1

BN_RELU = 1 << 0
BN_ADD_RELU = 1 << 1
BN_BIASED_RUNNING_VAR = 1 << 2
CHECK_FINITE = 1 << 3
BN_GLOBAL_STATS = 1 << 4
SILU = 1 << 5
BN_COUNT_WEIGHTED = 1 << 6

BN_OP_FORWARD_TRAINING = 0
BN_OP_FORWARD_INFERENCE = 1
BN_OP_BACKWARD = 2


class NormaError(RuntimeError):
    """A norma C call failed.

    Attributes: ``status`` (the norma_status number), ``status_name`` (e.g.
    ``"NORMA_ERR_INVALID_ARGUMENT"``), ``detail`` (the text of ``norma_last_error()``, which
    names the offending argument and its value) and ``function`` (the C function called).
    """

    def __init__(self, status, status_name, detail, function=None):
        self.status = int(status)
        self.status_name = status_name
        self.detail = detail
        self.function = function
        super().__init__("%s: %s" % (status_name, detail or "(no detail)"))


class NormaLibraryNotFound(OSError):
    """The shared library libnorma could not be found or loaded."""


class BnDesc(ctypes.Structure):
    """norma_bn_desc."""

    _fields_ = [
        ("n", ctypes.c_int64),
        ("c", ctypes.c_int64),
        ("spatial", ctypes.c_int64),
        ("layout", ctypes.c_int),  # norma_layout
        ("dtype", ctypes.c_int),  # norma_dtype
        ("eps", ctypes.c_double),
        ("flags", ctypes.c_uint),
    ]

    def __repr__(self):
        return "BnDesc(n=%d, c=%d, spatial=%d, layout=%d, dtype=%d, eps=%g, flags=0x%x)" % (
            self.n, self.c, self.spatial, self.layout, self.dtype, self.eps, self.flags)


class LnDesc(ctypes.Structure):
    """norma_ln_desc (LayerNorm and RMSNorm)."""

    _fields_ = [
        ("rows", ctypes.c_int64),
        ("d", ctypes.c_int64),
        ("dtype", ctypes.c_int),  # norma_dtype
        ("eps", ctypes.c_double),
        ("flags", ctypes.c_uint),
    ]


class GnDesc(ctypes.Structure):
    """norma_gn_desc (GroupNorm)."""

    _fields_ = [
        ("n", ctypes.c_int64),
        ("c", ctypes.c_int64),
        ("spatial", ctypes.c_int64),
        ("groups", ctypes.c_int64),
        ("layout", ctypes.c_int),
        ("dtype", ctypes.c_int),
        ("eps", ctypes.c_double),
        ("flags", ctypes.c_uint),
    ]


class InDesc(ctypes.Structure):
    """norma_in_desc (InstanceNorm)."""

    _fields_ = [
        ("n", ctypes.c_int64),
        ("c", ctypes.c_int64),
        ("spatial", ctypes.c_int64),
        ("layout", ctypes.c_int),
        ("dtype", ctypes.c_int),
        ("eps", ctypes.c_double),
        ("flags", ctypes.c_uint),
    ]


class BnPlan(ctypes.Structure):
    """norma_bn_plan (filled by norma_bn_query_plan)."""

    _fields_ = [
        ("dram_passes", ctypes.c_int),
        ("fused", ctypes.c_int),
        ("unit", ctypes.c_int64),
        ("threads", ctypes.c_int),
        ("isa", ctypes.c_int),  # norma_isa
        ("streaming_stores", ctypes.c_int),
        ("reference", ctypes.c_int),
    ]

    def as_dict(self):
        return {name: int(getattr(self, name)) for name, _ in self._fields_}

    def __repr__(self):
        return "BnPlan(%s)" % ", ".join("%s=%d" % kv for kv in self.as_dict().items())


_vp = ctypes.c_void_p
_i64 = ctypes.c_int64
_int = ctypes.c_int
_dbl = ctypes.c_double
_status = ctypes.c_int  # norma_status
_pdesc = ctypes.POINTER(BnDesc)

# name: (restype, [argtypes]); every function of include/norma.h.
PROTOTYPES = {
    # status, errors, version, threads
    "norma_status_string": (ctypes.c_char_p, [_status]),
    "norma_last_error": (ctypes.c_char_p, []),
    "norma_version": (ctypes.c_char_p, []),
    "norma_set_num_threads": (None, [_int]),
    "norma_get_num_threads": (_int, []),
    # instruction-set dispatch
    "norma_set_max_isa": (_status, [_int]),
    "norma_get_isa": (_int, []),
    "norma_isa_name": (ctypes.c_char_p, [_int]),
    "norma_set_use_reference": (None, [_int]),
    "norma_get_use_reference": (_int, []),
    "norma_set_streaming_stores": (_status, [ctypes.c_int64, ctypes.c_int64]),
    # BatchNorm
    # (d, x, residual, gamma, beta, y, save_mean, save_invstd, running_mean, running_var, momentum)
    "norma_bn_forward_training": (_status, [_pdesc, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp,
                                            _dbl]),
    # (d, x, residual, gamma, beta, mean, var, y)
    "norma_bn_forward_inference": (_status, [_pdesc, _vp, _vp, _vp, _vp, _vp, _vp, _vp]),
    # (d, x, y, dy, gamma, beta, save_mean, save_invstd, dx, dresidual, dgamma, dbeta)
    "norma_bn_backward": (_status, [_pdesc, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp,
                                    _vp]),
    # plan introspection: (d, op, plan)
    "norma_bn_query_plan": (_status, [_pdesc, _int, ctypes.POINTER(BnPlan)]),
    # inference folding
    # (c, gamma, beta, mean, var, eps, scale, shift)   float arrays
    "norma_bn_fold": (_status, [_i64, _vp, _vp, _vp, _vp, _dbl, _vp, _vp]),
    # (c_out, per_out, weight, bias, gamma, beta, mean, var, eps)   float arrays
    "norma_bn_fold_into_weights": (_status, [_i64, _i64, _vp, _vp, _vp, _vp, _vp, _vp, _dbl]),
    # split API
    # (d, x, count[int64], mean[double], m2[double])
    "norma_bn_moments": (_status, [_pdesc, _vp, _vp, _vp, _vp]),
    # (dtype, rows, channels, x, row_stride, channel_stride, count, mean, m2)
    "norma_bn_moments_accumulate": (_status, [_int, _i64, _i64, _vp, _i64, _i64, _vp, _vp, _vp]),
    # (c, count_a, mean_a, m2_a, count_b, mean_b, m2_b)
    "norma_bn_moments_merge": (_status, [_i64, _vp, _vp, _vp, _vp, _vp, _vp]),
    # (d, count, mean, m2, mean_out, invstd_out, save_mean, save_invstd, running_mean,
    #  running_var, momentum)
    "norma_bn_stats_from_moments": (_status, [_pdesc, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp,
                                              _vp, _dbl]),
    # (d, x, residual, gamma, beta, mean[double], invstd[double], y)
    "norma_bn_forward_apply": (_status, [_pdesc, _vp, _vp, _vp, _vp, _vp, _vp, _vp]),
    # (d, x, y, dy, gamma, beta, mean, invstd, sum_dy, sum_dy_xhat, sum_xhat)
    "norma_bn_backward_reduce": (_status, [_pdesc, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp,
                                           _vp]),
    # (d, x, y, dy, gamma, beta, mean, invstd, sum_dy, sum_dy_xhat, sum_xhat, count, dx,
    #  dresidual)
    "norma_bn_backward_apply": (_status, [_pdesc, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp,
                                          _vp, _i64, _vp, _vp]),
    # (d, sum_dy, sum_dy_xhat, sum_xhat, count, dgamma, dbeta)
    "norma_bn_param_grads": (_status, [_pdesc, _vp, _vp, _vp, _i64, _vp, _vp]),
    # running statistics: (d, count, mean, var, running_mean, running_var, running_count, momentum)
    "norma_bn_running_update": (_status, [_pdesc, _i64, _vp, _vp, _vp, _vp, _vp, _dbl]),
    # (d, x, residual, gamma, beta, y, save_mean, save_invstd, running_mean, running_var,
    #  running_count, momentum)
    "norma_bn_forward_training_counted": (_status, [_pdesc, _vp, _vp, _vp, _vp, _vp, _vp, _vp,
                                                    _vp, _vp, _vp, _dbl]),
    # the norm family
    # (d, x, residual, gamma, beta, y, sum, save_mean, save_invstd)
    "norma_ln_forward": (_status, [ctypes.POINTER(LnDesc), _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp]),
    # (d, x, dy, dsum, gamma, save_mean, save_invstd, dx, dgamma, dbeta)
    "norma_ln_backward": (_status, [ctypes.POINTER(LnDesc), _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp,
                                    _vp]),
    # (d, x, residual, gamma, y, sum, save_invrms)
    "norma_rms_forward": (_status, [ctypes.POINTER(LnDesc), _vp, _vp, _vp, _vp, _vp, _vp]),
    # (d, x, dy, dsum, gamma, save_invrms, dx, dgamma)
    "norma_rms_backward": (_status, [ctypes.POINTER(LnDesc), _vp, _vp, _vp, _vp, _vp, _vp, _vp]),
    # (d, x, gamma, beta, y, save_mean, save_invstd)
    "norma_gn_forward": (_status, [ctypes.POINTER(GnDesc), _vp, _vp, _vp, _vp, _vp, _vp]),
    # (d, x, y, dy, gamma, beta, save_mean, save_invstd, dx, dgamma, dbeta)
    "norma_gn_backward": (_status, [ctypes.POINTER(GnDesc), _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp,
                                    _vp, _vp]),
    # (d, x, gamma, beta, y, save_mean, save_invstd, running_mean, running_var, momentum)
    "norma_in_forward_training": (_status, [ctypes.POINTER(InDesc), _vp, _vp, _vp, _vp, _vp, _vp,
                                            _vp, _vp, _dbl]),
    # (d, x, gamma, beta, mean, var, y)
    "norma_in_forward_inference": (_status, [ctypes.POINTER(InDesc), _vp, _vp, _vp, _vp, _vp, _vp]),
    # (d, x, y, dy, gamma, beta, save_mean, save_invstd, dx, dgamma, dbeta)
    "norma_in_backward": (_status, [ctypes.POINTER(InDesc), _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp,
                                    _vp, _vp]),
}

# Declared in norma.h, implemented in a later libnorma: a library without them still loads
# (they are then absent from lib(); see missing_functions()).
OPTIONAL = frozenset(n for n in PROTOTYPES if n.startswith(("norma_ln_", "norma_rms_",
                                                              "norma_gn_", "norma_in_")))

_LOCK = threading.Lock()
_LIB = None
_LIB_PATH = None
_MISSING = ()


def _package_dir():
    return os.path.dirname(os.path.abspath(__file__))


def repo_dir():
    """The checkout this package lives in (<repo>/python/norma -> <repo>), or None when the
    package is installed elsewhere."""
    repo = os.path.dirname(os.path.dirname(_package_dir()))
    return repo if os.path.isfile(os.path.join(repo, "include", "norma.h")) else None


def shared_names(base):
    """File name patterns of the shared library `base` ("norma", "norma_mpi", ...)."""
    if sys.platform == "darwin":
        return ["lib%s.dylib" % base, "lib%s.*.dylib" % base]
    if sys.platform.startswith("win"):
        return ["%s.dll" % base, "lib%s.dll" % base]
    return ["lib%s.so" % base, "lib%s.so.*" % base]


def candidate_paths(base="norma", first=()):
    """The files tried after the environment variable, in order (those that exist): the
    folders in `first`, beside the package, the checkout's build/ then build-*/ (most recently
    built first)."""
    out = []
    names = shared_names(base)

    def add_glob(folder):
        for pattern in names:
            for p in sorted(glob.glob(os.path.join(folder, pattern))):
                if os.path.isfile(p) and p not in out:
                    out.append(p)

    for folder in first:
        add_glob(folder)
    add_glob(_package_dir())
    repo = repo_dir()
    if repo:
        add_glob(os.path.join(repo, "build"))
        # build-*/: the most recently built library first (a stale tree must not win by name)
        others = []
        for d in glob.glob(os.path.join(repo, "build-*")):
            p = os.path.join(d, names[0])
            if os.path.isfile(p):
                others.append((-os.path.getmtime(p), p))
        for _, p in sorted(others):
            if p not in out:
                out.append(p)
    return out


def install_candidates(base="norma"):
    """Where `cmake --install` puts the library: find_library, then the usual prefixes."""
    out = []
    found = ctypes.util.find_library(base)
    if found:
        out.append(found)
    prefixes = [sys.prefix, getattr(sys, "base_prefix", sys.prefix), "/usr/local", "/usr",
                os.path.expanduser("~/.local"), "/opt/norma"]
    libdirs = ["lib", "lib64", "lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu"]
    for pre in prefixes:
        for ld in libdirs:
            folder = os.path.join(pre, ld)
            for pattern in shared_names(base):
                for p in sorted(glob.glob(os.path.join(folder, pattern))):
                    if os.path.isfile(p) and p not in out:
                        out.append(p)
    return out


def find_library(base, env, load, first=(), what=None, hint=""):
    """Loads the shared library `base` with `load(path)` (which raises OSError on failure):
    the file named by the environment variable `env` when it is set (that file or an error),
    else the first candidate that loads (candidate_paths, then install_candidates).  Returns
    (loaded, path); raises NormaLibraryNotFound listing where it looked."""
    what = what or "lib" + base
    path = os.environ.get(env)
    if path:
        try:
            return load(path), path
        except OSError as e:
            raise NormaLibraryNotFound("%s=%r could not be loaded: %s" % (env, path, e)) from None
    tried = []
    for cand in candidate_paths(base, first) + install_candidates(base):
        try:
            return load(cand), cand
        except OSError as e:
            tried.append("%s (%s)" % (cand, e))
    repo = repo_dir()
    if repo:
        build = ("Build it (cd %s && cmake -S . -B build && cmake --build build), install it "
                 "(cmake --install build), " % repo)
        where = "in %s/build and %s/build-*, " % (repo, repo)
    else:
        build = "Install it (cmake --install build in a norma checkout), "
        where = ""
    raise NormaLibraryNotFound(
        "%s not found. %s%sor set %s to the path of %s. Looked %sbeside the package (%s), "
        "%svia ctypes.util.find_library(%r) and in the usual prefixes (sys.prefix/lib, "
        "/usr/local/lib, /usr/lib...).%s"
        % (what, hint, build, env, shared_names(base)[0],
           "".join("in %s, " % f for f in first), _package_dir(), where, base,
           (" Failed to load: " + "; ".join(tried)) if tried else ""))


def loaded_copies(base="norma"):
    """Paths of the distinct lib<base>.so files mapped in this process (Linux only)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "/lib%s.so" % base in line}
    except OSError:
        return []
    return sorted({os.path.realpath(p) for p in paths})


def _declare(dll):
    missing = []
    for name, (restype, argtypes) in PROTOTYPES.items():
        try:
            fn = getattr(dll, name)
        except AttributeError:
            missing.append(name)
            continue
        fn.restype = restype
        fn.argtypes = argtypes
    return missing


def _load():
    global _LIB, _LIB_PATH, _MISSING
    dll, path = find_library("norma", "NORMA_LIBRARY", ctypes.CDLL)
    missing = _declare(dll)
    required = [m for m in missing if m not in OPTIONAL]
    if required:
        raise NormaLibraryNotFound(
            "%s does not export %s: it is older than this package or not libnorma"
            % (path, ", ".join(required)))
    _LIB = dll
    _LIB_PATH = path
    _MISSING = tuple(missing)
    return dll


def missing_functions():
    """The functions of norma.h that the loaded library does not export (yet): OPTIONAL
    ones, declared in the header ahead of their implementation."""
    lib()
    return _MISSING


def lib():
    """The loaded CDLL (loads it on first call; raises NormaLibraryNotFound)."""
    if _LIB is not None:
        return _LIB
    with _LOCK:
        if _LIB is not None:
            return _LIB
        return _load()


def library_path():
    """The path (or name) of the loaded shared library."""
    lib()
    return _LIB_PATH


def _s(b):
    return b.decode("utf-8", "replace") if b is not None else ""


def status_string(status):
    return _s(lib().norma_status_string(int(status)))


def last_error():
    return _s(lib().norma_last_error())


def check(status, function=None):
    """Raises NormaError for a status other than NORMA_OK."""
    if status != OK:
        L = lib()
        raise NormaError(status, _s(L.norma_status_string(status)), _s(L.norma_last_error()),
                         function)
    return status


def call(name, *args):
    """Calls the C function `name` and raises NormaError on failure."""
    return check(getattr(lib(), name)(*args), name)
