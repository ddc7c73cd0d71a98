"""The PyTorch section of docs/integration.md runs as written: its blocks
marked `<!-- test: cpu -->`, in order, as one program on 2 CPU ranks under
`arbiter launch` (a gloo group, the shm backend). The block marked
`<!-- test: cuda -->` runs in test_gpu.py, on a GPU machine.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from doc_blocks import doc_program  # noqa: E402
from test_communicator import launch  # noqa: E402


def test_the_cpu_blocks_of_the_pytorch_section_run_on_2_ranks(arbiter_bin, tmp_path):
    program = tmp_path / "pytorch_section.py"
    program.write_text(doc_program("cpu"))
    code, log = launch(arbiter_bin, tmp_path, 2, None, site=False, program=[str(program)])
    assert code == 0, log
    for rank in (0, 1):  # both decisions printed: eager, then after the compiled model
        assert log.count(f"[rank {rank}] Decision(backend='shm', algorithm='oneshot', "
                         "fused=True") == 2, log
