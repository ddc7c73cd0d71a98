"""Arrays as the Communicator sees them: an address, a shape, an element type,
a device, and whether they may be written.

Three ways in, tried in this order:
  1. numpy arrays and torch tensors, read through their own attributes
     (torch: _torch_tensors.py): pointer, shape, element type, device,
     contiguity, numpy's read-only flag; no DLPack export, no Py_buffer.
  2. The buffer protocol (array.array, bytearray, memoryview, other
     exporters): host memory, with the producer's read-only flag, format
     and strides.
  3. DLPack (`__dlpack__` / `__dlpack_device__`: cupy, jax, ...): host or
     CUDA memory. A CUDA producer is given the caller's stream, so its
     pending work is ordered before ours, as the protocol asks (stream None:
     the legacy default stream, the protocol's 1). Legacy DLPack cannot say
     "read-only"; such arrays count as writable.

Element names are the Communicator's: fp16, bf16, fp32, u16, u8, i8, and
each 8-bit float by its format (fp8_e4m3fn, fp8_e5m2, ...), since only
e4m3fn is what the FP8 kernels write.

A Borrowed view keeps what it borrowed (the Py_buffer, the capsule) until it
is released, so the address stays valid for the call.
"""

from __future__ import annotations

import ctypes
import sys
from ctypes import (
    POINTER,
    Structure,
    c_char_p,
    c_int,
    c_int32,
    c_int64,
    c_ssize_t,
    c_uint8,
    c_uint16,
    c_uint64,
    c_void_p,
)

from .errors import ArbiterError, invalid_argument

# Element names: what the Communicator's dtype accepts (bf16 also as u16 bits).
_FORMATS = {"e": "fp16", "f": "fp32", "d": "f64", "H": "u16", "B": "u8", "b": "i8"}

_PyBUF_RECORDS_RO = 0x0004 | 0x0008 | 0x0010  # FORMAT | ND | STRIDES
_PyBUF_C_ORDER_RO = 0x0004 | 0x0008 | 0x0010 | 0x0020  # FORMAT | C_CONTIGUOUS


class _PyBuffer(Structure):
    """CPython's Py_buffer (stable layout since 3.3)."""

    _fields_ = [
        ("buf", c_void_p),
        ("obj", c_void_p),
        ("len", c_ssize_t),
        ("itemsize", c_ssize_t),
        ("readonly", c_int),
        ("ndim", c_int),
        ("format", c_char_p),
        ("shape", POINTER(c_ssize_t)),
        ("strides", POINTER(c_ssize_t)),
        ("suboffsets", POINTER(c_ssize_t)),
        ("internal", c_void_p),
    ]


class _DLDevice(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class _DLDataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class _DLTensor(Structure):
    _fields_ = [
        ("data", c_void_p),
        ("device", _DLDevice),
        ("ndim", c_int32),
        ("dtype", _DLDataType),
        ("shape", POINTER(c_int64)),
        ("strides", POINTER(c_int64)),
        ("byte_offset", c_uint64),
    ]


_api = ctypes.pythonapi
_api.PyObject_GetBuffer.argtypes = [ctypes.py_object, POINTER(_PyBuffer), c_int]
_api.PyObject_GetBuffer.restype = c_int
_api.PyBuffer_Release.argtypes = [POINTER(_PyBuffer)]
_api.PyBuffer_Release.restype = None
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, c_char_p]
_api.PyCapsule_GetPointer.restype = c_void_p
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, c_char_p]
_api.PyCapsule_IsValid.restype = c_int

_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13
_DL_INT, _DL_UINT, _DL_FLOAT, _DL_BFLOAT = 0, 1, 2, 4
# The 8-, 6- and 4-bit float formats of DLPack 1.1, by type code.
_DL_SMALL_FLOATS = {7: "fp8_e3m4", 8: "fp8_e4m3", 9: "fp8_e4m3b11fnuz", 10: "fp8_e4m3fn",
                    11: "fp8_e4m3fnuz", 12: "fp8_e5m2", 13: "fp8_e5m2fnuz", 14: "fp8_e8m0fnu",
                    15: "fp6_e2m3fn", 16: "fp6_e3m2fn", 17: "fp4_e2m1fn"}


def _dl_element(code: int, bits: int, lanes: int) -> str:
    if lanes != 1:
        return f"vector of {lanes}"
    if code == _DL_FLOAT and bits in (16, 32, 64):
        return {16: "fp16", 32: "fp32", 64: "f64"}[bits]
    if code == _DL_BFLOAT and bits == 16:
        return "bf16"
    if code == _DL_UINT and bits in (8, 16):
        return f"u{bits}"
    if code == _DL_INT and bits == 8:
        return "i8"
    if code in _DL_SMALL_FLOATS:
        name = _DL_SMALL_FLOATS[code]
        return name if int(name[2]) == bits else f"{name} of {bits} bits"
    return f"dlpack type code {code} of {bits} bits"


class Borrowed:
    """One array, borrowed for a call. `device` is -1 for host memory, else
    the CUDA ordinal. `contiguous` means C order (row-major, dense)."""

    __slots__ = ("address", "shape", "element", "itemsize", "device", "readonly", "contiguous",
                 "_buffer", "_keep")

    def __init__(self, address, shape, element, itemsize, device, readonly, contiguous,
                 buffer=None, keep=None) -> None:
        self.address = address
        self.shape = shape
        self.element = element
        self.itemsize = itemsize
        self.device = device
        self.readonly = readonly
        self.contiguous = contiguous
        self._buffer = buffer  # a Py_buffer to release
        self._keep = keep  # what must stay alive meanwhile (a DLPack capsule)

    @property
    def nbytes(self) -> int:
        n = self.itemsize
        for d in self.shape:
            n *= d
        return n

    def release(self) -> None:
        if self._buffer is not None:
            buffer, self._buffer = self._buffer, None
            _release_buffer(ctypes.byref(buffer))
        self._keep = None


def _c_contiguous(shape: tuple, strides, itemsize: int) -> bool:
    if strides is None:
        return True
    expected = itemsize
    for extent, stride in zip(reversed(shape), reversed(strides)):
        if extent != 1 and stride != expected:
            return False
        expected *= extent
    return True


_get_buffer = _api.PyObject_GetBuffer
_release_buffer = _api.PyBuffer_Release
_elements: dict = {}  # format bytes -> element name


def _element_of(fmt: bytes | None) -> str:
    element = _elements.get(fmt)
    if element is None:
        text = (fmt or b"B").decode("ascii", "replace")
        if text[:1] in "@=" or (text[:1] == "<" and sys.byteorder == "little"):
            text = text[1:]
        element = _elements[fmt] = _FORMATS.get(text, f"format '{text}'")
    return element


def _from_buffer(obj: object) -> Borrowed | None:
    """The buffer protocol's view, or None when obj does not offer one. Asks
    for C order first (the exporter checks it); a strided view is taken only
    to say that it is one."""
    view = _PyBuffer()
    ref = ctypes.byref(view)
    try:
        _get_buffer(obj, ref, _PyBUF_C_ORDER_RO)
        contiguous = True
    except TypeError:
        return None
    except (BufferError, ValueError):
        try:
            _get_buffer(obj, ref, _PyBUF_RECORDS_RO)
        except (BufferError, TypeError, ValueError):
            return None
        contiguous = False
    try:
        ndim = view.ndim
        shape = tuple(view.shape[:ndim]) if view.shape else (view.len // max(view.itemsize, 1),)
        if not contiguous and view.strides:
            contiguous = _c_contiguous(shape, tuple(view.strides[:ndim]), view.itemsize)
        return Borrowed(view.buf or 0, shape, _element_of(view.format), view.itemsize, -1,
                        bool(view.readonly), contiguous, buffer=view)
    except BaseException:
        _release_buffer(ref)
        raise


_numpy_elements: dict = {}  # numpy dtype.str ("<f2") -> element name
_address_of = ctypes.addressof
_char_at = ctypes.c_char.from_buffer


def _from_numpy(a) -> Borrowed:
    """A numpy array read through its attributes: what the buffer protocol
    says, for a fraction of the cost of asking it through ctypes."""
    kind = a.dtype.str
    element = _numpy_elements.get(kind)
    if element is None:
        fmt = a.dtype.char if kind[0] in "=|" or (kind[0] == "<") == (
            sys.byteorder == "little") else kind
        element = _numpy_elements[kind] = _FORMATS.get(fmt, f"format '{kind}'")
    flags = a.flags
    writable, contiguous = flags.writeable, flags.c_contiguous
    # A writable dense buffer's address without a dict or a ctypes helper
    # object; the c_char holds the buffer (and the array) until released.
    keep = _char_at(a) if writable and contiguous and a.nbytes else a
    address = _address_of(keep) if keep is not a else a.ctypes.data
    return Borrowed(address, a.shape, element, a.itemsize, -1, not writable, contiguous,
                    keep=keep)


def _from_dlpack(obj: object, what: str, stream: int | None) -> Borrowed:
    device_type, device_id = obj.__dlpack_device__()
    if device_type in (_DL_CUDA, _DL_CUDA_MANAGED):
        # The protocol's stream numbers: 1 is CUDA's legacy default stream.
        capsule = obj.__dlpack__(stream=1 if not stream else stream)
        device = int(device_id)
    elif device_type in (_DL_CPU, _DL_CUDA_HOST):
        capsule = obj.__dlpack__()
        device = -1
    else:
        raise invalid_argument(
            f"{what}: DLPack device type {device_type} is neither host nor CUDA memory"
        )
    if not _api.PyCapsule_IsValid(capsule, b"dltensor"):
        raise invalid_argument(f"{what}: __dlpack__ did not return an unused 'dltensor'")
    # The capsule stays unconsumed and referenced until release(); its own
    # destructor then calls the producer's deleter.
    t = _DLTensor.from_address(_api.PyCapsule_GetPointer(capsule, b"dltensor"))
    shape = tuple(int(t.shape[i]) for i in range(t.ndim))
    strides = tuple(int(t.strides[i]) for i in range(t.ndim)) if t.strides else None
    itemsize = max(t.dtype.bits // 8, 1) * t.dtype.lanes
    return Borrowed(
        (t.data or 0) + int(t.byte_offset),
        shape,
        _dl_element(t.dtype.code, t.dtype.bits, t.dtype.lanes),
        itemsize,
        device,
        False,
        _c_contiguous(shape, strides, 1),  # DLPack strides count elements
        keep=capsule,
    )


def borrow(obj: object, what: str, stream: int | None = None) -> Borrowed:
    """The array behind obj, for the duration of a call (release() it after).
    Raises ArbiterError naming `what` when obj is not an array."""
    numpy = sys.modules.get("numpy")
    if numpy is not None and type(obj) is numpy.ndarray:
        return _from_numpy(obj)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        from ._torch_tensors import borrow_tensor

        return borrow_tensor(obj, what)
    view = _from_buffer(obj)
    if view is not None:
        return view
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        try:
            return _from_dlpack(obj, what, stream)
        except ArbiterError:
            raise
        except Exception as e:
            raise invalid_argument(
                f"{what}: DLPack export failed: {type(e).__name__}: {e}"
            ) from e
    raise invalid_argument(
        f"{what}: a {type(obj).__name__} is not an array (it offers neither the buffer "
        "protocol nor __dlpack__)"
    )
