#!/usr/bin/env bash
# Long fuzzing: each libFuzzer target for SECONDS (default 600) in turn, one
# at a time so every target has a core, from the corpus grown by earlier
# runs (build-hardening/fuzz/corpus/<target>, kept between runs) plus the
# seeds and past crashes. Builds with scripts/test-hardening.sh's fuzz stage
# (FUZZ_SECONDS=0 there: build only). Any crash is minimised with
# -minimize_crash and stored as tests/data/fuzz/<target>/crash-<hash>, where
# the normal build replays it (fuzz_replay_<target>): fix it, then commit it.
#
#   scripts/fuzz-long.sh [SECONDS] [TARGET...]     (targets: policy_load size cli)
#
# Prints, per target: executions, executions per second, coverage (edges),
# corpus size and crashes. Exit 1 when any target crashed.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
seconds=${1:-600}
shift || true
targets=("$@")
((${#targets[@]})) || targets=(policy_load size cli)
root=${HARDENING_DIR:-build-hardening}
dir=$root/fuzz

FUZZ_SECONDS=0 FUZZ_BUILD_ONLY=1 HARDENING_STAGES=fuzz scripts/test-hardening.sh >/dev/null ||
  { echo "fuzz-long: the fuzz build failed (see $dir.build.log)" >&2; exit 2; }
dir=$(cd "$dir" && pwd)
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1" UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export LSAN_OPTIONS="suppressions=$repo/scripts/lsan-third-party.supp"
unset ARBITER_CONFIG ARBITER_BACKENDS

failed=0
report=()
for t in "${targets[@]}"; do
  bin=$dir/bin/arbiter_fuzz_$t
  [ -x "$bin" ] || { echo "fuzz-long: no target $t" >&2; exit 2; }
  corpus=$dir/corpus/$t
  artifacts=$dir/long-artifacts/$t
  mkdir -p "$corpus" "$artifacts"
  seeds=("$repo/fuzz/seeds/$t")
  [ -d "$repo/tests/data/fuzz/$t" ] && seeds+=("$repo/tests/data/fuzz/$t")
  max_len=4096
  # The same seeds as scripts/test-hardening.sh's fuzz stage.
  if [ "$t" = policy_load ]; then
    max_len=8192
    seeds+=("$repo/tests/data/good" "$repo/tests/data/warn" "$repo/tests/data/bad"
            "$repo/configs" "$repo/tests/schema/cases/good" "$repo/tests/schema/cases/bad")
  fi
  echo "fuzz-long: $t for $seconds s"
  rc=0
  timeout -k 10 $((seconds + 300)) "$bin" -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=2048 -max_len="$max_len" -dict="$repo/fuzz/$t.dict" \
    -artifact_prefix="$artifacts/" -print_final_stats=1 "$corpus" "${seeds[@]}" \
    >"$dir/long-$t.log" 2>&1 || rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$dir/long-$t.log" | grep -o '[0-9]*$' || echo 0)
  cov=$(grep -o 'cov: [0-9]*' "$dir/long-$t.log" | tail -1 | grep -o '[0-9]*$' || echo '?')
  crashes=0
  for crash in "$artifacts"/crash-* "$artifacts"/leak-* "$artifacts"/timeout-* "$artifacts"/oom-*; do
    [ -f "$crash" ] || continue
    crashes=$((crashes + 1))
    small=$artifacts/minimised-$(basename "$crash")
    "$bin" -minimize_crash=1 -max_total_time=60 -exact_artifact_path="$small" "$crash" \
      >"$dir/long-$t-minimise.log" 2>&1 || true
    [ -f "$small" ] || small=$crash
    name=crash-$(sha1sum "$small" | cut -c1-12)
    mkdir -p "$repo/tests/data/fuzz/$t"
    cp "$small" "$repo/tests/data/fuzz/$t/$name"
    echo "fuzz-long: $t crashed; stored tests/data/fuzz/$t/$name (log: $dir/long-$t.log)"
    rm -f "$crash"
  done
  ((rc == 0 && crashes == 0)) || failed=1
  line="$t: $execs executions in $seconds s ($((execs / (seconds > 0 ? seconds : 1))) per s), coverage $cov edges, corpus $(find "$corpus" -type f | wc -l), crashes $crashes"
  ((rc == 0)) || line+=" (exit $rc)"
  report+=("$line")
  echo "fuzz-long: $line"
done
echo
echo "fuzz-long summary:"
printf '  %s\n' "${report[@]}"
exit $failed
