#!/usr/bin/env bash
# Runs ON the H200 image from the repo root (the Python package). Run dev/gpu/prepare_h200.sh
# on the development machine first and send .deps with the tree (SQLite headers, pytest). Steps:
#   1. build harness, harness_ops (the torch ops) and harness_bench_attention (dev/gpu/h200_build.sh);
#   2. pytest tests/python against that build: every CPU test plus the `cuda` ones
#      (tests/python/test_attention_cuda.py): harness.attention against torch.compile(flex_attention)
#      in one process at the real DFlash dims (32/8 heads, D 128, 128 anchors x 16, context 8192)
#      and at others (D 64, odd lengths, every mask kind), forward, lse and the three gradients; a
#      training step of a drafter layer under torch.compile(mode="reduce-overhead") (CUDA graphs),
#      matching eager, with no cudagraph skip; bad CUDA input;
#   3. bench/python_vs_cpp.py: the op timed from Python against the same kernels timed in C++
#      (harness_bench_attention), host microseconds per call, and the drafter layer compiled with
#      harness.attention vs with compiled flex_attention (outputs compared, fwd/bwd ms).
# Logs go to $OUT (default ./gpu_check_python.out). Exit status 0 only when 1-3 succeed.
# Expected: pytest "N passed" with no failure (no cuda test skipped on an H200); bench JSON with
# python_ms within ~0.05 ms of cpp_ms, host_us_per_forward_call for harness.attention a few tens of
# microseconds at most, layer_ms harness below flex, layer_max_abs_diff.out small against out_scale.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
out=${OUT:-$root/gpu_check_python.out}
mkdir -p "$out"
build_dir=${BUILD_DIR:-$root/build-h200}
BUILD_TARGETS="harness harness_ops harness_bench_attention" BUILD_DIR=$build_dir dev/gpu/h200_build.sh \
  > "$out/build.log" 2>&1 || { echo "build failed (see $out/build.log)"; tail -30 "$out/build.log"; exit 2; }
python3 -c 'import pytest' 2>/dev/null || export PYTHONPATH=$root/.deps/python${PYTHONPATH:+:$PYTHONPATH}
export HARNESS_OPS_LIBRARY=$build_dir/python/libharness_ops.so HARNESS_BIN=$build_dir/harness/harness
export HARNESS_REQUIRE_NATIVE=1
timeout 900 python3 -m pytest -q -p no:cacheprovider -rs tests/python > "$out/pytest.log" 2>&1
pytest_rc=$?
tail -15 "$out/pytest.log"
echo "pytest rc=$pytest_rc"
timeout 600 python3 bench/python_vs_cpp.py --binary "$build_dir/bench/harness_bench_attention" \
  > "$out/python_vs_cpp.log" 2>&1
bench_rc=$?
cat "$out/python_vs_cpp.log" | tail -25
echo "bench rc=$bench_rc"
[[ $pytest_rc -eq 0 && $bench_rc -eq 0 ]]
