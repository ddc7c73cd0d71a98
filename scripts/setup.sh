#!/usr/bin/env bash
# Installs what arbiter builds with on Debian 12: yaml-cpp, Boost.Test,
# Boost.Program_options, UCX, CMake and a C++20 compiler; numpy for the
# Python example and tests; clang and pytest for the tests; python3-venv for
# the wheel's test (scripts/test-wheel.sh). Skips apt when
# everything is already there.
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
