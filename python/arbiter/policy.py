"""The policy: tables -> decisions, through the C API.

A Policy holds one immutable set of tables (the embedded defaults, site files,
the backends restriction). decide(), max_fused_bytes(), explain() and
fingerprint never change it and may be called from any thread.
"""

from __future__ import annotations

import ctypes
import dataclasses
import enum
import os
import re
import threading
from dataclasses import dataclass
from fractions import Fraction
from typing import Iterable, Union

from . import _library
from .errors import ArbiterError, Status
from .errors import invalid_argument as _invalid


class Dtype(enum.IntEnum):
    FP16 = 0
    BF16 = 1
    FP32 = 2


class Pattern(enum.IntEnum):
    ALLREDUCE = 0
    RESIDUAL_RMSNORM = 1
    RESIDUAL_RMSNORM_FP8 = 2
    RESIDUAL_RMSNORM_FP4 = 3


_ALGORITHMS = ("oneshot", "twoshot", "native")
_REASONS = (
    "fused",
    "no_fusion_cell",
    "fusion_off",
    "above_cap",
    "no_eligible_backend",
    "no_backend",
    "invalid_request",
)
_NO_CAP = (1 << 64) - 1
_MIN_SM, _MAX_SM = 50, 199
_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}

Capability = Union[int, str, tuple]
Size = Union[int, str]


def element_size(dtype: str | Dtype) -> int:
    """Bytes per element: 2 for fp16 and bf16, 4 for fp32."""
    return 4 if parse_dtype(dtype) == Dtype.FP32 else 2


def parse_capability(value: Capability) -> int:
    """103, "103", "10.3", "sm_103", "sm103", (10, 3) -> 103; "cpu" (or 0) ->
    0, as the C API encodes CPU ranks. A (major, minor) tuple is what
    torch.cuda.get_device_capability() returns."""
    if isinstance(value, bool):
        raise _invalid(f"capability {value!r} is not a capability")
    if isinstance(value, tuple):
        if not (len(value) == 2 and all(type(v) is int for v in value)
                and 0 < value[0] < 100 and 0 <= value[1] <= 9):
            raise _invalid(f"capability {value!r}: a tuple must be (major, minor), minor a "
                           "digit, as torch.cuda.get_device_capability() returns")
        value = "{}.{}".format(*value)
    if isinstance(value, int):
        code = value
        text = str(value)
    elif isinstance(value, str):
        text = value
        if text == "cpu":
            return 0
        hint = 'write major*10+minor (90, 100, 103), "10.3", "sm_103" or cpu'
        m = re.fullmatch(r"([0-9]+)\.([0-9])", text) or re.fullmatch(r"(?:sm_?)?([0-9]+)", text)
        if not m:
            raise _invalid(f"unknown capability '{text}'; {hint}")
        code = int(m.group(1)) * 10 + int(m.group(2)) if m.lastindex == 2 else int(m.group(1))
    else:
        raise _invalid(f"capability {value!r} is not an int, a string or a (major, minor) tuple")
    if not (code == 0 and isinstance(value, int)) and not _MIN_SM <= code <= _MAX_SM:
        hint = f"did you mean {code * 10}?" if 5 <= code <= 19 else "write major*10+minor"
        raise _invalid(f"capability '{text}' is outside {_MIN_SM}..{_MAX_SM}; {hint}")
    return code


_BY_NAME = {kind: {m.name.lower(): m for m in kind} for kind in (Dtype, Pattern)}


def _parse_name(enum_type: type[enum.IntEnum], value: object, what: str) -> enum.IntEnum:
    if isinstance(value, enum_type):
        return value
    names = _BY_NAME[enum_type]
    if isinstance(value, str) and value in names:
        return names[value]
    raise _invalid(f"unknown {what} '{value}'; known: {', '.join(names)}")


def parse_dtype(value: str | Dtype) -> Dtype:
    """"fp16" | "bf16" | "fp32" (or a Dtype)."""
    return _parse_name(Dtype, value, "dtype")  # type: ignore[return-value]


def parse_pattern(value: str | Pattern) -> Pattern:
    """"allreduce" | "residual_rmsnorm" | "residual_rmsnorm_fp8" | "residual_rmsnorm_fp4"."""
    return _parse_name(Pattern, value, "pattern")  # type: ignore[return-value]


def _bare_fraction(text: str) -> ArbiterError:
    """A table value (MiB) pasted where bytes go: name both readings."""
    fix = f"write '{text}MiB'"
    as_mib = Fraction(text) * _UNITS["MiB"]
    if as_mib.denominator == 1 and 0 < as_mib <= _UNITS["TiB"]:
        fix += f" or {int(as_mib)}"
    return _invalid(
        f"size {text!r}: {text} what? in the tables a bare number is MiB; in Python (as on the "
        f"command line) a bare number is bytes and must be a whole int: {fix} "
        "(or give the unit you meant: B, KiB, MiB, GiB, TiB)"
    )


def parse_size(value: Size) -> int:
    """Exact integer bytes: 524288, "524288", "512KiB", "0.5 MiB", "64MiB".

    A plain number is bytes (as `arbiter decide --bytes`) and must be whole;
    units are binary; the result must be a whole number of bytes in
    1 .. 1 TiB. In the tables a plain number is MiB, so a bare fraction
    (0.5, "0.5") is refused with both readings rather than read either way;
    floats are refused: 0.5 MiB is 524288, never 524288.0."""
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise _invalid(f"size {value!r} is not a finite number of bytes")
        if value <= 0:
            raise _invalid(f"size {value!r} is {'zero' if value == 0 else 'negative'}")
        if value.is_integer():
            raise _invalid(
                f"size {value!r} is a float; sizes are exact integers: write {int(value)} "
                "(bytes) or a string with a unit such as '512KiB'"
            )
        raise _bare_fraction(repr(value))
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise _invalid(f"size {value!r} is not an int or a string; sizes are exact integers")
    if isinstance(value, int):
        number, text = Fraction(value), str(value)
    else:
        text = value
        m = re.fullmatch(r"\s*\+?([0-9]+(?:\.[0-9]*)?|\.[0-9]+) ?([A-Za-z]*)\s*", text)
        if not m:
            raise _invalid(f"size '{text}' is not a number; write e.g. 524288, 512KiB or 64MiB")
        if not m.group(2) and "." in m.group(1):
            raise _bare_fraction(m.group(1))
        unit = m.group(2) or "B"
        if unit not in _UNITS:
            raise _invalid(
                f"unknown size unit '{unit}' in '{text}'; known units: B, KiB, MiB, GiB, TiB"
            )
        number = Fraction(m.group(1)) * _UNITS[unit]
    if number.denominator != 1:
        raise _invalid(f"size '{text}' is not a whole number of bytes")
    if number <= 0:
        raise _invalid(f"size '{text}' is {'zero' if number == 0 else 'negative'}")
    if number > _UNITS["TiB"]:
        raise _invalid(f"size '{text}' is above 1 TiB, which is not a plausible message size")
    return int(number)


@dataclass(frozen=True)
class Request:
    """One all-reduce call site, as the policy sees it.

    message_bytes is per-rank input bytes; leave it None to have it computed
    as tokens x hidden x element size. nvlink_domain None means: NVLink on one
    node, none across nodes (say True for a multi-node NVLink rack).
    residual_replicated says every rank passes the same residual (tables may
    key on it with `residual: replicated`); ignored for pattern allreduce.
    buffers_registered says the input lies in memory registered with a
    communicator (comm.empty(), arbiter.torch.empty()); tables may key on it
    with `buffers: registered`."""

    capability: Capability
    world_size: int
    nodes: int = 1
    nvlink_domain: bool | None = None
    multicast: bool = False
    dtype: str | Dtype = "bf16"
    pattern: str | Pattern = "residual_rmsnorm"
    message_bytes: Size | None = None
    tokens: int = 0
    hidden: int = 0
    residual_replicated: bool = False
    buffers_registered: bool = False

    def _to_c(self, sized: bool = False) -> _library.CRequestEx:
        """The C request; `sized`: the call's size must be known (decide,
        explain), as message_bytes or tokens and hidden."""
        if sized and self.message_bytes is None and not (self.tokens and self.hidden):
            raise _invalid("give the message size: message_bytes=..., or tokens= and hidden= "
                           "(a decision for 0 bytes would say fused for any real size)")
        if self.nvlink_domain is not None and not isinstance(self.nvlink_domain, bool):
            raise _invalid(f"nvlink_domain {self.nvlink_domain!r} is not True, False or None "
                           "(auto)")
        if not isinstance(self.multicast, bool):
            raise _invalid(f"multicast {self.multicast!r} is not a bool")
        ex = _library.CRequestEx()
        ex.size = ctypes.sizeof(ex)
        if not isinstance(self.buffers_registered, bool):
            raise _invalid(f"buffers_registered {self.buffers_registered!r} is not a bool")
        ex.buffers_registered = 1 if self.buffers_registered else 0
        c = ex.request
        c.capability = parse_capability(self.capability)
        for name in ("world_size", "nodes", "tokens", "hidden"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < (1 << 32):
                raise _invalid(f"{name} {v!r} is not an integer in 0..2^32-1")
            setattr(c, name, v)
        nvlink = self.nodes <= 1 if self.nvlink_domain is None else self.nvlink_domain
        c.nvlink_domain = 1 if nvlink else 0
        c.multicast = 1 if self.multicast else 0
        if not isinstance(self.residual_replicated, bool):
            raise _invalid(f"residual_replicated {self.residual_replicated!r} is not a bool")
        c.residual_replicated = 1 if self.residual_replicated else 0
        c.dtype = parse_dtype(self.dtype)
        c.pattern = parse_pattern(self.pattern)
        c.message_bytes = 0 if self.message_bytes is None else parse_size(self.message_bytes)
        return ex


@dataclass(frozen=True)
class Decision:
    """What runs the call: `backend` ("trtllm", "mnnvl", "nccl", "shm" or
    "none") with `algorithm` ("oneshot", "twoshot", "native"); `fused` says
    whether residual + RMSNorm (+quant) run inside the all-reduce; `reason`
    is "fused", "no_fusion_cell", "fusion_off", "above_cap",
    "no_eligible_backend", "no_backend" or "invalid_request"; `cap` is the
    fused cap that applied in bytes (None when none did)."""

    backend: str
    algorithm: str
    fused: bool
    reason: str
    cap: int | None


def decision_from_c(lib: ctypes.CDLL, out: _library.CDecision) -> Decision:
    """The C API's arbiter_decision as a Decision."""
    return Decision(
        backend=lib.arbiter_backend_name(out.backend).decode(),
        algorithm=_ALGORITHMS[out.algorithm] if 0 <= out.algorithm < 3 else str(out.algorithm),
        fused=bool(out.fused),
        reason=_REASONS[out.reason] if out.reason < len(_REASONS) else str(out.reason),
        cap=None if out.cap == _NO_CAP else int(out.cap),
    )


def _request(request: Request | None, fields: dict) -> Request:
    """A Request from keyword fields, or `request` with the fields given
    changed (decide(request, buffers_registered=True))."""
    if request is None:
        return Request(**fields)
    if not isinstance(request, Request):
        raise TypeError(f"expected an arbiter.Request, got {type(request).__name__}")
    return dataclasses.replace(request, **fields) if fields else request


class Policy:
    """Immutable tables and the decisions they make. Build one with
    Policy.load(...) or Policy.from_environment(); free it with close() or a
    `with` block (or leave it to the garbage collector)."""

    def __init__(self, handle: ctypes.c_void_p, lib: ctypes.CDLL) -> None:
        self._handle = handle
        self._lib = lib
        # close() from one thread while another decides: the C calls run
        # under it, so the tables are never freed under a decision.
        self._lock = threading.Lock()

    @classmethod
    def from_environment(cls) -> "Policy":
        """The embedded defaults <- ARBITER_CONFIG (':'-separated site files),
        restricted by ARBITER_BACKENDS: the same layers as the `arbiter`
        program and the C and C++ APIs read."""
        lib = _library.library()
        handle = ctypes.c_void_p()
        _library.check(lib, lib.arbiter_policy_from_environment(ctypes.byref(handle)))
        return cls(handle, lib)

    @classmethod
    def load(
        cls,
        site_files: Iterable[str | os.PathLike] = (),
        backends: str | Iterable[str] | None = None,
    ) -> "Policy":
        """The embedded defaults <- site_files (in order, later files win),
        with `backends` read as ARBITER_BACKENDS would be: a comma list, or
        a list of names; None: unrestricted. The environment is not read.
        Raises ArbiterError with every "FILE:LINE:COL: error: ..." line when
        a table is bad: loading is all or nothing."""
        if isinstance(site_files, (str, os.PathLike)):
            site_files = [site_files]
        paths = [os.fsencode(p) for p in site_files]
        for p in paths:  # C would read the path up to the NUL: another file
            if b"\0" in p:
                raise _invalid(f"site file {p!r}: a path with a NUL byte")
        array = (ctypes.c_char_p * max(len(paths), 1))(*paths)
        lib = _library.library()
        handle = ctypes.c_void_p()
        if backends is not None and not isinstance(backends, str):
            backends = ",".join(backends)  # ["shm", "nccl"] as "shm,nccl"
        if backends is not None and "\0" in backends:
            raise _invalid(f"backends {backends!r}: a NUL byte")
        # "" as ARBITER_BACKENDS="" reads: unrestricted.
        env = None if not backends else backends.encode()
        _library.check(lib, lib.arbiter_policy_load(array, len(paths), env, ctypes.byref(handle)))
        return cls(handle, lib)

    def close(self) -> None:
        with self._lock:
            if self._handle:
                self._lib.arbiter_policy_free(self._handle)
                self._handle = ctypes.c_void_p()

    def __copy__(self):
        # A copy would share the handle and outlive close() (use after free).
        raise TypeError("an arbiter.Policy cannot be copied: its tables never change, so share "
                        "the object itself")

    def __deepcopy__(self, memo):
        self.__copy__()

    def __reduce__(self):
        self.__copy__()

    def __enter__(self) -> "Policy":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def _live(self) -> ctypes.c_void_p:
        if not self._handle:
            raise ArbiterError(Status.INVALID_ARGUMENT, "the policy was closed")
        return self._handle

    def decide(self, request: Request | None = None, /, **fields: object) -> Decision:
        """The decision for one call: decide(Request(...)) or
        decide(capability=103, world_size=16, nodes=4, nvlink_domain=True,
        multicast=True, message_bytes="64MiB"). Never allocates in the library;
        an impossible request (world size 0, nodes > world size) is a decision
        with reason "invalid_request", not an exception."""
        c = _request(request, fields)._to_c(sized=True)
        out = _library.CDecision()
        with self._lock:
            status = self._lib.arbiter_decide_ex(self._live(), ctypes.byref(c), ctypes.byref(out))
        _library.check(self._lib, status)
        return decision_from_c(self._lib, out)

    def max_fused_bytes(self, request: Request | None = None, /, **fields: object) -> int | None:
        """The largest message fused for this call site at any size (its bytes
        are ignored), or None when nothing would be fused: what vLLM's
        PassConfig.flashinfer_max_size() answers. Size workspaces with it and
        split compile ranges at max_fused_bytes // (hidden * element_size)."""
        c = _request(request, fields)._to_c()
        cap = ctypes.c_uint64()
        has_cap = ctypes.c_int32()
        with self._lock:
            status = self._lib.arbiter_max_fused_bytes_ex(
                self._live(), ctypes.byref(c), ctypes.byref(cap), ctypes.byref(has_cap))
        _library.check(self._lib, status)
        return int(cap.value) if has_cap.value else None

    def explain(
        self, request: Request | None = None, /, *, json: bool = False, **fields: object
    ) -> str:
        """The decision with its trace: text for people (one line per rule,
        with the file:line and layer of every cell used), or with json=True
        one JSON object (json.loads it) with backend, algorithm, fused,
        reason, max_fused_bytes, cap, fingerprint, request and trace."""
        c = _request(request, fields)._to_c(sized=True)
        size = 4096
        while True:
            buf = ctypes.create_string_buffer(size)
            needed = ctypes.c_size_t(0)
            with self._lock:
                status = self._lib.arbiter_explain_ex(
                    self._live(), ctypes.byref(c), 1 if json else 0, buf, size,
                    ctypes.byref(needed))
            if status == Status.INVALID_ARGUMENT and needed.value > size:
                size = needed.value
                continue
            _library.check(self._lib, status)
            # A site file's path need not be UTF-8 (the JSON form escapes it).
            return buf.value.decode("utf-8", "replace")

    @property
    def fingerprint(self) -> int:
        """Hash of the effective tables (64 bits): equal on every rank, and in
        every consumer (C++, C, Python, the `arbiter` program), that loaded
        the same layers."""
        with self._lock:
            return int(self._lib.arbiter_policy_fingerprint(self._live()))

    @property
    def fingerprint_hex(self) -> str:
        """The fingerprint as `arbiter decide --json` prints it (16 hex digits)."""
        return f"{self.fingerprint:016x}"

    def __repr__(self) -> str:
        if not self._handle:
            return "<arbiter.Policy closed>"
        return f"<arbiter.Policy tables {self.fingerprint_hex}>"
