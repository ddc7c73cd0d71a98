#!/usr/bin/env bash
# ctest's python_gpu_test: test_gpu.py under the first interpreter that has
# torch and pytest (ARBITER_PYTHON, then the torch environment scripts/setup.sh
# makes, ARBITER_TORCH_VENV or /opt/arbiter-torch, then python3 on PATH, then
# /usr/bin/python3). Exit 77 (ctest: skipped) without such an interpreter or
# without a CUDA device; otherwise pytest's status.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
python=""
venv=${ARBITER_TORCH_VENV:-/opt/arbiter-torch}
for candidate in "${ARBITER_PYTHON:-}" "$venv/bin/python" python3 /usr/bin/python3; do
  [ -n "$candidate" ] || continue
  if "$candidate" -c 'import torch, pytest' >/dev/null 2>&1; then
    python=$candidate
    break
  fi
done
if [ -z "$python" ]; then
  echo "arbiter-gpu-skip: no python3 with torch and pytest (set ARBITER_PYTHON)"
  exit 77
fi
if ! "$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "arbiter-gpu-skip: torch sees no CUDA device"
  exit 77
fi
export PYTHONPATH="$here/..${PYTHONPATH:+:$PYTHONPATH}"
exec "$python" -m pytest -q -rs -p no:cacheprovider "$here/test_gpu.py"
