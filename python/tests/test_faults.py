"""Faults through the Python binding, as issue 32 tried them: CPU ranks
started by hand with torchrun's variables (no launcher, so nothing stops the
survivors), Communicator.from_environment(hidden=1024, dtype="fp32",
max_tokens=64, timeout=20), the shm backend.

- a rank SIGKILLed between calls is named within a second (it took the whole
  20 s timeout, naming the wrong rank), the next call fails at once, close()
  is prompt, nothing is left in /dev/shm, and the survivors' new communicator
  over their own group runs exactly;
- Communicator.abort() from another thread returns the waiting call within
  100 ms (ABORTED) and its peers' (PEER_FAILED, naming the rank);
- calls that differ across ranks (tokens, eps, residual or an output given on
  one rank only) raise MISMATCH on every rank, and the next call runs.

Each rank is faults_worker.py.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import uuid

import pytest

import arbiter
from arbiter.errors import Status

pytest.importorskip("numpy")

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "faults_worker.py")
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(arbiter.__file__)))
# "At once": far below the workers' 20 s deadline, so a call that waited on a
# peer still fails the check, and above the stalls a busy 2-core host gives.
AT_ONCE = 0.5


def free_port() -> int:
    """A free port below the kernel's ephemeral range, as `arbiter launch`
    picks (arbiter::free_bootstrap_port): a port the kernel picked may be
    taken by an outgoing connection before rank 0 listens on it."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    candidates = list(range(10000, low)) if low > 10001 else []
    for port in random.SystemRandom().sample(candidates, min(64, len(candidates))):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shm_objects() -> set:
    return {n for n in os.listdir("/dev/shm") if n.startswith("arbiter-shm-")}


def start(tmp_path, nproc: int, scenario: str) -> list[dict]:
    """Runs the worker as `nproc` ranks by hand; returns each rank's record."""
    (tmp_path / "survivors").mkdir()
    env = dict(os.environ)
    env.update(
        PYTHONPATH=PACKAGE_PARENT + os.pathsep + env.get("PYTHONPATH", ""),
        PYTHONDONTWRITEBYTECODE="1", WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()), ARBITER_JOB_TOKEN=uuid.uuid4().hex,
        UCX_TLS="tcp,self", UCX_NET_DEVICES="lo",
    )
    for name in ("ARBITER_CONFIG", "ARBITER_BACKENDS", "ARBITER_CHECK_CALLS",
                 "ARBITER_TEST_FAULT", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        env.pop(name, None)
    ranks = []
    for r in range(nproc):
        ranks.append(subprocess.Popen(
            [sys.executable, WORKER, scenario, str(tmp_path)],
            # No LOCAL_RANK: CPU ranks started by hand need none.
            env=dict(env, RANK=str(r)),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [p.communicate(timeout=120)[0] for p in ranks]
    records = []
    for r in range(nproc):
        path = tmp_path / f"rank{r}.json"
        records.append(dict(json.loads(path.read_text()), output=outputs[r]) if path.exists()
                       else {"missing": outputs[r], "returncode": ranks[r].returncode})
    return records


def test_a_rank_killed_between_calls_is_named_within_a_second(tmp_path):
    before = shm_objects()
    records = start(tmp_path, 3, "kill")
    assert "missing" in records[2], "the killed rank wrote a record"
    for r in (0, 1):
        rec = records[r]
        assert "exception" not in rec, rec
        failed = rec["failed"]
        assert failed["status"] == Status.PEER_FAILED, rec
        assert "rank 2 died" in failed["message"], failed
        assert failed["seconds"] <= 1.0, failed
        assert rec["next"]["status"] == Status.PEER_FAILED and rec["next"]["seconds"] < AT_ONCE, rec
        assert rec["close_seconds"] < 0.5, rec
        assert rec["survivors"] == "ok", rec
    assert shm_objects() <= before


def test_abort_from_another_thread_returns_the_call_and_its_peers(tmp_path):
    before = shm_objects()
    records = start(tmp_path, 3, "abort")
    for rec in records:
        assert "exception" not in rec, rec
    aborted = records[0]["abort_at"]
    assert records[0]["failed"]["status"] == Status.ABORTED, records[0]
    assert records[0]["returned_at"] - aborted <= AT_ONCE, records[0]
    assert records[1]["failed"]["status"] == Status.PEER_FAILED, records[1]
    assert "rank 0 aborted" in records[1]["failed"]["message"], records[1]
    assert records[1]["returned_at"] - aborted <= 1.0, records[1]
    assert records[2]["failed"]["status"] == Status.PEER_FAILED, records[2]
    for rec in records:
        assert rec["next"]["status"] != 0 and rec["next"]["seconds"] < AT_ONCE, rec
        assert rec["close_seconds"] < 0.5, rec
    assert shm_objects() <= before


def test_ctrl_c_during_a_waiting_call_raises_keyboard_interrupt_at_once(tmp_path):
    # Python raises KeyboardInterrupt only between bytecodes: the call used to
    # wait for the late rank (3 s here; its deadline when a peer hangs).
    before = shm_objects()
    records = start(tmp_path, 2, "interrupt")
    for rec in records:
        assert "exception" not in rec, rec
    r0, r1 = records
    # A handler of the program's own decides for itself; a Ctrl-C caught
    # between calls leaves the communicator alone.
    assert r0["handler_ran"] and r0["handler"]["status"] == 0, r0
    assert r1["handler"]["status"] == 0, r1
    assert r0["between"] == "caught", r0
    assert r0["after_between"]["status"] == 0 and r1["after_between"]["status"] == 0, records
    assert r0["interrupted"] == "KeyboardInterrupt", r0
    assert r0["returned_at"] - r0["signal_at"] <= 0.5, r0
    assert "arbiter: Ctrl-C while rank 0's call waited on its peers" in r0["output"], r0
    assert r1["failed"]["status"] == Status.PEER_FAILED, r1
    assert "rank 0 aborted" in r1["failed"]["message"], r1
    assert r1["failed"]["seconds"] < 0.5, r1
    assert r0["close_seconds"] < 0.5 and r1["close_seconds"] < 0.5, records
    assert shm_objects() <= before


@pytest.mark.parametrize("nproc", [2, 3])
def test_calls_that_differ_across_ranks_raise_mismatch_on_every_rank(tmp_path, nproc):
    records = start(tmp_path, nproc, "mismatch")
    fields = {"tokens": "in tokens: ", "eps": "in eps: ", "residual on one rank only":
              "in pattern: ", "an output on one rank only": "in the buffers given: "}
    for r, rec in enumerate(records):
        assert "exception" not in rec, rec
        for case, field in fields.items():
            assert rec[case]["status"] == Status.MISMATCH, (r, case, rec[case])
            assert field in rec[case]["message"], (r, case, rec[case])
            assert f"rank {nproc - 1}" in rec[case]["message"], (r, case, rec[case])
            assert rec[case + ": next"]["status"] == 0, (r, case, rec[case + ": next"])
