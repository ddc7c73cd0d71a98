"""The numpy fast path of Communicator.allreduce_fusion: host arrays of the
communicator's dtype, plain all-reduce or residual + RMSNorm, every array a
C-contiguous numpy.ndarray and every output writable. Read straight from
the arrays' attributes, no Borrowed view per array (arrays.py), in the
manner of the torch path (_torch_tensors.py).

try_run() returns None, having done nothing, whenever a call is not that
common case or breaks any rule; _array_call.run() then takes it and raises
the error that names the rule. So this file holds no error message of its
own: the two paths cannot disagree on what they refuse.
"""

from __future__ import annotations

import ctypes
from time import monotonic as _now

from . import _library
from ._results import FusionResult
from .errors import FLOAT32_MAX as _F32_MAX
from .policy import Dtype, Pattern

_NUMPY_DTYPES = {Dtype.FP16: "float16", Dtype.BF16: "uint16", Dtype.FP32: "float32"}
_address_of = ctypes.addressof
_char_at = ctypes.c_char.from_buffer
_pack = _library.ALLREDUCE_ARGS_LAYOUT.pack_into
_NORM = int(Pattern.RESIDUAL_RMSNORM)
_ALLREDUCE = int(Pattern.ALLREDUCE)
# The outputs each of the two patterns may write (out's keys), and those
# written when `out` leaves them out.
_MAY_WRITE = ({"allreduce_out"}, {"allreduce_out", "residual_out", "norm_out"})
_PRODUCED = (("allreduce_out",), ("residual_out", "norm_out"))
_REQUIRED = ("allreduce_out", "norm_out")


def _address(a, ndarray, dtype, shape, writable: bool) -> int:
    """The array's address when it is an ndarray of `dtype` and `shape`, C
    order (and writable when asked), else 0. Nonzero for every array that
    qualifies: a C-contiguous array of a nonzero shape has a buffer."""
    if type(a) is not ndarray or a.shape != shape or a.dtype != dtype:
        return 0
    flags = a.flags
    if not flags.c_contiguous:
        return 0
    if flags.writeable:
        return _address_of(_char_at(a))
    return 0 if writable else a.ctypes.data


def try_run(comm, numpy, x, residual, weight, eps, pattern, out, stream, scale, weight_bias,
            residual_replicated):
    """The call's FusionResult, or None to hand it to the general path."""
    if stream is not None or scale is not None or comm.device >= 0:
        return None
    if pattern is None:
        code = _ALLREDUCE if residual is None and weight is None else _NORM
    elif type(pattern) is Pattern and pattern in (Pattern.ALLREDUCE, Pattern.RESIDUAL_RMSNORM):
        code = int(pattern)
    else:
        return None
    ndarray = numpy.ndarray
    if type(x) is not ndarray or x.ndim != 2 or type(residual_replicated) is not bool:
        return None
    shape = x.shape
    tokens, hidden = shape
    if hidden != comm.hidden or tokens == 0 or (
            comm.max_tokens is not None and tokens > comm.max_tokens):
        return None
    dtype = comm._numpy_dtype
    if dtype is None:
        dtype = comm._numpy_dtype = numpy.dtype(_NUMPY_DTYPES[comm.dtype])
    x_at = _address(x, ndarray, dtype, shape, False)
    if not x_at:
        return None
    residual_at = gamma_at = flags = 0
    if code == _NORM:
        if weight is None:
            return None
        if residual is not None:
            residual_at = _address(residual, ndarray, dtype, shape, False)
            if not residual_at:
                return None
        gamma_at = _address(weight, ndarray, dtype, (hidden,), False)
        if not gamma_at:
            return None
        # Plain floats a float32 holds; anything else (an int beyond any
        # float raised here, unjoined) goes to the general path to be refused.
        if not (type(eps) is float and 0 <= eps <= _F32_MAX
                and type(weight_bias) is float and -_F32_MAX <= weight_bias <= _F32_MAX):
            return None
        flags = _library.RUN_RESIDUAL_REPLICATED if residual_replicated else 0
    elif residual is not None or weight is not None:
        return None
    else:
        eps = weight_bias = 0.0
    results = {}
    if out:
        if type(out) is not dict or not _MAY_WRITE[code].issuperset(out):
            return None
        results.update(out)
        if results.get(_REQUIRED[code], 0) is None:
            return None
    for name in _PRODUCED[code]:
        if name not in results:
            results[name] = numpy.empty(shape, dtype)
    at = {}
    for name, a in results.items():
        if a is not None:
            at[name] = _address(a, ndarray, dtype, shape, True)
            if not at[name]:
                return None
    if not comm._lock.acquire(blocking=False):
        return None
    comm._call_started = _now()  # for the Ctrl-C watcher (_interrupt)
    try:
        if not comm._handle_value:
            return None
        get = at.get
        _pack(comm._args, 0, code, comm._dtype_code, 0, tokens, hidden, flags, x_at,
              get("allreduce_out", 0), residual_at, get("residual_out", 0), gamma_at, eps,
              weight_bias, get("norm_out", 0), 0, 0, 0)
        status = comm._fusion_call(comm._handle_value, comm._args_address, None,
                                   comm._decision_address)
        if status:
            _library.check(comm._lib, status)
    finally:
        comm._lock.release()
    return FusionResult(comm.last_decision, **results)
