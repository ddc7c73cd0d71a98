"""One rank of the Communicator tests, started by test_communicator.py under
`arbiter launch --nproc N -- python3 comm_worker.py SCENARIO OUTDIR`.

Each scenario runs on every rank, checks what a rank can check alone, and
leaves in OUTDIR what the test compares across ranks (rank<r>.npz, with the
rank's inputs and outputs, and rank<r>.json, with the decisions). A failed
expectation exits non-zero with the reason, so `arbiter launch` fails.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

import arbiter

HIDDEN = 512
MAX_TOKENS = 320
# One-shot, two-shot at 4 ranks (fp16/bf16) or 2 (fp32), and the fallback
# above the 256 KiB cap of the tests' site table.
TOKENS = (2, 96, 300)
DTYPES = ("fp16", "bf16", "fp32")
PATTERNS = ("allreduce", "residual_rmsnorm", "residual_rmsnorm_fp8")
FP8_SCALE = 0.0625


def to_dtype(values: np.ndarray, dtype: str) -> np.ndarray:
    """fp32 values in the array type arbiter takes for dtype (bf16: uint16 bits, RNE)."""
    values = values.astype(np.float32)
    if dtype == "fp16":
        return values.astype(np.float16)
    if dtype == "fp32":
        return values
    bits = values.view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def make(rank: int, case: int, shape: tuple, dtype: str, low=-2.0, high=2.0) -> np.ndarray:
    rng = np.random.default_rng(1000 * case + rank)
    return to_dtype(rng.uniform(low, high, size=shape), dtype)


class DlpackOnly:
    """An array offered through DLPack alone (as torch or cupy offer theirs)."""

    def __init__(self, array: np.ndarray) -> None:
        self._array = array

    def __dlpack__(self, stream=None):
        return self._array.__dlpack__()

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


class FileGroup:
    """The caller's own process group for Communicator(oob, ...): allgather
    through files in a shared folder, with a deadline."""

    def __init__(self, folder: str, rank: int, size: int) -> None:
        self.folder, self.rank, self.size, self.calls = folder, rank, size, 0

    def allgather(self, data: bytes, timeout: float) -> list[bytes]:
        self.calls += 1
        name = lambda r: os.path.join(self.folder, f"{self.calls}.{r}")  # noqa: E731
        with open(name(self.rank) + ".tmp", "wb") as f:
            f.write(data)
        os.rename(name(self.rank) + ".tmp", name(self.rank))
        deadline = time.monotonic() + timeout
        parts = []
        for r in range(self.size):
            while not os.path.exists(name(r)):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"rank {r} did not reach allgather {self.calls}")
                time.sleep(0.001)
            with open(name(r), "rb") as f:
                parts.append(f.read())
        return parts


def fail(message: str) -> None:
    print(f"FAILED: {message}", flush=True)
    sys.exit(1)


def run_cases(comm, dtype: str, record: dict, saved: dict, cases) -> None:
    """Every pattern x size of `cases` on one communicator, plus in place."""
    case = 0
    weight = make(99, 99, (HIDDEN,), dtype, 0.5, 1.5)
    for pattern in PATTERNS:
        for tokens in cases:
            case += 1
            key = f"{dtype}-{pattern}-{tokens}"
            x = make(comm.rank, case, (tokens, HIDDEN), dtype)
            kwargs = {"pattern": pattern}
            args = [x]
            if pattern != "allreduce":
                residual = make(77, case, (tokens, HIDDEN), dtype)
                args += [residual, weight]
                saved[key + "/residual"] = residual
                kwargs["eps"] = 1e-5
            if pattern == "residual_rmsnorm_fp8":
                kwargs["scale"] = FP8_SCALE
                kwargs["out"] = {"norm_out": np.empty_like(x)}
            result = comm.allreduce_fusion(*args, **kwargs)
            saved[key + "/x"] = x
            for name in ("allreduce_out", "residual_out", "norm_out", "quant_out"):
                value = getattr(result, name)
                if value is not None:
                    saved[f"{key}/{name}"] = np.asarray(value)
            d = result.decision
            record[key] = [d.backend, d.algorithm, d.fused]
    # In place, as vLLM calls it: norm_out over x, residual_out over residual;
    # and the same call with the arrays offered through DLPack only.
    for how in ("inplace", "dlpack"):
        case += 1
        tokens = cases[-1]
        key = f"{dtype}-{how}-{tokens}"
        x = make(comm.rank, case, (tokens, HIDDEN), dtype)
        residual = make(77, case, (tokens, HIDDEN), dtype)
        saved[key + "/x"], saved[key + "/residual"] = x.copy(), residual.copy()
        if how == "inplace":
            r = comm.allreduce_fusion(
                x, residual, weight, eps=1e-5, out={"norm_out": x, "residual_out": residual}
            )
            if r.norm_out is not x or r.residual_out is not residual:
                fail("in place: the result does not hand back the arrays given in out")
            norm_out, residual_out = x, residual
        else:
            norm_out, residual_out = np.empty_like(x), np.empty_like(x)
            r = comm.allreduce_fusion(
                DlpackOnly(x), DlpackOnly(residual), DlpackOnly(weight), eps=1e-5,
                out={"norm_out": DlpackOnly(norm_out), "residual_out": DlpackOnly(residual_out)},
            )
        saved[key + "/norm_out"], saved[key + "/residual_out"] = norm_out, residual_out
        record[key] = [r.decision.backend, r.decision.algorithm, r.decision.fused]
    # The residual declared replicated (it is: every rank makes it from the
    # same seed): the same bits as the same call without the promise. The
    # size is one the policy runs as a fused two-shot (above the 256 KiB
    # one-shot total, within the site table's 256 KiB cap), where shm uses it.
    case += 1
    tokens = 96 if dtype == "fp32" else 200
    key = f"{dtype}-replicated-{tokens}"
    x = make(comm.rank, case, (tokens, HIDDEN), dtype)
    residual = make(77, case, (tokens, HIDDEN), dtype)
    plain = comm.allreduce_fusion(x, residual, weight, eps=1e-5)
    r = comm.allreduce_fusion(x, residual, weight, eps=1e-5, residual_replicated=True)
    if (r.decision.backend, r.decision.algorithm) != ("shm", "twoshot"):
        fail(f"{key}: ran {r.decision}, expected the shm two-shot")
    for name in ("residual_out", "norm_out"):
        got, want = getattr(r, name), getattr(plain, name)
        if not np.array_equal(got.view(np.uint8), want.view(np.uint8)):
            fail(f"{key}: {name} with residual_replicated=True differs from without")
    saved[key + "/x"], saved[key + "/residual"] = x, residual
    saved[key + "/norm_out"], saved[key + "/residual_out"] = r.norm_out, r.residual_out
    record[key] = [r.decision.backend, r.decision.algorithm, r.decision.fused]


def scenario_matrix(outdir: str) -> None:
    record, saved = {}, {}
    for dtype in DTYPES:
        with arbiter.Communicator.from_environment(
            hidden=HIDDEN, dtype=dtype, max_tokens=MAX_TOKENS, timeout=60
        ) as comm:
            if comm.backends != ["shm"]:
                fail(f"backends {comm.backends}, expected ['shm']")
            with arbiter.Policy.from_environment() as policy:
                if comm.fingerprint != policy.fingerprint:
                    fail("the communicator's fingerprint is not the policy's")
            record["world_size"] = comm.world_size
            run_cases(comm, dtype, record, saved, TOKENS)
    save(outdir, record, saved)


def scenario_oob(outdir: str) -> None:
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    folder = os.path.join(outdir, "group")
    os.makedirs(folder, exist_ok=True)
    group = FileGroup(folder, rank, size)
    record, saved = {}, {}
    with arbiter.Communicator(
        group, rank=rank, world_size=size, local_rank=int(os.environ["LOCAL_RANK"]),
        hidden=HIDDEN, dtype="bf16", max_tokens=MAX_TOKENS, timeout=60,
    ) as comm:
        if (comm.rank, comm.world_size) != (rank, size) or group.calls == 0:
            fail("the communicator did not meet its peers through the given group")
        record["world_size"] = size
        run_cases(comm, "bf16", record, saved, (2, 96))
    save(outdir, record, saved)


def wait_for_file(path: str, seconds: float = 60) -> None:
    """Until `path` exists (a peer's "done"), at most `seconds`."""
    deadline = time.monotonic() + seconds
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)


def expect_error(what: str, needle: str, call) -> None:
    try:
        call()
    except arbiter.ArbiterError as e:
        if e.status != arbiter.Status.INVALID_ARGUMENT or needle not in e.message:
            fail(f"{what}: got {e!r}, expected INVALID_ARGUMENT with {needle!r}")
        return
    fail(f"{what}: no error")


def scenario_bad(outdir: str) -> None:
    """Every rank makes the same bad calls: each raises at once, nobody waits,
    and the communicator still works afterwards."""
    t = 4
    with arbiter.Communicator.from_environment(
        hidden=HIDDEN, dtype="fp16", max_tokens=8, timeout=20
    ) as comm:
        x = make(comm.rank, 1, (t, HIDDEN), "fp16")
        res = make(7, 1, (t, HIDDEN), "fp16")
        w = make(9, 1, (HIDDEN,), "fp16")
        readonly = res.copy()
        readonly.flags.writeable = False
        started = time.monotonic()
        cases = [
            ("1-D input", "shape (512,)", lambda: comm.allreduce_fusion(x[0])),
            ("wrong hidden", "hidden 256", lambda: comm.allreduce_fusion(x[:, :256].copy())),
            ("wrong dtype", "element type fp32", lambda: comm.allreduce_fusion(
                x.astype(np.float32))),
            ("not contiguous", "not C-contiguous", lambda: comm.allreduce_fusion(
                np.asfortranarray(x))),
            ("too many tokens", "more than max_tokens=8", lambda: comm.allreduce_fusion(
                np.zeros((9, HIDDEN), np.float16))),
            ("not an array", "is not an array", lambda: comm.allreduce_fusion([[1.0] * HIDDEN])),
            ("read-only output", "read-only", lambda: comm.allreduce_fusion(
                x, res, w, out={"residual_out": readonly})),
            ("output shape", "shape (3, 512)", lambda: comm.allreduce_fusion(
                x, res, w, out={"norm_out": np.empty((3, HIDDEN), np.float16)})),
            ("unknown out key", "unknown keys", lambda: comm.allreduce_fusion(
                x, out={"sum": x})),
            ("norm without weight", "residual_rmsnorm needs weight", lambda: comm.allreduce_fusion(
                x, res)),
            ("fp8 without scale", "needs scale", lambda: comm.allreduce_fusion(
                x, res, w, pattern="residual_rmsnorm_fp8")),
            ("eps NaN", "eps nan", lambda: comm.allreduce_fusion(x, res, w, eps=float("nan"))),
            ("stream on host", "pass no stream", lambda: comm.allreduce_fusion(x, stream=7)),
            ("unknown pattern", "unknown pattern", lambda: comm.allreduce_fusion(
                x, pattern="softmax")),
            ("replicated not a bool", "must be True or False", lambda: comm.allreduce_fusion(
                x, res, w, residual_replicated="yes")),
        ]
        for what, needle, call in cases:
            expect_error(what, needle, call)
        # The aliasing rule of the backend ABI, checked locally before anyone waits.
        big = np.zeros((t + 1, HIDDEN), np.float16)
        big[:t] = x
        expect_error("partial overlap", "overlap", lambda: comm.allreduce_fusion(
            big[:t], res, w, out={"norm_out": big[1:]}))
        elapsed = time.monotonic() - started
        if elapsed > 5:
            fail(f"the bad calls took {elapsed:.1f} s: someone waited")
        r = comm.allreduce_fusion(x, res, w)
        if r.decision.backend != "shm" or r.norm_out.shape != (t, HIDDEN):
            fail(f"the good call after the bad ones: {r}")
        print(f"rank {comm.rank}: {len(cases) + 1} bad calls refused in {elapsed * 1000:.0f} ms",
              flush=True)
    with arbiter.Communicator.from_environment(hidden=HIDDEN, dtype="bf16", timeout=20) as comm:
        expect_error("bf16 given as float32", "bf16 as a uint16 array",
                     lambda: comm.allreduce_fusion(np.zeros((1, HIDDEN), np.float32)))


def scenario_raise(outdir: str) -> None:
    """Rank 1's first call is refused by the binding (a wrong shape) and
    rank 1 goes on, as a framework that catches the error would. It still
    joins that call to say so: rank 0's call raises MISMATCH at once, naming
    rank 1, instead of pairing with rank 1's next call; the next call is in
    step and exact on both ranks."""
    with arbiter.Communicator.from_environment(
        hidden=HIDDEN, dtype="fp32", max_tokens=8, timeout=20
    ) as comm:
        rng = np.random.default_rng(5)
        xs = [rng.standard_normal((4, HIDDEN)).astype(np.float32) for _ in range(2)]
        mine = xs[comm.rank]
        residual, weight = np.zeros_like(mine), np.ones(HIDDEN, np.float32)
        bad = comm.rank == 1
        # Besides the shape: numbers beyond any float, which the numpy fast
        # path met with an OverflowError that skipped the join (rank 0's
        # call then paired with rank 1's next one, and both "succeeded").
        for what, call in (
            ("shape", lambda: comm.allreduce_fusion(mine[:, :100].copy() if bad else mine)),
            ("eps", lambda: comm.allreduce_fusion(mine, residual, weight,
                                                  eps=10**400 if bad else 0.0)),
            ("weight_bias", lambda: comm.allreduce_fusion(mine, residual, weight,
                                                          weight_bias=10**400 if bad else 0.0)),
            ("scale", lambda: comm.allreduce_fusion(mine, residual, weight,
                                                    pattern="residual_rmsnorm_fp8",
                                                    scale=10**400 if bad else 1.0)),
        ):
            started = time.monotonic()
            try:
                call()
                fail(f"rank {comm.rank}'s call with a bad {what} succeeded")
            except arbiter.ArbiterError as e:
                elapsed = time.monotonic() - started
                print(f"rank {comm.rank}: {what}: {e.status.name} after {elapsed:.2f} s: "
                      f"{e.message}", flush=True)
                if comm.rank == 1 and e.status != arbiter.Status.INVALID_ARGUMENT:
                    fail(f"rank 1: expected its own INVALID_ARGUMENT, got {e!r}")
                if comm.rank == 0 and (e.status != arbiter.Status.MISMATCH or
                                       "rank 1 refused its call" not in e.message):
                    fail(f"rank 0: expected a MISMATCH naming rank 1, got {e!r}")
                if elapsed > 5:
                    fail(f"the refused call took {elapsed:.2f} s: someone waited")
            sums = [comm.allreduce_fusion(x).allreduce_out for x in (mine, 2 * mine)]
            for k, got in enumerate(sums):
                want = (k + 1) * xs[0] + (k + 1) * xs[1]
                if not np.array_equal(got, want):
                    fail(f"rank {comm.rank}: call {k + 1} after the refused {what} is not the "
                         "sum of both ranks' inputs of that call")
        print(f"rank {comm.rank}: in step after the refusals", flush=True)


def scenario_fingerprint(outdir: str) -> None:
    """Ranks with different tables are refused, on every rank."""
    if int(os.environ["RANK"]) == 1:
        site = os.path.join(outdir, "site.yaml")
        with open(site, "w") as f:
            f.write("format: 1\nfusion:\n  - {capability: cpu, world_size: 2, max: 1MiB}\n")
        os.environ["ARBITER_CONFIG"] = site
    try:
        arbiter.Communicator.from_environment(hidden=HIDDEN, dtype="bf16", timeout=20)
    except arbiter.ArbiterError as e:
        print(f"refused: {e.message}", flush=True)
        return
    fail("ranks with different tables got a communicator")


def scenario_registered(outdir: str) -> None:
    """Communicator.empty(): registered arrays give the bits of ordinary
    ones (one-shot and two-shot sizes), views crossing the end or of another
    communicator are refused, close() refuses while an array lives, and the
    memory is freed when the last view dies."""
    import gc

    with arbiter.Communicator.from_environment(
        hidden=HIDDEN, dtype="bf16", max_tokens=MAX_TOKENS, timeout=20
    ) as comm, arbiter.Communicator.from_environment(
        hidden=HIDDEN, dtype="bf16", max_tokens=8, timeout=20
    ) as other:
        x = comm.empty((MAX_TOKENS, HIDDEN))
        if x.dtype != np.uint16 or x.shape != (MAX_TOKENS, HIDDEN):
            fail(f"empty(): got {x.dtype} {x.shape}")
        res = make(7, 1, (MAX_TOKENS, HIDDEN), "bf16")
        w = make(9, 1, (HIDDEN,), "bf16")
        for t in (2, 96, MAX_TOKENS):
            plain = make(comm.rank, t, (t, HIDDEN), "bf16")
            x[:t] = plain
            a = comm.allreduce_fusion(plain, res[:t], w)
            b = comm.allreduce_fusion(x[:t], res[:t], w)
            for key in ("norm_out", "residual_out"):
                if not np.array_equal(getattr(a, key), getattr(b, key)):
                    fail(f"registered and ordinary {key} differ at {t} tokens")
        # The last token and one past the end of the allocation.
        crossing = np.lib.stride_tricks.as_strided(x[-1:], shape=(2, HIDDEN))
        expect_error("a view crossing the end", "crosses the end",
                     lambda: comm.allreduce_fusion(crossing))
        foreign = other.empty((4, HIDDEN))
        foreign[:] = 0
        expect_error("another communicator's array", "another communicator",
                     lambda: comm.allreduce_fusion(foreign))
        # A view keeps the allocation (crossing is one too): close() is refused
        # until every view dies.
        view = x[1:3]
        del x
        gc.collect()
        expect_error("close() with a live view", "still alive", comm.close)
        view[:] = make(comm.rank, 2, (2, HIDDEN), "bf16")  # still mapped
        comm.allreduce_fusion(view)
        del view, foreign, crossing
        gc.collect()
        if comm._registered or other._registered or comm._pending_frees:
            fail(f"allocations left: {comm._registered}, {other._registered}")
        # A shape refused on rank 1 alone: rank 0's empty() fails at once,
        # naming rank 1 (it waited out its timeout), and both go on.
        started = time.monotonic()
        try:
            comm.empty((0, HIDDEN) if comm.rank == 1 else (4, HIDDEN))
            fail(f"rank {comm.rank}: empty() with a shape refused on rank 1 succeeded")
        except arbiter.ArbiterError as e:
            want = "is not a tuple of positive integers" if comm.rank == 1 else \
                "rank 1 asked for 0 bytes"
            if want not in e.message:
                fail(f"rank {comm.rank}: empty() refused with {e!r}")
        if time.monotonic() - started > 5:
            fail(f"rank {comm.rank}: the refused empty() took {time.monotonic() - started:.1f} s")
        y = comm.empty((4, HIDDEN))
        y[:] = make(comm.rank, 4, (4, HIDDEN), "bf16")
        comm.allreduce_fusion(y)
        del y
        gc.collect()
    print("registered: OK", flush=True)


def scenario_refuse_alone(outdir: str) -> None:
    """Rank 1 refuses a call rank 0 never makes: joining it, rank 1 waits
    for rank 0 like any call, until the deadline, then raises TIMEOUT saying
    both; the communicator is unusable afterwards."""
    flag = os.path.join(outdir, "rank1-done")
    with arbiter.Communicator.from_environment(hidden=HIDDEN, dtype="fp32", timeout=2) as comm:
        if comm.rank == 0:
            wait_for_file(flag)
            print("rank 0: made no call", flush=True)
            return
        try:
            started = time.monotonic()
            try:
                comm.allreduce_fusion(np.zeros((4, 100), np.float32))
                fail("rank 1's bad call succeeded")
            except arbiter.ArbiterError as e:
                elapsed = time.monotonic() - started
                print(f"rank 1: {e.status.name} after {elapsed:.1f} s: {e.message}", flush=True)
                if (e.status != arbiter.Status.TIMEOUT or "x: hidden 100" not in e.message or
                        "; then joining call 0 (refused on this rank) to tell the peers "
                        "failed" not in e.message):
                    fail(f"expected a TIMEOUT after the refusal, got {e!r}")
                if not 1.5 < elapsed < 10:
                    fail(f"the join took {elapsed:.1f} s under a 2 s deadline")
            try:
                comm.allreduce_fusion(np.zeros((4, HIDDEN), np.float32))
                fail("a call after the failed join ran")
            except arbiter.ArbiterError as e:
                if e.status != arbiter.Status.TIMEOUT or "unusable" not in e.message:
                    fail(f"expected the fault again, got {e!r}")
        finally:
            open(flag, "w").close()


def scenario_abort_close(outdir: str) -> None:
    """A watchdog thread aborting while the main thread closes: abort() runs
    on a live communicator or does nothing (it crashed 2 runs in 2 here)."""
    import threading

    for _ in range(100):
        comm = arbiter.Communicator.from_environment(hidden=HIDDEN, dtype="fp32", timeout=20)
        t = threading.Thread(target=lambda: [comm.abort() for _ in range(20)])
        t.start()
        comm.close()
        t.join()
        comm.abort()  # after close: nothing to abort, no error
    print("abort/close: survived", flush=True)


def scenario_fork_join(outdir: str) -> None:
    """A forked child that calls from_environment again would talk on its
    parent's connections: refused at once in the child; the parent's group
    goes on working. A group of one shares no connections: the child may
    use its copy."""
    comm = arbiter.Communicator.from_environment(hidden=HIDDEN, dtype="fp32", timeout=20)
    rank = comm.rank
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        start = time.monotonic()
        try:
            own = arbiter.Communicator.from_environment(hidden=HIDDEN, dtype="fp32", timeout=20)
            got = own.allreduce_fusion(np.full((2, HIDDEN), 5.0, np.float32)).allreduce_out
            message = f"the child joined and ran: {got[0, 0]}"
        except arbiter.ArbiterError as e:
            message = f"{time.monotonic() - start:.2f} s: {e.message}"
        os.write(write, message.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = pipe.read()
    os.waitpid(pid, 0)
    print(f"fork/join: child of rank {rank}: {child}", flush=True)
    again = arbiter.Communicator.from_environment(hidden=HIDDEN, dtype="fp32", timeout=20)
    x = np.full((2, HIDDEN), rank + 1.0, np.float32)
    expected = sum(r + 1.0 for r in range(comm.world_size))
    for c in (comm, again):
        got = c.allreduce_fusion(x.copy()).allreduce_out
        if not np.array_equal(got, np.full_like(x, expected)):
            fail(f"rank {rank}: the parent's call after the fork gave {got[0, :4]}")
        c.close()
    print(f"fork/join: rank {rank} ran on", flush=True)


def save(outdir: str, record: dict, saved: dict) -> None:
    rank = int(os.environ["RANK"])
    np.savez(os.path.join(outdir, f"rank{rank}.npz"), **saved)
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    scenario, outdir = sys.argv[1], sys.argv[2]
    globals()["scenario_" + scenario](outdir)
