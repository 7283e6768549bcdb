#!/usr/bin/env bash
# Fuzzes the parsers of hostile input with libFuzzer under AddressSanitizer and UBSan:
#   spec     experiment specs: parse, profile, --set overrides, validation, sweep expansion
#   plan     spec to plan: every sweep point validated, the memory model and its OOM replay (dims,
#            layers, repeats, sweeps), under a tighter memory and time limit than the others
#   capsule  capsule files: preamble, header, payload hashes, fit to a spec, output comparison
#   import   `replay --import` of torch.save files (links LibTorch, whose unpickler it reaches)
# The targets run side by side, each for FUZZ_SECONDS (default 60) from its seed corpus
# tests/fuzz/<target>/ (the shipped specs and tests/specs/bad are added to the spec seeds). A crash leaves its input in
# build-sanitize/findings/ and fails the script: copy it into tests/fuzz/<target>/ (it then
# becomes a regression input that the unit tests replay on every run) and fix the cause.
# Prints one line per target (executions, crashes) and writes them to findings/summary.tsv.
# Built by scripts/sanitize_build.sh (clang, build-sanitize/, shared with scripts/asan.sh).
# Env: FUZZ_SECONDS (60), FUZZ_TARGETS ("spec plan capsule import"), SANITIZE_BUILD_DIR,
#      FUZZ_REPORT_ONLY (targets whose findings are printed and kept but do not fail the script;
#      scripts/test.sh names `import`, see there).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${SANITIZE_BUILD_DIR:-$root/build-sanitize}
seconds=${FUZZ_SECONDS:-60}
targets=(${FUZZ_TARGETS:-spec plan capsule import})
log() { printf '[fuzz] %s\n' "$*" >&2; }

build_targets=()
for target in "${targets[@]}"; do build_targets+=("harness_fuzz_$target"); done
"$root/scripts/sanitize_build.sh" "${build_targets[@]}"

findings=$build_dir/findings
mkdir -p "$findings"
# Findings newer than this stamp are this run's.
stamp=$findings/.started
touch "$stamp"
# The targets run side by side (one process each; libFuzzer's time limit is wall time, so the phase
# takes FUZZ_SECONDS once, not once per target).
declare -A pids=()
trap 'for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done' INT TERM
for target in "${targets[@]}"; do
  corpus=$build_dir/corpus/$target  # grows here; tests/fuzz/ holds the seeds only
  mkdir -p "$corpus"
  seeds=("$root/tests/fuzz/$target")
  [[ $target == spec || $target == plan ]] && seeds+=("$root/experiments" "$root/tests/specs/bad" "$root/tests/cli")
  # Every input of the planner must plan within 2 GiB and 10 s (the others: 3 GiB, 20 s): a plan
  # whose memory or time grows with a count in the spec is a finding.
  limits=(-timeout=20 -rss_limit_mb=3072)
  [[ $target == plan ]] && limits=(-timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024)
  log "$target: ${seconds}s from ${seeds[*]}"
  ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:${ASAN_OPTIONS:-}" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
    "$build_dir/tests/fuzz/harness_fuzz_$target" "$corpus" "${seeds[@]}" -max_total_time="$seconds" \
    "${limits[@]}" -max_len=65536 -print_final_stats=1 -artifact_prefix="$findings/$target-" \
    >"$build_dir/$target.log" 2>&1 &
  pids[$target]=$!
done
printf 'target\tseconds\texecutions\tcrashes\tcorpus\n' >"$findings/summary.tsv"
failed=0
for target in "${targets[@]}"; do
  status=0
  wait "${pids[$target]}" || status=$?
  output=$build_dir/$target.log
  executions=$(sed -n 's/^stat::number_of_executed_units: *//p' "$output" | tail -1)
  crashes=$(find "$findings" -name "$target-*" -newer "$stamp" | wc -l)
  printf '%s\t%s\t%s\t%s\t%s\n' "$target" "$seconds" "${executions:-0}" "$crashes" "$(ls "$build_dir/corpus/$target" | wc -l)" \
    >>"$findings/summary.tsv"
  log "$target: ${executions:-?} executions, $crashes crash(es), exit $status"
  if ((status != 0 || crashes > 0)); then
    if [[ " ${FUZZ_REPORT_ONLY:-} " == *" $target "* ]]; then
      log "$target: REPORTED, NOT GATING (FUZZ_REPORT_ONLY): its finding is in $findings"
    else
      failed=1
    fi
    grep -E 'ERROR|runtime error|SUMMARY|Test unit written' "$output" | head -20 >&2 || true
  fi
done
column -t "$findings/summary.tsv" >&2 || cat "$findings/summary.tsv" >&2
if ((failed)); then
  log "findings in $findings: copy each into tests/fuzz/<target>/ as a regression input and fix the cause"
  exit 1
fi
