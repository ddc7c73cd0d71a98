#!/usr/bin/env bash
# Rewrites every command transcript in the markdown from what the program
# prints now on the embedded default tables (after a change to
# configs/default.yaml or to the program's output), and the default tables'
# fingerprint in recorded runs. Builds the `arbiter` program into
# ${BUILD_DIR:-build} first. Review the diff: it is the docs' new text.
#   scripts/regen-doc-transcripts.sh [FILE.md ...]   (default: every .md of the tree)
set -euo pipefail
cd "$(dirname "$0")/.."
build="${BUILD_DIR:-build}"
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release > /dev/null
fi
cmake --build "$build" -j"$(nproc)" --target arbiter > /dev/null
python3 scripts/doc_transcripts.py write --arbiter "$build/bin/arbiter" "$@"
python3 scripts/doc_transcripts.py check --arbiter "$build/bin/arbiter" "$@"
