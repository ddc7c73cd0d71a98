"""Host cost of one fused call from Python, side by side in one process with
torch's own rms_norm on the same tensors (one rank: the fallback runs the
residual add and the norm, so every method does the same work).

    python3 bench/python/host_cost.py                  # CPU tensors
    python3 bench/python/host_cost.py --device cuda    # CUDA tensors (GPU 0)

Methods, each on (tokens, hidden) tensors of --dtype, in place as vLLM calls it:
  rms_norm     torch.nn.functional.rms_norm(x, (hidden,), weight, eps)
  eager        comm.allreduce_fusion(x, residual, weight, out={norm_out: x, residual_out: residual})
  op           torch.ops.arbiter.allreduce_fusion(comm.op_handle, 1, x, residual, weight, None, residual, x)
  dlpack       the eager call with every tensor offered through __dlpack__ only (the old path)
  c_call       arbiter_comm_allreduce_fusion through ctypes with the arguments prebuilt (the floor)
  numpy        (CPU only) the eager call on numpy arrays of the same bits

The library: ARBITER_LIBRARY, else the source tree's build/lib.

Host cost per call: the wall time of --calls calls back to back divided by
--calls (on CUDA without synchronising inside the batch, so it is the
launch cost while the GPU keeps up; the batch is synchronised before it
starts). Each of --runs runs times every method once, in an order that
rotates, and keeps each method's median over --repeats batches. Printed:
per method the median and min-max over runs of the per-call microseconds,
and of the ratio to rms_norm in the same run. Exits non-zero if a method's
result differs from rms_norm's beyond rounding (it checks before timing).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir)
sys.path.insert(0, os.path.join(ROOT, "python"))
# The source tree's build unless ARBITER_LIBRARY names another library.
if os.path.isdir(os.path.join(ROOT, "build", "lib")):
    os.environ.setdefault("ARBITER_LIBRARY", os.path.join(ROOT, "build", "lib"))
import arbiter  # noqa: E402  (the source tree's, unless PYTHONPATH says otherwise)
from arbiter import _library  # noqa: E402


class Solo:
    """The oob of a group of one."""

    def allgather(self, data: bytes) -> list[bytes]:
        return [data]


class DlpackOnly:
    """A tensor offered through DLPack alone."""

    def __init__(self, tensor) -> None:
        self._tensor = tensor

    def __dlpack__(self, stream=None):
        return self._tensor.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self._tensor.__dlpack_device__()


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def make_methods(comm, x, residual, weight, eps, device):
    """name -> a function of no arguments that makes one call."""
    hidden = x.shape[1]
    rms_norm = torch.nn.functional.rms_norm
    op = torch.ops.arbiter.allreduce_fusion.default
    handle = comm.op_handle
    out = {"norm_out": x, "residual_out": residual}
    wrapped = [DlpackOnly(t) for t in (x, residual, weight)]
    wrapped_out = {"norm_out": wrapped[0], "residual_out": wrapped[1]}
    fusion = comm.allreduce_fusion
    stream = torch.cuda.current_stream() if device == "cuda" else None
    methods = {
        "rms_norm": lambda: rms_norm(x, (hidden,), weight, eps),
        "eager": lambda: fusion(x, residual, weight, eps=eps, out=out),
        "op": lambda: op(handle, 1, x, residual, weight, None, residual, x, eps=eps),
        "dlpack": lambda: fusion(*wrapped, eps=eps, out=wrapped_out, stream=stream),
    }
    args = _library.CAllreduceArgs(pattern=1, dtype=int(comm.dtype), tokens=x.shape[0],
                                   hidden=hidden, input=x.data_ptr(),
                                   residual_in=residual.data_ptr(),
                                   residual_out=residual.data_ptr(), gamma=weight.data_ptr(),
                                   norm_out=x.data_ptr(), eps=eps)
    call, args_at = comm._fusion_call, _library.ctypes.addressof(args)
    handle_value, decision_at = comm._handle_value, comm._decision_address
    raw_stream = stream.cuda_stream if stream is not None else None
    methods["c_call"] = lambda: call(handle_value, args_at, raw_stream, decision_at)
    methods["c_call"].keep = args
    if device == "cpu":
        bits = [t.view(torch.int16).numpy().view("uint16") if t.dtype == torch.bfloat16
                else t.numpy() for t in (x, residual, weight)]
        numpy_out = {"norm_out": bits[0], "residual_out": bits[1]}
        methods["numpy"] = lambda: fusion(*bits, eps=eps, out=numpy_out)
    return methods


def check_results(comm, x, residual, weight, eps):
    """Every arbiter method gives rms_norm(x + residual) (once, before timing)."""
    total = (x.float() + residual.float()).to(x.dtype)
    want = torch.nn.functional.rms_norm(total.float(), (x.shape[1],), weight.float(), eps)
    tolerance = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10, torch.float32: 2.0**-20}
    for name, method in make_methods(comm, x, residual, weight, eps, x.device.type).items():
        if name == "rms_norm":
            continue
        saved = x.clone(), residual.clone()
        method()
        if x.is_cuda:
            torch.cuda.synchronize()
        error = float(((x.float() - want).abs() / (want.abs() + 1e-3)).max())
        if not torch.equal(residual, total) or error > 2 * tolerance[x.dtype]:
            sys.exit(f"host_cost: {name} gives wrong results (relative error {error:.3g})")
        x.copy_(saved[0])
        residual.copy_(saved[1])


def time_batch(method, calls: int, device: str) -> float:
    """Microseconds per call over `calls` calls back to back."""
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        method()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--tokens", type=int, default=1)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calls", type=int, default=1000)
    opts = parser.parse_args()
    if opts.runs < 5:
        parser.error("--runs: at least 5, for a spread worth reading")
    torch.set_num_threads(1)
    device = opts.device
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("host_cost: --device cuda, but torch sees no CUDA device")
    capability = torch.cuda.get_device_capability(0) if device == "cuda" else "cpu"
    comm = arbiter.Communicator(Solo(), rank=0, world_size=1, local_rank=0, hidden=opts.hidden,
                                dtype=opts.dtype, capability=capability)
    g = torch.Generator().manual_seed(1)
    shape = (opts.tokens, opts.hidden)
    x, residual = (torch.randn(shape, generator=g).to(DTYPES[opts.dtype]).to(device)
                   for _ in range(2))
    weight = (1 + 0.1 * torch.randn(opts.hidden, generator=g)).to(DTYPES[opts.dtype]).to(device)
    eps = 1e-6
    check_results(comm, x, residual, weight, eps)
    x0, residual0 = x.clone(), residual.clone()
    methods = make_methods(comm, x, residual, weight, eps, device)
    names = list(methods)
    per_run = {name: [] for name in names}
    for run in range(opts.runs):
        order = names[run % len(names):] + names[:run % len(names)]
        for name in order:
            x.copy_(x0)  # in place: keep the values where they started
            residual.copy_(residual0)
            time_batch(methods[name], max(opts.calls // 10, 10), device)  # warm up
            per_run[name].append(statistics.median(
                time_batch(methods[name], opts.calls, device) for _ in range(opts.repeats)))
    if device == "cuda":
        torch.cuda.synchronize()
    where = torch.cuda.get_device_name(0) if device == "cuda" else "CPU"
    print(f"# host cost per call, {opts.tokens} x {opts.hidden} {opts.dtype} on {where}; "
          f"{opts.runs} runs x {opts.repeats} batches of {opts.calls} calls; torch "
          f"{torch.__version__}; arbiter decision: {comm.last_decision}")
    print(f"{'method':<9} {'us/call median':>15} {'(min-max)':>17} {'x rms_norm':>11} "
          f"{'(min-max)':>13}")
    base = per_run["rms_norm"]
    for name in names:
        us = per_run[name]
        ratios = [a / b for a, b in zip(us, base)]
        print(f"{name:<9} {statistics.median(us):>15.2f} {min(us):>8.2f}-{max(us):<8.2f} "
              f"{statistics.median(ratios):>11.2f} {min(ratios):>6.2f}-{max(ratios):<6.2f}")
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
