#!/usr/bin/env bash
# Installs what arbiter builds with on Debian 12: yaml-cpp, Boost.Test,
# Boost.Program_options, UCX, CMake and a C++20 compiler; numpy for the
# Python example and tests; clang and pytest for the tests; python3-venv for
# the wheel's test (scripts/test-wheel.sh); torch in a venv for the PyTorch
# tests (below). Skips apt when everything is already there.
set -euo pipefail
packages=(cmake g++ make libyaml-cpp-dev libboost-test-dev libboost-program-options-dev
          libucx-dev ucx-utils pkg-config python3-pytest python3-numpy
          clang libclang-rt-14-dev llvm python3-yaml python3-jsonschema python3-venv)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# torch for the PyTorch tests (python/tests/test_torch*.py, run by
# scripts/test-install.sh): the version the GPU machine has, from PyPI, in a
# venv that also sees Debian's numpy and pytest. About 5 GB with the CUDA
# libraries it needs to import, also on a machine without a GPU. Kept when
# that version is already there; ARBITER_TORCH=0 skips it.
torch_version=2.11.0
torch_venv=${ARBITER_TORCH_VENV:-/opt/arbiter-torch}
if [ "${ARBITER_TORCH:-1}" != 0 ] &&
   ! "$torch_venv/bin/python" -c "import sys, torch
sys.exit(torch.__version__.split('+')[0] != '$torch_version')" 2> /dev/null; then
  echo "setup: installing torch $torch_version into $torch_venv" >&2
  /usr/bin/python3 -m venv --system-site-packages "$torch_venv"
  "$torch_venv/bin/pip" install --quiet --progress-bar off --no-cache-dir \
    "torch==$torch_version"
fi
