#!/usr/bin/env bash
# The pack's wheel on the GPU machine, as a pip user would have it: installs
# WHEEL (no registry there: --no-index --no-deps) into a venv that sees the
# machine's own torch and pytest (--system-site-packages; without the venv
# module, pip install --target), then, from a folder outside the checkout,
# with no ARBITER_LIBRARY, LD_LIBRARY_PATH or UCX_MODULE_DIR, and no
# PYTHONPATH but ARBITER_PYTEST_PATH's folder (pytest only, when set):
# arbiter --version, arbiter plugins (the GPU modules it carries and the
# libnccl.so.2 each finds), and the Python GPU tests (python/tests/test_gpu.py:
# one rank on CUDA tensors, two ranks on one GPU under the venv's arbiter
# launch) against the installed package.
#
#   scripts/device-wheel.sh WHEEL [PYTHON]      PYTHON: default python3
# scripts/device-check.sh --full --prebuilt PACK runs it on PACK/wheel/*.whl.
# Exit: pytest's status; 77 when PYTHON lacks torch or pytest, or torch sees no GPU.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
wheel=${1:?usage: scripts/device-wheel.sh WHEEL [PYTHON]}
python=${2:-python3}
wheel=$(cd "$(dirname "$wheel")" && pwd)/$(basename "$wheel")
[ -f "$wheel" ] || { echo "device-wheel: no wheel $wheel"; exit 1; }
# ARBITER_PYTEST_PATH: a folder holding pytest, for a python without it
# (device-check.sh sets it to the pack's python-libs/); nothing of arbiter.
if ! PYTHONPATH=${ARBITER_PYTEST_PATH:-} "$python" -c 'import torch, pytest' > /dev/null 2>&1; then
  echo "device-wheel: $python cannot import torch and pytest: nothing to test"
  exit 77
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/arbiter-device-wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT
unset PYTHONPATH ARBITER_LIBRARY ARBITER_PLUGIN_PATH LD_LIBRARY_PATH UCX_MODULE_DIR \
  ARBITER_CONFIG ARBITER_BACKENDS
export PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1
[ -n "${ARBITER_PYTEST_PATH:-}" ] && export PYTHONPATH=$ARBITER_PYTEST_PATH

echo "=== install $(basename "$wheel") with $("$python" --version 2>&1)"
if "$python" -m venv --system-site-packages "$work/venv" > "$work/venv.log" 2>&1; then
  "$work/venv/bin/python" -m pip install -q --no-index --no-deps "$wheel" || exit 1
  py=$work/venv/bin/python
  bin=$work/venv/bin
else
  echo "(no venv module: $(tail -n1 "$work/venv.log"); pip install --target instead)"
  "$python" -m pip install -q --no-index --no-deps --target "$work/site" "$wheel" || exit 1
  export PYTHONPATH=$work/site${PYTHONPATH:+:$PYTHONPATH}
  py=$python
  bin=$work/site/bin
fi
export PATH=$bin:$PATH
mkdir -p "$work/elsewhere" &&
  cp "$root"/python/tests/{conftest.py,test_gpu.py,gpu_worker.py,doc_blocks.py} "$work/elsewhere/"
# The doc whose CUDA block test_gpu.py runs (doc_blocks.py).
export ARBITER_INTEGRATION_DOC=$root/docs/integration.md
cd "$work/elsewhere" || exit 1
echo "=== arbiter --version; arbiter.__version__; the library"
arbiter --version || exit 1
"$py" -c 'import arbiter; print(arbiter.__version__, arbiter.library_path())' || exit 1
echo "=== arbiter plugins"
arbiter plugins || exit 1
echo "=== pytest test_gpu.py against the installed package"
ARBITER_BIN=$bin/arbiter "$py" -m pytest -q -rs -p no:cacheprovider test_gpu.py
rc=$?
# 5: nothing ran (the module skipped itself: no torch or no CUDA device here).
((rc == 5)) && exit 77
exit $rc
