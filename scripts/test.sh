#!/usr/bin/env bash
# The whole test suite: set up and build everything (scripts/setup.sh), then run CTest.
# GPU tests ([cuda]) are registered only with -DHARNESS_TEST_CUDA=ON (scripts/h200_build.sh).
# The CTest `slurm` starts a one-node Slurm of its own (tests/slurm_test.sh, scripts/slurm_local.sh),
# runs the [slurm] cases and stops it; it is skipped, with the reason, where Slurm cannot start.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${BUILD_DIR:-$root/build}
"$root/scripts/setup.sh"
cd "$build_dir"
ctest --output-on-failure "$@"
"$root/scripts/tsan.sh"  # ThreadSanitizer over the autotuner and the race experiment (torch-free build-tsan/)
