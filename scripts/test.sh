#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine, builds everything and runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
export BOOST_TEST_COLOR_OUTPUT=no
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j"$(nproc)"
scripts/test-install.sh   # install into a temporary prefix; consumers: CMake, pkg-config, Python
scripts/test-wheel.sh     # pip's wheel (CPU) from a clean clone, in a fresh venv, system libraries hidden
scripts/test-hardening.sh  # clang: libFuzzer targets, ctest -L cpu under ASan+UBSan, TSan
