#!/usr/bin/env bash
# Device check: on a machine with a GPU, builds arbiter for that GPU, runs the
# GPU tests (ctest -L gpu: the trtllm and mnnvl loopback suites, nccl, and
# every module with one rank per process at 2 and 4 processes on one GPU),
# the loopback suites at world sizes 2 and 8 under compute-sanitizer
# (memcheck, racecheck, synccheck) and the fused benchmark (trtllm and
# mnnvl), and writes everything into one folder:
#   report.md        one line per step and per GPU test, the GPU, the bench summary
#   summary.json     the same steps and tests, for machines
#   build.log        cmake configure and build output
#   ctest.log        ctest -L gpu --output-on-failure
#   sanitizer.log    compute-sanitizer runs
#   bench.csv        arbiter-bench-fused CSV (bench/FUSED.md describes it)
#   bench.log        its progress and summary (stderr)
#   nvidia-smi.txt   nvidia-smi -q
# (eight files, flat: the device tool returns at most 8 files from $OUT.)
#
# Usage: scripts/device-check.sh [--full] [--out DIR] [--build-dir DIR]
#                                [--arch ARCH] [--quick] [--deadline S] [--jobs N]
#                                [-- BENCH ARGS...]
#   --full        configure the whole project instead of -DARBITER_GPU_ONLY=ON
#                 (needs yaml-cpp, Boost and UCX installed)
#   --out DIR     the folder; default $OUT when set, else device-check-<date>
#   --build-dir   default build-device-check (always configured afresh)
#   --arch ARCH   CUDA architecture; default from nvidia-smi (9.0 -> 90a, 10.0 -> 100a,
#                 10.3 -> 103a), else "native"
#   --quick       the benchmark's short sweep
#   --deadline S  the whole check's time limit, default 450 s (7.5 min)
#   --no-sanitizer  skip the compute-sanitizer runs
#   --jobs N      parallel build jobs, default nproc
# Needs CUDA, CMake >= 3.25 and a C++20 compiler; uses ninja when present.
# Exit: 0 all passed; 1 a step failed or timed out; 2 bad usage; 77 no GPU
# (after the build, which is still checked).
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
start=$SECONDS
full=0
quick=0
sanitize=1
out=""
build=""
arch=""
deadline=450
jobs=$(nproc 2>/dev/null || echo 2)
bench_args=()

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; }
while (($#)); do
  case "$1" in
    --full) full=1 ;;
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
[[ $deadline =~ ^[0-9]+$ ]] || { echo "device-check: --deadline takes whole seconds" >&2; exit 2; }
[[ $jobs =~ ^[1-9][0-9]*$ ]] || { echo "device-check: --jobs takes a positive number" >&2; exit 2; }

[ -n "$out" ] || out=${OUT:-device-check-$(date -u +%Y%m%d-%H%M%S)}
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)
build=${build:-$root/build-device-check}

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
if command -v nvidia-smi >/dev/null 2>&1 &&
  gpu_name=$(timeout 30 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1) &&
  [ -n "$gpu_name" ]; then
  gpu_cap=$(timeout 30 nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null |
    head -n1 | tr -d '[:space:]')
else
  gpu_name=""
fi
if [ -z "$arch" ]; then
  if [[ $gpu_cap =~ ^([0-9]+)\.([0-9]+)$ ]]; then
    cc=$((BASH_REMATCH[1] * 10 + BASH_REMATCH[2]))
    if ((cc >= 90)); then arch="${cc}a"; else arch=$cc; fi
  elif [ -n "$gpu_name" ]; then
    arch=native
  fi
fi

cmake_args=(-S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release)
if ((full)); then
  mode="full"
else
  mode="GPU-only (-DARBITER_GPU_ONLY=ON)"
  cmake_args+=(-DARBITER_GPU_ONLY=ON)
fi
# No GPU and no --arch: the project's default architectures (only the build is checked).
[ -n "$arch" ] && cmake_args+=("-DARBITER_CUDA_ARCHITECTURES=$arch")
command -v ninja >/dev/null 2>&1 && cmake_args+=(-G Ninja)

: >"$out/build.log"
say "GPU: ${gpu_name:-none} (capability ${gpu_cap:-?}), arch ${arch:-project default}, $mode"
say "build dir $build, output $out, deadline ${deadline}s"

# A fresh build folder, but never remove anything that is not one.
if [ -e "$build" ]; then
  if [ -f "$build/CMakeCache.txt" ] || [ -z "$(ls -A "$build" 2>/dev/null)" ]; then
    rm -rf "$build"
  else
    say "$build exists and is not a CMake build folder; remove it or pass --build-dir"
    exit 2
  fi
fi
if step configure "$out/build.log" "$(budget 120 300)" cmake "${cmake_args[@]}" &&
  step build "$out/build.log" "$(budget 300 120)" cmake --build "$build" -j"$jobs"; then
  built=1
else
  built=0
  failed=1
fi

gpu_present=0
[ -n "$gpu_name" ] && gpu_present=1
if ((built && gpu_present)); then
  timeout 60 nvidia-smi -q >"$out/nvidia-smi.txt" 2>&1
  : >"$out/ctest.log"
  step "ctest -L gpu" "$out/ctest.log" "$(budget 300 60)" \
    ctest --test-dir "$build" -L gpu --output-on-failure --no-tests=error || failed=1
  skipped=$(grep -c '(Skipped)$' "$out/ctest.log")
  ((skipped)) && notes+=("$skipped GPU test(s) skipped on a machine with a GPU: see ctest.log.")

  # The loopback suites, small (ARBITER_GPU_SUITE=small: world sizes 2 and
  # 8, bf16), under each compute-sanitizer tool. A kernel waiting for a
  # peer the tool keeps from running traps after 60 s instead of 10 min.
  : >"$out/sanitizer.log"
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  if ((sanitize)) && [ -x "$sanitizer" ]; then
    for tool in memcheck racecheck synccheck; do
      for suite in trtllm mnnvl; do
        bin=$build/bin/backends_${suite}_gpu_test
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

  bench=$build/bin/arbiter-bench-fused
  : >"$out/bench.log"
  if [ -x "$bench" ]; then
    left=$(($(remaining) - 15))
    args=(--csv "$out/bench.csv")
    # The full sweep (trtllm and mnnvl) needs a few minutes on an H200 (not
    # yet measured; --budget stops it in time); with less time left, the
    # short one.
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
  say "no GPU (nvidia-smi found none): the build passed; nothing to run"
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
  echo "- CUDA compiler: nvcc $(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
  echo "- CMake: $(cmake --version | head -n1)"
  echo "- architecture: ${arch:-project default}; mode: $mode"
  commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
  dirty=$(git -C "$root" status --porcelain 2>/dev/null | wc -l)
  echo "- source: commit $commit, $dirty changed file(s) in the working tree"
  echo "- total: $((SECONDS - start)) s of a ${deadline} s deadline"
  echo
  if ((!gpu_present)); then
    echo "**No GPU found (nvidia-smi): only the build was checked.**"
    echo
  fi
  echo "| step | result | seconds | log |"
  echo "|---|---|---|---|"
  printf '%s\n' "${steps[@]}"
  if ((${#notes[@]})); then
    echo
    printf -- '- %s\n' "${notes[@]}"
  fi
  if [ -s "$out/ctest.log" ]; then
    echo
    echo "## GPU tests (one line per suite)"
    echo
    echo '```'
    grep -E '^ *[0-9]+/[0-9]+ Test|tests passed|tests failed' "$out/ctest.log" | head -n 60
    echo '```'
    echo
    echo "Group and process lines:"
    echo
    echo '```'
    grep -E 'calls \(|processes[,:]|cases passed|FAIL' "$out/ctest.log" | head -n 80
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
    tail -n 60 "$out/build.log" 2>/dev/null || true
    echo '```'
  fi
} >"$report"

# summary.json: the steps and every ctest line, for machines.
{
  echo "{"
  echo "  \"gpu\": \"${gpu_name:-none}\", \"capability\": \"${gpu_cap:-}\", \"arch\": \"${arch:-}\","
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
  say "no GPU: build checked, nothing run"
  exit 77
fi
say "passed in $((SECONDS - start)) s"
exit 0
