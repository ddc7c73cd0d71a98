"""A fused call from Python against the same call from C++, on CPU ranks (the
shm backend), run after run in one invocation:

    python3 bench/python/host_cost_shm.py [--nproc 2] [--hidden 4096] [--tokens 1]

Each run starts `arbiter launch --nproc N` twice: once this file as the
ranks' program (--worker), timing the Python ways in (the bare C call through
ctypes with its arguments prebuilt, torch tensors eager and through the
op, numpy arrays; bf16, in place), once `arbiter-bench-shm`
for the same bytes, whose fused_oneshot row is the C++ figure. A figure is
the median over trials of the slowest rank's per-call time, calls back to
back, as arbiter-bench-shm measures it. Printed: per way the median and
min-max over runs, and its excess over C++ in the same run.

Finds `arbiter` through ARBITER_BIN or build/bin of the source tree;
`arbiter-bench-shm` through ARBITER_BENCH_SHM, beside the program, or in the
source tree's build/bin (an install has no benchmarks); the library through
ARBITER_LIBRARY or build/lib.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, os.pardir, os.pardir)
sys.path.insert(0, os.path.join(ROOT, "python"))
# The source tree's build unless ARBITER_LIBRARY names another library.
if os.path.isdir(os.path.join(ROOT, "build", "lib")):
    os.environ.setdefault("ARBITER_LIBRARY", os.path.join(ROOT, "build", "lib"))
WAYS = ("c_call", "torch_eager", "torch_op", "numpy")


def worker(opts) -> int:
    """One rank: each way, `--trials` batches of `--calls` calls."""
    import numpy as np
    import torch

    import arbiter

    torch.set_num_threads(1)
    comm = arbiter.Communicator.from_environment(hidden=opts.hidden, dtype="bf16", timeout=60)
    times = arbiter.Communicator.from_environment(hidden=8, dtype="fp32", timeout=60)
    g = torch.Generator().manual_seed(comm.rank)
    x, residual = (torch.randn(opts.tokens, opts.hidden, generator=g).bfloat16() for _ in "ab")
    weight = torch.ones(opts.hidden, dtype=torch.bfloat16)
    start = (x.clone(), residual.clone())
    bits = [t.view(torch.int16).numpy().view(np.uint16) for t in (x, residual, weight)]
    out, numpy_out = {"norm_out": x, "residual_out": residual}, {"norm_out": bits[0],
                                                                 "residual_out": bits[1]}
    op, handle = torch.ops.arbiter.allreduce_fusion.default, comm.op_handle
    comm.allreduce_fusion(x, residual, weight, out=out)  # fills comm's argument block
    call, args = comm._fusion_call, (comm._handle_value, comm._args_address, None,
                                     comm._decision_address)
    ways = {
        "c_call": lambda: call(*args),
        "torch_eager": lambda: comm.allreduce_fusion(x, residual, weight, out=out),
        "torch_op": lambda: op(handle, 1, x, residual, weight, None, residual, x),
        "numpy": lambda: comm.allreduce_fusion(*bits, out=numpy_out),
    }
    slot = np.zeros((1, 8), np.float32)
    for name in WAYS:
        per_trial = []
        for trial in range(opts.trials + 1):  # the first warms up
            x.copy_(start[0])
            residual.copy_(start[1])
            began = time.perf_counter()
            for _ in range(opts.calls):
                ways[name]()
            slot[:] = 0
            slot[0, comm.rank] = (time.perf_counter() - began) / opts.calls * 1e6
            slowest = float(times.allreduce_fusion(slot).allreduce_out.max())
            if trial:
                per_trial.append(slowest)
        if comm.rank == 0:
            print(f"{name},{statistics.median(per_trial):.3f},{comm.last_decision.algorithm}",
                  flush=True)
    times.close()
    comm.close()
    return 0


def programs() -> tuple[str, str]:
    built = os.path.join(ROOT, "build", "bin")
    arbiter_bin = os.environ.get("ARBITER_BIN") or os.path.join(built, "arbiter")
    if not os.access(arbiter_bin, os.X_OK):
        sys.exit(f"host_cost_shm: no {arbiter_bin}; build first or set ARBITER_BIN")
    # An install has no benchmarks: beside the program, else the source tree's.
    candidates = [os.environ.get("ARBITER_BENCH_SHM"),
                  os.path.join(os.path.dirname(arbiter_bin), "arbiter-bench-shm"),
                  os.path.join(built, "arbiter-bench-shm")]
    for bench in filter(None, candidates):
        if os.access(bench, os.X_OK):
            return arbiter_bin, bench
    sys.exit(f"host_cost_shm: no arbiter-bench-shm ({', '.join(filter(None, candidates))}); "
             "build it or set ARBITER_BENCH_SHM")


def launch(arbiter_bin: str, nproc: int, affinity: str, program: list[str]) -> list[str]:
    done = subprocess.run([arbiter_bin, "launch", "--nproc", str(nproc), "--timeout", "300",
                           "--cpu-affinity", affinity, "--"] + program, capture_output=True,
                          text=True, timeout=330)
    if done.returncode != 0:
        sys.exit(f"host_cost_shm: {' '.join(program[:2])} failed:\n{done.stdout}{done.stderr}")
    prefix = "[rank 0] "
    return [line[len(prefix):] for line in done.stdout.splitlines() if line.startswith(prefix)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--tokens", type=int, default=1)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--trials", type=int, default=15)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--cpu-affinity", default="none",
                        help="arbiter launch --cpu-affinity for both (none, spread, a CPU list)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.worker:
        return worker(opts)
    if opts.runs < 5:
        parser.error("--runs: at least 5, for a spread worth reading")
    if opts.trials < 3:
        parser.error("--trials: at least 3 (arbiter-bench-shm's minimum)")
    arbiter_bin, bench = programs()
    size = f"{opts.tokens * opts.hidden * 2}B"
    figures = {name: [] for name in ("cpp",) + WAYS}
    algorithms = set()
    for _ in range(opts.runs):
        for line in launch(arbiter_bin, opts.nproc, opts.cpu_affinity, [
                sys.executable, os.path.abspath(__file__), "--worker", "--hidden",
                str(opts.hidden), "--tokens", str(opts.tokens), "--trials", str(opts.trials),
                "--calls", str(opts.calls)]):
            name, us, algorithm = line.split(",")
            figures[name].append(float(us))
            algorithms.add(algorithm)
        rows = csv.reader(launch(arbiter_bin, opts.nproc, opts.cpu_affinity, [
            bench, "--from", size, "--to", size, "--hidden", str(opts.hidden), "--trials",
            str(opts.trials)]))
        cpp = [float(r[4]) for r in rows if len(r) > 4 and r[3] == "fused_oneshot"]
        figures["cpp"].append(cpp[0])
    print(f"# {opts.nproc} ranks (cpu affinity {opts.cpu_affinity}), {opts.tokens} x "
          f"{opts.hidden} bf16, residual_rmsnorm in place "
          f"({'/'.join(sorted(algorithms))}); {opts.runs} runs, each the median of "
          f"{opts.trials} trials of {opts.calls} calls (slowest rank)")
    print(f"{'way':<12} {'us/call median':>15} {'(min-max)':>15} {'over C++':>9} {'(min-max)':>13}")
    for name, values in figures.items():
        over = [v - c for v, c in zip(values, figures["cpp"])]
        print(f"{name:<12} {statistics.median(values):>15.2f} {min(values):>7.2f}-"
              f"{max(values):<7.2f} {statistics.median(over):>9.2f} {min(over):>6.2f}-"
              f"{max(over):<6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
