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


def real_number(value, what: str, nonnegative: bool = False) -> float:
    """`value` as a float when it is a finite real number (a Python int or
    float, or a numpy scalar), else the error that names what is wrong with
    it. The call paths test plain floats inline and come here otherwise."""
    import math
    import numbers

    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise invalid_argument(f"{what} must be a real number (a Python or numpy float), "
                               f"not {type(value).__module__}.{type(value).__qualname__}")
    number = float(value)
    if not math.isfinite(number) or (nonnegative and number < 0):
        raise invalid_argument(f"{what} {number!r} must be finite"
                               + (" and >= 0" if nonnegative else ""))
    return number
