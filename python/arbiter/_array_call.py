"""Communicator.allreduce_fusion on arrays other than torch tensors: numpy,
buffer-protocol exporters and DLPack producers (arrays.py borrows them).

Every array is checked on the calling rank before the call joins the
collective, and held (arrays.Borrowed) until the call returns. The
arguments go into the communicator's own arbiter_allreduce_args in one
struct.pack_into, as on the torch path.
"""

from __future__ import annotations

import sys
from time import monotonic as _now

from . import _library, _numpy_call
from ._results import FP8_HINT, OUTPUTS, FusionResult, nvfp4_scale_bytes, stream_handle
from .arrays import Borrowed, borrow
from .errors import invalid_argument as _invalid
from .errors import FLOAT32_MAX as _F32_MAX
from .errors import real_number as _real
from .policy import Dtype, Pattern, parse_pattern

# What each pattern writes when `out` does not say otherwise, and what it
# must write.
_PRODUCED = {
    Pattern.ALLREDUCE: ("allreduce_out",),
    Pattern.RESIDUAL_RMSNORM: ("residual_out", "norm_out"),
    Pattern.RESIDUAL_RMSNORM_FP8: ("residual_out", "quant_out"),
    Pattern.RESIDUAL_RMSNORM_FP4: ("residual_out", "quant_out", "scale_out"),
}
_REQUIRED = {
    Pattern.ALLREDUCE: ("allreduce_out",),
    Pattern.RESIDUAL_RMSNORM: ("norm_out",),
    Pattern.RESIDUAL_RMSNORM_FP8: ("quant_out",),
    Pattern.RESIDUAL_RMSNORM_FP4: ("quant_out", "scale_out"),
}
_ELEMENTS = {Dtype.FP16: ("fp16",), Dtype.BF16: ("bf16", "u16"), Dtype.FP32: ("fp32",)}
_NUMPY_TYPES = {Dtype.FP16: "float16", Dtype.BF16: "uint16", Dtype.FP32: "float32"}
# Quantised outputs: raw bytes, or the format the kernels write.
_FP8_BYTES = ("u8", "i8", "fp8_e4m3fn")
_FP4_BYTES = ("u8", "i8", "fp4_e2m1fn_x2")
_KEYS = frozenset(OUTPUTS)
_WHAT = {name: f"out[{name!r}]" for name in OUTPUTS}
_pack = _library.ALLREDUCE_ARGS_LAYOUT.pack_into


def _where(device: int) -> str:
    return "host memory" if device < 0 else f"CUDA device {device}"


def _borrow(comm, obj, what: str, stream: int, held: list) -> Borrowed:
    view = borrow(obj, what, stream)
    held.append(view)
    if view.device != comm.device:
        raise _invalid(f"{what}: the array is in {_where(view.device)}, this rank's "
                       f"communicator runs on {_where(comm.device)}")
    if not view.contiguous:
        raise _invalid(f"{what}: the array is not C-contiguous (copy it first)")
    return view


def _check(view: Borrowed, what: str, shape: tuple, elements: tuple,
           writable: bool = False) -> None:
    if view.shape != shape:
        raise _invalid(f"{what}: shape {view.shape}, expected {shape}")
    if view.element not in elements:
        hint = (FP8_HINT if elements is _FP8_BYTES else
                " (bf16 as a uint16 array of its bits)" if "u16" in elements else "")
        raise _invalid(
            f"{what}: element type {view.element}, expected {' or '.join(elements)}{hint}")
    if writable and view.readonly:
        raise _invalid(f"{what}: the array is read-only")


def _layout(name: str, pattern: Pattern, tokens: int, hidden: int, elements: tuple) -> tuple:
    """(shape, element types) of an output."""
    if name == "quant_out" and pattern == Pattern.RESIDUAL_RMSNORM_FP8:
        return (tokens, hidden), _FP8_BYTES
    if name == "quant_out":
        return (tokens, hidden // 2), _FP4_BYTES
    if name == "scale_out":
        return (nvfp4_scale_bytes(tokens, hidden),), _FP8_BYTES
    return (tokens, hidden), elements


def _allocate(comm, name: str, shape: tuple, elements: tuple):
    if comm.device >= 0:
        raise _invalid(
            f"out: on a GPU rank every output is the caller's; pass out={{'{name}': ...}}")
    import numpy

    kind = "uint8" if elements in (_FP8_BYTES, _FP4_BYTES) else _NUMPY_TYPES[comm.dtype]
    return numpy.empty(shape, dtype=kind)


def run(comm, x, residual, weight, eps, pattern, out, stream, scale, weight_bias,
        residual_replicated) -> FusionResult:
    """The call, with the communicator's lock held (one call at a time)."""
    numpy = sys.modules.get("numpy")
    if numpy is not None and type(x) is numpy.ndarray:
        result = _numpy_call.try_run(comm, numpy, x, residual, weight, eps, pattern, out, stream,
                                     scale, weight_bias, residual_replicated)
        if result is not None:
            return result
    if not comm._lock.acquire(blocking=False):
        raise _invalid("allreduce_fusion: another thread is in a call on this communicator")
    comm._call_started = _now()  # for the Ctrl-C watcher (_interrupt)
    held: list[Borrowed] = []
    try:
        try:
            results, handle = _prepare(comm, x, residual, weight, eps, pattern, out, stream,
                                       scale, weight_bias, residual_replicated, held)
        except Exception as refused:
            raise _library.join_refused(comm, True, refused)
        status = comm._fusion_call(comm._handle_value, comm._args_address, handle or None,
                                   comm._decision_address)
        if status:
            _library.check(comm._lib, status)
        return FusionResult(comm.last_decision, **results)
    finally:
        for view in held:
            view.release()
        comm._lock.release()


def _prepare(comm, x, residual, weight, eps, pattern, out, stream, scale, weight_bias,
             residual_replicated, held) -> tuple:
    """Every check of the call on this rank, then its arguments packed into
    the communicator's struct: (outputs by name, stream handle)."""
    if not comm._handle_value:
        raise _invalid("the communicator was closed")
    if pattern is None:
        no_norm = residual is None and weight is None
        pattern = Pattern.ALLREDUCE if no_norm else Pattern.RESIDUAL_RMSNORM
    pattern = parse_pattern(pattern)
    if comm.device < 0 and stream is not None:
        raise _invalid("stream: this communicator runs on host memory; pass no stream")
    handle = stream_handle(stream)
    elements = _ELEMENTS[comm.dtype]
    xv = _borrow(comm, x, "x", handle, held)
    if len(xv.shape) != 2:
        raise _invalid(f"x: shape {xv.shape}; expected (tokens, hidden={comm.hidden})")
    tokens, hidden = xv.shape
    if hidden != comm.hidden:
        raise _invalid(f"x: hidden {hidden}; the communicator was created for {comm.hidden}")
    if comm.max_tokens is not None and tokens > comm.max_tokens:
        raise _invalid(f"x: {tokens} tokens, more than max_tokens={comm.max_tokens}")
    _check(xv, "x", (tokens, hidden), elements)
    if not isinstance(residual_replicated, bool):
        raise _invalid(f"residual_replicated {residual_replicated!r} must be True or False")
    norm = pattern != Pattern.ALLREDUCE
    residual_at = gamma_at = flags = 0
    if norm:
        if weight is None:
            raise _invalid(f"pattern {pattern.name.lower()} needs weight")
        # residual None: a first block, no residual added (no zeros tensor).
        rv = None if residual is None else _borrow(comm, residual, "residual", handle, held)
        if rv is not None:
            _check(rv, "residual", (tokens, hidden), elements)
        wv = _borrow(comm, weight, "weight", handle, held)
        _check(wv, "weight", (hidden,), elements)
        if not (type(eps) is float and 0 <= eps <= _F32_MAX):
            eps = _real(eps, "eps", nonnegative=True)  # an int, a numpy scalar, or refused
        if not (type(weight_bias) is float and -_F32_MAX <= weight_bias <= _F32_MAX):
            weight_bias = _real(weight_bias, "weight_bias")
        residual_at, gamma_at = (0 if rv is None else rv.address), wv.address
        flags = _library.RUN_RESIDUAL_REPLICATED if residual_replicated else 0
    elif residual is not None or weight is not None:
        raise _invalid("pattern allreduce takes no residual or weight")
    else:
        eps = weight_bias = 0.0
    quant = pattern in (Pattern.RESIDUAL_RMSNORM_FP8, Pattern.RESIDUAL_RMSNORM_FP4)
    scale_at = 0
    if quant:
        if scale is None:
            raise _invalid(f"pattern {pattern.name.lower()} needs scale")
        if isinstance(scale, (int, float)) and not isinstance(scale, bool):
            if comm.device >= 0:
                raise _invalid("scale: on a GPU rank, pass one float32 in device memory")
            comm._scale_value.value = _real(scale, "scale", positive=True)
            scale_at = comm._scale_address
        else:
            sv = _borrow(comm, scale, "scale", handle, held)
            if sv.element != "fp32" or sv.nbytes != 4:
                raise _invalid(f"scale: {sv.element} of shape {sv.shape}; pass one float32")
            scale_at = sv.address
    elif scale is not None:
        raise _invalid(f"pattern {pattern.name.lower()} takes no scale")

    if out is not None and not isinstance(out, dict):
        raise _invalid(f"out: a {type(out).__name__}; pass a dict of output name -> array")
    if out and not _KEYS.issuperset(out):
        raise _invalid(f"out: unknown keys {sorted(set(out) - _KEYS)}; use {', '.join(OUTPUTS)}")
    given = out or {}
    results = {}
    addresses = {}
    for name in OUTPUTS:
        if name in given:
            obj = given[name]
            if obj is None:
                if name in _REQUIRED[pattern]:
                    raise _invalid(f"out: {name} is required by this pattern")
                continue
        elif name in _PRODUCED[pattern]:
            obj = _allocate(comm, name, *_layout(name, pattern, tokens, hidden, elements))
        else:
            continue
        if not norm and name != "allreduce_out":
            raise _invalid(f"out: pattern allreduce writes no {name}")
        if not quant and name in ("quant_out", "scale_out"):
            raise _invalid(f"out: pattern {pattern.name.lower()} writes no {name}")
        if pattern == Pattern.RESIDUAL_RMSNORM_FP8 and name == "scale_out":
            raise _invalid("out: residual_rmsnorm_fp8 writes no scale_out")
        what = _WHAT[name]
        view = _borrow(comm, obj, what, handle, held)
        _check(view, what, *_layout(name, pattern, tokens, hidden, elements), writable=True)
        addresses[name] = view.address
        results[name] = obj

    get = addresses.get
    _pack(comm._args, 0, int(pattern), comm._dtype_code, 0, tokens, hidden, flags, xv.address,
          get("allreduce_out", 0), residual_at, get("residual_out", 0), gamma_at, eps,
          weight_bias, get("norm_out", 0), get("quant_out", 0), get("scale_out", 0), scale_at)
    return results, handle
