#!/usr/bin/env bash
# Device check: on a machine with a GPU, builds arbiter for that GPU (or takes
# a tree packed elsewhere, --prebuilt), runs the GPU tests (ctest -L gpu: the
# trtllm and mnnvl loopback suites, nccl, every module with one rank per
# process at 2 and 4 processes on one GPU; with --full also whatever else the
# whole tree labels gpu: the runtime's communicator, the C API, the Python
# binding on CUDA tensors), with --full the examples on the GPU (the Python
# tensor-parallel example with 2 ranks sharing the GPU, when torch imports;
# the C++ example when it has a GPU mode), the loopback suites at world sizes
# 2 and 8 under compute-sanitizer (memcheck, racecheck, synccheck) and the
# fused benchmark (trtllm and mnnvl), and writes everything into one folder:
#   report.md        one line per step and per GPU test, the GPU, the bench summary
#   summary.json     the same steps and tests, for machines
#   setup.log        cmake configure and build output (or the pack check), then nvidia-smi -q
#   ctest.log        ctest -L gpu --output-on-failure
#   examples.log     the torch probe, the examples and the Python host-cost bench (--full)
#   sanitizer.log    compute-sanitizer runs
#   bench.csv        arbiter-bench-fused CSV (bench/FUSED.md describes it)
#   bench.log        its progress and summary (stderr)
# (eight files, flat: the device tool returns at most 8 files from $OUT.)
#
# Usage: scripts/device-check.sh [--full] [--prebuilt PACK] [--out DIR] [--build-dir DIR]
#                                [--arch ARCH] [--quick] [--deadline S] [--jobs N]
#                                [-- BENCH ARGS...]
#   --full        configure the whole project instead of -DARBITER_GPU_ONLY=ON
#                 (needs yaml-cpp, Boost and UCX installed; see --prebuilt)
#   --prebuilt PACK  run the whole tree packed by scripts/device-pack.sh (on a
#                 machine with those libraries) instead of building: no
#                 yaml-cpp, Boost or UCX needed here; implies --full. The
#                 pack's PACK_INFO names the paths the tree was built at; the
#                 check links them to this checkout and to PACK when they do
#                 not exist here, and removes those links at the end. The
#                 pack's wheel (when it has one) is installed into a venv and
#                 the Python GPU tests run against it (scripts/device-wheel.sh).
#   --out DIR     the folder; default $OUT when set, else device-check-<date>
#   --build-dir   default build-device-check (always configured afresh)
#   --arch ARCH   CUDA architecture; default from nvidia-smi (9.0 -> 90a, 10.0 -> 100a,
#                 10.3 -> 103a), else "native" (with --prebuilt: the pack's)
#   --quick       the benchmark's short sweep
#   --deadline S  the whole check's time limit, default 450 s (7.5 min); with
#                 --prebuilt 540 s (the whole tree's GPU tests, the wheel's and
#                 the examples take longer: give the device tool 600)
#   --no-sanitizer  skip the compute-sanitizer runs
#   --jobs N      parallel build jobs, default nproc
# Needs CUDA, CMake >= 3.25 and a C++20 compiler (with --prebuilt only ctest
# and the driver); uses ninja when present. With --full, UCX_TLS=tcp,self and
# UCX_NET_DEVICES=lo unless already set (the launcher's bootstrap on one host).
# Exit: 0 all passed; 1 a step failed or timed out; 2 bad usage; 77 no GPU
# (after the build or the pack check, which is still done).
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
start=$SECONDS
full=0
prebuilt=""
quick=0
sanitize=1
out=""
build=""
arch=""
deadline=""
jobs=$(nproc 2>/dev/null || echo 2)
bench_args=()

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; }
while (($#)); do
  case "$1" in
    --full) full=1 ;;
    --prebuilt) prebuilt=${2:?--prebuilt needs the pack folder}; full=1; shift ;;
    --quick) quick=1 ;;
    --no-sanitizer) sanitize=0 ;;
    --out) out=${2:?--out needs a folder}; shift ;;
    --build-dir) build=${2:?--build-dir needs a folder}; shift ;;
    --arch) arch=${2:?--arch needs an architecture}; shift ;;
    --deadline) deadline=${2:?--deadline needs seconds}; shift ;;
    --jobs) jobs=${2:?--jobs needs a number}; shift ;;
    --) shift; bench_args=("$@"); break ;;
    -h | --help) usage; exit 0 ;;
    *) echo "device-check: unknown option $1" >&2; usage; exit 2 ;;
  esac
  shift
done
[ -n "$deadline" ] || deadline=$([ -n "$prebuilt" ] && echo 540 || echo 450)
[[ $deadline =~ ^[0-9]+$ ]] || { echo "device-check: --deadline takes whole seconds" >&2; exit 2; }
[[ $jobs =~ ^[1-9][0-9]*$ ]] || { echo "device-check: --jobs takes a positive number" >&2; exit 2; }
if [ -n "$prebuilt" ]; then
  [ -z "$arch" ] || { echo "device-check: --arch with --prebuilt: the pack's architecture was chosen when packing (scripts/device-pack.sh --arch)" >&2; exit 2; }
  [ -z "$build" ] || { echo "device-check: --build-dir with --prebuilt: nothing is built" >&2; exit 2; }
  [ -f "$prebuilt/PACK_INFO" ] || { echo "device-check: $prebuilt holds no PACK_INFO: make the pack with scripts/device-pack.sh and carry its folder" >&2; exit 2; }
  prebuilt=$(cd "$prebuilt" && pwd)
fi

[ -n "$out" ] || out=${OUT:-device-check-$(date -u +%Y%m%d-%H%M%S)}
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)
build=${build:-$root/build-device-check}
# The working tree as it came, before this check links anything into it.
commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=$(git -C "$root" status --porcelain 2>/dev/null | wc -l)

report=$out/report.md
steps=()    # "| step | result | seconds | log |" rows of the report
json_steps=()  # {"name", "result", "seconds", "log"} objects of summary.json
notes=()    # lines for the report
failed=0

say() { echo "device-check: $*" >&2; }
# The toolkit's usual place, when nvcc is not on PATH.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  PATH=/usr/local/cuda/bin:$PATH
fi
remaining() { echo $((deadline - (SECONDS - start))); }
# min(cap, remaining - reserve), at least 10 s.
budget() {
  local cap=$1 reserve=$2 left
  left=$(($(remaining) - reserve))
  ((left < cap)) && cap=$left
  ((cap < 10)) && cap=10
  echo "$cap"
}

# record NAME RESULT SECONDS LOG: one row of the report and of summary.json.
record() {
  steps+=("| $1 | $2 | $3 | $4 |")
  json_steps+=("{\"name\": \"$1\", \"result\": \"$2\", \"seconds\": $3, \"log\": \"$4\"}")
}

# step NAME LOG TIMEOUT CMD...: runs CMD under `timeout`, output to LOG;
# records the result; returns CMD's status.
step() {
  local name=$1 log=$2 limit=$3 t0 rc result
  shift 3
  say "$name (limit ${limit}s) -> $(basename "$log")"
  t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >>"$log" 2>&1
  rc=$?
  case $rc in
    0) result=pass ;;
    77) result=skip ;;
    124 | 137) result="FAIL (timed out after ${limit}s)" ;;
    *) result="FAIL (exit $rc)" ;;
  esac
  record "$name" "$result" $((SECONDS - t0)) "$(basename "$log")"
  say "$name: $result in $((SECONDS - t0))s"
  return $rc
}

# The GPU, if any: capability "9.0" -> "90a" (the arch-specific targets exist
# from 9.0 on; older GPUs get the plain number).
gpu_name=""
gpu_cap=""
gpu_arch=""
if command -v nvidia-smi >/dev/null 2>&1 &&
  gpu_name=$(timeout 30 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1) &&
  [ -n "$gpu_name" ]; then
  gpu_cap=$(timeout 30 nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null |
    head -n1 | tr -d '[:space:]')
else
  gpu_name=""
fi
if [[ $gpu_cap =~ ^([0-9]+)\.([0-9]+)$ ]]; then
  cc=$((BASH_REMATCH[1] * 10 + BASH_REMATCH[2]))
  if ((cc >= 90)); then gpu_arch="${cc}a"; else gpu_arch=$cc; fi
fi
if [ -z "$arch" ] && [ -z "$prebuilt" ]; then
  if [ -n "$gpu_arch" ]; then
    arch=$gpu_arch
  elif [ -n "$gpu_name" ]; then
    arch=native
  fi
fi
gpu_present=0
[ -n "$gpu_name" ] && gpu_present=1

# ------------------------------------------------------------ the tree
# tree: the build tree's path as its own files name it (ctest files, RUNPATH,
# the compiled-in plugin folder).
links=()    # links this check made; removed at exit, newest first
# shellcheck disable=SC2317  # run by the EXIT trap
remove_links() {
  local i
  for ((i = ${#links[@]} - 1; i >= 0; --i)); do
    if [ -L "${links[$i]}" ]; then rm -f "${links[$i]}"; fi
  done
}
trap remove_links EXIT
# leads PATH TARGET: PATH is TARGET or a way to it.
leads() { [ "$(cd "$1" 2>/dev/null && pwd -P)" = "$(cd "$2" 2>/dev/null && pwd -P)" ]; }
# link_to TARGET PATH: makes PATH lead to TARGET (a symbolic link) unless it
# already does; refuses to touch a PATH that exists and is something else.
link_to() {
  local target=$1 path=$2
  leads "$path" "$target" && return 0
  if [ -e "$path" ] || [ -L "$path" ]; then
    say "$path exists here and is not $target: the packed tree names that path." \
      "Run the check where it is free (a GPU machine), or, on the machine that packed it," \
      "run scripts/device-check.sh --full without --prebuilt"
    return 1
  fi
  if ! { mkdir -p "$(dirname "$path")" && ln -s "$target" "$path"; }; then
    say "cannot make $path a link to $target (root, or write access to $(dirname "$path"), needed)"
    return 1
  fi
  links+=("$path")
  say "linked $path -> $target"
}
pack_value() { sed -n "s/^$1=//p" "$prebuilt/PACK_INFO" | head -n1; }

prepared=build  # what the check makes ready before the GPU steps
if [ -n "$prebuilt" ]; then
  prepared="pack check"
  tree=$(pack_value build_dir)
  pack_root=$(pack_value source_root)
  arch=$(pack_value arch)
  mode="full, prebuilt ($(basename "$prebuilt"): commit $(pack_value commit | cut -c1-7), $(pack_value changed_files) changed file(s), packed $(pack_value date) on $(pack_value host))"
  if [ -z "$tree" ] || [ -z "$pack_root" ]; then
    say "$prebuilt/PACK_INFO names no build_dir or source_root: pack it again with scripts/device-pack.sh"
    exit 2
  fi
  here=$(git -C "$root" rev-parse HEAD 2>/dev/null)
  [ -z "$here" ] || [ "$(pack_value commit)" = "$here" ] ||
    notes+=("The pack was built from commit $(pack_value commit | cut -c1-12), this checkout is $commit: the tests run the pack's programs against this checkout's scripts and data.")
  # The source path first: the build path may lie inside it.
  if ! link_to "$root" "$pack_root" || ! link_to "$prebuilt" "$tree"; then
    exit 2
  fi
  # The pack's libraries, UCX's modules beside them.
  export LD_LIBRARY_PATH=$prebuilt/device-libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export UCX_MODULE_DIR=$prebuilt/device-libs/ucx
elif ((full)); then
  tree=$build
  mode="full"
else
  tree=$build
  mode="GPU-only (-DARBITER_GPU_ONLY=ON)"
fi
if ((full)); then
  # The launcher's UCX bootstrap, all ranks on this host (DESIGN.md, "UCX facts").
  export UCX_TLS=${UCX_TLS:-tcp,self} UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}
fi

: >"$out/setup.log"
say "GPU: ${gpu_name:-none} (capability ${gpu_cap:-?}), arch ${arch:-project default}, $mode"
say "tree $tree, output $out, deadline ${deadline}s"

if [ -n "$prebuilt" ]; then
  # No build: the pack must find its libraries here and run.
  if step "pack check" "$out/setup.log" "$(budget 60 300)" \
    "$root/scripts/device-pack.sh" --verify "$prebuilt"; then
    built=1
  else
    built=0
    failed=1
  fi
  while IFS= read -r line; do
    notes+=("Pack check: ${line#WARNING: }")
  done < <(grep '^WARNING: ' "$out/setup.log")
  # pytest for the Python GPU tests (ctest's and the wheel's), from the pack
  # when this machine's python3 has none.
  if ! python3 -c 'import pytest' >/dev/null 2>&1 && [ -d "$prebuilt/python-libs" ]; then
    export ARBITER_PYTEST_PATH=$prebuilt/python-libs
    export PYTHONPATH=$ARBITER_PYTEST_PATH${PYTHONPATH:+:$PYTHONPATH}
    notes+=("python3 here has no pytest: the pack's python-libs/ (pytest $(python3 -c 'import pytest; print(pytest.__version__)' 2>/dev/null || echo '?')) is on PYTHONPATH.")
  fi
  if ((built && gpu_present)) && [ -n "$gpu_arch" ] && [ "$gpu_arch" != "$arch" ]; then
    echo "the pack was built for $arch; this GPU (capability $gpu_cap) needs $gpu_arch:" \
      "pack again with scripts/device-pack.sh --arch $gpu_arch" >>"$out/setup.log"
    record "architecture" "FAIL (pack $arch, GPU $gpu_arch)" 0 setup.log
    built=0
    failed=1
  fi
else
  cmake_args=(-S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release)
  ((full)) || cmake_args+=(-DARBITER_GPU_ONLY=ON)
  # No GPU and no --arch: the project's default architectures (only the build is checked).
  [ -n "$arch" ] && cmake_args+=("-DARBITER_CUDA_ARCHITECTURES=$arch")
  command -v ninja >/dev/null 2>&1 && cmake_args+=(-G Ninja)
  # A fresh build folder, but never remove anything that is not one.
  if [ -e "$build" ]; then
    if [ -f "$build/CMakeCache.txt" ] || [ -z "$(ls -A "$build" 2>/dev/null)" ]; then
      rm -rf "$build"
    else
      say "$build exists and is not a CMake build folder; remove it or pass --build-dir"
      exit 2
    fi
  fi
  if step configure "$out/setup.log" "$(budget 120 300)" cmake "${cmake_args[@]}" &&
    step build "$out/setup.log" "$(budget 300 120)" cmake --build "$build" -j"$jobs"; then
    built=1
  else
    built=0
    failed=1
  fi
fi

# ------------------------------------------------------------ GPU steps
torch_line=""
if ((built && gpu_present)); then
  {
    echo
    echo "=== nvidia-smi -q"
    timeout 60 nvidia-smi -q 2>&1
  } >>"$out/setup.log"

  # What ctest -L gpu holds, to tell a test that did not run from one that is
  # not registered.
  listed=$(timeout 60 ctest --test-dir "$tree" -L gpu --show-only=json-v1 2>/dev/null |
    python3 -c '
import json, sys
tests = json.load(sys.stdin).get("tests", [])
py = [t for t in tests if any("python" in c or "pytest" in c for c in t.get("command", []))]
exe = sorted({next((c for c in t["command"] if "python" in c.rsplit("/", 1)[-1]), "-") for t in py} - {"-"})
print(len(tests), len(py), ",".join(exe) or "-", " ".join(t["name"] for t in py))' 2>/dev/null)
  read -r listed_count listed_python listed_python_exe listed_python_names <<<"${listed:-? ? -}"
  # A test names the interpreter the build machine found; torch must be in it here.
  if [ "$listed_python_exe" != "-" ] && [ -n "$prebuilt" ]; then
    here_python=$(readlink -f "$(command -v python3 2>/dev/null)" 2>/dev/null)
    for exe in ${listed_python_exe//,/ }; do
      [ "$(readlink -f "$exe" 2>/dev/null)" = "$here_python" ] ||
        notes+=("The Python GPU tests run $exe (the build machine's); python3 here is ${here_python:-missing}: torch must be importable from $exe.")
    done
  fi

  : >"$out/ctest.log"
  # ctest stops the running test and starts no other at --stop-time, so that
  # every test still gets its line; the step's timeout is the backstop. The
  # stop time is a time of day (UTC here): left out when it would fall on
  # the next day, which ctest would take as already passed.
  limit=$(budget 300 150)
  stop_args=()
  stop_at=$(($(date -u +%s) + limit - 20))
  if [ "$(date -u -d "@$stop_at" +%F)" = "$(date -u +%F)" ]; then
    stop_args=(--stop-time "$(date -u -d "@$stop_at" +%H:%M:%S)")
  fi
  step "ctest -L gpu" "$out/ctest.log" "$limit" env TZ=UTC \
    ctest --test-dir "$tree" -L gpu --output-on-failure --no-tests=error "${stop_args[@]}" || failed=1
  skipped=$(grep -c '(Skipped)$' "$out/ctest.log")
  ((skipped)) && notes+=("$skipped GPU test(s) skipped on a machine with a GPU: see ctest.log.")
  ran=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#' "$out/ctest.log")
  [ "$listed_count" != "?" ] && ((ran < listed_count)) &&
    notes+=("ctest -L gpu lists $listed_count tests; $ran have a result line (see ctest.log).")

  # ---------------------------------------------------------- examples
  if ((full)); then
    : >"$out/examples.log"
    # The Python example needs torch with CUDA; probing costs a few seconds.
    echo "=== python3 -c 'import torch'" >>"$out/examples.log"
    if torch_line=$(timeout 60 python3 -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "available", torch.cuda.is_available())' 2>>"$out/examples.log"); then
      echo "$torch_line" >>"$out/examples.log"
      if [ "$listed_python" = 0 ]; then
        notes+=("torch imports, but ctest -L gpu lists no test that runs Python: the binding's CUDA-tensor tests are not registered.")
      fi
    else
      torch_line="not importable ($(tail -n1 "$out/examples.log"))"
      echo "$torch_line" >>"$out/examples.log"
    fi
    [ -n "$listed_python_names" ] && notes+=("Python GPU tests in ctest -L gpu: $listed_python_names.")

    # 2 ranks, one GPU: the example turns on the shared-GPU test mode itself
    # when there are fewer GPUs than ranks.
    example=$root/examples/python/tp_decode.py
    name="example tp_decode.py --device cuda (2 ranks)"
    py_env=(env ARBITER_LIBRARY="$tree/lib" PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}")
    if [ ! -f "$example" ]; then
      record "$name" "skip (no examples/python/tp_decode.py)" 0 examples.log
    elif [[ $torch_line != torch* ]]; then
      record "$name" "skip (python3 cannot import torch)" 0 examples.log
    else
      echo "=== tp_decode.py --help" >>"$out/examples.log"
      help=$("${py_env[@]}" timeout 60 python3 "$example" --help 2>&1)
      rc=$?
      echo "$help" >>"$out/examples.log"
      if ((rc)); then
        record "$name" "FAIL (tp_decode.py --help: exit $rc)" 0 examples.log
        failed=1
      elif ! grep -q -- '--device' <<<"$help"; then
        record "$name" "skip (tp_decode.py has no --device option yet)" 0 examples.log
      else
        limit=$(budget 120 150)
        echo "=== arbiter launch --nproc 2 -- python3 tp_decode.py --device cuda" >>"$out/examples.log"
        step "$name" "$out/examples.log" "$limit" "${py_env[@]}" \
          "$tree/bin/arbiter" launch --nproc 2 --timeout $((limit > 30 ? limit - 15 : limit / 2)) -- \
          python3 "$example" --device cuda || failed=1
      fi
    fi

    # The host cost of a call from Python on CUDA tensors, side by side with
    # torch's rms_norm in one process (bench/python/host_cost.py).
    bench_py=$root/bench/python/host_cost.py
    name="host cost from Python (CUDA tensors)"
    if [ ! -f "$bench_py" ]; then
      record "$name" "skip (no bench/python/host_cost.py)" 0 examples.log
    elif [[ $torch_line != torch* ]]; then
      record "$name" "skip (python3 cannot import torch)" 0 examples.log
    else
      echo "=== python3 bench/python/host_cost.py --device cuda --runs 5" >>"$out/examples.log"
      step "$name" "$out/examples.log" "$(budget 90 150)" "${py_env[@]}" \
        python3 "$bench_py" --device cuda --runs 5 || failed=1
    fi

    # The pack's wheel installed with pip into a venv (scripts/device-wheel.sh)
    # and the Python GPU tests against it, with none of the pack's libraries.
    wheel_file=""
    [ -n "$prebuilt" ] && wheel_file=$(pack_value wheel)
    name="python GPU tests, installed wheel"
    if [ -z "$prebuilt" ]; then
      :
    elif [ -z "$wheel_file" ] || [ ! -f "$prebuilt/$wheel_file" ]; then
      record "$name" "skip (the pack carries no wheel)" 0 examples.log
    elif [[ $torch_line != torch* ]]; then
      record "$name" "skip (python3 cannot import torch)" 0 examples.log
    else
      echo "=== scripts/device-wheel.sh $wheel_file" >>"$out/examples.log"
      step "$name" "$out/examples.log" "$(budget 240 150)" env -u LD_LIBRARY_PATH -u UCX_MODULE_DIR \
        "$root/scripts/device-wheel.sh" "$prebuilt/$wheel_file" "${ARBITER_PYTHON:-python3}" || failed=1
    fi

    # The C++ example on the GPU, once it has a mode for it (--help says).
    example=$tree/bin/arbiter-example-fused
    name="example arbiter-example-fused --device cuda (2 ranks)"
    if [ ! -x "$example" ]; then
      record "$name" "skip (not built)" 0 examples.log
    else
      echo "=== arbiter-example-fused --help" >>"$out/examples.log"
      help=$(timeout 30 "$example" --help 2>&1)
      echo "$help" >>"$out/examples.log"
      if ! grep -q -- '--device' <<<"$help"; then
        record "$name" "skip (its --help names no --device option: no GPU mode yet)" 0 examples.log
      else
        limit=$(budget 120 150)
        echo "=== arbiter launch --nproc 2 -- arbiter-example-fused --device cuda" >>"$out/examples.log"
        step "$name" "$out/examples.log" "$limit" \
          "$tree/bin/arbiter" launch --nproc 2 --timeout $((limit > 30 ? limit - 15 : limit / 2)) -- \
          "$example" --device cuda || failed=1
      fi
    fi
  fi

  # The loopback suites, small (ARBITER_GPU_SUITE=small: world sizes 2 and
  # 8, bf16), under each compute-sanitizer tool. A kernel waiting for a
  # peer the tool keeps from running traps after 60 s instead of 10 min.
  : >"$out/sanitizer.log"
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  if ((sanitize)) && [ -x "$sanitizer" ]; then
    for tool in memcheck racecheck synccheck; do
      for suite in trtllm mnnvl; do
        bin=$tree/bin/backends_${suite}_gpu_test
        [ -x "$bin" ] || continue
        # The benchmark keeps its last 90 s.
        if (($(remaining) < 150)); then
          record "sanitizer $tool $suite" "skipped (no time left)" 0 sanitizer.log
          continue
        fi
        echo "=== compute-sanitizer --tool $tool $suite (world sizes 2, 8)" >>"$out/sanitizer.log"
        step "sanitizer $tool $suite" "$out/sanitizer.log" "$(budget 90 120)" \
          env ARBITER_GPU_SUITE=small ARBITER_KERNEL_TIMEOUT_MS=60000 \
          "$sanitizer" --tool "$tool" --error-exitcode 3 "$bin" || failed=1
      done
    done
  elif ((sanitize)); then
    notes+=("compute-sanitizer not found: the sanitizer runs were skipped.")
  fi

  bench=$tree/bin/arbiter-bench-fused
  : >"$out/bench.log"
  if [ -x "$bench" ]; then
    left=$(($(remaining) - 15))
    args=(--csv "$out/bench.csv")
    # The full sweep (trtllm and mnnvl) needs a few minutes on an H200
    # (--budget stops it in time); with less time left, the short one.
    if ((quick || left < 150)); then args+=(--quick); fi
    args+=(--budget $((left > 60 ? left - 40 : 20)))
    step benchmark "$out/bench.log" "$(budget "$left" 5)" "$bench" "${args[@]}" "${bench_args[@]}"
    case $? in
      0) ;;
      77) failed=1; notes+=("The benchmark saw no CUDA device although nvidia-smi lists one.") ;;
      *) failed=1 ;;
    esac
  else
    echo "arbiter-bench-fused was not built (are the trtllm and mnnvl module targets defined?)" >"$out/bench.log"
    record benchmark "FAIL (not built)" 0 bench.log
    failed=1
  fi
elif ((built)); then
  say "no GPU (nvidia-smi found none): the $prepared passed; nothing to run"
fi

# ------------------------------------------------------------ report
{
  echo "# arbiter device check"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "- host: $(hostname 2>/dev/null || echo unknown)"
  echo "- GPU: ${gpu_name:-none} (capability ${gpu_cap:-?})"
  if ((gpu_present)); then
    echo "- driver: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n1)"
  fi
  if [ -n "$prebuilt" ]; then
    echo "- CUDA compiler: none needed (prebuilt; packed with nvcc $(pack_value nvcc))"
  else
    echo "- CUDA compiler: nvcc $(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
  fi
  echo "- CMake: $(cmake --version 2>/dev/null | head -n1)"
  echo "- architecture: ${arch:-project default}; mode: $mode"
  echo "- source: commit $commit, $dirty changed file(s) in the working tree"
  [ -n "$torch_line" ] && echo "- python3: $torch_line"
  ((full)) && echo "- UCX: UCX_TLS=$UCX_TLS UCX_NET_DEVICES=$UCX_NET_DEVICES"
  echo "- total: $((SECONDS - start)) s of a ${deadline} s deadline"
  echo
  if ((!gpu_present)); then
    echo "**No GPU found (nvidia-smi): only the $prepared was checked.**"
    echo
  fi
  echo "| step | result | seconds | log |"
  echo "|---|---|---|---|"
  printf '%s\n' "${steps[@]}"
  if ((${#notes[@]})); then
    echo
    printf -- '- %s\n' "${notes[@]}"
  fi
  if [ -n "$prebuilt" ] && grep -q '^found outside the pack' "$out/setup.log"; then
    echo
    echo "## Libraries this machine gave the pack"
    echo
    echo '```'
    sed -n '/^found outside the pack/,/^[^ ]/{/^  /p}' "$out/setup.log" | head -n 40
    echo '```'
  fi
  if [ -s "$out/ctest.log" ]; then
    echo
    echo "## GPU tests (one line per suite)"
    echo
    echo '```'
    grep -E '^ *[0-9]+/[0-9]+ Test|tests passed|tests failed' "$out/ctest.log" | head -n 80
    echo '```'
    echo
    echo "Group and process lines:"
    echo
    echo '```'
    grep -E 'calls \(|processes[,:]|cases passed|FAIL' "$out/ctest.log" | head -n 80
    echo '```'
  fi
  if [ -s "$out/examples.log" ]; then
    echo
    echo "## Examples (the last lines of each; all of it in examples.log)"
    echo
    echo '```'
    awk '/^=== / { if (head != "") flush(); head = $0; n = 0; next }
         { buf[n++ % 12] = $0 }
         function flush(  i, k) { print head; k = n < 12 ? n : 12
           for (i = n - k; i < n; ++i) print "  " buf[i % 12] }
         END { if (head != "") flush() }' "$out/examples.log" | head -n 120
    echo '```'
  fi
  if [ -s "$out/sanitizer.log" ]; then
    echo
    echo "## compute-sanitizer"
    echo
    echo '```'
    grep -E '^=== |ERROR SUMMARY|RACECHECK SUMMARY|failures, ' "$out/sanitizer.log" | head -n 60
    echo '```'
  fi
  if [ -s "$out/bench.log" ]; then
    echo
    echo "## Benchmark summary (loopback, one GPU)"
    echo
    echo '```'
    # The summary table and failures; the progress lines are in bench.log.
    sed -n '/^summary/,$p' "$out/bench.log" | head -n 200
    grep -E '^(SKIP|error|FAILED)' "$out/bench.log" | head -n 20
    echo '```'
  fi
  if ((built == 0)); then
    echo
    echo "## Last lines of the failed step"
    echo
    echo '```'
    tail -n 60 "$out/setup.log" 2>/dev/null || true
    echo '```'
  fi
} >"$report"

# summary.json: the steps and every ctest line, for machines.
{
  echo "{"
  echo "  \"gpu\": \"${gpu_name:-none}\", \"capability\": \"${gpu_cap:-}\", \"arch\": \"${arch:-}\","
  echo "  \"mode\": \"${mode//\"/\'}\", \"prebuilt\": $([ -n "$prebuilt" ] && echo true || echo false),"
  echo "  \"seconds\": $((SECONDS - start)), \"deadline\": $deadline, \"failed\": $failed,"
  echo "  \"steps\": ["
  for ((i = 0; i < ${#json_steps[@]}; ++i)); do
    sep=","
    ((i == ${#json_steps[@]} - 1)) && sep=""
    echo "    ${json_steps[$i]}$sep"
  done
  echo "  ],"
  echo "  \"tests\": ["
  if [ -s "$out/ctest.log" ]; then
    sed -nE 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: ([^ ]+) \.*[ *]*([A-Za-z]+( Run)?)[^0-9]*([0-9.]+) sec.*/    {"name": "\1", "result": "\2", "seconds": \4},/p' \
      "$out/ctest.log" | sed '$ s/,$//'
  fi
  echo "  ]"
  echo "}"
} >"$out/summary.json"

say "report: $report"
if ((failed)); then
  say "FAILED"
  exit 1
fi
if ((!gpu_present)); then
  say "no GPU: $prepared checked, nothing run"
  exit 77
fi
say "passed in $((SECONDS - start)) s"
exit 0
