"""One rank of test_faults.py, started by hand with torchrun's variables (no
launcher, which would stop the survivors), as issue 32 tried it:

    Communicator.from_environment(hidden=1024, dtype="fp32", max_tokens=64, timeout=20)

    python3 faults_worker.py SCENARIO OUTDIR

Scenarios:
  kill      100 good calls; then the last rank SIGKILLs itself; the survivors
            time their failing call, the next one and close(), then make a
            new communicator over their own group (a caller oob) and run it
  abort     rank 0 aborts from a thread 0.3 s into a call the last rank joins
            1.5 s late
  interrupt rank 0 gets SIGINT (Ctrl-C): with a handler of its own during a
            call (left alone); between calls, caught (the next call works);
            0.3 s into a call the last rank joins 3 s late (KeyboardInterrupt
            at once, and the last rank's call fails naming rank 0)
  mismatch  calls that differ on the last rank (tokens, eps, residual given on
            one rank only, an output given on one rank only), each followed by
            a matching call

Each rank writes OUTDIR/rank<r>.json with what it saw.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import numpy as np

import arbiter

HIDDEN = 1024


class FileGroup:
    """The survivors' own group: allgather through files in a shared folder."""

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


def call(comm, rank: int, n: int, tokens: int = 8) -> None:
    """One exact all-reduce: rank r adds r + 1 + n."""
    x = np.full((tokens, HIDDEN), rank + 1 + n, dtype=np.float32)
    out = comm.allreduce_fusion(x).allreduce_out
    size = comm.world_size
    expected = size * (size + 1) / 2 + size * n
    if not np.all(out == expected):
        raise AssertionError(f"call {n}: got {out.flat[0]}, expected {expected}")


def failure(run) -> dict:
    started = time.monotonic()
    try:
        run()
    except arbiter.ArbiterError as e:
        return {"status": int(e.status), "message": e.message,
                "seconds": time.monotonic() - started}
    return {"status": 0, "message": "", "seconds": time.monotonic() - started}


def scenario_kill(outdir: str, rank: int, size: int, record: dict) -> None:
    comm = arbiter.Communicator.from_environment(hidden=HIDDEN, dtype="fp32", max_tokens=64,
                                                 timeout=20)
    for n in range(100):
        call(comm, rank, n)
    if rank == size - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    record["failed"] = failure(lambda: call(comm, rank, 100))
    record["next"] = failure(lambda: call(comm, rank, 101))
    started = time.monotonic()
    comm.close()
    record["close_seconds"] = time.monotonic() - started
    group = FileGroup(os.path.join(outdir, "survivors"), rank, size - 1)
    with arbiter.Communicator(group, rank=rank, world_size=size - 1, hidden=HIDDEN, dtype="fp32",
                              max_tokens=64, timeout=20) as survivors:
        for n in range(20):
            call(survivors, rank, n)
    record["survivors"] = "ok"


def scenario_abort(outdir: str, rank: int, size: int, record: dict) -> None:
    comm = arbiter.Communicator.from_environment(hidden=HIDDEN, dtype="fp32", max_tokens=64,
                                                 timeout=20)
    for n in range(10):
        call(comm, rank, n)
    if rank == size - 1:
        time.sleep(1.5)
    if rank == 0:
        def abort():
            record["abort_at"] = time.monotonic()
            comm.abort()

        threading.Timer(0.3, abort).start()
    record["failed"] = failure(lambda: call(comm, rank, 10))
    record["returned_at"] = time.monotonic()
    record["next"] = failure(lambda: call(comm, rank, 11))
    comm.abort()  # harmless again, and on every rank
    started = time.monotonic()
    comm.close()
    record["close_seconds"] = time.monotonic() - started


def scenario_interrupt(outdir: str, rank: int, size: int, record: dict) -> None:
    # As at a terminal: a job started in the background of a script inherits
    # SIGINT ignored, and Python then leaves it so.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    comm = arbiter.Communicator.from_environment(hidden=HIDDEN, dtype="fp32", max_tokens=64,
                                                 timeout=20)
    for n in range(10):
        call(comm, rank, n)
    sigint = lambda: os.kill(os.getpid(), signal.SIGINT)  # noqa: E731
    # 1. A handler of the program's own: it decides; the call is left alone.
    if rank == 0:
        handled = []
        previous = signal.signal(signal.SIGINT, lambda *_: handled.append(1))
        threading.Timer(0.3, sigint).start()
        record["handler"] = failure(lambda: call(comm, rank, 10))
        record["handler_ran"] = bool(handled)
        signal.signal(signal.SIGINT, previous)
    else:
        time.sleep(1.0)
        record["handler"] = failure(lambda: call(comm, rank, 10))
    # 2. Ctrl-C between calls, caught: the next call is not aborted.
    if rank == 0:
        threading.Timer(0.2, sigint).start()
        try:
            time.sleep(1.0)
            record["between"] = "no KeyboardInterrupt"
        except KeyboardInterrupt:
            record["between"] = "caught"
    else:
        time.sleep(1.5)
    record["after_between"] = failure(lambda: call(comm, rank, 11))
    # 3. Ctrl-C while the call waits on a peer 3 s late.
    if rank == size - 1:
        time.sleep(3)
    if rank == 0:
        def interrupt():
            record["signal_at"] = time.monotonic()
            sigint()

        threading.Timer(0.3, interrupt).start()
        try:
            call(comm, rank, 12)
            record["interrupted"] = "the call returned"
        except KeyboardInterrupt:
            record["interrupted"] = "KeyboardInterrupt"
        record["returned_at"] = time.monotonic()
    else:
        record["failed"] = failure(lambda: call(comm, rank, 12))
    started = time.monotonic()
    comm.close()
    record["close_seconds"] = time.monotonic() - started


def scenario_mismatch(outdir: str, rank: int, size: int, record: dict) -> None:
    comm = arbiter.Communicator.from_environment(hidden=HIDDEN, dtype="fp32", max_tokens=64,
                                                 timeout=20)
    odd = rank == size - 1
    x = np.full((8, HIDDEN), 1.0, dtype=np.float32)
    residual = np.full((8, HIDDEN), 0.5, dtype=np.float32)
    weight = np.ones(HIDDEN, dtype=np.float32)
    cases = {
        "tokens": lambda: comm.allreduce_fusion(x[:4] if odd else x),
        "eps": lambda: comm.allreduce_fusion(x, residual, weight, eps=1e-2 if odd else 1e-6),
        "residual on one rank only": lambda: (comm.allreduce_fusion(x) if odd else
                                              comm.allreduce_fusion(x, residual, weight)),
        "an output on one rank only": lambda: comm.allreduce_fusion(
            x, residual, weight, out={"residual_out": None} if odd else None),
    }
    for n, (name, run) in enumerate(cases.items()):
        record[name] = failure(run)
        record[name + ": next"] = failure(lambda: call(comm, rank, n))
    comm.close()


def main() -> None:
    scenario, outdir = sys.argv[1], sys.argv[2]
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    record: dict = {}
    try:
        globals()["scenario_" + scenario](outdir, rank, size, record)
    except Exception as e:  # recorded for the test to show
        record["exception"] = f"{type(e).__name__}: {e}"
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main()
