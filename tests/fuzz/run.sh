#!/usr/bin/env bash
# Runs every libFuzzer target of a fuzzing build for SECONDS each (or, with FUZZ_RUNS=N in the
# environment, for N executions each) and prints the executions and wall time per target, from
# libFuzzer's final stats. New inputs go to BUILD/fuzz-corpus/<target> (the committed seeds in
# tests/fuzz/corpus are read, never written); a crash leaves its reproducer in BUILD/fuzz-artifacts/
# and fails the run: copy it to tests/fuzz/regressions/<target>/ with the fix, so `make test`
# replays it for good (tests/fuzz/FUZZ_RESULTS.md).
#   usage: tests/fuzz/run.sh BUILD SECONDS [TARGET...]
set -uo pipefail
build=${1:?build folder}; seconds=${2:?seconds per target}; shift 2
root=$(cd "$(dirname "$0")/../.." && pwd)
targets=("$@"); [ ${#targets[@]} -gt 0 ] || targets=(model hf_config cluster prediction measurement flags printable)
mkdir -p "$build/fuzz-artifacts"
limit=(-max_total_time="$seconds")
[ -n "${FUZZ_RUNS:-}" ] && limit=(-runs="$FUZZ_RUNS")
status=0; total=0
printf '%-12s %12s %8s  %s\n' target executions seconds result
for t in "${targets[@]}"; do
  exe="$build/tests/fuzz/fuzz_$t"
  [ -x "$exe" ] || { echo "run.sh: $exe is missing (build with make fuzz)" >&2; exit 2; }
  mkdir -p "$build/fuzz-corpus/$t"
  seeds="$root/tests/fuzz/corpus/$t"; regress="$root/tests/fuzz/regressions/$t"
  dirs=("$build/fuzz-corpus/$t" "$seeds"); [ -d "$regress" ] && dirs+=("$regress")
  log="$build/fuzz-$t.log"
  # -rss_limit_mb: a loader that grows past 2 GB on one input is a finding; -timeout: so is one input
  # that takes over 10 s.
  start=$SECONDS
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    "$exe" "${limit[@]}" -rss_limit_mb=2048 -timeout=10 -max_len=65536 -print_final_stats=1 \
    -artifact_prefix="$build/fuzz-artifacts/$t-" "${dirs[@]}" >"$log" 2>&1
  rc=$?
  took=$((SECONDS - start))
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  runs=${runs:-0}; total=$((total + runs))
  if [ $rc -eq 0 ]; then result=ok; else result="FAILED (exit $rc; see $log)"; status=1; fi
  printf '%-12s %12s %8s  %s\n' "$t" "$runs" "$took" "$result"
done
printf '%-12s %12s\n' total "$total"
exit $status
