"""arbiter in PyTorch programs: the op torch.ops.arbiter.allreduce_fusion.

Importing this module (torch must be installed) registers the op; a
Communicator created while torch is imported does it for you. The op runs
one fused all-reduce on the communicator named by its first argument,
Communicator.op_handle, and writes only the outputs it declares mutated:

    torch.ops.arbiter.allreduce_fusion(
        comm.op_handle, pattern,                    # arbiter.Pattern as int
        x, residual, weight,                        # inputs (None for allreduce; residual None: first block)
        allreduce_out, residual_out, norm_out,      # outputs, Tensor(a!)? ...
        quant_out=None, scale_out=None, scale=None,
        eps=1e-6, weight_bias=0.0, residual_replicated=False) -> ()

In place as vLLM does it: norm_out=x, residual_out=residual. It runs on
torch's current stream, so CUDA-graph capture records it, and its fake
implementation refuses tensors that require grad while torch.compile
traces (everything else is checked where the op runs, so that a refusal
joins the peers). It is registered with Library.define + impl (the dispatcher calls
the Python implementation directly), not torch.library.custom_op, whose
per-call wrapper costs more.

Communicator.allreduce_fusion on torch tensors calls the same C API
directly in eager mode, and this op when torch.compile traces it (or a
torch dispatch mode is active, or x is a tensor subclass), so one model
runs eager and compiled with fullgraph=True unchanged. The traced result's
`decision` is None: the compiled graph runs later, deciding at each call by
its size; Communicator.last_decision says what the latest call ran.

empty(comm, shape, dtype) is Communicator.empty() for torch: a CPU tensor
over registered memory, which the fast path and the op read in place
(docs/registered-buffers.md).
"""

from __future__ import annotations

import itertools
import math
import threading
import weakref

import torch

from . import _torch_tensors
from ._library import join_refused as _library_join
from ._results import FusionResult, nvfp4_scale_bytes, stream_handle
from .communicator import check_registered_bytes
from .errors import ArbiterError
from .errors import invalid_argument as _invalid
from .errors import FLOAT32_MAX as _F32_MAX
from .errors import FLOAT32_TINIEST as _F32_TINIEST
from .policy import Dtype, Pattern, parse_pattern

__all__ = ["allreduce_fusion", "empty", "op"]

_library = torch.library.Library("arbiter", "DEF")
_library.define(
    "allreduce_fusion(int comm, int pattern, Tensor x, Tensor? residual, Tensor? weight, "
    "Tensor(a!)? allreduce_out, Tensor(b!)? residual_out, Tensor(c!)? norm_out, "
    "Tensor(d!)? quant_out=None, Tensor(e!)? scale_out=None, Tensor? scale=None, "
    "float eps=1e-06, float weight_bias=0., bool residual_replicated=False) -> ()"
)

# --- which communicator an op call names ------------------------------------

_lock = threading.Lock()
_communicators: dict[int, weakref.ref] = {}
_handles = itertools.count(1)  # never reused: a compiled graph holds its handle


def register(comm) -> int:
    """A new handle for `comm` (held weakly)."""
    with _lock:
        handle = next(_handles)
        _communicators[handle] = weakref.ref(comm)
    return handle


def unregister(handle: int) -> None:
    with _lock:
        _communicators.pop(handle, None)


def communicator(handle: int):
    ref = _communicators.get(handle)
    comm = ref() if ref is not None else None
    if comm is None:
        raise _invalid(f"arbiter.allreduce_fusion: communicator {handle} was closed (or never "
                       "existed); pass the op_handle of a live Communicator")
    return comm


def _code(pattern: int) -> int:
    if not isinstance(pattern, int) or not 0 <= pattern <= 3:
        raise _invalid(f"pattern {pattern!r}: pass int(arbiter.Pattern.X), 0..3")
    return pattern


# --- the op -----------------------------------------------------------------

# The dispatcher hands a Python kernel the arguments as the caller gave
# them: the schema's defaults are repeated here.
def _impl(comm, pattern, x, residual, weight, allreduce_out, residual_out, norm_out,
          quant_out=None, scale_out=None, scale=None, eps=1e-6, weight_bias=0.0,
          residual_replicated=False):
    live = communicator(comm)
    try:
        code = _code(pattern)
    except Exception as refused:  # a refused call joins its peers
        raise _library_join(live, False, refused)
    _torch_tensors.run(live, code, x, residual, weight, scale,
                       (allreduce_out, residual_out, norm_out, quant_out, scale_out), eps,
                       weight_bias, residual_replicated, None)


def _fake(comm, pattern, x, residual, weight, allreduce_out, residual_out, norm_out,
          quant_out=None, scale_out=None, scale=None, eps=1e-6, weight_bias=0.0,
          residual_replicated=False):
    """Nothing to compute (the op returns nothing). What a call's arguments
    may differ in across ranks (shapes, dtypes, values) is not refused here:
    refused while one rank traces, the call would never reach its peers,
    which would wait out their deadline on a communicator left unusable. The
    compiled call runs _impl, which refuses what check() refuses and joins
    the peers, as the eager call does. Tensors that require grad are: that is
    the program's, alike on every rank, and the compiled forward runs under
    no_grad (AOTAutograd), where _impl can no longer see it."""
    if torch.is_grad_enabled():
        _torch_tensors.refuse_grad(x, residual, weight,
                                   (allreduce_out, residual_out, norm_out, quant_out, scale_out))


for _key in ("CPU", "CUDA"):
    _library.impl("allreduce_fusion", _impl, _key)
torch.library.register_fake("arbiter::allreduce_fusion", _fake, lib=_library)

op = torch.ops.arbiter.allreduce_fusion.default
"""The op's overload, as vLLM-style code calls it."""


# --- Communicator.allreduce_fusion on torch tensors -------------------------

_PATTERNS = {p.name.lower(): int(p) for p in Pattern}
_OUTPUTS = _torch_tensors.OUTPUTS
_KEYS = frozenset(_OUTPUTS)
_Tensor = torch.Tensor
_is_compiling = torch.compiler.is_compiling
_modes = getattr(torch._C, "_len_torch_dispatch_stack", lambda: 0)
_result = tuple.__new__


def _outputs(code: int, x, out) -> list:
    """The five outputs: those `out` names (a name set to None is not
    written), then new tensors for what the pattern writes by default."""
    if out:
        if not isinstance(out, dict):
            raise _invalid(f"out: a {type(out).__name__}; pass a dict of output name -> tensor")
        if not _KEYS.issuperset(out):
            raise _invalid(f"out: unknown keys {sorted(set(out) - _KEYS)}; use "
                           f"{', '.join(_OUTPUTS)}")
        get = out.get
        outs = [get("allreduce_out"), get("residual_out"), get("norm_out"), get("quant_out"),
                get("scale_out")]
        for i in _torch_tensors.PRODUCED[code]:
            if outs[i] is None and _OUTPUTS[i] not in out:
                outs[i] = _new_output(code, i, x)
        return outs
    if out is not None and not isinstance(out, dict):  # 0, "", []
        raise _invalid(f"out: a {type(out).__name__}; pass a dict of output name -> tensor")
    outs = [None, None, None, None, None]
    for i in _torch_tensors.PRODUCED[code]:
        outs[i] = _new_output(code, i, x)
    return outs


def _new_output(code: int, i: int, x):
    if i < 3:
        return torch.empty_like(x)
    tokens, hidden = x.shape
    if i == 3 and code == 2:  # FP8: the type the kernels write
        return torch.empty((tokens, hidden), dtype=torch.float8_e4m3fn, device=x.device)
    if i == 3:  # NVFP4: two e2m1 values per byte
        return torch.empty((tokens, hidden // 2), dtype=torch.uint8, device=x.device)
    return torch.empty((nvfp4_scale_bytes(tokens, hidden),), dtype=torch.uint8,
                       device=x.device)


def _keep_new_outputs_for(stream, handle: int, outs: list, out, device) -> None:
    """The outputs made here were allocated on torch's current stream; when
    the call runs on another, torch's allocator must not hand their memory
    out again (the caller may drop them at once) before that stream's work is
    done: record_stream, as torch's own collectives do. Nothing to look up
    when the caller gave every output (the usual in-place call)."""
    made = [t for i, t in enumerate(outs)
            if t is not None and (not out or _OUTPUTS[i] not in out)]
    if not made or handle == torch.cuda.current_stream(device).cuda_stream:
        return
    if not isinstance(stream, torch.cuda.Stream):
        stream = torch.cuda.ExternalStream(handle, device=device)
    for t in made:
        t.record_stream(stream)


def call(comm, x, residual, weight, eps, pattern, out, stream, scale, weight_bias,
         residual_replicated):
    """Communicator.allreduce_fusion on torch tensors (its arguments, in its
    order): outputs not in `out` are new tensors on x's device (FP8
    quant_out as float8_e4m3fn, NVFP4's as uint8)."""
    # Eager: this is the call. Otherwise the op is (traced, or under a
    # dispatch mode such as FakeTensorMode) and joins what it refuses itself.
    eager = not (_is_compiling() or type(x) is not _Tensor or _modes())
    try:
        if not eager and getattr(x, "is_nested", False):  # a jagged one is a subclass
            raise _invalid("x: a nested tensor; pass a dense (tokens, hidden) tensor")
        if pattern is None:
            code = 0 if residual is None and weight is None else 1
        elif type(pattern) is str and pattern in _PATTERNS:
            code = _PATTERNS[pattern]
        else:
            code = int(parse_pattern(pattern))
        outs = _outputs(code, x, out)
    except Exception as refused:
        if not isinstance(refused, ArbiterError):  # torch could not make outputs like x
            refused = _invalid(f"x: torch cannot make outputs like this {x.layout} tensor "
                               f"({type(refused).__name__}: "
                               f"{(str(refused).splitlines() or [''])[0]}); pass a strided "
                               "(dense) tensor")
        if eager:  # a refused call joins its peers (_library.join_refused)
            raise _library_join(comm, False, refused)
        raise refused
    if not eager:
        if stream is not None:
            raise _invalid("stream: traced by torch.compile (or under a torch dispatch mode) "
                           "the call runs on torch's current stream; instead of stream=, wrap "
                           "the call in `with torch.cuda.stream(s):`")
        if scale is not None and not isinstance(scale, _Tensor):
            # A Python number is a constant of the program: checked as the
            # eager call checks it (torch.full overflowed to a compiler error
            # on 1e300; True ran as 1.0). A numpy scalar is symbolic to
            # torch.compile: its range cannot be compared while tracing.
            if isinstance(scale, (bool, str, bytes)) or (
                    type(scale) in (float, int) and
                    not (abs(scale) < 2**129 and _F32_TINIEST <= float(scale) <= _F32_MAX)):
                raise _invalid(f"scale {scale!r} must be a positive float within float32's "
                               "range")
            scale = torch.full((1,), float(scale), dtype=torch.float32, device=x.device)
        op(comm._op_handle, code, x, residual, weight, outs[0], outs[1], outs[2], outs[3],
           outs[4], scale, eps, weight_bias, residual_replicated)
        return FusionResult(None, *outs)
    if stream is not None:
        try:
            if comm.device < 0:
                raise _invalid("stream: this communicator runs on host memory; pass no stream")
            handle = stream_handle(stream)
        except Exception as refused:
            raise _library_join(comm, False, refused)
        _keep_new_outputs_for(stream, handle, outs, out, x.device)
        stream = handle
    _torch_tensors.run(comm, code, x, residual, weight, scale, outs, eps, weight_bias,
                       residual_replicated, stream)
    return _result(FusionResult, (comm.last_decision, *outs))


def allreduce_fusion(comm, x, residual=None, weight=None, *, eps=1e-6, pattern=None, out=None,
                     stream=None, scale=None, weight_bias=0.0, residual_replicated=False):
    """comm.allreduce_fusion(...) for torch tensors, as a function."""
    return call(comm, x, residual, weight, eps, pattern, out, stream, scale, weight_bias,
                residual_replicated)


# --- registered memory ------------------------------------------------------

_TORCH_DTYPES = {Dtype.FP16: torch.float16, Dtype.BF16: torch.bfloat16,
                 Dtype.FP32: torch.float32}
_DTYPE_NAMES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def _empty_layout(comm, shape, dtype):
    """empty()'s torch dtype and shape; raises ArbiterError naming what is wrong."""
    if dtype is None:
        kind = _TORCH_DTYPES[comm.dtype]
    elif isinstance(dtype, str) and dtype in _DTYPE_NAMES:
        kind = _DTYPE_NAMES[dtype]
    elif isinstance(dtype, torch.dtype):
        kind = dtype
    else:
        raise _invalid(f"arbiter.torch.empty(): dtype {dtype!r}: pass a torch.dtype, "
                       f"'fp16', 'bf16', 'fp32' or None")
    try:
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
    except TypeError:
        shape = ()
    if not shape or any(not isinstance(n, int) or isinstance(n, bool) or n <= 0 for n in shape):
        raise _invalid(f"arbiter.torch.empty(): shape {shape!r} is not a tuple of positive "
                       "integers")
    check_registered_bytes("arbiter.torch.empty()", shape, kind,
                           math.prod(shape) * torch.empty((), dtype=kind).element_size())
    return kind, shape


def empty(comm, shape, dtype=None):
    """Collective (every rank, same shape and dtype, same order): a new CPU
    tensor, uninitialised, in registered memory that every rank maps, as
    comm.empty() gives a numpy array. A call whose x (and outputs) are such
    tensors, or views at the same offsets on every rank, reads them in place
    through the fast path and the op alike.

    dtype: a torch.dtype, "fp16"/"bf16"/"fp32", or None for the
    communicator's. The tensor (and every view of it) keeps the allocation
    alive, freed on this rank when the last dies; comm.close() refuses while
    one lives. On a CUDA communicator the tensor is on its device, in memory
    the trtllm module maps into every rank (peers read it in place; calls
    the policy sends elsewhere copy as usual); ArbiterError(UNSUPPORTED)
    where no backend of the communicator registers memory."""
    try:
        kind, shape = _empty_layout(comm, shape, dtype)
    except ArbiterError:
        # Refused here, the allocation still takes place with 0 bytes, which
        # every module refuses on every rank at once: the peers' empty()
        # fails now rather than at its deadline.
        try:
            comm._alloc("arbiter.torch.empty()", 0)
        except ArbiterError:
            pass
        raise
    itemsize = torch.empty((), dtype=kind).element_size()
    count = 1
    for n in shape:
        count *= n
    if comm.device >= 0:
        # uint8 through __cuda_array_interface__ (it has no bf16 type); the
        # tensor's storage holds the owner object, which frees the memory.
        owner = comm._empty_cuda(count * itemsize)
        raw = torch.as_tensor(owner, device=f"cuda:{comm.device}")
        return raw.view(kind).view(shape)
    # Bytes as numpy's uint8, then viewed as `kind` (bf16 and fp8 have no
    # numpy type): torch.from_numpy holds the array, which holds the
    # allocation, and every view of the tensor holds its storage.
    raw = comm.empty((count * itemsize,), "uint8")
    return torch.from_numpy(raw).view(kind).view(shape)
