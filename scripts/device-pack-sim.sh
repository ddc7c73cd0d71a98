#!/usr/bin/env bash
# Device pack, simulated: runs a pack made by scripts/device-pack.sh the way
# the GPU machine will, on this (build) machine, as far as it can go without a
# GPU. Needs root (a private mount namespace: unshare -m).
#
#   scripts/device-pack-sim.sh [--pack DIR] [--sim DIR] [--fake-gpu]
#
# It copies what the device tool sends (tracked files, untracked files that
# git does not ignore, and the pack) into SIM/root, then, in a mount namespace
# of its own:
#   - hides the repository's parent folder under an empty tmpfs, so that the
#     paths the pack records do not exist (as on the device) and
#     device-check.sh must link them;
#   - hides this machine's copy of every library the pack gathered (a bind
#     mount of /dev/null over each file: loading it would fail) and UCX's
#     module folder, as a bare CUDA image lacks them;
#   - hides Debian's pytest (python3 cannot import it), as a GPU image with
#     torch may lack it: the check must use the pack's python-libs/;
#   - gives the namespace a /dev/shm of its own (the shm tests count the files
#     there; other builds' tests on this machine would change the count);
# and runs there:
#   1. scripts/device-check.sh --full --prebuilt PACK (no GPU: the pack check,
#      then exit 77; --fake-gpu puts an nvidia-smi that names an H200 first on
#      PATH, so that every GPU step runs and its report is written: the GPU
#      tests and the benchmark then find no CUDA device and skip or fail);
#   2. with the same links: a control (`arbiter show` without the pack's
#      libraries must fail), then `arbiter show`, `arbiter plugins`, 2 ranks of
#      arbiter-example-fused (CPU, shm) under `arbiter launch` with
#      LD_DEBUG=libs (which file each library came from), and the CPU tests
#      that go through the launcher, the UCX bootstrap and shm
#      (ctest -L cpu -R 'launch|communicator|example').
# Output: SIM/out (device-check's folder) and SIM/*.log. Exit: 0 when every
# part did what it should (device-check: 77 without --fake-gpu).
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
pack=$root/build-device-pack
sim=/tmp/arbiter-device-sim
fake_gpu=0
usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; }
while (($#)); do
  case "$1" in
    --pack) pack=${2:?--pack needs a folder}; shift ;;
    --sim) sim=${2:?--sim needs a folder}; shift ;;
    --fake-gpu) fake_gpu=1 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "device-pack-sim: unknown option $1" >&2; usage; exit 2 ;;
  esac
  shift
done
say() { echo "device-pack-sim: $*" >&2; }
[ "$(id -u)" = 0 ] || { say "needs root (mount namespace)"; exit 2; }
[ -f "$pack/PACK_INFO" ] || { say "$pack holds no PACK_INFO: run scripts/device-pack.sh first"; exit 2; }
pack=$(cd "$pack" && pwd)
[[ $pack == "$root"/* ]] || { say "$pack is not inside $root: the device tool could not carry it"; exit 2; }
source_root=$(sed -n 's/^source_root=//p' "$pack/PACK_INFO")
hide=$(dirname "$source_root")
case $sim in
  "$hide"/* | "$hide") say "--sim $sim lies under $hide, which the simulation hides"; exit 2 ;;
esac
case $hide in
  / | /usr | /usr/* | /lib* | /tmp | /proc* | /dev* | /etc*)
    say "the pack's source root $source_root lies in $hide, which cannot be hidden safely"; exit 2 ;;
esac

# ------------------------------------------------------------ what the tool sends
rm -rf "$sim" && mkdir -p "$sim/root" "$sim/out" || exit 2
(cd "$root" && { git ls-files -z; git ls-files -z -o --exclude-standard; } |
  xargs -0 -r cp -a --parents -t "$sim/root") || { say "copying the source failed"; exit 1; }
cp -a "$pack" "$sim/root/" || { say "copying the pack failed"; exit 1; }
carried=$sim/root/$(basename "$pack")
say "device tree: $(du -sb "$sim/root" | awk '{ printf "%.1f MiB", $1 / 1048576 }') in $sim/root"

# The system's copies of the gathered libraries (real files, /lib is /usr/lib).
hidden=()
for lib in "$carried"/device-libs/*.so* "$carried"/device-libs/ucx/*.so*; do
  name=$(basename "$lib")
  for dir in /usr/lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu/ucx /usr/lib /usr/local/lib; do
    [ -e "$dir/$name" ] && hidden+=("$(readlink -f "$dir/$name")")
  done
done
mapfile -t hidden < <(printf '%s\n' "${hidden[@]}" | sort -u)
say "hiding ${#hidden[@]} system library files and /usr/lib/x86_64-linux-gnu/ucx; $hide under a tmpfs"

if ((fake_gpu)); then
  mkdir -p "$sim/fake-bin"
  cat >"$sim/fake-bin/nvidia-smi" <<'EOF'
#!/bin/sh
# A stand-in for the GPU machine's nvidia-smi (device-pack-sim.sh --fake-gpu).
case "$*" in
  *query-gpu=name*) echo "NVIDIA H200 (simulated: no GPU here)" ;;
  *query-gpu=compute_cap*) echo "9.0" ;;
  *query-gpu=driver_version*) echo "simulated" ;;
  *-q*) echo "simulated nvidia-smi: no GPU on this machine" ;;
  *) exit 6 ;;
esac
EOF
  chmod +x "$sim/fake-bin/nvidia-smi"
fi

# ------------------------------------------------------------ inside the namespace
mkdir -p "$sim/no-pytest"
echo 'raise ImportError("pytest is hidden by scripts/device-pack-sim.sh, as on a bare GPU image")' \
  >"$sim/no-pytest/__init__.py"
cat >"$sim/inside.sh" <<'EOF'
set -uo pipefail
hide=$1 carried=$2 sim=$3 fake_gpu=$4
shift 4
mount -t tmpfs arbiter-sim "$hide" || exit 3
for f in "$@"; do mount --bind /dev/null "$f" || exit 3; done
[ -d /usr/lib/x86_64-linux-gnu/ucx ] && { mount -t tmpfs arbiter-sim /usr/lib/x86_64-linux-gnu/ucx || exit 3; }
mount -t tmpfs -o mode=1777 arbiter-sim-shm /dev/shm || exit 3
# No pytest, as on a GPU image with torch and without it: the check must take
# the pack's python-libs/. (An empty folder would import as a namespace
# package; this one refuses.)
for d in /usr/lib/python3/dist-packages/pytest /usr/lib/python3/dist-packages/_pytest; do
  [ -d "$d" ] && { mount --bind "$sim/no-pytest" "$d" || exit 3; }
done
if python3 -c 'import pytest' 2>/dev/null; then echo "pytest is still importable here"; status_pytest=1; else status_pytest=0; fi
dev=$sim/root
cd "$dev" || exit 3
((fake_gpu)) && PATH=$sim/fake-bin:$PATH
status=$status_pytest

echo "=== 1. scripts/device-check.sh --full --prebuilt $(basename "$carried")"
timeout 900 scripts/device-check.sh --full --prebuilt "$(basename "$carried")" --out "$sim/out" \
  >"$sim/device-check.log" 2>&1
rc=$?
echo "device-check exit $rc (expected: 77 without a GPU, 1 with --fake-gpu: the benchmark finds no device)"
tail -n 5 "$sim/device-check.log"
if ((fake_gpu)); then ((rc == 1 || rc == 0)) || status=1; else ((rc == 77)) || status=1; fi
leftover=$(find "$dev" -maxdepth 1 -type l | wc -l)
echo "links left in the device tree after the check: $leftover (expected 0)"
((leftover == 0)) || status=1

echo "=== 2. the pack's programs through the recorded paths"
src=$(sed -n 's/^source_root=//p' "$carried/PACK_INFO")
tree=$(sed -n 's/^build_dir=//p' "$carried/PACK_INFO")
[ -e "$src" ] && { echo "$src exists inside the namespace: the hiding failed"; exit 3; }
ln -s "$dev" "$src" && ln -s "$carried" "$tree" || exit 3
# The control: without the pack's libraries the program must not start here.
if control=$(env -u LD_LIBRARY_PATH timeout 30 "$tree/bin/arbiter" show 2>&1); then
  echo "control FAILED: arbiter show ran without the pack's libraries: the system's are not hidden"
  status=1
else
  echo "control: without the pack's libraries arbiter show fails: $(head -n1 <<<"$control")"
fi
export LD_LIBRARY_PATH=$carried/device-libs UCX_MODULE_DIR=$carried/device-libs/ucx
export UCX_TLS=tcp,self UCX_NET_DEVICES=lo
run() { echo "--- $*"; timeout 300 "$@"; local rc=$?; echo "(exit $rc)"; return $rc; }
{
  run "$tree/bin/arbiter" show || status=1
  run "$tree/bin/arbiter" plugins || status=1
  run env LD_DEBUG=libs LD_DEBUG_OUTPUT="$sim/ld-debug" \
    "$tree/bin/arbiter" launch --nproc 2 --timeout 240 -- "$tree/bin/arbiter-example-fused" || status=1
  run ctest --test-dir "$tree" -L cpu -R 'launch|communicator|example' --output-on-failure || status=1
} >"$sim/programs.log" 2>&1
grep -E '^--- |^\(exit|tests passed|tests failed|Test +#' "$sim/programs.log"
# Every library the gathered set names must have been opened from the pack.
names=$(cd "$carried/device-libs" && printf '%s\n' *.so* | sed 's/[.+]/\\&/g' | paste -sd'|')
cat "$sim"/ld-debug.* | sed -nE 's/.*calling init: (.*)/\1/p' | sort -u >"$sim/opened.txt"
echo "libraries initialised by arbiter launch and its 2 ranks (from the pack or not):"
grep -E "/($names)\$" "$sim/opened.txt" | sed 's/^/  /'
outside=$(grep -E "/($names)\$" "$sim/opened.txt" | grep -v "^$carried/device-libs/")
if [ -n "$outside" ]; then
  echo "FROM OUTSIDE THE PACK:"; echo "$outside"; status=1
fi
rm -f "$tree" "$src"
exit $status
EOF
say "running in a private mount namespace (logs in $sim)"
unshare -m --propagation private bash "$sim/inside.sh" "$hide" "$carried" "$sim" "$fake_gpu" "${hidden[@]}"
rc=$?
say "$( ((rc == 0)) && echo "all parts as expected" || echo "FAILED (exit $rc): see $sim/*.log")"
exit $rc
