#!/usr/bin/env bash
# One device call on the H200 image does everything that needs the GPU, so the lease is spent
# on work, not on machine starts: build (scripts/h200_build.sh), the [cuda] tests, the main job
# at the real dims with `show`, and the kernel benchmark against torch.compile(flex_attention).
# Logs go to $OUT (the device tool brings them back); a short summary is printed last.
# Run here first: scripts/prepare_h200.sh (carry .deps).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
out=${OUT:-$root/out}
mkdir -p "$out"
build=${BUILD_DIR:-$root/build-h200}
export BUILD_DIR=$build

step() { printf '\n== %s (%s)\n' "$1" "$(date +%T)"; }

step build
if ! scripts/h200_build.sh >"$out/build.log" 2>&1; then
  tail -40 "$out/build.log"
  exit 1
fi
grep -E '^-- harness' "$out/build.log"

step "unit tests (Catch2 v3)"
"$build/tests/harness_unit_tests" >"$out/unit.log" 2>&1; echo "rc=$?"; tail -2 "$out/unit.log"

step "[cuda] tests"
"$build/tests/harness_torch_tests" "[cuda]" >"$out/cuda_tests.log" 2>&1; echo "rc=$?"; tail -3 "$out/cuda_tests.log"

step "CLI end to end on the GPU"
"$build/tests/harness_cli_tests" "[cuda]" >"$out/cli_cuda.log" 2>&1; echo "rc=$?"; tail -3 "$out/cli_cuda.log"

step "harness run bwd_fusion --device cuda:0"
db=$out/h200.db
"$build/harness/harness" env --device cuda:0 >"$out/env.txt" 2>&1
"$build/harness/harness" run bwd_fusion --device cuda:0 --db "$db" 2>&1 | tee "$out/bwd_fusion.txt"
"$build/harness/harness" show 1 --db "$db" >"$out/show.txt" 2>&1
"$build/harness/harness" show 1 --db "$db" --json >"$out/show.json" 2>&1

if [[ "${HARNESS_SKIP_OOM:-0}" != 1 ]]; then
  # The founding failure on a 96 GB GPU, reproduced on the H200's 141 GB by capping each trial.
  step "bwd_fusion at 512 anchors, 5 layers, --memory-limit 96GiB"
  "$build/harness/harness" run bwd_fusion --device cuda:0 --db "$db" --set dims.anchors=512 --set dims.layers=5 \
    --memory-limit 96GiB 2>&1 | tee "$out/bwd_fusion_oom.txt"
fi

if [[ "${HARNESS_SKIP_BENCH:-0}" != 1 ]]; then
  step "benchmark: ours vs torch.compile(flex_attention)"
  PYTHONUNBUFFERED=1 python3 bench/attention_vs_flex.py --binary "$build/bench/harness_bench_attention" \
    --json-out "$out/bench.json" ${BENCH_ARGS:-} 2>&1 | tee "$out/bench.txt" | tail -20
fi
step done
