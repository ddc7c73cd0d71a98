"""torch tensors on 2 CPU ranks (the shm backend) under `arbiter launch`: the
fast path, the op, DLPack and numpy write the same bits at every dtype,
pattern and size (fused one-shot, two-shot, fallback), within rounding of
fp64 and equal across ranks; a gloo group carries the creation through
Communicator.from_process_group, and its timeout bounds the calls.

Each rank runs torch_worker.py; skipped without torch.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("torch")

from test_communicator import check_ranks, launch  # noqa: E402

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_worker.py")


def run(arbiter_bin, tmp_path, scenario, nproc=2, site=True):
    return launch(arbiter_bin, tmp_path, nproc, None, site=site,
                  program=[WORKER, scenario, str(tmp_path)])


def test_every_way_in_writes_the_same_bits_at_every_dtype_pattern_and_size(
    arbiter_bin, tmp_path
):
    code, log = run(arbiter_bin, tmp_path, "paths")
    assert code == 0, log
    record = check_ranks(tmp_path, 2)
    kinds = {tuple(v) for k, v in record.items() if k != "world_size"}
    assert {("shm", "oneshot", True), ("shm", "twoshot", True),
            ("shm", "native", False)} <= kinds, kinds


def test_a_gloo_group_carries_the_creation_through_from_process_group(arbiter_bin, tmp_path):
    code, log = run(arbiter_bin, tmp_path, "group")
    assert code == 0, log
    check_ranks(tmp_path, 2)


def test_the_groups_timeout_bounds_a_call_a_rank_stays_out_of(arbiter_bin, tmp_path):
    code, log = run(arbiter_bin, tmp_path, "group_timeout", site=False)
    assert code == 0, log
    assert "rank 0: TIMEOUT" in log and "rank 1: stayed out of the call" in log, log


def test_arbiter_torch_empty_gives_registered_tensors_read_in_place(arbiter_bin, tmp_path):
    code, log = run(arbiter_bin, tmp_path, "registered")
    assert code == 0, log
    assert log.count("registered: OK") == 2, log


def test_a_call_refused_on_one_rank_through_the_tensor_paths_is_joined(arbiter_bin, tmp_path):
    code, log = run(arbiter_bin, tmp_path, "refusals")
    assert code == 0, log
    assert log.count("refusals joined") == 2, log


@pytest.mark.parametrize("scenario", ["arbiter_then_gloo", "gloo_then_arbiter"])
def test_from_environment_and_a_gloo_group_live_side_by_side(arbiter_bin, tmp_path, scenario):
    # torch's store holds MASTER_PORT while it lives; `arbiter launch` gives
    # arbiter's bootstrap a port of its own, so either may come first.
    code, log = run(arbiter_bin, tmp_path, scenario)
    assert code == 0, log
    assert log.count("both groups OK") == 2, log
