"""arbiter's out-of-band exchange over a torch.distributed group, for
Communicator.from_process_group: each allgather is one all_gather of uint8
CPU tensors over the group, bounded by the deadline the C side passes.

The group must move CPU tensors (gloo, or a gloo group beside NCCL such as
vLLM's cpu_group): creation exchanges a few hundred bytes of host memory.
"""

from __future__ import annotations

import ctypes
import datetime
import time

import torch
import torch.distributed as dist

from .errors import ArbiterError, Status
from .errors import invalid_argument as _invalid


class GroupOob:
    """allgather(bytes, timeout) -> list[bytes] over `group` (None: the
    default group), as arbiter.oob asks of a group."""

    def __init__(self, group) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise _invalid("from_process_group: torch.distributed is not initialised; call "
                           "torch.distributed.init_process_group(...) first")
        if group is None:
            group = dist.group.WORLD
        if isinstance(group, int) and group == dist.GroupMember.NON_GROUP_MEMBER:
            raise _invalid("from_process_group: this rank is not a member of the group "
                           "(new_group() returns NON_GROUP_MEMBER on the ranks it leaves "
                           "out); only the group's ranks create its communicator")
        if not isinstance(group, dist.ProcessGroup):
            raise _invalid(f"from_process_group: a {type(group).__name__} is not a "
                           "torch.distributed ProcessGroup")
        try:
            group._get_backend(torch.device("cpu"))
        except RuntimeError:
            raise _invalid(
                f"from_process_group: the group ({dist.get_backend(group)}) does not move CPU "
                "tensors, and arbiter's bootstrap exchanges host bytes; pass a gloo group, "
                "e.g. torch.distributed.new_group(ranks, backend='gloo') (vLLM's cpu_group)"
            ) from None
        self.group = group
        try:
            self.rank = dist.get_rank(group)
            self.size = dist.get_world_size(group)
        except ValueError as e:  # "Group ... is not registered": destroyed, or never made
            raise _invalid(f"from_process_group: torch.distributed does not know the group "
                           f"({e}); pass a live group (destroy_process_group() ends them all)"
                           ) from None

    def allgather(self, data: bytes, timeout: float) -> list[bytes]:
        # gloo refuses empty tensors: a barrier's empty message travels as one byte.
        # Not inference tensors: a view of one does not hold it (see _drained).
        with torch.inference_mode(False):
            send = torch.frombuffer(bytearray(data or b"\0"), dtype=torch.uint8)
            parts = [torch.empty_like(send) for _ in range(self.size)]
            tensors = [send, *parts]
            anchors = [t.view(-1) for t in tensors]
        held = [_use_count(t) for t in tensors]
        work = None
        try:
            work = dist.all_gather(parts, send, group=self.group, async_op=True)
            work.wait(timeout=datetime.timedelta(seconds=timeout))
        except RuntimeError as e:
            if "timed out" in str(e).lower() or "timeout" in str(e).lower():
                raise TimeoutError(f"all_gather over the process group: {e}") from e
            raise
        finally:
            if (work is None or work.is_completed()) and min(held) >= 2:
                del work
                if not _drained(tensors, held):
                    _strand(anchors)
            else:  # still running (timed out), or the views do not hold
                _strand((work, anchors))
        return [part.numpy().tobytes() if data else b"" for part in parts]


_DRAIN_S = 5.0  # gloo lets go microseconds after the work completes


def _use_count(tensor) -> int:
    use_count = getattr(tensor, "_use_count", None)  # torch.utils.swap_tensors reads it too
    return use_count() if use_count is not None else -1


def _drained(tensors, held) -> bool:
    """Waits (up to _DRAIN_S) until nothing but allgather's own references
    holds `tensors` (each back to its count in `held`); False if not.

    gloo's worker thread drops its references to a collective's tensors after
    wait() returns. Since torch 2.10 a tensor's C++ side holds its Python
    object while C++ holds the tensor beside that object (refcount 2 and up),
    and lets go when the count falls back to 1, taking the GIL: were gloo's
    drop the one to 1, gloo's thread would take the GIL, and during interpreter
    exit that ends the thread inside a noexcept destructor (SIGABRT, "terminate
    called without an active exception"). Keeping the Python tensors alive
    does not prevent it; the views do: each holds its tensor from C++, so
    gloo's drop never reaches 1 while they live, and allgather frees them
    (here, with the GIL) only once gloo let go."""
    deadline = time.monotonic() + _DRAIN_S
    pause = 0.0
    while any(_use_count(t) > n for t, n in zip(tensors, held)):
        if time.monotonic() > deadline:
            return False
        time.sleep(pause)  # gloo's thread needs no GIL to let go (the views hold)
        pause = min(pause * 2 or 1e-5, 1e-3)
    return True


def _strand(obj) -> None:
    """Never frees `obj`, and so the tensors it holds, which gloo's thread may
    still hold (a timed-out all_gather runs on): a module-level list would be
    emptied at interpreter exit. Costs the few hundred bytes of one exchange."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


def group_timeout(group) -> float | None:
    """The group's own timeout in seconds (None when torch does not say)."""
    try:
        timeout = group._get_backend(torch.device("cpu")).options._timeout
    except (AttributeError, RuntimeError):
        return None
    seconds = timeout.total_seconds()
    return seconds if seconds > 0 else None


def rank_device(device, capability) -> tuple[int | None, object]:
    """(local_rank for the Communicator, capability) from from_process_group's
    device and capability."""
    if device is None:
        gpu = capability is not None and capability != "cpu" and capability != 0
        device = torch.cuda.current_device() if gpu else "cpu"
    if isinstance(device, int) and not isinstance(device, bool):
        device = torch.device("cuda", device)
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise _invalid(f"device {device!r} is not a torch device: {e}") from None
    if device.type == "cpu":
        if capability not in (None, "cpu", 0):
            raise _invalid(f"device cpu with capability {capability!r}: CPU ranks use the "
                           "capability cpu")
        return None, "cpu"
    if device.type != "cuda":
        raise _invalid(f"device {device}: arbiter runs on cpu or cuda devices")
    if not torch.cuda.is_available():
        raise ArbiterError(Status.UNAVAILABLE,
                           f"device {device}: torch sees no CUDA device here (torch "
                           f"{torch.__version__}, CUDA build {torch.version.cuda}); pass "
                           f"device='cpu' for CPU ranks")
    ordinal = torch.cuda.current_device() if device.index is None else device.index
    if capability is None:
        capability = torch.cuda.get_device_capability(ordinal)
    return ordinal, capability
