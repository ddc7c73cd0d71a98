"""Fixtures for the binding's tests.

The library comes from ARBITER_LIBRARY (scripts/test-install.sh points it into
an installed prefix) or the binding's own search. Tests that compare with the
`arbiter` program use ARBITER_BIN, else `arbiter` on PATH, else skip.
"""

from __future__ import annotations

import os
import shutil
import sys

import pytest

try:
    import arbiter
except ImportError:  # not on PYTHONPATH: the package beside these tests
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
    import arbiter


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    """Every test starts from the embedded defaults, whatever the caller's shell set."""
    monkeypatch.delenv("ARBITER_CONFIG", raising=False)
    monkeypatch.delenv("ARBITER_BACKENDS", raising=False)


@pytest.fixture(scope="session")
def defaults():
    with arbiter.load() as policy:
        yield policy


@pytest.fixture()
def site_file(tmp_path):
    """A GB300 NVL72 site table: ws=16 on 4 nodes fused only up to 8 MiB."""
    path = tmp_path / "site.yaml"
    path.write_text(
        "# site.yaml\n"
        "format: 1\n"
        "fusion:\n"
        "  - {capability: 103, world_size: 16, nodes: 4, max: 8MiB}\n"
    )
    return path


@pytest.fixture(scope="session")
def arbiter_bin():
    path = os.environ.get("ARBITER_BIN") or shutil.which("arbiter")
    if not path or not os.access(path, os.X_OK):
        pytest.skip("no arbiter program (set ARBITER_BIN)")
    return path
