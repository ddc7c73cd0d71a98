"""Fused all-reduce through arbiter from Python: the C API's communicator.

    comm = arbiter.Communicator.from_environment(hidden=4096, dtype="bf16")
    r = comm.allreduce_fusion(x, residual, weight, eps=1e-6)
    r.norm_out, r.residual_out, r.decision     # (tokens, hidden) arrays; shm oneshot fused

Every rank calls the same methods in the same order with the same shapes
(only the data differs). Arrays are checked on the calling rank before it
joins the collective, so a bad call raises ArbiterError at once; its peers,
which did join, fail when the deadline passes, naming the rank they lacked.
"""

from __future__ import annotations

import ctypes
import math
import sys
import threading
from dataclasses import dataclass

from . import _library
from .arrays import Borrowed, borrow
from .errors import invalid_argument as _invalid
from .oob import PythonOob
from .policy import Decision, Dtype, Pattern, Policy, decision_from_c, parse_capability
from .policy import parse_dtype, parse_pattern

_OUTPUTS = ("allreduce_out", "residual_out", "norm_out", "quant_out", "scale_out")
# What each pattern writes when `out` does not say otherwise.
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
_BYTES = ("u8", "fp8", "i8")  # quantised outputs


@dataclass(frozen=True)
class FusionResult:
    """The outputs of one call (None where the pattern or `out` wrote none)
    and the decision that ran it."""

    decision: Decision
    allreduce_out: object = None
    residual_out: object = None
    norm_out: object = None
    quant_out: object = None
    scale_out: object = None


def _stream_handle(stream: object) -> int:
    """A CUDA stream as its handle: an int, an object with `cuda_stream`
    (torch), or one with `__cuda_stream__()` returning (version, handle)."""
    if stream is None:
        return 0
    if isinstance(stream, int):
        return stream
    if hasattr(stream, "__cuda_stream__"):
        return int(stream.__cuda_stream__()[1])
    if hasattr(stream, "cuda_stream"):
        return int(stream.cuda_stream)
    raise _invalid(f"stream: a {type(stream).__name__} is not a CUDA stream or handle")


def _pattern_mask(patterns: object) -> int:
    """arbiter_comm_options.pattern_mask for `patterns` (None: 0, every pattern)."""
    if patterns is None:
        return 0
    if isinstance(patterns, (str, Pattern)):
        patterns = (patterns,)
    try:
        names = list(patterns)
    except TypeError:
        raise _invalid(f"patterns: a {type(patterns).__name__} is not a list of patterns") from None
    if not names:
        raise _invalid("patterns: an empty list asks for nothing; pass None for every pattern")
    mask = 0
    for name in names:
        mask |= 1 << int(parse_pattern(name))
    return mask


def _nvfp4_scale_bytes(tokens: int, hidden: int) -> int:
    """scale_out for NVFP4 in the 128x4 swizzled layout (16-element blocks)."""
    block_cols = hidden // 16
    return ((tokens + 127) // 128) * 128 * ((block_cols + 3) // 4) * 4


class Communicator:
    """The ranks of one all-reduce group, with arbiter's backends ready to
    run. Collective to create and to close (every rank, same order)."""

    def __init__(
        self,
        oob: object,
        *,
        rank: int,
        world_size: int,
        local_rank: int | None = None,
        hidden: int,
        dtype: str | Dtype,
        max_tokens: int | None = None,
        policy: Policy | None = None,
        timeout: float | None = None,
        capability: int | str | tuple = "cpu",
        nodes: int = 1,
        nvlink_domain: bool = True,
        multicast: bool = False,
        patterns: object = None,
    ) -> None:
        """Meets the other ranks through `oob`, the caller's own group: an
        object with allgather(bytes) -> list[bytes] (see arbiter.oob). GPU
        ranks (capability "9.0", 90 or (9, 0)) use CUDA device `local_rank`;
        "cpu" ranks run on host memory (the shm backend).

        `patterns`: the patterns calls will use (names or Pattern values, e.g.
        ["residual_rmsnorm"]); None asks for all four. Each backend is asked
        only for those it runs on this device; a pattern no backend runs here
        (NVFP4 below capability 10.0, say) is refused when called, with the
        reason, and fewer patterns can mean smaller workspaces. A world size of
        1 works: the fallback runs the residual add and norm on this rank."""
        if not isinstance(rank, int) or not isinstance(world_size, int) or not (
            0 <= rank < world_size
        ):
            raise _invalid(f"rank {rank!r} of world_size {world_size!r}: need 0 <= rank < size")
        self._setup(hidden, dtype, max_tokens, timeout, capability, nodes, nvlink_domain,
                    multicast, local_rank, patterns)
        if self.capability != 0 and local_rank is None:
            raise _invalid("local_rank: a GPU rank needs its CUDA device ordinal (LOCAL_RANK)")
        self._oob = PythonOob(oob, rank, world_size)
        self._create(policy, lambda lib, p, o, h: lib.arbiter_comm_create(
            ctypes.byref(self._oob.c), p, o, h))

    @classmethod
    def from_environment(
        cls,
        *,
        hidden: int,
        dtype: str | Dtype,
        max_tokens: int | None = None,
        policy: Policy | None = None,
        timeout: float | None = None,
        capability: int | str | tuple = "cpu",
        nodes: int = 1,
        nvlink_domain: bool = True,
        multicast: bool = False,
        patterns: object = None,
        device: int | None = None,
    ) -> "Communicator":
        """Collective: meets the other ranks through arbiter's UCX bootstrap
        from torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
        MASTER_PORT), as `arbiter launch` and torchrun set them. GPU ranks
        use CUDA device `device`, by default LOCAL_RANK. `patterns` as for
        the constructor."""
        self = cls.__new__(cls)
        self._setup(hidden, dtype, max_tokens, timeout, capability, nodes, nvlink_domain,
                    multicast, device, patterns)
        self._oob = None
        self._create(policy, lambda lib, p, o, h: lib.arbiter_comm_create_from_environment(
            p, o, h))
        return self

    # --- creation ---------------------------------------------------------

    def _setup(self, hidden, dtype, max_tokens, timeout, capability, nodes, nvlink_domain,
               multicast, local_rank, patterns) -> None:
        self._handle = ctypes.c_void_p()
        self._lock = threading.Lock()
        if not isinstance(hidden, int) or isinstance(hidden, bool) or not 0 < hidden < 2**32:
            raise _invalid(f"hidden {hidden!r} is not a positive integer")
        if max_tokens is not None and (
            not isinstance(max_tokens, int) or isinstance(max_tokens, bool)
            or not 0 < max_tokens < 2**32
        ):
            raise _invalid(f"max_tokens {max_tokens!r} is not a positive integer (or None)")
        if timeout is not None and not (isinstance(timeout, (int, float)) and timeout > 0
                                        and math.isfinite(timeout)):
            raise _invalid(f"timeout {timeout!r} is not a positive number of seconds")
        self.hidden = hidden
        self.dtype = parse_dtype(dtype)
        self.max_tokens = max_tokens
        if isinstance(capability, tuple) and len(capability) == 2:
            capability = "{}.{}".format(*capability)  # torch.cuda.get_device_capability()
        self.capability = parse_capability(capability)
        if self.capability != 0 and local_rank is not None and not (
            isinstance(local_rank, int) and local_rank >= 0
        ):
            raise _invalid(f"local_rank {local_rank!r} is not a CUDA device ordinal")
        self._options = _library.CCommOptions(
            capability=self.capability,
            nodes=nodes,
            nvlink_domain=1 if nvlink_domain else 2,  # ARBITER_NVLINK_YES / _NO
            multicast=1 if multicast else 0,
            device=-1 if self.capability == 0 else (-1 if local_rank is None else local_rank),
            max_tokens=max_tokens or 0,
            hidden=hidden,
            dtype=int(self.dtype),
            pattern_mask=_pattern_mask(patterns),
            timeout_ms=0 if timeout is None else max(1, int(timeout * 1000)),
        )

    def _create(self, policy: Policy | None, create) -> None:
        lib = _library.library()
        own = policy is None
        if own:
            policy = Policy.from_environment()
        try:
            _library.check(
                lib, create(lib, policy._live(), ctypes.byref(self._options),
                            ctypes.byref(self._handle))
            )
        finally:
            if own:
                policy.close()  # the communicator keeps its own copy
        self._lib = lib
        info = _library.CCommInfo()
        _library.check(lib, lib.arbiter_comm_get_info(self._handle, ctypes.byref(info)))
        self.rank = int(info.rank)
        self.world_size = int(info.world_size)
        self.device = int(info.device)
        self._backends = [
            lib.arbiter_backend_name(i).decode() for i in range(32) if (info.backend_mask >> i) & 1
        ]
        self._fingerprint = int(info.fingerprint)

    # --- properties -------------------------------------------------------

    @property
    def backends(self) -> list[str]:
        """The backends with a workspace on every rank (the ones a call may use)."""
        return list(self._backends)

    @property
    def fingerprint(self) -> int:
        """Fingerprint of the tables every rank agreed on (Policy.fingerprint)."""
        return self._fingerprint

    @property
    def fingerprint_hex(self) -> str:
        return f"{self._fingerprint:016x}"

    # --- the call ---------------------------------------------------------

    def allreduce_fusion(
        self,
        x: object,
        residual: object = None,
        weight: object = None,
        *,
        eps: float = 1e-6,
        pattern: str | Pattern | None = None,
        out: dict | None = None,
        stream: object = None,
        scale: object = None,
        weight_bias: float = 0.0,
        residual_replicated: bool = False,
    ) -> FusionResult:
        """One all-reduce of x (tokens, hidden) over the group, with residual
        add + RMSNorm (+FP8/NVFP4 quantisation) when residual and weight are
        given: residual_out = sum + residual, norm_out = rmsnorm(residual_out)
        * (weight + weight_bias). The pattern defaults to "allreduce" without
        residual and "residual_rmsnorm" with it; "residual_rmsnorm_fp8" needs
        `scale` (dequantisation scale: a float, or one float32 on the device).

        Outputs are new arrays (numpy, for host memory), or the arrays in
        `out` (keys allreduce_out, residual_out, norm_out, quant_out,
        scale_out; a key set to None is not written). In place is allowed as
        the C API says: an output may be exactly x or residual. CUDA arrays
        need every output in `out`; `stream` (a handle or a torch/cupy
        stream) orders the call, and the arrays' producers, on it.

        residual_replicated=True promises that `residual` holds the same
        values on every rank (as in tensor parallelism): a backend may then
        run each token's norm on one rank and copy its outputs to the others
        (the shm two-shot does). Same results while the promise holds."""
        if not self._lock.acquire(blocking=False):
            raise _invalid("allreduce_fusion: another thread is in a call on this communicator")
        held: list[Borrowed] = []
        try:
            return self._run(x, residual, weight, eps, pattern, out, stream, scale, weight_bias,
                             residual_replicated, held)
        finally:
            for view in held:
                view.release()
            self._lock.release()

    def _borrow(self, obj, what, stream, held) -> Borrowed:
        view = borrow(obj, what, stream)
        held.append(view)
        if view.device != self.device:
            where = lambda d: "host memory" if d < 0 else f"CUDA device {d}"  # noqa: E731
            raise _invalid(
                f"{what}: the array is in {where(view.device)}, this rank's communicator "
                f"runs on {where(self.device)}"
            )
        if not view.contiguous:
            raise _invalid(f"{what}: the array is not C-contiguous (copy it first)")
        return view

    def _check(self, view: Borrowed, what: str, shape: tuple, elements: tuple,
               writable: bool = False) -> None:
        if view.shape != shape:
            raise _invalid(f"{what}: shape {view.shape}, expected {shape}")
        if view.element not in elements:
            raise _invalid(
                f"{what}: element type {view.element}, expected {' or '.join(elements)}"
                + (" (bf16 as a uint16 array of its bits)" if "u16" in elements else "")
            )
        if writable and view.readonly:
            raise _invalid(f"{what}: the array is read-only")

    def _run(self, x, residual, weight, eps, pattern, out, stream, scale, weight_bias,
             residual_replicated, held):
        if not self._handle:
            raise _invalid("the communicator was closed")
        if pattern is None:
            pattern = Pattern.ALLREDUCE if residual is None else Pattern.RESIDUAL_RMSNORM
        pattern = parse_pattern(pattern)
        if self.device < 0 and stream is not None:
            raise _invalid("stream: this communicator runs on host memory; pass no stream")
        handle = _stream_handle(stream)
        elements = _ELEMENTS[self.dtype]
        xv = self._borrow(x, "x", handle, held)
        if len(xv.shape) != 2:
            raise _invalid(f"x: shape {xv.shape}; expected (tokens, hidden={self.hidden})")
        tokens, hidden = xv.shape
        if hidden != self.hidden:
            raise _invalid(f"x: hidden {hidden}; the communicator was created for {self.hidden}")
        if self.max_tokens is not None and tokens > self.max_tokens:
            raise _invalid(f"x: {tokens} tokens, more than max_tokens={self.max_tokens}")
        self._check(xv, "x", (tokens, hidden), elements)
        args = _library.CAllreduceArgs(pattern=int(pattern), dtype=int(self.dtype), tokens=tokens,
                                       hidden=hidden, input=xv.address)
        if not isinstance(residual_replicated, bool):
            raise _invalid(f"residual_replicated {residual_replicated!r} must be True or False")
        norm = pattern != Pattern.ALLREDUCE
        if norm:
            if residual is None or weight is None:
                raise _invalid(f"pattern {pattern.name.lower()} needs residual and weight")
            rv = self._borrow(residual, "residual", handle, held)
            self._check(rv, "residual", (tokens, hidden), elements)
            wv = self._borrow(weight, "weight", handle, held)
            self._check(wv, "weight", (hidden,), elements)
            if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps >= 0):
                raise _invalid(f"eps {eps!r} must be finite and >= 0")
            if not (isinstance(weight_bias, (int, float)) and math.isfinite(weight_bias)):
                raise _invalid(f"weight_bias {weight_bias!r} must be finite")
            args.residual_in, args.gamma = rv.address, wv.address
            args.eps, args.weight_bias = float(eps), float(weight_bias)
            args.flags = _library.RUN_RESIDUAL_REPLICATED if residual_replicated else 0
        elif residual is not None or weight is not None:
            raise _invalid("pattern allreduce takes no residual or weight")
        quant = pattern in (Pattern.RESIDUAL_RMSNORM_FP8, Pattern.RESIDUAL_RMSNORM_FP4)
        scale_keep = None
        if quant:
            if scale is None:
                raise _invalid(f"pattern {pattern.name.lower()} needs scale")
            if isinstance(scale, (int, float)) and not isinstance(scale, bool):
                if self.device >= 0:
                    raise _invalid("scale: on a GPU rank, pass one float32 in device memory")
                scale_keep = ctypes.c_float(scale)
                args.scale = ctypes.addressof(scale_keep)
            else:
                sv = self._borrow(scale, "scale", handle, held)
                if sv.element != "fp32" or sv.nbytes != 4:
                    raise _invalid(f"scale: {sv.element} of shape {sv.shape}; pass one float32")
                args.scale = sv.address
        elif scale is not None:
            raise _invalid(f"pattern {pattern.name.lower()} takes no scale")

        def layout(name: str) -> tuple:  # (shape, element types) of an output
            if name == "quant_out":
                per_token = hidden if pattern == Pattern.RESIDUAL_RMSNORM_FP8 else hidden // 2
                return (tokens, per_token), _BYTES
            if name == "scale_out":
                return (_nvfp4_scale_bytes(tokens, hidden),), _BYTES
            return (tokens, hidden), elements

        given = dict(out or {})
        unknown = set(given) - set(_OUTPUTS)
        if unknown:
            raise _invalid(f"out: unknown keys {sorted(unknown)}; use {', '.join(_OUTPUTS)}")
        results = {}
        for name in _OUTPUTS:
            if name in given:
                obj = given[name]
                if obj is None:
                    if name in _REQUIRED[pattern]:
                        raise _invalid(f"out: {name} is required by this pattern")
                    continue
            elif name in _PRODUCED[pattern]:
                obj = self._allocate(name, *layout(name))
            else:
                continue
            if not norm and name != "allreduce_out":
                raise _invalid(f"out: pattern allreduce writes no {name}")
            if not quant and name in ("quant_out", "scale_out"):
                raise _invalid(f"out: pattern {pattern.name.lower()} writes no {name}")
            if pattern == Pattern.RESIDUAL_RMSNORM_FP8 and name == "scale_out":
                raise _invalid("out: residual_rmsnorm_fp8 writes no scale_out")
            view = self._borrow(obj, f"out[{name!r}]", handle, held)
            self._check(view, f"out[{name!r}]", *layout(name), writable=True)
            setattr(args, name, view.address)
            results[name] = obj

        decision = _library.CDecision()
        lib = self._lib
        status = lib.arbiter_comm_allreduce_fusion(
            self._handle, ctypes.byref(args), handle or None, ctypes.byref(decision)
        )
        del scale_keep  # the call is over
        _library.check(lib, status)
        return FusionResult(decision=decision_from_c(lib, decision), **results)

    def _allocate(self, name: str, shape: tuple, elements: tuple):
        if self.device >= 0:
            raise _invalid(
                f"out: on a GPU rank every output is the caller's; pass out={{'{name}': ...}}"
            )
        import numpy

        kind = "uint8" if elements is _BYTES else _NUMPY_TYPES[self.dtype]
        return numpy.empty(shape, dtype=kind)

    # --- lifetime ---------------------------------------------------------

    def abort(self) -> None:
        """Makes a call waiting in another thread return: it raises
        ArbiterError(ABORTED) (CPU ranks: within milliseconds), peers waiting
        on this rank raise ArbiterError(PEER_FAILED) naming it, GPU kernels
        waiting on a peer stop waiting, and every later call raises at once.
        For a framework's watchdog; safe from any thread, any number of
        times. close() afterwards waits on no peer."""
        handle = self._handle
        if handle:
            _library.check(self._lib, self._lib.arbiter_comm_abort(handle))

    def close(self) -> None:
        """Collective: frees every workspace (every rank must close). After
        a failed call or abort() it is local, waiting on no peer."""
        if self._handle:
            handle, self._handle = self._handle, ctypes.c_void_p()
            self._lib.arbiter_comm_destroy(handle)
        self._oob = None

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # Not at interpreter exit: destruction is collective and may call
        # back into a Python group that is already gone.
        if getattr(self, "_handle", None) and not sys.is_finalizing():
            try:
                self.close()
            except Exception:
                pass

    def __repr__(self) -> str:
        if not self._handle:
            return "<arbiter.Communicator closed>"
        return (
            f"<arbiter.Communicator rank {self.rank} of {self.world_size}, "
            f"{', '.join(self._backends) or 'no backend'}, tables {self.fingerprint_hex}>"
        )
