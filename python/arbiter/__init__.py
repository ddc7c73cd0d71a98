"""arbiter: which all-reduce runs each call site, from YAML tables.

A thin ctypes binding over the C API of libarbiter_runtime (no compiled
extension). It reads the same layers as every other consumer: the embedded
default tables, site files (ARBITER_CONFIG) and the backends restriction
(ARBITER_BACKENDS), so Python, C, C++ and the `arbiter` program decide alike,
which their fingerprints show.

    import arbiter
    policy = arbiter.Policy.from_environment()
    d = policy.decide(capability="10.3", world_size=16, nodes=4, nvlink_domain=True,
                      multicast=True, tokens=4096, hidden=8192, dtype="bf16")
    d.backend, d.algorithm, d.fused            # ("mnnvl", "twoshot", True)
    policy.max_fused_bytes(capability=103, world_size=16, nodes=4,
                           nvlink_domain=True, multicast=True)   # 67108864
    print(policy.explain(capability=90, world_size=8, message_bytes="1MiB"))

And it runs the all-reduce (every rank, e.g. under `arbiter launch` or torchrun):

    comm = arbiter.Communicator.from_environment(hidden=4096, dtype="bf16")
    r = comm.allreduce_fusion(x, residual, weight, eps=1e-6)   # numpy, torch, cupy ...
    r.norm_out, r.residual_out, r.decision

With torch: torch tensors are read directly (no DLPack export), CUDA calls
run on torch's current stream, Communicator.from_process_group(group, ...)
meets the ranks over a torch.distributed gloo group, and arbiter.torch
registers torch.ops.arbiter.allreduce_fusion, which torch.compile traces
(see docs/integration.md, PyTorch).

The library is found through ARBITER_LIBRARY (the file or its folder), then
next to this package, then where the install put it (the wheel: inside this
package; `cmake --install`: the prefix's library folder), then on the
system's library path. Failures raise ArbiterError, whose message is the C
API's arbiter_last_error().

__version__ is the project version (as `arbiter --version` prints it);
cmake_prefix_path is the folder to put on CMAKE_PREFIX_PATH for a C++
project's find_package(arbiter) against this install (None when this package
is a source tree).
"""

from __future__ import annotations

from ._library import installed_folder, library_path
from .communicator import Communicator, FusionResult, WorkspaceFootprint
from .errors import ArbiterError, Status
from .policy import (
    Decision,
    Dtype,
    Pattern,
    Policy,
    Request,
    element_size,
    parse_capability,
    parse_dtype,
    parse_pattern,
    parse_size,
)

try:
    from ._version import __version__  # written by the install (cmake --install, the wheel)
except ImportError:  # a source tree on PYTHONPATH: ask the library when asked

    def __getattr__(name: str):
        if name == "__version__":
            from ._library import version

            return version()
        raise AttributeError(f"module 'arbiter' has no attribute {name!r}")


_libdir = installed_folder("LIBDIR")
cmake_prefix_path = None if _libdir is None else f"{_libdir}/cmake"
del _libdir

__all__ = [
    "ArbiterError",
    "Communicator",
    "FusionResult",
    "WorkspaceFootprint",
    "Decision",
    "Dtype",
    "Pattern",
    "Policy",
    "Request",
    "Status",
    "cmake_prefix_path",
    "element_size",
    "from_environment",
    "library_path",
    "load",
    "parse_capability",
    "parse_dtype",
    "parse_pattern",
    "parse_size",
]


def from_environment() -> Policy:
    """Policy.from_environment(): defaults <- ARBITER_CONFIG, ARBITER_BACKENDS."""
    return Policy.from_environment()


def load(site_files=(), backends: str | None = None) -> Policy:
    """Policy.load(): defaults <- site_files, restricted to `backends`."""
    return Policy.load(site_files, backends)
