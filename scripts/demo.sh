#!/usr/bin/env bash
# Sets up, builds, and runs the main job on the embedded default tables: the
# effective tables, then the world-size-16 GB300 NVL72 decision explained.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh > /dev/null
arbiter="${BUILD_DIR:-build}/bin/arbiter"
"$arbiter" show
echo
echo "\$ arbiter decide --capability 10.3 --world-size 16 --nodes 4 --nvlink-domain --multicast --bytes 64MiB --explain"
"$arbiter" decide --capability 10.3 --world-size 16 --nodes 4 --nvlink-domain --multicast \
  --bytes 64MiB --explain
echo
echo "\$ arbiter sweep --capability 10.3 --world-size 16 --nodes 4 --nvlink-domain --multicast"
"$arbiter" sweep --capability 10.3 --world-size 16 --nodes 4 --nvlink-domain --multicast
echo
echo "\$ arbiter plugins"
"$arbiter" plugins
echo
echo "\$ arbiter launch --nproc 4 -- arbiter-example-fused"
"$arbiter" launch --nproc 4 --timeout 300 -- "${BUILD_DIR:-build}/bin/arbiter-example-fused"
