"""What both call paths (arrays: _array_call.py; torch: _torch_tensors.py and
torch.py) share: the result type, the NVFP4 scale layout, stream handles."""

from __future__ import annotations

from typing import NamedTuple

from .errors import invalid_argument as _invalid
from .policy import Decision

OUTPUTS = ("allreduce_out", "residual_out", "norm_out", "quant_out", "scale_out")
FP8_HINT = " (the kernels write float8 e4m3fn; another float8 format would hold wrong values)"


class WorkspaceFootprint(NamedTuple):
    """What one backend's workspace costs this rank (Communicator.footprint).

    shared_bytes is memory peers map too (/dev/shm, CUDA IPC, multicast);
    max_message_bytes maps each algorithm to the largest call it takes
    (None: any size; 0: not offered); note says what is not counted."""

    backend: str
    known: bool
    device_bytes: int
    host_bytes: int
    shared_bytes: int
    max_message_bytes: dict
    note: str

    @property
    def total_bytes(self) -> int:
        return self.device_bytes + self.host_bytes + self.shared_bytes


class FusionResult(NamedTuple):
    """The outputs of one call (None where the pattern or `out` wrote none)
    and the decision that ran it: None when torch.compile traced the call
    (the compiled graph runs later, deciding by size at each call; see
    Communicator.last_decision). A named tuple: immutable, cheap to make."""

    decision: Decision | None
    allreduce_out: object = None
    residual_out: object = None
    norm_out: object = None
    quant_out: object = None
    scale_out: object = None


def stream_handle(stream: object) -> int:
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


def nvfp4_scale_bytes(tokens: int, hidden: int) -> int:
    """scale_out for NVFP4 in the 128x4 swizzled layout (16-element blocks)."""
    block_cols = hidden // 16
    return ((tokens + 127) // 128) * 128 * ((block_cols + 3) // 4) * 4
