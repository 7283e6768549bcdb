#!/usr/bin/env bash
# The whole test suite: set up and build everything (scripts/setup.sh), then run CTest.
# GPU tests ([cuda]) are registered only with -DHARNESS_TEST_CUDA=ON (scripts/h200_build.sh).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${BUILD_DIR:-$root/build}
"$root/scripts/setup.sh"
cd "$build_dir"
ctest --output-on-failure "$@"
"$root/scripts/tsan.sh"  # ThreadSanitizer over the autotuner and the race experiment (torch-free build-tsan/)
# AddressSanitizer + UBSan over the torch-free tests, then each fuzz target for FUZZ_SECONDS (60):
# one clang build (build-sanitize/) serves both (docs/RELIABILITY.md has their figures).
"$root/scripts/asan.sh"
"$root/scripts/fuzz.sh"
