"""torch tensors as the Communicator reads them: the pointer, shape, dtype,
device and contiguity straight from the tensor (no DLPack export), and on
CUDA the stream from torch's current stream when the caller names none.

Two entries:
  - check(): every rule a call's tensors must meet, on metadata alone;
  - run(): check() then one call of the C API, with the arguments packed
    into the communicator's own arbiter_allreduce_args. This is the eager
    path of Communicator.allreduce_fusion and the op's implementation.

Imported only when torch is.
"""

from __future__ import annotations

from time import monotonic as _now

import torch

from . import _library
from .arrays import Borrowed
from ._results import OUTPUTS, nvfp4_scale_bytes
from .errors import ArbiterError
from .errors import invalid_argument as _invalid
from .errors import FLOAT32_MAX as _F32_MAX
from .errors import FLOAT32_TINIEST as _F32_TINIEST
from .errors import real_number as _real
from .policy import Dtype

TORCH_DTYPES = {Dtype.FP16: torch.float16, Dtype.BF16: torch.bfloat16, Dtype.FP32: torch.float32}
_NAMES = {
    torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "f64",
    torch.uint8: "u8", torch.int8: "i8", torch.uint16: "u16",
    torch.float8_e4m3fn: "fp8_e4m3fn", torch.float8_e4m3fnuz: "fp8_e4m3fnuz",
    torch.float8_e5m2: "fp8_e5m2", torch.float8_e5m2fnuz: "fp8_e5m2fnuz",
}
for _name in ("float8_e8m0fnu", "float4_e2m1fn_x2"):  # newer torch only
    if hasattr(torch, _name):
        _NAMES[getattr(torch, _name)] = _name.replace("float", "fp")

# By pattern code (arbiter_pattern): the outputs it may write, those it
# must, and those written when the caller gives none.
WRITES = ({0}, {0, 1, 2}, {0, 1, 2, 3}, {0, 1, 2, 3, 4})
REQUIRED = ({0}, {2}, {3}, {3, 4})
PRODUCED = ((0,), (1, 2), (1, 3), (1, 3, 4))
# Quantised outputs: raw bytes, or the float type the kernels write.
_FP8 = (torch.uint8, torch.int8, torch.float8_e4m3fn)
_FP4 = (torch.uint8, torch.int8) + ((torch.float4_e2m1fn_x2,)
                                    if hasattr(torch, "float4_e2m1fn_x2") else ())
_WHAT = ("out['allreduce_out']", "out['residual_out']", "out['norm_out']", "out['quant_out']",
         "out['scale_out']")
_PATTERN_NAMES = ("allreduce", "residual_rmsnorm", "residual_rmsnorm_fp8", "residual_rmsnorm_fp4")


def element(dtype: torch.dtype) -> str:
    return _NAMES.get(dtype, str(dtype).replace("torch.", ""))


def _where(device: int) -> str:
    return "host memory" if device < 0 else f"CUDA device {device}"


def _device_of(t: torch.Tensor) -> int | None:
    """-1 for host memory, the ordinal on CUDA, None elsewhere (meta, ...)."""
    if t.is_cpu:
        return -1
    return t.get_device() if t.is_cuda else None


def _refuse(t, what: str, shape: tuple, dtypes: tuple, device: int, hint: str = ""):
    """The error for a tensor that check() found wanting: says which rule failed."""
    if not isinstance(t, torch.Tensor):
        raise _invalid(f"{what}: a {type(t).__name__}; the other arguments are torch tensors, "
                       "pass torch tensors throughout")
    if t.is_nested:
        raise _invalid(f"{what}: a nested tensor; pass a dense one")
    got = _device_of(t)
    if got != device:
        where = _where(got) if got is not None else f"{t.device.type} memory"
        raise _invalid(f"{what}: the tensor is in {where}, this rank's communicator runs on "
                       f"{_where(device)}")
    if tuple(t.shape) != tuple(shape):
        raise _invalid(f"{what}: shape {tuple(t.shape)}, expected {tuple(shape)}")
    if t.dtype not in dtypes:
        raise _invalid(f"{what}: element type {element(t.dtype)}, expected "
                       f"{' or '.join(element(d) for d in dtypes)}{hint}")
    if t.is_neg():
        raise _neg(what)
    raise _invalid(f"{what}: the tensor is not C-contiguous (call .contiguous() first)")


def _neg(what: str):
    """A negative view (torch._neg_view) shares its base's memory and negates
    on read: the kernels, reading or writing that memory, would lose the sign."""
    return _invalid(f"{what}: the tensor has its negative bit set (a lazy negation that arbiter's "
                    "kernels cannot see); call .resolve_neg() first")


def _check(t, what: str, shape, dtype: torch.dtype, device: int) -> None:
    try:  # free unless raised: a list has no .dtype, a nested tensor no shape
        ok = (t.dtype is dtype and t.shape == shape and t.is_contiguous() and not t.is_neg()
              and (t.is_cpu if device < 0 else t.is_cuda and t.get_device() == device))
    except (AttributeError, RuntimeError):
        ok = False
    if not ok:
        _refuse(t, what, shape, (dtype,), device)


def _check_bytes(t, what: str, shape: tuple, dtypes: tuple, device: int) -> None:
    try:
        ok = (t.dtype in dtypes and t.shape == shape and t.is_contiguous() and not t.is_neg()
              and (t.is_cpu if device < 0 else t.is_cuda and t.get_device() == device))
    except (AttributeError, RuntimeError):
        ok = False
    if not ok:
        _refuse(t, what, shape, dtypes, device,
                " (the kernels write float8 e4m3fn; another float8 format would hold wrong "
                "values)" if torch.float8_e4m3fn in dtypes else "")


def refuse_grad(x, residual, weight, outs: tuple) -> None:
    """A tensor that requires grad would be read or written behind autograd's
    back (no version bump, no grad_fn): a silently wrong gradient. torch's own
    in-place ops refuse such writes; arbiter refuses them all."""
    for what, t in (("x", x), ("residual", residual), ("weight", weight), *zip(OUTPUTS, outs)):
        if isinstance(t, torch.Tensor) and t.requires_grad:
            name = what if what in ("x", "residual", "weight") else f"out['{what}']"
            raise _invalid(f"{name} requires grad: arbiter's calls have no gradient (inference "
                           "only); call under torch.no_grad() or torch.inference_mode(), or pass "
                           "a detached tensor")


def _refuse_inference_outputs(outs) -> None:
    """torch refuses in-place writes to inference tensors outside
    inference_mode (they have no version counter to bump): so does arbiter."""
    for i, t in enumerate(outs):
        if t is not None and t.is_inference():
            raise _invalid(f"{_WHAT[i]}: an inference tensor written outside "
                           "torch.inference_mode(), which torch refuses for its own in-place ops; "
                           "call inside inference_mode(), or pass a tensor made outside it")


def _storage_less(tensors) -> None:
    """Raises for the first (name, tensor) with data_ptr() 0 and elements: a
    wrapper subclass (its data lives in inner tensors), which arbiter would
    read as an argument not given."""
    for what, t in tensors:
        if t is not None and t.data_ptr() == 0 and t.numel():
            raise _invalid(f"{what}: a {type(t).__name__} without storage of its own (a "
                           "wrapper tensor subclass); arbiter reads and writes memory: pass "
                           "the plain tensor that holds the data")


def check(comm, code: int, x, residual, weight, scale, outs: tuple, eps, weight_bias,
          replicated) -> int:
    """Raises ArbiterError naming the argument and the rule unless the call
    can run on `comm`; returns the number of tokens. Reads metadata only."""
    dtype, device, hidden = comm._torch_dtype, comm.device, comm.hidden
    if torch.is_grad_enabled():  # inference runs without grad: no cost there
        refuse_grad(x, residual, weight, outs)
    try:
        shape = x.shape
    except (AttributeError, RuntimeError):  # not a tensor; a nested tensor has no sizes
        kind = "nested tensor" if getattr(x, "is_nested", False) else type(x).__name__
        raise _invalid(f"x: a {kind}; pass a (tokens, hidden) torch tensor") from None
    if len(shape) != 2:
        raise _invalid(f"x: shape {tuple(shape)}; expected (tokens, hidden={hidden})")
    tokens = shape[0]
    if shape[1] != hidden:
        raise _invalid(f"x: hidden {shape[1]}; the communicator was created for {hidden}")
    if comm.max_tokens is not None and tokens > comm.max_tokens:
        raise _invalid(f"x: {tokens} tokens, more than max_tokens={comm.max_tokens}")
    _check(x, "x", shape, dtype, device)
    name = _PATTERN_NAMES[code]
    if code:
        if weight is None:
            raise _invalid(f"pattern {name} needs weight")
        if residual is not None:  # None: a first block, no residual added
            _check(residual, "residual", shape, dtype, device)
        _check(weight, "weight", (hidden,), dtype, device)
        if not (type(eps) is float and 0 <= eps <= _F32_MAX):
            eps = _real(eps, "eps", nonnegative=True)  # an int, a numpy scalar, or refused
        if not (type(weight_bias) is float and -_F32_MAX <= weight_bias <= _F32_MAX):
            weight_bias = _real(weight_bias, "weight_bias")
    elif residual is not None or weight is not None:
        raise _invalid("pattern allreduce takes no residual or weight")
    if replicated is not True and replicated is not False:
        raise _invalid(f"residual_replicated {replicated!r} must be True or False")
    if code >= 2:
        if scale is None:
            raise _invalid(f"pattern {name} needs scale")
        if isinstance(scale, torch.Tensor):
            if _device_of(scale) != device:
                raise _invalid(f"scale: the tensor is in {scale.device}, this rank's "
                               f"communicator runs on {_where(device)}")
            if not (scale.dtype is torch.float32 and scale.numel() == 1):
                raise _invalid(f"scale: {element(scale.dtype)} of shape {tuple(scale.shape)}; "
                               "pass one float32")
            if scale.is_neg():
                raise _neg("scale")
            _storage_less((("scale", scale),))
        elif device >= 0:
            raise _invalid("scale: on a GPU rank, pass one float32 in device memory")
        elif not (type(scale) is float and _F32_TINIEST <= scale <= _F32_MAX):
            # An int, a numpy scalar (as eps takes), or refused: joined, run() stores it.
            _real(scale, "scale", positive=True)
    elif scale is not None:
        raise _invalid(f"pattern {name} takes no scale")
    writes = WRITES[code]
    for i in range(5):
        t = outs[i]
        if t is None:
            if i in REQUIRED[code]:
                raise _invalid(f"out: {OUTPUTS[i]} is required by this pattern")
            continue
        if i not in writes:
            raise _invalid(f"out: pattern {name} writes no {OUTPUTS[i]}")
        if i < 3:
            if t is not x and t is not residual:  # in place: checked above
                _check(t, _WHAT[i], shape, dtype, device)
        elif i == 3:
            _check_bytes(t, _WHAT[3], (tokens, hidden if code == 2 else hidden // 2),
                         _FP8 if code == 2 else _FP4, device)
        else:
            _check_bytes(t, _WHAT[4], (nvfp4_scale_bytes(tokens, hidden),), _FP8, device)
    if not _inference_mode():  # inference runs in it: no cost there
        _refuse_inference_outputs(outs)
    return tokens


def run(comm, code: int, x, residual, weight, scale, outs: tuple, eps, weight_bias, replicated,
        stream) -> None:
    """check(), then the C call on `stream` (a handle; None: torch's current
    stream on this rank's device). The decision it took is the
    communicator's last_decision."""
    ar, res, norm, quant, sf = outs
    try:
        tokens = check(comm, code, x, residual, weight, scale, outs, eps, weight_bias, replicated)
        at = (x.data_ptr(), 0 if ar is None else ar.data_ptr(),
              0 if residual is None else residual.data_ptr(), 0 if res is None else res.data_ptr(),
              0 if weight is None else weight.data_ptr(), 0 if norm is None else norm.data_ptr(),
              0 if quant is None else quant.data_ptr(), 0 if sf is None else sf.data_ptr())
        # 0 for a tensor given: an empty one, or a wrapper subclass (refused).
        if 0 in at and (at.count(0) != (ar is None) + (residual is None) + (res is None) +
                        (weight is None) + (norm is None) + (quant is None) + (sf is None)):
            _storage_less((("x", x), ("residual", residual), ("weight", weight),
                           *zip(_WHAT, outs)))
    except Exception as refused:
        if not isinstance(refused, ArbiterError):  # torch's own, e.g. a tensor without storage
            refused = _invalid(f"a tensor arbiter cannot read ({type(refused).__name__}: "
                               f"{(str(refused).splitlines() or [''])[0]}); pass dense tensors "
                               "in host or CUDA memory")
        raise _library.join_refused(comm, False, refused)
    if stream is None and comm.device >= 0:
        stream = _current_stream(comm.device)
    if not comm._lock.acquire(blocking=False):
        raise _invalid("allreduce_fusion: another thread is in a call on this communicator")
    comm._call_started = _now()  # for the Ctrl-C watcher (_interrupt)
    try:
        if not comm._handle_value:
            raise _invalid("the communicator was closed")
        if code < 2:
            scale_at = 0
        elif isinstance(scale, torch.Tensor):
            scale_at = scale.data_ptr()
        else:
            comm._scale_value.value = scale
            scale_at = comm._scale_address
        _pack(comm._args, 0, code, comm._dtype_code, 0, tokens, comm.hidden,
              _REPLICATED if replicated and code else 0, at[0], at[1], at[2], at[3], at[4],
              eps if code else 0.0, weight_bias if code else 0.0, at[5], at[6], at[7], scale_at)
        status = comm._fusion_call(comm._handle_value, comm._args_address, stream or None,
                                   comm._decision_address)
        # Written behind autograd's back, as torch's own in-place ops are
        # not: a bump makes backward() refuse a tensor it saved before the
        # write, instead of computing a gradient from what arbiter wrote.
        _bump([t for t in outs if t is not None])
        if status:
            _library.check(comm._lib, status)
    finally:
        comm._lock.release()


_REPLICATED = _library.RUN_RESIDUAL_REPLICATED
_bump = torch._C._increment_version
_inference_mode = torch.is_inference_mode_enabled
_pack = _library.ALLREDUCE_ARGS_LAYOUT.pack_into
_current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
if _current_stream is None:  # a torch without it: the public, slower way
    def _current_stream(device: int) -> int:
        return torch.cuda.current_stream(device).cuda_stream


def borrow_tensor(t: torch.Tensor, what: str) -> Borrowed:
    """A tensor as arrays.borrow() describes arrays, read directly."""
    device = _device_of(t)
    if device is None:
        raise _invalid(f"{what}: the tensor is in {t.device.type} memory, neither host nor CUDA")
    if t.is_neg():
        raise _neg(what)
    return Borrowed(t.data_ptr(), tuple(t.shape), element(t.dtype), t.element_size(), device,
                    False, t.is_contiguous(), keep=t)
