#!/usr/bin/env bash
# GPU check of `harness bisect`, run ON the H200 image from the repo root after
# dev/gpu/prepare_h200.sh (no network there: every test installs only wheels it builds itself).
#   1. builds the unit and CLI tests with Catch2 v3 (the development machine has v2);
#   2. runs the [bisect] tests: the search, versions, judging and db rows, then end to end:
#      tiny wheels, real venvs (venv + pip; uv too when it is in $PATH), a bisect over them on
#      the CPU, `bisect show`, `writeup --bisect`, `envs list|prune`, the exit-2 inputs;
#   3. one bisect on the GPU: `--envs` over the image's own python3 twice is the same verdict on
#      both ends, so it must exit 2 naming it (the probes are real triton_autotune_race_py runs
#      on cuda:0, 2 variants x 30 trials each).
# Expected: both test commands "All tests passed"; step 3 prints "same verdict RACE" (or the
# verdict the image's Triton reads) and "exit 2".
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
BUILD_TARGETS="harness harness_unit_tests harness_cli_tests" dev/gpu/h200_build.sh
build=${BUILD_DIR:-$root/build-h200}
"$build/tests/harness_unit_tests" "[bisect]"
"$build/tests/harness_cli_tests" "[bisect]"
python=$(command -v python3)
mkdir -p /tmp/gpu_check_bisect && ln -sf "$python" /tmp/gpu_check_bisect/python3-a && ln -sf "$python" /tmp/gpu_check_bisect/python3-b
set +e
"$build/harness/harness" bisect triton_autotune_race_py --envs /tmp/gpu_check_bisect/python3-a /tmp/gpu_check_bisect/python3-b \
  --device cuda:0 --db /tmp/gpu_check_bisect/bisect.db
echo "exit $?"
