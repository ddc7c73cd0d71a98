"""Status codes of the C API and the exception that carries them."""

from __future__ import annotations

import enum


class Status(enum.IntEnum):
    """arbiter_status (backends/abi/arbiter_backend.h)."""

    OK = 0
    UNSUPPORTED = 1
    INVALID_ARGUMENT = 2
    UNAVAILABLE = 3
    TIMEOUT = 4
    PEER_FAILED = 5
    INTERNAL = 6
    ABORTED = 7  # abort() was called on this rank; the call's outputs are unspecified
    MISMATCH = 8  # the ranks made different calls: refused on every rank, nothing written


class ArbiterError(Exception):
    """A call failed: `status` is the C API's code, `message` (and str(error))
    is arbiter_last_error() verbatim, e.g. every "FILE:LINE:COL: error: ..."
    line of a table that did not load."""

    def __init__(self, status: int, message: str) -> None:
        try:
            self.status: Status | int = Status(status)
        except ValueError:
            self.status = status
        self.message = message
        super().__init__(message)

    def __repr__(self) -> str:
        name = self.status.name if isinstance(self.status, Status) else str(self.status)
        return f"ArbiterError({name}, {self.message!r})"


def invalid_argument(message: str) -> ArbiterError:
    """The error for a bad argument caught in Python, before the C API."""
    return ArbiterError(Status.INVALID_ARGUMENT, message)


# The C API passes eps, weight_bias and scale as float32.
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINIEST = 1.401298464324817e-45  # the smallest positive float32


def real_number(value, what: str, nonnegative: bool = False, positive: bool = False) -> float:
    """`value` as a float when it is a real number (a Python int or float, or
    a numpy scalar) that a float32 holds, else the error that names what is
    wrong with it: the C API would read an overflow as inf and a positive
    value below float32's smallest as 0. The call paths test plain floats
    inline and come here otherwise."""
    import math
    import numbers

    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise invalid_argument(f"{what} must be a real number (a Python or numpy float), "
                               f"not {type(value).__module__}.{type(value).__qualname__}")
    try:
        number = float(value)
    except OverflowError:  # an int beyond any float (10**400)
        number = math.inf if value > 0 else -math.inf
    bounds = " and > 0" if positive else " and >= 0" if nonnegative else ""
    shown = f"{value!r:.40}" if isinstance(value, int) else repr(number)
    if not (math.isfinite(number) and abs(number) <= FLOAT32_MAX):
        raise invalid_argument(f"{what} {shown} must be finite{bounds}, within float32's "
                               f"range (magnitude <= {FLOAT32_MAX:.8g})")
    if (positive and not number >= FLOAT32_TINIEST) or (nonnegative and number < 0):
        raise invalid_argument(f"{what} {shown} must be finite{bounds}"
                               + (f" (a float32 holds none below {FLOAT32_TINIEST:.8g})"
                                  if positive and number > 0 else ""))
    return number
