"""One rank of the torch tests that need several processes, started by
test_torch_ranks.py under `arbiter launch --nproc N -- python3 torch_worker.py
SCENARIO OUTDIR`. Leaves what the test compares across ranks in OUTDIR, as
comm_worker.py does (rank<r>.npz: inputs and outputs as numpy bits;
rank<r>.json: decisions), and exits non-zero with the reason on a failed
expectation.
"""

from __future__ import annotations

import datetime
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

import arbiter
from comm_worker import (DTYPES, FP8_SCALE, HIDDEN, MAX_TOKENS, DlpackOnly, fail, make, save,
                         wait_for_file)

TORCH_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
PATTERNS = ("allreduce", "residual_rmsnorm", "residual_rmsnorm_fp8")


def to_torch(bits: np.ndarray, dtype: str) -> torch.Tensor:
    """comm_worker's arrays (bf16 as uint16 bits) as torch tensors of the same bits."""
    if dtype == "bf16":
        return torch.from_numpy(bits.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(bits.copy())


def to_bits(t: torch.Tensor) -> np.ndarray:
    """A tensor as the numpy array comm_worker would have (bf16 as uint16, float8 as uint8)."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16).copy()
    if t.dtype == torch.float8_e4m3fn:
        return t.view(torch.uint8).numpy().copy()
    return t.numpy().copy()


def same_bits(a, b) -> bool:
    a = a if isinstance(a, np.ndarray) else to_bits(a)
    b = b if isinstance(b, np.ndarray) else to_bits(b)
    return a.shape == b.shape and np.array_equal(a.view(np.uint8), b.view(np.uint8))


def paths_agree(comm, dtype: str, record: dict, saved: dict, cases) -> None:
    """Every pattern and size through four ways in: torch tensors (the fast
    path), the op, the same tensors offered through DLPack only, numpy
    arrays of the same bits. All four must write the same bits."""
    case = 0
    weight = make(99, 99, (HIDDEN,), dtype, 0.5, 1.5)
    for pattern in PATTERNS:
        for tokens in cases:
            case += 1
            key = f"{dtype}-{pattern}-{tokens}"
            arrays = [make(comm.rank, case, (tokens, HIDDEN), dtype)]
            if pattern != "allreduce":
                arrays += [make(77, case, (tokens, HIDDEN), dtype), weight]
                saved[key + "/residual"] = arrays[1]
            saved[key + "/x"] = arrays[0]
            kwargs = {"pattern": pattern}
            if pattern != "allreduce":
                kwargs["eps"] = 1e-5
            if pattern == "residual_rmsnorm_fp8":
                kwargs["scale"] = FP8_SCALE
            tensors = [to_torch(a, dtype) for a in arrays]
            fast = comm.allreduce_fusion(*tensors, **kwargs)
            names = [n for n in ("allreduce_out", "residual_out", "norm_out", "quant_out")
                     if getattr(fast, n) is not None]
            if pattern == "residual_rmsnorm_fp8" and fast.quant_out.dtype != torch.float8_e4m3fn:
                fail(f"{key}: the default FP8 quant_out is {fast.quant_out.dtype}")
            outs = {n: torch.empty_like(getattr(fast, n)) for n in names}
            if "quant_out" in outs:  # raw bytes this time
                outs["quant_out"] = torch.empty(tokens, HIDDEN, dtype=torch.uint8)
            dlpack = comm.allreduce_fusion(*map(DlpackOnly, tensors), **kwargs,
                                           out={n: DlpackOnly(t) for n, t in outs.items()})
            through_dlpack = dict(outs)
            outs = {n: torch.empty_like(getattr(fast, n)) for n in names}
            op_args = dict(outs)
            scale = torch.tensor([FP8_SCALE]) if "scale" in kwargs else None
            torch.ops.arbiter.allreduce_fusion(
                comm.op_handle, int(arbiter.parse_pattern(pattern)), tensors[0],
                *(tensors[1:] if len(tensors) > 1 else (None, None)),
                op_args.get("allreduce_out"), op_args.get("residual_out"),
                op_args.get("norm_out"), op_args.get("quant_out"), scale=scale,
                eps=kwargs.get("eps", 1e-6))
            through_op = dict(outs)
            numpy_out = comm.allreduce_fusion(*arrays, **kwargs, out={
                n: np.empty_like(to_bits(getattr(fast, n))) for n in names})
            for n in names:
                want = getattr(fast, n)
                for how, got in (("dlpack", through_dlpack[n]), ("op", through_op[n]),
                                 ("numpy", getattr(numpy_out, n))):
                    if not same_bits(got, want):
                        fail(f"{key}: {n} through {how} differs from the torch fast path")
                saved[f"{key}/{n}"] = to_bits(want)
            d = fast.decision
            if dlpack.decision != d or numpy_out.decision != d:
                fail(f"{key}: the paths took different decisions")
            record[key] = [d.backend, d.algorithm, d.fused]


def scenario_paths(outdir: str) -> None:
    record, saved = {}, {}
    for dtype in DTYPES:
        with arbiter.Communicator.from_environment(
            hidden=HIDDEN, dtype=dtype, max_tokens=MAX_TOKENS, timeout=60
        ) as comm:
            record["world_size"] = comm.world_size
            paths_agree(comm, dtype, record, saved, (2, 96, 300))
    save(outdir, record, saved)


def init_gloo(timeout: float) -> None:
    """torch.distributed over `arbiter launch`'s RANK, WORLD_SIZE, MASTER_ADDR
    and MASTER_PORT (nothing else listens there: arbiter's own bootstrap is
    not used when the group carries the exchange)."""
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout))


def scenario_group(outdir: str) -> None:
    """A gloo group carries the creation; the shm backend runs the calls."""
    init_gloo(timeout=600)
    record, saved = {}, {}
    # As vLLM's cpu_group, with a timeout of its own.
    cpu_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=45))
    with arbiter.Communicator.from_process_group(
        cpu_group, hidden=HIDDEN, dtype="bf16", max_tokens=MAX_TOKENS
    ) as comm:
        if (comm.rank, comm.world_size) != (dist.get_rank(), dist.get_world_size()):
            fail("the communicator's rank and size are not the group's")
        if comm._options.timeout_ms != 45000:
            fail(f"timeout {comm._options.timeout_ms} ms, the group's is 45 s")
        if comm.backends != ["shm"]:
            fail(f"backends {comm.backends}, expected ['shm']")
        record["world_size"] = comm.world_size
        paths_agree(comm, "bf16", record, saved, (2, 96))
    # A group that leaves this rank out: new_group() returns NON_GROUP_MEMBER
    # to it, which is refused by name; the member makes a communicator alone.
    solo = dist.new_group([0], backend="gloo")
    if dist.get_rank() == 0:
        with arbiter.Communicator.from_process_group(solo, hidden=HIDDEN, dtype="bf16") as comm:
            if comm.world_size != 1:
                fail(f"the group of rank 0 alone made a communicator of {comm.world_size}")
    else:
        try:
            arbiter.Communicator.from_process_group(solo, hidden=HIDDEN, dtype="bf16")
            fail("a group that leaves this rank out made a communicator")
        except arbiter.ArbiterError as e:
            if "this rank is not a member of the group" not in e.message:
                fail(f"a group that leaves this rank out: {e.message}")
    save(outdir, record, saved)
    dist.destroy_process_group()


def scenario_group_timeout(outdir: str) -> None:
    """The group's timeout bounds the calls: rank 1 never calls; rank 0's
    call fails after the group's 3 s, naming rank 1."""
    init_gloo(timeout=3)
    flag = os.path.join(outdir, "rank0-done")
    with arbiter.Communicator.from_process_group(hidden=HIDDEN, dtype="bf16") as comm:
        x = torch.ones(1, HIDDEN, dtype=torch.bfloat16)
        if comm.rank == 1:
            wait_for_file(flag)
            print("rank 1: stayed out of the call", flush=True)
            return
        started = time.monotonic()
        try:
            comm.allreduce_fusion(x)
            fail("rank 0's call succeeded without rank 1")
        except arbiter.ArbiterError as e:
            elapsed = time.monotonic() - started
            print(f"rank 0: {e.status.name} after {elapsed:.2f} s: {e.message}", flush=True)
            if e.status != arbiter.Status.TIMEOUT or "rank 1" not in e.message:
                fail(f"expected a TIMEOUT naming rank 1, got {e!r}")
            if not 2 < elapsed < 8:
                fail(f"the group's timeout is 3 s, the call took {elapsed:.2f} s")
        finally:
            open(flag, "w").close()


def scenario_registered(outdir: str) -> None:
    """arbiter.torch.empty(): registered tensors give the bits of ordinary
    ones through the fast path and the op (one-shot and two-shot sizes), a
    view crossing the end is refused (so the registered path was taken),
    and the tensor keeps the allocation alive until its last view dies."""
    import gc

    import arbiter.torch as arbiter_torch

    with arbiter.Communicator.from_environment(
        hidden=HIDDEN, dtype="bf16", max_tokens=MAX_TOKENS, timeout=20
    ) as comm:
        x = arbiter_torch.empty(comm, (MAX_TOKENS, HIDDEN))
        if x.dtype != torch.bfloat16 or tuple(x.shape) != (MAX_TOKENS, HIDDEN) or x.is_cuda:
            fail(f"empty(): got {x.dtype} {tuple(x.shape)} on {x.device}")
        res = to_torch(make(7, 1, (MAX_TOKENS, HIDDEN), "bf16"), "bf16")
        w = to_torch(make(9, 1, (HIDDEN,), "bf16"), "bf16")
        for t in (2, 96, MAX_TOKENS):
            plain = to_torch(make(comm.rank, t, (t, HIDDEN), "bf16"), "bf16")
            x[:t] = plain
            a = comm.allreduce_fusion(plain, res[:t], w)
            b = comm.allreduce_fusion(x[:t], res[:t], w)
            n, r = torch.empty_like(plain), torch.empty_like(plain)
            arbiter_torch.op(comm.op_handle, 1, x[:t], res[:t], w, None, r, n)
            for key in ("norm_out", "residual_out"):
                if not same_bits(getattr(a, key), getattr(b, key)):
                    fail(f"registered and ordinary {key} differ at {t} tokens (fast path)")
            if not same_bits(a.norm_out, n) or not same_bits(a.residual_out, r):
                fail(f"registered and ordinary outputs differ at {t} tokens (op)")
        # The last token and one past the end (torch's own views cannot
        # cross their storage; numpy's can).
        crossing = torch.from_numpy(np.lib.stride_tricks.as_strided(
            x[-1:].view(torch.int16).numpy(), shape=(2, HIDDEN))).view(torch.bfloat16)
        try:
            comm.allreduce_fusion(crossing)
            fail("a view crossing the end of the registered tensor was taken")
        except arbiter.ArbiterError as e:
            if "crosses the end" not in e.message:
                fail(f"a view crossing the end: {e!r}")
        for dtype in (torch.float32, "fp16", torch.uint8):
            t = arbiter_torch.empty(comm, (3, 5), dtype)
            if t.dtype != (torch.float16 if dtype == "fp16" else dtype) or t.shape != (3, 5):
                fail(f"empty(dtype={dtype}): got {t.dtype} {tuple(t.shape)}")
        view = x[1:3]
        del x, crossing, t
        gc.collect()
        try:
            comm.close()
            fail("close() succeeded while a registered tensor lived")
        except arbiter.ArbiterError as e:
            if "still alive" not in e.message:
                fail(f"close() with a live view: {e!r}")
        comm.allreduce_fusion(view)
        del view
        gc.collect()
        if comm._registered or comm._pending_frees:
            fail(f"allocations left: {comm._registered}")
        # A dtype refused on rank 1 alone: rank 0's empty() fails at once
        # (it waited out its timeout), and both go on.
        started = time.monotonic()
        try:
            arbiter_torch.empty(comm, (4, HIDDEN), "int4" if comm.rank == 1 else None)
            fail(f"rank {comm.rank}: empty() with a dtype refused on rank 1 succeeded")
        except arbiter.ArbiterError as e:
            want = "pass a torch.dtype" if comm.rank == 1 else "rank 1 asked for 0 bytes"
            if want not in e.message:
                fail(f"rank {comm.rank}: empty() refused with {e!r}")
        if time.monotonic() - started > 5:
            fail(f"rank {comm.rank}: the refused empty() took {time.monotonic() - started:.1f} s")
        y = arbiter_torch.empty(comm, (4, HIDDEN))
        y.copy_(to_torch(make(comm.rank, 4, (4, HIDDEN), "bf16"), "bf16"))
        comm.allreduce_fusion(y)
        del y
        gc.collect()
    print("registered: OK", flush=True)


def scenario_refusals(outdir: str) -> None:
    """Rank 1 makes calls that arbiter.torch refuses on it alone, through
    the eager path, the op and a compiled model (a wrong dtype, a pattern
    outside 0..3, a scale or eps beyond any float, a negative view, a weight
    of another shape): each
    joins its peers, whose call raises MISMATCH naming rank 1, and the call
    after each is in step and exact on both ranks."""
    import arbiter.torch as arbiter_torch

    with arbiter.Communicator.from_environment(hidden=HIDDEN, dtype="fp32", timeout=20) as comm:
        gen = torch.Generator().manual_seed(3)
        xs = [torch.randn(4, HIDDEN, generator=gen) for _ in range(2)]
        mine = xs[comm.rank]
        out = torch.empty_like(mine)

        def eager_bad_dtype():
            comm.allreduce_fusion(mine.double() if comm.rank == 1 else mine)

        def op_bad_pattern():
            arbiter_torch.op(comm._op_handle, 7 if comm.rank == 1 else 0, mine, None, None,
                             out, None, None)

        residual, weight = torch.zeros(4, HIDDEN), torch.ones(HIDDEN)

        def eager_huge_scale():  # raised OverflowError after the join point: out of step
            comm.allreduce_fusion(mine, residual, weight, pattern="residual_rmsnorm_fp8",
                                  scale=10**400 if comm.rank == 1 else 1.0)

        def eager_huge_eps():
            comm.allreduce_fusion(mine, residual, weight, eps=10**400 if comm.rank == 1 else 0.0)

        def eager_negative_view():
            comm.allreduce_fusion(torch._neg_view(mine) if comm.rank == 1 else mine)

        # Refused while tracing on rank 1 alone, the call never reached rank
        # 0, which waited out its deadline on a communicator left unusable.
        torch._dynamo.reset()
        compiled = torch.compile(lambda x, r, w: comm.allreduce_fusion(x, r, w).norm_out,
                                 fullgraph=True, backend="eager")

        def compiled_bad_weight():
            compiled(mine, residual.clone(),
                     weight[: HIDDEN // 2].contiguous() if comm.rank == 1 else weight)

        for name, bad in (("eager dtype", eager_bad_dtype), ("op pattern", op_bad_pattern),
                          ("eager scale 10**400", eager_huge_scale),
                          ("eager eps 10**400", eager_huge_eps),
                          ("eager negative view", eager_negative_view),
                          ("compiled weight shape", compiled_bad_weight)):
            try:
                bad()
                fail(f"{name}: rank {comm.rank}'s call succeeded")
            except arbiter.ArbiterError as e:
                want = arbiter.Status.INVALID_ARGUMENT if comm.rank == 1 else \
                    arbiter.Status.MISMATCH
                if e.status != want or (comm.rank == 0 and "rank 1 refused" not in e.message):
                    fail(f"{name}: rank {comm.rank} got {e!r}")
            got = comm.allreduce_fusion(mine).allreduce_out
            if not torch.equal(got, xs[0] + xs[1]):
                fail(f"{name}: the call after the refusal is not in step")
    print(f"rank {comm.rank}: refusals joined", flush=True)


def both_groups(arbiter_first: bool) -> None:
    """arbiter's bootstrap and a gloo group in one process: under `arbiter
    launch` they listen on two ports (ARBITER_BOOTSTRAP_PORT, MASTER_PORT),
    in either order, and both carry calls."""
    if not arbiter_first:
        init_gloo(timeout=60)
    comm = arbiter.Communicator.from_environment(hidden=HIDDEN, dtype="fp32", timeout=20)
    if arbiter_first:
        init_gloo(timeout=60)
    gen = torch.Generator().manual_seed(5)
    xs = [torch.randn(3, HIDDEN, generator=gen) for _ in range(2)]
    got = comm.allreduce_fusion(xs[comm.rank]).allreduce_out
    if not torch.allclose(got, xs[0] + xs[1]):
        fail("the arbiter call is wrong")
    t = torch.tensor([comm.rank + 1.0])
    dist.all_reduce(t)
    if t.item() != 3.0:
        fail(f"gloo's all_reduce gave {t.item()}")
    comm.close()
    dist.destroy_process_group()
    print(f"rank {comm.rank}: both groups OK", flush=True)


def scenario_arbiter_then_gloo(outdir: str) -> None:
    both_groups(arbiter_first=True)


def scenario_gloo_then_arbiter(outdir: str) -> None:
    both_groups(arbiter_first=False)


if __name__ == "__main__":
    torch.set_num_threads(1)
    scenario, outdir = sys.argv[1], sys.argv[2]
    globals()["scenario_" + scenario](outdir)
