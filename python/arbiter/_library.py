"""Finding libarbiter_runtime and declaring the C API (runtime/include/arbiter/arbiter.h).

Search order, first hit wins:
  1. ARBITER_LIBRARY: the library file, or the folder that holds it. When it
     is set and does not load, that is an error (no silent fallback).
  2. Next to the package: in the package folder, then its parent folder.
  3. Where the install put it: `cmake --install` and the wheel write
     _install.py into the installed package with the path from there to the
     library's folder (the wheel: arbiter/lib, inside the package).
  4. ctypes.util.find_library("arbiter_runtime"): the system's library path.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import struct
import threading
from ctypes import (
    POINTER,
    Structure,
    CFUNCTYPE,
    c_char_p,
    c_float,
    c_int,
    c_int32,
    c_int64,
    c_size_t,
    c_uint32,
    c_uint64,
    c_void_p,
)
from time import monotonic as _now

from .errors import ArbiterError, Status

LIBRARY_NAME = "libarbiter_runtime.so"

# arbiter_allreduce_args.flags (arbiter_backend.h).
RUN_RESIDUAL_REPLICATED = 1 << 2


class CRequest(Structure):
    """arbiter_request."""

    _fields_ = [
        ("capability", c_uint32),
        ("world_size", c_uint32),
        ("nodes", c_uint32),
        ("nvlink_domain", c_uint32),
        ("multicast", c_uint32),
        ("dtype", c_int),  # arbiter_dtype
        ("pattern", c_int),  # arbiter_pattern
        ("residual_replicated", c_uint32),
        ("message_bytes", c_uint64),
        ("tokens", c_uint32),
        ("hidden", c_uint32),
    ]


class CRequestEx(Structure):
    """arbiter_request_ex: arbiter_request and what it has no room for."""

    _fields_ = [
        ("request", CRequest),
        ("size", c_uint32),
        ("buffers_registered", c_uint32),
    ]


class CDecision(Structure):
    """arbiter_decision."""

    _fields_ = [
        ("backend", c_uint32),
        ("algorithm", c_int),  # arbiter_algorithm
        ("fused", c_uint32),
        ("reason", c_uint32),
        ("cap", c_uint64),
    ]


# arbiter_oob's functions (backends/abi/arbiter_backend.h). last_error
# returns a pointer the callee keeps alive (c_void_p: ctypes cannot return a
# c_char_p from a callback without leaking or dangling).
OobAllgather = CFUNCTYPE(c_int32, c_void_p, c_void_p, c_void_p, c_size_t, c_int64)
OobBroadcast = CFUNCTYPE(c_int32, c_void_p, c_void_p, c_size_t, c_int32, c_int64)
OobBarrier = CFUNCTYPE(c_int32, c_void_p, c_int64)
OobLastError = CFUNCTYPE(c_void_p, c_void_p)


class COob(Structure):
    """arbiter_oob."""

    _fields_ = [
        ("ctx", c_void_p),
        ("rank", c_int32),
        ("size", c_int32),
        ("allgather", OobAllgather),
        ("broadcast", OobBroadcast),
        ("barrier", OobBarrier),
        ("last_error", OobLastError),
    ]


class CCommOptions(Structure):
    """arbiter_comm_options."""

    _fields_ = [
        ("capability", c_uint32),
        ("nodes", c_uint32),
        ("nvlink_domain", c_uint32),
        ("multicast", c_uint32),
        ("device", c_int32),
        ("max_tokens", c_uint32),
        ("hidden", c_uint32),
        ("dtype", c_int),  # arbiter_dtype
        ("pattern_mask", c_uint32),
        ("timeout_ms", c_int64),
    ]


class CCommInfo(Structure):
    """arbiter_comm_info."""

    _fields_ = [
        ("rank", c_int32),
        ("world_size", c_int32),
        ("device", c_int32),
        ("backend_mask", c_uint32),
        ("fingerprint", c_uint64),
    ]


class CCommFootprint(Structure):
    """arbiter_comm_footprint."""

    _fields_ = [
        ("backend", c_int32),
        ("known", c_int32),
        ("device_bytes", c_uint64),
        ("host_bytes", c_uint64),
        ("shared_bytes", c_uint64),
        ("max_message_bytes", c_uint64 * 3),
        ("note", c_char_p),
    ]


class CAllreduceArgs(Structure):
    """arbiter_allreduce_args."""

    _fields_ = [
        ("pattern", c_int),  # arbiter_pattern
        ("dtype", c_int),  # arbiter_dtype
        ("algorithm", c_int),  # arbiter_algorithm
        ("tokens", c_uint32),
        ("hidden", c_uint32),
        ("flags", c_uint32),
        ("input", c_void_p),
        ("allreduce_out", c_void_p),
        ("residual_in", c_void_p),
        ("residual_out", c_void_p),
        ("gamma", c_void_p),
        ("eps", c_float),
        ("weight_bias", c_float),
        ("norm_out", c_void_p),
        ("quant_out", c_void_p),
        ("scale_out", c_void_p),
        ("scale", c_void_p),
    ]


# arbiter_allreduce_args as struct.pack_into writes it, field by field in
# CAllreduceArgs' order: one call fills the whole struct (pointers are ints,
# 0 for NULL). Checked against the ctypes layout when the module loads.
ALLREDUCE_ARGS_LAYOUT = struct.Struct("@iiiIII5P2f4P")
assert ALLREDUCE_ARGS_LAYOUT.size == ctypes.sizeof(CAllreduceArgs)

# arbiter_comm_allreduce_fusion with every argument an address (an int, or
# None for NULL): what the hot path calls, without byref() objects.
FusionCall = CFUNCTYPE(c_int32, c_void_p, c_void_p, c_void_p, c_void_p)


def fusion_call(lib: ctypes.CDLL):
    """arbiter_comm_allreduce_fusion(comm, args, stream, used) of `lib` as a
    FusionCall."""
    return FusionCall(("arbiter_comm_allreduce_fusion", lib))


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    lib.arbiter_last_error.argtypes = []
    lib.arbiter_last_error.restype = c_char_p
    lib.arbiter_version.argtypes = []
    lib.arbiter_version.restype = c_char_p
    lib.arbiter_policy_from_environment.argtypes = [POINTER(c_void_p)]
    lib.arbiter_policy_from_environment.restype = c_int32
    lib.arbiter_policy_load.argtypes = [POINTER(c_char_p), c_size_t, c_char_p, POINTER(c_void_p)]
    lib.arbiter_policy_load.restype = c_int32
    lib.arbiter_policy_free.argtypes = [c_void_p]
    lib.arbiter_policy_free.restype = None
    lib.arbiter_backend_name.argtypes = [c_uint32]
    lib.arbiter_backend_name.restype = c_char_p
    lib.arbiter_decide_ex.argtypes = [c_void_p, POINTER(CRequestEx), POINTER(CDecision)]
    lib.arbiter_decide_ex.restype = c_int32
    lib.arbiter_max_fused_bytes_ex.argtypes = [
        c_void_p,
        POINTER(CRequestEx),
        POINTER(c_uint64),
        POINTER(c_int32),
    ]
    lib.arbiter_max_fused_bytes_ex.restype = c_int32
    lib.arbiter_policy_fingerprint.argtypes = [c_void_p]
    lib.arbiter_policy_fingerprint.restype = c_uint64
    lib.arbiter_explain_ex.argtypes = [
        c_void_p,
        POINTER(CRequestEx),
        c_int32,
        c_char_p,
        c_size_t,
        POINTER(c_size_t),
    ]
    lib.arbiter_explain_ex.restype = c_int32
    lib.arbiter_comm_create.argtypes = [
        POINTER(COob),
        c_void_p,
        POINTER(CCommOptions),
        POINTER(c_void_p),
    ]
    lib.arbiter_comm_create.restype = c_int32
    lib.arbiter_comm_create_from_environment.argtypes = [
        c_void_p,
        POINTER(CCommOptions),
        POINTER(c_void_p),
    ]
    lib.arbiter_comm_create_from_environment.restype = c_int32
    lib.arbiter_comm_get_info.argtypes = [c_void_p, POINTER(CCommInfo)]
    lib.arbiter_comm_get_info.restype = c_int32
    lib.arbiter_comm_get_footprint.argtypes = [c_void_p, c_int32, POINTER(CCommFootprint)]
    lib.arbiter_comm_get_footprint.restype = c_int32
    lib.arbiter_comm_allreduce_fusion.argtypes = [
        c_void_p,
        POINTER(CAllreduceArgs),
        c_void_p,
        POINTER(CDecision),
    ]
    lib.arbiter_comm_allreduce_fusion.restype = c_int32
    lib.arbiter_comm_join_refused.argtypes = [c_void_p]
    lib.arbiter_comm_join_refused.restype = c_int32
    lib.arbiter_comm_alloc.argtypes = [c_void_p, c_uint64, POINTER(c_void_p)]
    lib.arbiter_comm_alloc.restype = c_int32
    lib.arbiter_comm_free.argtypes = [c_void_p, c_void_p]
    lib.arbiter_comm_free.restype = c_int32
    lib.arbiter_comm_destroy.argtypes = [c_void_p]
    lib.arbiter_comm_destroy.restype = None
    lib.arbiter_comm_abort.argtypes = [c_void_p]
    lib.arbiter_comm_abort.restype = c_int32
    return lib


def _in_folder(folder: str) -> list[str]:
    """The library in `folder`: the development name first, then a versioned one."""
    exact = os.path.join(folder, LIBRARY_NAME)
    if os.path.isfile(exact):
        return [exact]
    return sorted(glob.glob(os.path.join(glob.escape(folder), LIBRARY_NAME + ".*")))


_PACKAGE = os.path.dirname(os.path.abspath(__file__))


def installed_folder(kind: str) -> str | None:
    """The install's folder of `kind` ("LIBDIR" or "BINDIR"), from _install.py.

    None when this package was not installed (a source tree on PYTHONPATH).
    """
    try:
        from . import _install  # written by cmake --install (and so by the wheel's build)
    except ImportError:
        return None
    relative = getattr(_install, kind, None)
    return os.path.normpath(os.path.join(_PACKAGE, relative)) if relative else None


def _candidates() -> list[str]:
    found = _in_folder(_PACKAGE) + _in_folder(os.path.dirname(_PACKAGE))
    libdir = installed_folder("LIBDIR")
    if libdir is not None:
        found += _in_folder(libdir)
    return found


def _open(path: str) -> ctypes.CDLL:
    """The library at `path`, declared; OSError when it is not one, or not
    arbiter's runtime (a symbol missing: another library, or a stale one)."""
    lib = ctypes.CDLL(path)
    try:
        return _declare(lib)
    except AttributeError as e:
        raise OSError(f"not {LIBRARY_NAME}, or one older than this package ({e}); "
                      f"give the path of {LIBRARY_NAME} or of its folder") from e


def _load() -> tuple[ctypes.CDLL, str]:
    explicit = os.environ.get("ARBITER_LIBRARY", "")
    if explicit:
        paths = _in_folder(explicit) if os.path.isdir(explicit) else [explicit]
        if not paths:
            raise ArbiterError(
                Status.UNAVAILABLE, f"ARBITER_LIBRARY={explicit}: no {LIBRARY_NAME} in that folder"
            )
        try:
            return _open(paths[0]), paths[0]
        except OSError as e:
            raise ArbiterError(Status.UNAVAILABLE, f"ARBITER_LIBRARY={explicit}: {e}") from e
    tried = []
    for path in _candidates():
        try:
            return _open(path), path
        except OSError as e:
            tried.append(f"{path}: {e}")
    name = ctypes.util.find_library("arbiter_runtime")
    if name:
        try:
            return _open(name), name
        except OSError as e:
            tried.append(f"{name}: {e}")
    detail = "; ".join(tried) if tried else "not next to the package, nor installed"
    raise ArbiterError(
        Status.UNAVAILABLE,
        f"cannot find {LIBRARY_NAME} ({detail}); set ARBITER_LIBRARY to the library "
        "or to the folder that holds it (e.g. <prefix>/lib)",
    )


_lock = threading.Lock()
_loaded: tuple[ctypes.CDLL, str] | None = None


def library() -> ctypes.CDLL:
    """The loaded C library (loaded on first use, then kept)."""
    global _loaded
    with _lock:
        if _loaded is None:
            _loaded = _load()
        return _loaded[0]


def library_path() -> str:
    """The file the C library was loaded from (or the name the loader resolved)."""
    library()
    assert _loaded is not None
    return _loaded[1]


def version() -> str:
    """The loaded library's version (arbiter_version()), e.g. "0.1.0"."""
    return library().arbiter_version().decode("ascii")


def last_error(lib: ctypes.CDLL) -> str:
    message = lib.arbiter_last_error()
    return message.decode("utf-8", "replace") if message else ""


def check(lib: ctypes.CDLL, status: int) -> None:
    """Raises ArbiterError(status, arbiter_last_error()) unless status is OK."""
    if status != Status.OK:
        raise ArbiterError(status, last_error(lib) or f"arbiter call failed with status {status}")


def join_refused(comm, locked: bool, error: BaseException) -> BaseException:
    """A call refused by the binding's own checks (`error`) is still a call:
    it joins the peers (arbiter_comm_join_refused), whose call is then
    refused too instead of pairing with this rank's next call and mixing two
    calls' data. Returns what to raise: `error`, or, when the peers never
    came (the communicator is then unusable), an ArbiterError with that
    status saying both. `locked`: the caller holds comm._lock. Nothing is
    joined when another thread is in a call on comm (that misuse is refused
    on its own) or comm is closed."""
    if not locked and not comm._lock.acquire(blocking=False):
        return error
    if not locked:
        comm._call_started = _now()  # for the Ctrl-C watcher (_interrupt)
    try:
        if not comm._handle_value:
            return error
        status = comm._lib.arbiter_comm_join_refused(comm._handle_value)
        if status == Status.OK:
            return error
        # "...; then joining call N (refused on this rank) to tell the peers
        # failed: ..."
        return ArbiterError(status, f"{error}; then {last_error(comm._lib)}")
    finally:
        if not locked:
            comm._lock.release()
