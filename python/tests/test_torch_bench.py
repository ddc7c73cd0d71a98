"""The host-cost benchmarks of bench/python run, check their results and
print every row (tiny sizes and counts: the figures mean nothing here; the
device check and the note run them at full size)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "bench",
                     "python")


def run(args, env=None):
    done = subprocess.run([sys.executable] + args, capture_output=True, text=True, timeout=300,
                          env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def rows(output: str) -> dict:
    return {line.split()[0]: line.split()[1:] for line in output.splitlines()
            if line and not line.startswith("#")}


def test_host_cost_on_cpu_tensors_prints_every_method_against_rms_norm():
    out = run([os.path.join(BENCH, "host_cost.py"), "--hidden", "256", "--runs", "5",
               "--repeats", "1", "--calls", "20"])
    table = rows(out)
    assert set(table) >= {"rms_norm", "eager", "op", "dlpack", "c_call", "numpy"}, out
    assert table["rms_norm"][3].startswith("1.00"), out  # the ratio column's base


def test_host_cost_shm_compares_2_python_ranks_with_cpp(arbiter_bin):
    env = dict(os.environ, ARBITER_BIN=os.path.abspath(arbiter_bin))
    out = run([os.path.join(BENCH, "host_cost_shm.py"), "--hidden", "512", "--runs", "5",
               "--trials", "3", "--calls", "20"], env=env)
    assert set(rows(out)) >= {"cpp", "c_call", "torch_eager", "torch_op", "numpy"}, out
