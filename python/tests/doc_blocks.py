"""The python blocks of docs/integration.md marked `<!-- test: KIND -->`, for
the tests that run them (test_torch_docs.py on CPU ranks, test_gpu.py on a
GPU). No test imports beyond the standard library, so that a copy of this
file runs beside test_gpu.py against an installed wheel
(scripts/device-wheel.sh), with ARBITER_INTEGRATION_DOC naming the doc.
"""

from __future__ import annotations

import os
import re

DOC = os.environ.get("ARBITER_INTEGRATION_DOC") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "docs", "integration.md")


def doc_program(kind: str) -> str:
    """The doc's python blocks marked `<!-- test: kind -->`, joined in order."""
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    blocks = re.findall(r"<!-- test: (\w+) -->\n```python\n(.*?)```", text, re.S)
    program = "\n".join(code for marker, code in blocks if marker == kind)
    assert program, f"no block marked test: {kind} in {DOC}"
    return program
