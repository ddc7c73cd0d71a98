#!/usr/bin/env bash
# Sets up, builds what it runs, and runs the main job on the embedded default
# tables: the effective tables, the world-size-16 GB300 NVL72 decision
# explained, fused all-reduce on 4 CPU ranks from C++, and a tensor-parallel
# model on 2 CPU ranks from Python. Builds only the `arbiter` program first
# (the tables show as soon as it links), then the shm module and the C++
# example; `scripts/test.sh` builds the rest into the same folder.
set -euo pipefail
cd "$(dirname "$0")/.."
ARBITER_TORCH=0 scripts/setup.sh  # the demo needs no torch (its tests do)
build="${BUILD_DIR:-build}"
jobs="$(nproc)"
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release > /dev/null
fi
cmake --build "$build" -j"$jobs" --target arbiter > /dev/null
arbiter="$build/bin/arbiter"
"$arbiter" show
echo
echo "\$ arbiter decide --capability 10.3 --world-size 16 --nodes 4 --nvlink-domain --multicast --bytes 64MiB --explain"
"$arbiter" decide --capability 10.3 --world-size 16 --nodes 4 --nvlink-domain --multicast \
  --bytes 64MiB --explain
echo
echo "\$ arbiter sweep --capability 10.3 --world-size 16 --nodes 4 --nvlink-domain --multicast"
"$arbiter" sweep --capability 10.3 --world-size 16 --nodes 4 --nvlink-domain --multicast
cmake --build "$build" -j"$jobs" --target arbiter-shm arbiter-example-fused > /dev/null
echo
echo "\$ arbiter plugins"
"$arbiter" plugins
echo
echo "\$ arbiter launch --nproc 4 -- arbiter-example-fused"
"$arbiter" launch --nproc 4 --timeout 300 -- "$build/bin/arbiter-example-fused"
echo
echo "\$ arbiter launch --nproc 2 -- python3 examples/python/tp_decode.py"
# The package from the source tree, with the library just built.
ARBITER_LIBRARY="$(cd "$build" && pwd)/lib" PYTHONPATH="$PWD/python" \
  "$arbiter" launch --nproc 2 --timeout 300 -- /usr/bin/python3 examples/python/tp_decode.py
