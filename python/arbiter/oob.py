"""The caller's process group as the C API's arbiter_oob.

A group is any object with

    allgather(data: bytes) -> list[bytes]      # required: every rank's data, by rank

and, optionally, `broadcast(data: bytes, root: int) -> bytes` and
`barrier() -> None` (built from allgather when absent). A method that takes a
`timeout` keyword gets the deadline in seconds; otherwise the group enforces
its own (torch.distributed groups have one). Whatever a method raises becomes
the failed call's message (ArbiterError keeps its status; TimeoutError is
ARBITER_TIMEOUT; anything else ARBITER_PEER_FAILED), so creation fails with
the group's own words.
"""

from __future__ import annotations

import ctypes
import inspect

from . import _library
from .errors import ArbiterError, Status, invalid_argument


def _takes_timeout(method) -> bool:
    try:
        return "timeout" in inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False


class PythonOob:
    """Owns the C callbacks over `group`; keep it alive as long as the
    communicator created over it (destruction may use it too)."""

    def __init__(self, group: object, rank: int, world_size: int) -> None:
        allgather = getattr(group, "allgather", None)
        if not callable(allgather):
            raise invalid_argument(
                f"oob: a {type(group).__name__} has no allgather(bytes) -> list[bytes]"
            )
        self._group = group
        self._rank = rank
        self._size = world_size
        self._error = ctypes.create_string_buffer(b"no error")
        self._timed = {
            name: _takes_timeout(getattr(group, name))
            for name in ("allgather", "broadcast", "barrier")
            if callable(getattr(group, name, None))
        }
        self.c = _library.COob(
            None,
            rank,
            world_size,
            _library.OobAllgather(self._allgather),
            _library.OobBroadcast(self._broadcast),
            _library.OobBarrier(self._barrier),
            _library.OobLastError(self._last_error),
        )

    def _call(self, name: str, timeout_ms: int, *args):
        method = getattr(self._group, name)
        if self._timed.get(name):
            return method(*args, timeout=timeout_ms / 1000.0)
        return method(*args)

    def _gather(self, data: bytes, timeout_ms: int) -> list[bytes]:
        parts = list(self._call("allgather", timeout_ms, data))
        if len(parts) != self._size:
            raise ArbiterError(
                Status.INTERNAL,
                f"allgather returned {len(parts)} parts for a group of {self._size}",
            )
        for rank, part in enumerate(parts):
            if len(part) != len(data):
                raise ArbiterError(
                    Status.INTERNAL,
                    f"allgather: rank {rank} sent {len(part)} bytes, this rank {len(data)}",
                )
        return parts

    def _fail(self, what: str, error: BaseException) -> int:
        if isinstance(error, ArbiterError):
            status, text = int(error.status), error.message
        elif isinstance(error, TimeoutError):
            status, text = Status.TIMEOUT, f"{type(error).__name__}: {error}"
        else:
            status, text = Status.PEER_FAILED, f"{type(error).__name__}: {error}"
        self._error = ctypes.create_string_buffer(f"oob {what}: {text}".encode("utf-8", "replace"))
        return int(status)

    def _allgather(self, ctx, send, recv, nbytes, timeout_ms) -> int:
        try:
            parts = self._gather(ctypes.string_at(send, nbytes) if nbytes else b"", timeout_ms)
            for rank, part in enumerate(parts):
                ctypes.memmove(recv + rank * nbytes, part, nbytes)
            return Status.OK
        except BaseException as e:  # nothing may unwind into C
            return self._fail("allgather", e)

    def _broadcast(self, ctx, buf, nbytes, root, timeout_ms) -> int:
        try:
            data = ctypes.string_at(buf, nbytes) if nbytes else b""
            if "broadcast" in self._timed:
                got = bytes(self._call("broadcast", timeout_ms, data, root))
                if len(got) != nbytes:
                    raise ArbiterError(
                        Status.INTERNAL, f"broadcast returned {len(got)} bytes, not {nbytes}"
                    )
            else:
                got = self._gather(data, timeout_ms)[root]
            ctypes.memmove(buf, got, nbytes)
            return Status.OK
        except BaseException as e:
            return self._fail("broadcast", e)

    def _barrier(self, ctx, timeout_ms) -> int:
        try:
            if "barrier" in self._timed:
                self._call("barrier", timeout_ms)
            else:
                self._gather(b"", timeout_ms)
            return Status.OK
        except BaseException as e:
            return self._fail("barrier", e)

    def _last_error(self, ctx) -> int:
        return ctypes.addressof(self._error)
