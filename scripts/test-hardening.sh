#!/usr/bin/env bash
# Hardening checks, with clang (scripts/setup.sh installs it):
#   1. fuzz:  the libFuzzer targets under fuzz/ (table loader, sizes and
#             names, command line), built with -fsanitize=fuzzer,address,
#             undefined, each run for FUZZ_SECONDS (default 60, all targets at
#             once) from the seeds and the table corpus. Any crash, leak,
#             timeout (-timeout=10) or memory blow-up (-rss_limit_mb=2048)
#             fails; the executions of each target are printed.
#   2. asan:  every CPU test (ctest -L cpu) built with -fsanitize=address,
#             undefined (RelWithDebInfo, no CUDA), halting on the first error.
#             Leaks are fatal except in third-party libraries listed in
#             scripts/lsan-third-party.supp.
#   3. tsan:  the concurrent parts under ThreadSanitizer: readers deciding
#             while a writer reloads tables (policy_reload_test), the
#             multi-rank shm test, and dispatch with one thread per rank.
# Build folders: ${HARDENING_DIR:-build-hardening}/{fuzz,asan,tsan}; reruns
# reuse them (and the grown fuzz corpus). About 6.5 minutes on 2 cores from
# scratch: fuzz 1.5 (build 0.5, runs 1), asan 4 (build 2.5, tests 1.5),
# tsan 1. Exit 0 when every stage passed; a crash input is left in
# build-hardening/fuzz/artifacts/ (fix it, then add it under
# tests/data/fuzz/<target>/, where tests/fuzz replays it in every build).
#
# Environment: FUZZ_SECONDS (per target), FUZZ_BUILD_ONLY (build the fuzz
# targets and stop; scripts/fuzz-long.sh), HARDENING_STAGES (default
# "fuzz asan tsan"), HARDENING_JOBS (default: nproc), CC/CXX (default
# clang/clang++).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
root=${HARDENING_DIR:-build-hardening}
mkdir -p "$root"
root=$(cd "$root" && pwd)
jobs=${HARDENING_JOBS:-$(nproc)}
fuzz_seconds=${FUZZ_SECONDS:-60}
stages=${HARDENING_STAGES:-fuzz asan tsan}
cc=${CC:-clang}
cxx=${CXX:-clang++}
export BOOST_TEST_COLOR_OUTPUT=no
# Tests must not pick up the caller's tables or backend list.
unset ARBITER_CONFIG ARBITER_BACKENDS

for tool in "$cc" "$cxx" cmake; do
  command -v "$tool" >/dev/null || { echo "hardening: $tool not found (run scripts/setup.sh)" >&2; exit 2; }
done
if command -v llvm-symbolizer >/dev/null; then
  export ASAN_SYMBOLIZER_PATH=${ASAN_SYMBOLIZER_PATH:-$(command -v llvm-symbolizer)}
fi
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)

summary=()
failed=0
now() { date +%s; }
note() { summary+=("$1"); echo "== $1"; }

configure() {  # DIR COMPILE_FLAGS LINK_FLAGS CMAKE_ARGS...
  local dir=$1 flags=$2 link=$3
  shift 3
  cmake -S "$repo" -B "$dir" "${generator[@]}" -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DARBITER_WITH_CUDA=OFF \
    -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
    -DCMAKE_EXE_LINKER_FLAGS="$link" -DCMAKE_SHARED_LINKER_FLAGS="$link" \
    -DCMAKE_MODULE_LINKER_FLAGS="$link" "$@" >"$dir.configure.log" 2>&1 ||
    { tail -30 "$dir.configure.log"; return 1; }
}

build() {  # DIR [TARGETS...]
  local dir=$1
  shift
  local targets=()
  (($#)) && targets=(--target "$@")
  cmake --build "$dir" -j"$jobs" "${targets[@]}" >"$dir.build.log" 2>&1 ||
    { grep -E "error|Error" "$dir.build.log" | head -30; tail -20 "$dir.build.log"; return 1; }
}

# UCX can patch the allocator and mmap for its memory-registration cache,
# which is known to clash with sanitizer interceptors. arbiter's CPU paths
# never register memory with UCX, so the hooks stay off here (the suite also
# passed with them on, with Debian 12's UCX 1.13).
export UCX_MEM_MALLOC_HOOKS=no UCX_MEM_MMAP_HOOK_MODE=none UCX_MEM_EVENTS=no
supp="$repo/scripts/lsan-third-party.supp"
asan_options="halt_on_error=1:detect_leaks=1:check_initialization_order=1:strict_init_order=1"
asan_options+=":detect_stack_use_after_return=1:print_summary=1"
ubsan_options="halt_on_error=1:print_stacktrace=1"
# ARBITER_CHECKED keeps the library's internal invariant checks
# (policy/src/checked.h) in these optimised builds.
san_flags="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -DARBITER_CHECKED"
# Backend modules link with --no-undefined, but an instrumented module leaves
# the sanitizer runtime's symbols to the program that dlopens it (clang
# exports them from every sanitized executable). CMake puts
# CMAKE_CXX_STANDARD_LIBRARIES last on the link line, after the module's own
# --no-undefined, so this relaxes it for these builds only.
module_undefs=(-DCMAKE_CXX_STANDARD_LIBRARIES=-Wl,-z,undefs)

# --- 1. fuzz ----------------------------------------------------------------
if [[ " $stages " == *" fuzz "* ]]; then
  start=$(now)
  dir=$root/fuzz
  targets=(policy_load size cli)
  flags="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -DARBITER_CHECKED"
  if configure "$dir" "$flags" "$flags" \
      -DARBITER_FUZZ=ON -DARBITER_BUILD_TESTS=OFF -DARBITER_BUILD_BENCH=OFF \
      -DARBITER_BUILD_EXAMPLES=OFF &&
     build "$dir" "${targets[@]/#/arbiter_fuzz_}"; then
    note "fuzz build: $(($(now) - start)) s"
    [ -n "${FUZZ_BUILD_ONLY:-}" ] && exit 0  # scripts/fuzz-long.sh runs the targets itself
    run_start=$(now)
    pids=()
    for t in "${targets[@]}"; do
      corpus=$dir/corpus/$t
      mkdir -p "$corpus" "$dir/artifacts"
      seeds=("$repo/fuzz/seeds/$t")
      [ -d "$repo/tests/data/fuzz/$t" ] && seeds+=("$repo/tests/data/fuzz/$t")
      max_len=4096
      if [ "$t" = policy_load ]; then
        max_len=8192  # the default table is 4.5 KiB
        seeds+=("$repo/tests/data/good" "$repo/tests/data/warn" "$repo/tests/data/bad"
                "$repo/configs" "$repo/tests/schema/cases/good" "$repo/tests/schema/cases/bad")
      fi
      # Past crashes: replayed first, then the search.
      (cd "$dir" && ASAN_OPTIONS="$asan_options" UBSAN_OPTIONS="$ubsan_options" \
        LSAN_OPTIONS="suppressions=$supp" \
        timeout -k 10 $((fuzz_seconds + 120)) "$dir/bin/arbiter_fuzz_$t" \
          -max_total_time="$fuzz_seconds" -timeout=10 -rss_limit_mb=2048 -max_len="$max_len" \
          -dict="$repo/fuzz/$t.dict" -artifact_prefix="$dir/artifacts/$t-" \
          -print_final_stats=1 "$corpus" "${seeds[@]}" \
          >"$dir/$t.log" 2>&1) &
      pids+=($!)
    done
    for i in "${!targets[@]}"; do
      t=${targets[$i]}
      rc=0
      wait "${pids[$i]}" || rc=$?
      execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$dir/$t.log" | grep -o '[0-9]*$' || true)
      cov=$(grep -o 'cov: [0-9]*' "$dir/$t.log" | tail -1 | grep -o '[0-9]*$' || true)
      corpus_n=$(find "$dir/corpus/$t" -type f | wc -l)
      if ((rc == 0)); then
        note "fuzz $t: ${execs:-?} executions in ${fuzz_seconds} s, coverage ${cov:-?} edges, corpus $corpus_n: ok"
      else
        failed=1
        note "fuzz $t: FAILED (exit $rc) after ${execs:-?} executions: see $dir/$t.log"
        grep -E "ERROR|SUMMARY|invariant|Test unit written|==[0-9]+==" "$dir/$t.log" | head -20 || true
        tail -40 "$dir/$t.log"
      fi
    done
    note "fuzz runs: $(($(now) - run_start)) s"
  else
    failed=1
    note "fuzz: build FAILED (see $dir.build.log)"
  fi
fi

# --- 2. asan ------------------------------------------------------------------
if [[ " $stages " == *" asan "* ]]; then
  start=$(now)
  dir=$root/asan
  # A C program (the C API example) linking a C++ library needs UBSan's C++
  # part, and that needs libstdc++ (last on the link line of C targets only).
  if configure "$dir" "$san_flags" "$san_flags" "${module_undefs[@]}" \
       "-DCMAKE_C_STANDARD_LIBRARIES=-fsanitize-link-c++-runtime -lstdc++" \
       -DARBITER_BUILD_BENCH=OFF && build "$dir"; then
    note "asan build: $(($(now) - start)) s"
    test_start=$(now)
    # UCX loaded at start-up, as if linked: LeakSanitizer (clang 14) crashes
    # ("Tracer caught signal 11") scanning the dynamic TLS of a libucs that
    # the runtime dlopens with its bootstrap library. Tests of a machine
    # without UCX unset LD_PRELOAD themselves.
    ucx_preload=$(ldd "$dir/lib/libarbiter_bootstrap_ucx.so" | awk '/libuc[mpst]\.so/ { print $3 }' | tr '\n' ' ')
    if LD_PRELOAD="$ucx_preload" ASAN_OPTIONS="$asan_options" UBSAN_OPTIONS="$ubsan_options" \
       LSAN_OPTIONS="suppressions=$supp:print_suppressions=0" \
       ctest --test-dir "$dir" -L cpu --output-on-failure -j"$jobs" --timeout 600 \
         >"$dir.ctest.log" 2>&1; then
      note "asan+ubsan ctest -L cpu: $(grep -o '[0-9]*% tests passed.*' "$dir.ctest.log" | head -1 || true) in $(($(now) - test_start)) s"
    else
      failed=1
      note "asan+ubsan ctest -L cpu: FAILED in $(($(now) - test_start)) s (see $dir.ctest.log)"
      grep -E "ERROR: |SUMMARY: |runtime error|Failed|\*\*\*" "$dir.ctest.log" | head -40 || true
      tail -30 "$dir.ctest.log"
    fi
  else
    failed=1
    note "asan: build FAILED (see $dir.build.log)"
  fi
fi

# --- 3. tsan ------------------------------------------------------------------
if [[ " $stages " == *" tsan "* ]]; then
  start=$(now)
  dir=$root/tsan
  tsan_tests=(policy_reload_test backends_shm_test runtime_dispatch_test)
  if configure "$dir" "-fsanitize=thread -fno-omit-frame-pointer -DARBITER_CHECKED" "-fsanitize=thread" \
       "${module_undefs[@]}" -DARBITER_BUILD_BENCH=OFF \
       -DARBITER_BUILD_EXAMPLES=OFF &&
     build "$dir" "${tsan_tests[@]}" arbiter-shm recording-mnnvl recording-trtllm recording-nccl; then
    note "tsan build: $(($(now) - start)) s"
    test_start=$(now)
    regex="^($(IFS='|'; echo "${tsan_tests[*]}"))\$"
    if TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1" \
       ctest --test-dir "$dir" -R "$regex" --output-on-failure -j"$jobs" --timeout 600 \
         >"$dir.ctest.log" 2>&1; then
      note "tsan ${tsan_tests[*]}: $(grep -o '[0-9]*% tests passed.*' "$dir.ctest.log" | head -1 || true) in $(($(now) - test_start)) s"
    else
      failed=1
      note "tsan: FAILED in $(($(now) - test_start)) s (see $dir.ctest.log)"
      grep -E "WARNING: ThreadSanitizer|SUMMARY: |Failed|\*\*\*" "$dir.ctest.log" | head -40 || true
      tail -30 "$dir.ctest.log"
    fi
  else
    failed=1
    note "tsan: build FAILED (see $dir.build.log)"
  fi
fi

echo
echo "hardening summary:"
printf '  %s\n' "${summary[@]}"
if ((failed)); then
  echo "hardening: FAILED"
  exit 1
fi
echo "hardening: all passed"
