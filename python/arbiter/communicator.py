"""Fused all-reduce through arbiter from Python: the C API's communicator.

    comm = arbiter.Communicator.from_environment(hidden=4096, dtype="bf16")
    r = comm.allreduce_fusion(x, residual, weight, eps=1e-6)
    r.norm_out, r.residual_out, r.decision     # (tokens, hidden) arrays; shm oneshot fused

Every rank calls the same methods in the same order with the same shapes
(only the data differs). Arrays are checked on the calling rank before it
joins the collective, so a bad call raises ArbiterError at once; its peers,
which did join, fail when the deadline passes, naming the rank they lacked.

torch tensors take their own path (arbiter/torch.py): read directly, run
on torch's current stream, and through the op torch.ops.arbiter.allreduce_fusion
when torch.compile traces the call.
"""

from __future__ import annotations

import ctypes
import math
import operator
import sys
import threading
from time import monotonic as _now

from . import _array_call, _interrupt, _library
from ._results import FusionResult, WorkspaceFootprint, nvfp4_scale_bytes, stream_handle
from .errors import ArbiterError, Status
from .errors import invalid_argument as _invalid
from .oob import PythonOob
from .policy import Decision, Dtype, Pattern, Policy, decision_from_c, parse_capability
from .policy import parse_dtype, parse_pattern

_ANY_SIZE = (1 << 64) - 1  # max_message_bytes of a backend that takes any size
LONGEST_WAIT_MS = 30 * 24 * 3600 * 1000  # timeouts above 30 days wait 30 days (deadline.h)

__all__ = ["Communicator", "FusionResult", "WorkspaceFootprint", "nvfp4_scale_bytes", "stream_handle"]


class _NoTensor:
    """Stands for torch.Tensor until torch is imported: nothing is one."""


def _is_torch_group(oob: object) -> bool:
    """A torch.distributed ProcessGroup, or one of its backends (ProcessGroupGloo, ...)."""
    c10d = getattr(getattr(sys.modules.get("torch"), "_C", None), "_distributed_c10d", None)
    return c10d is not None and isinstance(oob, (c10d.ProcessGroup, c10d.Backend))


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


def check_registered_bytes(what: str, shape: tuple, kind: object, nbytes: int) -> None:
    """Refuses a byte count that size_t cannot hold: passed on, it would
    wrap around to another size (0, or a few bytes) and be allocated."""
    if nbytes > _SIZE_MAX:
        raise _invalid(f"{what}: shape {shape!r} of {kind} is {nbytes} bytes, more than "
                       f"any allocation can hold (2**64 - 1); ask for fewer elements")


_SIZE_MAX = (1 << 64) - 1


class _Registered:
    """One arbiter_comm_alloc allocation, the base of the arrays empty()
    returns: numpy keeps it alive while any view of its memory lives, and
    freeing it is the last view's death. It holds its communicator, so the
    communicator cannot be collected (and destroy the mapping) under it."""

    __slots__ = ("__array_interface__", "_comm", "_address")

    def __init__(self, comm: "Communicator", address: int, shape: tuple, typestr: str) -> None:
        self._comm = comm
        self._address = address
        self.__array_interface__ = {"shape": shape, "typestr": typestr,
                                    "data": (address, False), "version": 3}

    def __del__(self) -> None:
        # At interpreter exit the communicator's own teardown is skipped
        # too (it is collective); the process's exit unmaps the memory.
        if not sys.is_finalizing():
            self._comm._free_registered(self._address)


class _RegisteredCuda(_Registered):
    """The same for device memory (a CUDA communicator's registered memory,
    arbiter.torch.empty): torch.as_tensor() reads __cuda_array_interface__
    and holds this object until the tensor's storage dies."""

    __slots__ = ("__cuda_array_interface__",)

    def __init__(self, comm: "Communicator", address: int, nbytes: int) -> None:
        # No __array_interface__: nothing may read device memory as host memory.
        self._comm = comm
        self._address = address
        # Version 2: no "stream" entry, so torch synchronises nothing; the
        # allocation is complete when alloc returns.
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                         "data": (address, False), "version": 2}


class Communicator:
    """The ranks of one all-reduce group, with arbiter's backends ready to
    run. Collective to create and to close (every rank, same order)."""

    def __init__(
        self,
        oob: object,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        local_rank: int | None = None,
        hidden: int,
        dtype: str | Dtype,
        max_tokens: int | None = None,
        policy: Policy | None = None,
        timeout: float | None = None,
        capability: int | str | tuple = "cpu",
        nodes: int = 1,
        nvlink_domain: bool | None = None,
        multicast: bool = False,
        patterns: object = None,
    ) -> None:
        """Meets the other ranks through `oob`, the caller's own group: an
        object with allgather(bytes) -> list[bytes] (see arbiter.oob). GPU
        ranks (capability "9.0", 90 or (9, 0)) use CUDA device `local_rank`;
        "cpu" ranks run on host memory (the shm backend).

        `nvlink_domain`: None (auto): NVLink on one node, none across nodes;
        True for every rank in one NVLink domain (a GB300 NVL72 rack across
        nodes), False for PCIe only. As Request's, so that the communicator
        and Policy.decide() answer alike.

        `patterns`: the patterns calls will use (names or Pattern values, e.g.
        ["residual_rmsnorm"]); None asks for all four. Each backend is asked
        only for those it runs on this device; a pattern no backend runs here
        (NVFP4 below capability 10.0, say) is refused when called, with the
        reason, and fewer patterns can mean smaller workspaces. A world size of
        1 works: the fallback runs the residual add and norm on this rank.

        `rank` and `world_size` are required; they default to None only so
        that a torch.distributed group passed as `oob` is pointed to
        from_process_group() before anything else is said."""
        if _is_torch_group(oob):
            raise _invalid(f"oob: a torch.distributed {type(oob).__name__} moves tensors, not "
                           "bytes; create the communicator with "
                           "Communicator.from_process_group(group, ...)")
        if rank is None or world_size is None:
            raise _invalid("rank and world_size: pass this rank's place in the oob's group")
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
        nvlink_domain: bool | None = None,
        multicast: bool = False,
        patterns: object = None,
        device: int | None = None,
    ) -> "Communicator":
        """Collective: meets the other ranks through arbiter's UCX bootstrap
        from torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
        MASTER_PORT), as `arbiter launch` and torchrun set them. GPU ranks
        use CUDA device `device`, by default LOCAL_RANK (CPU ranks need
        no LOCAL_RANK). Rank 0 listens on ARBITER_BOOTSTRAP_PORT, else
        MASTER_PORT, until every rank joined (`arbiter launch` sets both;
        under torchrun, whose store holds MASTER_PORT, set
        ARBITER_BOOTSTRAP_PORT). `patterns` as for the constructor."""
        self = cls.__new__(cls)
        self._setup(hidden, dtype, max_tokens, timeout, capability, nodes, nvlink_domain,
                    multicast, device, patterns)
        self._oob = None
        self._create(policy, lambda lib, p, o, h: lib.arbiter_comm_create_from_environment(
            p, o, h))
        return self

    @classmethod
    def from_process_group(
        cls,
        group: object = None,
        *,
        hidden: int,
        dtype: str | Dtype,
        device: object = None,
        max_tokens: int | None = None,
        policy: Policy | None = None,
        timeout: float | None = None,
        capability: int | str | tuple | None = None,
        nodes: int = 1,
        nvlink_domain: bool | None = None,
        multicast: bool = False,
        patterns: object = None,
    ) -> "Communicator":
        """Collective over a torch.distributed group (None: the default
        group) that moves CPU tensors: gloo, or a gloo group beside NCCL
        (vLLM's cpu_group). Ranks and size are the group's; `timeout`
        (seconds) defaults to the group's own. `device`: "cpu" (the default
        unless `capability` names a GPU), a CUDA device ("cuda:1", 1,
        torch.device), or None for torch's current CUDA device on a GPU
        rank; `capability` defaults to the device's. The rest as for the
        constructor."""
        from ._process_group import GroupOob, group_timeout, rank_device

        oob = GroupOob(group)
        device, capability = rank_device(device, capability)
        return cls(oob, rank=oob.rank, world_size=oob.size, local_rank=device,
                   hidden=hidden, dtype=dtype, max_tokens=max_tokens, policy=policy,
                   timeout=group_timeout(oob.group) if timeout is None else timeout,
                   capability=capability, nodes=nodes, nvlink_domain=nvlink_domain,
                   multicast=multicast, patterns=patterns)

    # --- creation ---------------------------------------------------------

    def _setup(self, hidden, dtype, max_tokens, timeout, capability, nodes, nvlink_domain,
               multicast, local_rank, patterns) -> None:
        self._handle = ctypes.c_void_p()
        self._handle_value = 0
        self._lock = threading.Lock()
        self._call_started = 0.0  # when the call holding _lock began (monotonic)
        # abort() against close(): close() swaps the handle out under it, so
        # an abort() in flight finishes on a live communicator first.
        self._abort_lock = threading.Lock()
        self._tensor_type = _NoTensor
        self._op_handle = None
        self._registered = 0  # live empty() allocations; close() refuses while > 0
        self._pending_frees: list[int] = []  # dead ones not yet freed (see _free_registered)
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
        self.capability = parse_capability(capability)  # (9, 0) too: torch's tuple
        if nvlink_domain is not None and not isinstance(nvlink_domain, bool):
            raise _invalid(f"nvlink_domain {nvlink_domain!r} is not True, False or None (auto)")
        if not isinstance(multicast, bool):
            raise _invalid(f"multicast {multicast!r} is not a bool")
        if self.capability != 0 and local_rank is not None and not (
            isinstance(local_rank, int) and local_rank >= 0
        ):
            raise _invalid(f"local_rank {local_rank!r} is not a CUDA device ordinal")
        self._options = _library.CCommOptions(
            capability=self.capability,
            nodes=nodes,
            # ARBITER_NVLINK_AUTO / _YES / _NO
            nvlink_domain=0 if nvlink_domain is None else 1 if nvlink_domain else 2,
            multicast=1 if multicast else 0,
            device=-1 if self.capability == 0 else (-1 if local_rank is None else local_rank),
            max_tokens=max_tokens or 0,
            hidden=hidden,
            dtype=int(self.dtype),
            pattern_mask=_pattern_mask(patterns),
            # Capped at 30 days, as the library caps every wait: a larger
            # one (meant as "never") would not fit the C int64 of ms.
            timeout_ms=0 if timeout is None else max(1, int(min(timeout * 1000, LONGEST_WAIT_MS))),
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
        self._backend_codes = [i for i in range(32) if (info.backend_mask >> i) & 1]
        self._backends = [lib.arbiter_backend_name(i).decode() for i in self._backend_codes]
        self._fingerprint = int(info.fingerprint)
        # What every call reuses: one argument block, one decision, the
        # function as a prototype over plain addresses.
        self._handle_value = self._handle.value
        self._dtype_code = int(self.dtype)
        self._numpy_dtype = None  # numpy's dtype for self.dtype, once numpy is used
        self._args = _library.CAllreduceArgs()
        self._args_address = ctypes.addressof(self._args)
        self._decision = _library.CDecision()
        self._decision_address = ctypes.addressof(self._decision)
        self._decisions: dict = {}  # the C decision's bytes -> Decision
        self._scale_value = ctypes.c_float()
        self._scale_address = ctypes.addressof(self._scale_value)
        self._fusion_call = _library.fusion_call(lib)
        _interrupt.install()  # Ctrl-C ends a call that waits on its peers
        if "torch" in sys.modules:
            self._enable_torch()

    def _enable_torch(self) -> None:
        """Takes torch tensors through arbiter.torch from now on."""
        from . import torch as arbiter_torch
        from ._torch_tensors import TORCH_DTYPES

        self._torch_dtype = TORCH_DTYPES[self.dtype]
        self._torch_call = arbiter_torch.call
        self._op_handle = arbiter_torch.register(self)
        self._unregister = arbiter_torch.unregister
        self._tensor_type = sys.modules["torch"].Tensor

    # --- properties -------------------------------------------------------

    @property
    def backends(self) -> list[str]:
        """The backends with a workspace on every rank (the ones a call may use)."""
        return list(self._backends)

    def footprint(self) -> dict[str, WorkspaceFootprint]:
        """What each backend's workspace costs this rank, by backend name, as
        its module sized it (arbiter_comm_get_footprint). Not collective."""
        if not self._handle:
            raise _invalid("footprint(): the communicator is closed")
        figures = {}
        for code in self._backend_codes:
            c = _library.CCommFootprint()
            _library.check(
                self._lib, self._lib.arbiter_comm_get_footprint(self._handle, code, ctypes.byref(c))
            )
            name = self._lib.arbiter_backend_name(code).decode()
            figures[name] = WorkspaceFootprint(
                backend=name,
                known=bool(c.known),
                device_bytes=int(c.device_bytes),
                host_bytes=int(c.host_bytes),
                shared_bytes=int(c.shared_bytes),
                max_message_bytes={
                    algorithm: (None if int(c.max_message_bytes[i]) == _ANY_SIZE
                                else int(c.max_message_bytes[i]))
                    for i, algorithm in enumerate(("oneshot", "twoshot", "native"))
                },
                note=(c.note or b"").decode(),
            )
        return figures

    @property
    def fingerprint(self) -> int:
        """Fingerprint of the tables every rank agreed on (Policy.fingerprint)."""
        return self._fingerprint

    @property
    def fingerprint_hex(self) -> str:
        return f"{self._fingerprint:016x}"

    @property
    def op_handle(self) -> int:
        """This communicator's argument to torch.ops.arbiter.allreduce_fusion
        (arbiter.torch): an integer no other communicator ever gets."""
        if self._op_handle is None:
            if "torch" not in sys.modules:
                raise _invalid("op_handle: the op is torch's; import torch first")
            self._enable_torch()
        return self._op_handle

    @property
    def last_decision(self) -> Decision | None:
        """The decision of the latest call (None before the first), calls
        through the op and compiled graphs included; a call that failed after
        deciding leaves what it decided."""
        key = bytes(self._decision)
        decision = self._decisions.get(key)
        if decision is None:
            if not any(key):
                return None
            decision = self._decisions[key] = decision_from_c(self._lib, self._decision)
        return decision

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
        * (weight + weight_bias). residual=None with a weight is a first block:
        no residual is added (residual_out = sum), no zeros tensor needed.
        The pattern defaults to "allreduce" without residual and weight and
        "residual_rmsnorm" with either; "residual_rmsnorm_fp8" needs
        `scale` (dequantisation scale: a float, or one float32 on the device).

        Outputs are new arrays (numpy, for host memory), or the arrays in
        `out` (keys allreduce_out, residual_out, norm_out, quant_out,
        scale_out; a key set to None is not written). In place is allowed as
        the C API says: an output may be exactly x or residual. FP8
        quant_out is uint8 or float8_e4m3fn, what the kernels write; other
        float8 formats are refused. `stream` (a handle or a torch/cupy
        stream) orders the call, and the arrays' producers, on it.

        torch tensors (all of a call's arrays, then) are read directly;
        outputs not in `out` are new tensors on x's device; on CUDA the call
        runs on torch's current stream unless `stream` names another. Under
        torch.compile the call is the op torch.ops.arbiter.allreduce_fusion
        (arbiter.torch) and the result's decision is None. Other CUDA arrays
        need every output in `out`, and `stream`, or run on the legacy
        default stream (which CUDA-graph capture refuses).

        residual_replicated=True promises that `residual` holds the same
        values on every rank (as in tensor parallelism): a backend may then
        run each token's norm on one rank and copy its outputs to the others
        (the shm two-shot does). Same results while the promise holds.

        A call this rank refuses (ArbiterError INVALID_ARGUMENT: a wrong
        shape, dtype, ...) still joins its peers to tell them: their call
        raises MISMATCH naming this rank, and the next call is in step. Like
        any call it returns once the peers made theirs (or at the deadline);
        on GPU ranks only in the check mode (ARBITER_CHECK_CALLS=1)."""
        if isinstance(x, self._tensor_type):
            return self._torch_call(self, x, residual, weight, eps, pattern, out, stream, scale,
                                    weight_bias, residual_replicated)
        if self._tensor_type is _NoTensor and "torch" in sys.modules and self._handle_value:
            self._enable_torch()  # torch came after the communicator
            if isinstance(x, self._tensor_type):
                return self.allreduce_fusion(x, residual, weight, eps=eps, pattern=pattern,
                                             out=out, stream=stream, scale=scale,
                                             weight_bias=weight_bias,
                                             residual_replicated=residual_replicated)
        return _array_call.run(self, x, residual, weight, eps, pattern, out, stream, scale,
                               weight_bias, residual_replicated)

    # --- registered memory ------------------------------------------------

    def empty(self, shape: int | tuple, dtype: object = None) -> object:
        """Collective (every rank, same shape and dtype, same order): a new
        numpy array, uninitialised, in registered memory that every rank
        maps (docs/registered-buffers.md). A call whose x is such an array,
        or a view of it at the same offset on every rank, reads the peers'
        inputs in place instead of copying them; on return the peers are
        done reading, so x may be overwritten at once. Any other call works
        as before.

        dtype: None for the communicator's dtype (bf16 as uint16 bits, as
        every array of this binding), "fp16"/"bf16"/"fp32", or a numpy dtype.

        The memory stays allocated while the array or any view of it lives,
        and is freed (locally: peers keep their own views) when the last
        one dies. close() refuses while such an array lives: numpy cannot
        invalidate an array, so freeing the mapping under it would leave it
        pointing at unmapped memory. Raises ArbiterError(UNSUPPORTED) where
        no backend of this communicator has registered memory."""
        import numpy as np

        if not self._handle:
            raise _invalid("empty(): the communicator is closed")
        if self.device >= 0:
            raise ArbiterError(Status.UNSUPPORTED,
                               f"empty(): this communicator runs on CUDA device {self.device}, "
                               f"whose registered memory is device memory, and empty() returns "
                               f"numpy (host) arrays; use arbiter.torch.empty(comm, shape)")
        try:
            shape, kind = self._empty_layout(np, shape, dtype)
        except Exception as refused:
            # Refused here, the allocation still takes place with 0 bytes,
            # which every module refuses on every rank at once: the peers'
            # empty() fails now rather than at its deadline.
            try:
                self._alloc("empty()", 0)
            except ArbiterError:
                pass
            if isinstance(refused, ArbiterError):
                raise
            raise _invalid(f"empty(): dtype {dtype!r}: {refused}") from refused
        nbytes = math.prod(shape) * kind.itemsize
        owner = _Registered(self, self._alloc("empty()", nbytes), shape, kind.str)
        return np.asarray(owner)

    def _empty_layout(self, np, shape, dtype):
        """empty()'s shape as a tuple of positive ints and its numpy dtype;
        raises what is wrong with them."""
        parts = shape
        try:  # numpy integers too (operator.index); not bools or floats
            parts = tuple(shape) if hasattr(shape, "__iter__") else (shape,)
            if any(isinstance(n, bool) for n in parts):
                raise TypeError
            shape = tuple(operator.index(n) for n in parts)
        except TypeError:  # also a 0-d array, which has __iter__ and cannot iterate
            shape = ()
        if not shape or any(n <= 0 for n in shape):
            raise _invalid(f"empty(): shape {parts!r} is not a tuple of positive integers")
        if dtype is None:
            kind = np.dtype(_array_call._NUMPY_TYPES[self.dtype])
        elif isinstance(dtype, Dtype) or (isinstance(dtype, str)
                                          and dtype in ("fp16", "bf16", "fp32")):
            kind = np.dtype(_array_call._NUMPY_TYPES[parse_dtype(dtype)])
        else:
            kind = np.dtype(dtype)
        if kind.hasobject:
            raise _invalid(f"empty(): dtype {kind} holds pointers to Python objects, which "
                           f"mean nothing in the peers' processes; use a numeric dtype")
        check_registered_bytes("empty()", shape, kind, math.prod(shape) * kind.itemsize)
        return shape, kind

    def _alloc(self, what: str, nbytes: int) -> int:
        """arbiter_comm_alloc (collective): the address of this rank's part,
        counted in _registered until its owner object dies."""
        data = ctypes.c_void_p()
        with self._lock:
            self._call_started = _now()  # for the Ctrl-C watcher (_interrupt)
            if not self._handle:
                raise _invalid(f"{what}: the communicator is closed")
            self._drain_frees()
            _library.check(self._lib, self._lib.arbiter_comm_alloc(
                self._handle, nbytes, ctypes.byref(data)))
            self._registered += 1
        return data.value

    def _empty_cuda(self, nbytes: int) -> object:
        """arbiter.torch.empty on a CUDA communicator: registered device
        memory (trtllm) as an object with __cuda_array_interface__ (uint8,
        nbytes long) that frees it when it dies."""
        return _RegisteredCuda(self, self._alloc("arbiter.torch.empty()", nbytes), nbytes)

    def _free_registered(self, address: int) -> None:
        """The last view of an empty() array died: frees it on this rank.
        The death may come in the middle of a call on this communicator (the
        garbage collector runs anywhere, threads too), which holds the lock:
        then the free waits for the next empty(), free or close()."""
        self._registered -= 1
        self._pending_frees.append(address)
        if self._lock.acquire(blocking=False):
            try:
                self._drain_frees()
            finally:
                self._lock.release()

    def _drain_frees(self) -> None:
        """Frees the allocations whose arrays died (with self._lock held)."""
        while self._pending_frees:
            address = self._pending_frees.pop()
            if self._handle:
                _library.check(self._lib, self._lib.arbiter_comm_free(self._handle, address))

    # --- lifetime ---------------------------------------------------------

    def abort(self) -> None:
        """Makes a call waiting in another thread return: it raises
        ArbiterError(ABORTED) (CPU ranks: within milliseconds), peers waiting
        on this rank raise ArbiterError(PEER_FAILED) naming it, GPU kernels
        waiting on a peer stop waiting, and every later call raises at once.
        For a framework's watchdog; safe from any thread, any number of
        times. close() afterwards waits on no peer."""
        with self._abort_lock:
            handle = self._handle
            if handle:
                _library.check(self._lib, self._lib.arbiter_comm_abort(handle))

    def close(self) -> None:
        """Collective: frees every workspace (every rank must close). After
        a failed call or abort() it is local, waiting on no peer. Refuses
        (ArbiterError INVALID_ARGUMENT, nothing closed) while an array from
        empty() or a view of it lives: delete those first."""
        if self._handle:
            with self._lock:  # not while a call runs on it
                if self._registered:
                    raise _invalid(
                        f"close(): {self._registered} array(s) from empty() are still alive "
                        "and would point at freed memory; delete them and every view of "
                        "them (del a; gc.collect() if they sit in a cycle) before close()")
                with self._abort_lock:
                    handle, self._handle = self._handle, ctypes.c_void_p()
                    self._handle_value = 0
            if self._op_handle is not None:
                self._unregister(self._op_handle)
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

    def __copy__(self):
        # A copy would share the handle and outlive close() (use after free).
        raise TypeError("an arbiter.Communicator is this rank's place in a group and cannot be "
                        "copied; pass the object itself")

    def __deepcopy__(self, memo):
        self.__copy__()

    def __reduce__(self):
        self.__copy__()

    def __repr__(self) -> str:
        if not self._handle:
            return "<arbiter.Communicator closed>"
        return (
            f"<arbiter.Communicator rank {self.rank} of {self.world_size}, "
            f"{', '.join(self._backends) or 'no backend'}, tables {self.fingerprint_hex}>"
        )
