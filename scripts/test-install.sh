#!/usr/bin/env bash
# Installs arbiter into a temporary prefix and uses it as a consumer would:
# moves the prefix (it must be relocatable), builds the examples out of tree
# with find_package(arbiter) and a C program with pkg-config, runs the fused
# example on 2 ranks under the installed `arbiter launch`, checks that C,
# Python and the `arbiter` program read the same ARBITER_CONFIG layer (equal
# fingerprints and decisions), runs a fused all-reduce on 2 ranks from the
# installed Python package, and runs the Python binding's tests against the
# installed library, then the PyTorch tests with the torch venv of
# scripts/setup.sh (ARBITER_TORCH_VENV, default /opt/arbiter-torch;
# ARBITER_TORCH=0 skips them). Reuses ${BUILD_DIR:-build}, configuring and
# building it when needed. PYTHON selects the interpreter (default
# /usr/bin/python3, with python3-pytest from scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
build="${BUILD_DIR:-build}"
python="${PYTHON:-/usr/bin/python3}"
jobs="$(nproc)"
"$python" -c 'import pytest' 2> /dev/null ||
  {
    echo "test-install: $python has no pytest (scripts/setup.sh installs python3-pytest)" >&2
    exit 1
  }

start=$SECONDS
step() { echo "test-install: [$((SECONDS - start))s] $*"; }
die() {
  echo "test-install: FAILED: $*" >&2
  exit 1
}

if [ -f "$build/CMakeCache.txt" ]; then
  step "building $build"
  cmake --build "$build" -j"$jobs" > /dev/null
else
  step "configuring and building $build"
  scripts/build.sh > /dev/null
fi
build=$(cd "$build" && pwd)
libdir=$(sed -n 's/^CMAKE_INSTALL_LIBDIR:PATH=//p' "$build/CMakeCache.txt")
libdir=${libdir:-lib}
pydir=$(sed -n 's/^ARBITER_INSTALL_PYTHONDIR:STRING=//p' "$build/CMakeCache.txt")
pydir=${pydir:-lib/python3/dist-packages}

work=$(mktemp -d "${TMPDIR:-/tmp}/arbiter-install.XXXXXX")
trap 'rm -rf "$work"' EXIT
# Nothing of the build tree or the caller's tables may leak into the checks.
unset LD_LIBRARY_PATH ARBITER_PLUGIN_PATH ARBITER_CONFIG ARBITER_BACKENDS ARBITER_LIBRARY
export PYTHONDONTWRITEBYTECODE=1

# Install, then move: every path inside the prefix must be relative to it.
step "installing into a staging prefix, then moving it"
cmake --install "$build" --prefix "$work/staging" > "$work/install.log"
mv "$work/staging" "$work/prefix"
prefix=$work/prefix
for f in bin/arbiter "$libdir/libarbiter_runtime.so" "$libdir/libarbiter_policy.so" \
         "$libdir/libarbiter_bootstrap_ucx.so" \
         "$libdir/arbiter/libarbiter-shm.so" include/arbiter/arbiter.h include/arbiter/policy.h \
         include/arbiter_backend.h include/arbiter/common/reference.h \
         "$libdir/cmake/arbiter/arbiterConfig.cmake" \
         "$libdir/cmake/arbiter/arbiterConfigVersion.cmake" "$libdir/pkgconfig/arbiter.pc" \
         share/arbiter/default.yaml share/arbiter/schema/arbiter-table.schema.json \
         "$pydir/arbiter/__init__.py"; do
  [ -e "$prefix/$f" ] || die "$f is not installed"
done
if grep -rlF "$build" "$prefix/$libdir/cmake" "$prefix/$libdir/pkgconfig" > /dev/null; then
  die "the package files name the build tree"
fi
arbiter=$prefix/bin/arbiter
"$arbiter" plugins > "$work/plugins.txt"
grep -qF "shm  ABI v2 (registered memory)  available" "$work/plugins.txt" || die "$(cat "$work/plugins.txt")"
grep -qF "$prefix/bin/../$libdir/arbiter/libarbiter-shm.so" "$work/plugins.txt" ||
  die "the runtime did not load its modules from the prefix: $(cat "$work/plugins.txt")"

step "building examples/ out of tree with find_package(arbiter)"
cmake -S examples -B "$work/examples" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$prefix" > "$work/examples-configure.log" ||
  die "$(cat "$work/examples-configure.log")"
cmake --build "$work/examples" -j"$jobs" > "$work/examples-build.log" ||
  die "$(cat "$work/examples-build.log")"

step "building examples/decide.c with pkg-config"
export PKG_CONFIG_PATH=$prefix/$libdir/pkgconfig
# shellcheck disable=SC2046  # pkg-config prints several words on purpose
cc -std=c11 -Wall -Wextra -Werror examples/decide.c -o "$work/decide-pkgconfig" \
   $(pkg-config --cflags --libs arbiter) -Wl,-rpath,"$(pkg-config --variable=libdir arbiter)"
# The C++ policy API alone, through pkg-config too.
cat > "$work/policy.cpp" <<'EOF'
#include <arbiter/policy.h>
int main() { return arbiter::Policy::from_environment().fingerprint() == 0; }
EOF
# shellcheck disable=SC2046
c++ -std=c++20 "$work/policy.cpp" -o "$work/policy-pkgconfig" \
    $(pkg-config --cflags --libs arbiter) \
    -Wl,-rpath,"$(pkg-config --variable=libdir arbiter)"
"$work/policy-pkgconfig" || die "the pkg-config C++ consumer failed"

step "running the fused example on 2 ranks under the installed arbiter launch"
"$arbiter" launch --nproc 2 --timeout 120 -- "$work/examples/arbiter-example-fused" \
  > "$work/example.log" 2>&1 || die "$(cat "$work/example.log")"
grep -q "shm .* fused -> OK" "$work/example.log" || die "$(cat "$work/example.log")"
sed -n '1,3p' "$work/example.log"

step "one ARBITER_CONFIG for every consumer: C, C (CMake), Python, the arbiter program"
cat > "$work/site.yaml" <<'EOF'
format: 1
fusion:
  - {capability: 103, world_size: 16, nodes: 4, max: 8MiB}
EOF
export ARBITER_CONFIG=$work/site.yaml
c_pkg=$("$work/decide-pkgconfig")
c_cmake=$("$work/examples/arbiter-example-c")
[ "$c_pkg" = "$c_cmake" ] || die "the two C builds disagree"
cli=$("$arbiter" decide --capability 103 --world-size 16 --nodes 4 --nvlink-domain --multicast \
      --bytes 64MiB --json)
py=$(ARBITER_LIBRARY="$prefix/$libdir" PYTHONPATH="$src/python" "$python" -c '
import arbiter
p = arbiter.from_environment()
print(p.fingerprint_hex, p.max_fused_bytes(capability=103, world_size=16, nodes=4,
      nvlink_domain=True, multicast=True))')
fp=$(sed -n 's/^fingerprint //p' <<< "$c_pkg")
grep -q '"fingerprint":"'"$fp"'"' <<< "$cli" || die "C ($fp) and the CLI ($cli) disagree"
[ "$py" = "$fp 8388608" ] || die "C ($fp) and Python ($py) disagree"
grep -q "^max_fused_bytes 8388608$" <<< "$c_pkg" || die "C did not read ARBITER_CONFIG: $c_pkg"
grep -q '"backend":"nccl"' <<< "$cli" || die "the CLI did not read ARBITER_CONFIG: $cli"
c_decision=$(sed -n 's/^decide 64 MiB: //p' <<< "$c_pkg")
echo "  tables $fp everywhere; 64 MiB at ws=16 on 4 nodes: $c_decision"
unset ARBITER_CONFIG

step "the installed Python package finds its library without ARBITER_LIBRARY"
found=$(PYTHONPATH="$prefix/$pydir" "$python" -c \
        'import arbiter; print(arbiter.library_path())')
case "$found" in
  "$prefix"/*) ;;
  *) die "the installed package loaded $found, not the prefix's library" ;;
esac

step "the installed Python package runs a fused all-reduce on 2 ranks"
cat > "$work/comm.py" <<'EOF_PY'
import numpy as np, arbiter
with arbiter.Communicator.from_environment(hidden=256, dtype="fp32", timeout=60) as comm:
    x = np.full((4, 256), comm.rank + 1.0, np.float32)
    r = comm.allreduce_fusion(x, np.ones_like(x), np.ones(256, np.float32))
    assert float(r.residual_out[0, 0]) == 4.0, r.residual_out[0, 0]
    print(f"rank {comm.rank}: {r.decision.backend} {r.decision.algorithm} via {arbiter.library_path()}")
EOF_PY
PYTHONPATH="$prefix/$pydir" "$arbiter" launch --nproc 2 --timeout 120 -- "$python" "$work/comm.py" \
  > "$work/comm.log" 2>&1 || die "$(cat "$work/comm.log")"
[ "$(grep -c "shm oneshot via $prefix/" "$work/comm.log")" = 2 ] || die "$(cat "$work/comm.log")"

step "Python tests against the installed library"
ARBITER_LIBRARY="$prefix/$libdir" ARBITER_BIN="$arbiter" PYTHONPATH="$src/python" \
  "$python" -m pytest -q -p no:cacheprovider python/tests

if [ "${ARBITER_TORCH:-1}" != 0 ]; then
  torch_python=${ARBITER_TORCH_VENV:-/opt/arbiter-torch}/bin/python
  torch_version=$("$torch_python" -c 'import torch; print(torch.__version__)' 2> /dev/null) ||
    die "no torch in $torch_python (scripts/setup.sh installs it; ARBITER_TORCH=0 skips)"
  step "PyTorch tests (torch $torch_version) against the installed library"
  ARBITER_LIBRARY="$prefix/$libdir" ARBITER_BIN="$arbiter" PYTHONPATH="$src/python" \
    "$torch_python" -m pytest -q -p no:cacheprovider python/tests/test_torch*.py
fi
step "passed"
