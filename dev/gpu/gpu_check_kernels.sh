#!/usr/bin/env bash
# Runs ON the H200 image from the repo root (the attention kernels): builds the standalone
# self-test and the LibTorch tests with dev/gpu/h200_build.sh, then
#   1. harness_attention_selftest: every forward and backward kernel against the fp32 GPU and the
#      float64 CPU references (small and real dims), poisoned outputs, reproducibility (bitwise for
#      wgmma / mma; dK, dV bitwise and dQ to rounding for wgmma_atomic), then the timing tables;
#   2. the [cuda] Catch2 cases of tests/test_attention_cuda.cpp (wgmma_atomic forced through the
#      options against the dense reference at real and awkward dims; deterministic=true never runs
#      it and refuses it when forced; bitwise reproducibility of the deterministic path);
#   3. the self-test's real-dims cases at every head dim (--only REAL-D): head dims 64, 96, 192,
#      256 and 192/128, bf16 and fp16.
# Logs go to $OUT (or ./gpu_check_kernels.out). Exit status: 0 only when all three pass.
# Expected: self-test "PASSED: 0 failed checks"; wgmma_atomic bwd ms below wgmma's on every REAL
# case (kernels/cuda/README.md, "The backward"); Catch2 "All tests passed".
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=${OUT:-$root/gpu_check_kernels.out}
mkdir -p "$out"
build_dir=${BUILD_DIR:-$root/build-h200}
BUILD_TARGETS="harness_attention_selftest harness_torch_tests" BUILD_DIR=$build_dir "$root/dev/gpu/h200_build.sh" \
  > "$out/build.log" 2>&1 || { echo "build failed (see $out/build.log)"; tail -30 "$out/build.log"; exit 2; }
selftest=$(find "$build_dir" -name harness_attention_selftest -type f -perm -u+x | head -1)
timeout 400 "$selftest" --log "$out/selftest.log" > /dev/null
selftest_rc=$?
sed -n '/^Timing/,$p' "$out/selftest.log"
echo "selftest rc=$selftest_rc"
timeout 400 "$build_dir/tests/harness_torch_tests" "[cuda]" > "$out/catch_cuda.log" 2>&1
catch_rc=$?
tail -5 "$out/catch_cuda.log"
echo "catch [cuda] rc=$catch_rc"
timeout 400 "$selftest" --only REAL-D --log "$out/selftest_dims.log" > /dev/null
dims_rc=$?
tail -3 "$out/selftest_dims.log"
echo "selftest head dims rc=$dims_rc"
[[ $selftest_rc -eq 0 && $catch_rc -eq 0 && $dims_rc -eq 0 ]]
