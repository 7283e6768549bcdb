#!/usr/bin/env bash
# AddressSanitizer + UBSan over the torch-free tests (harness_unit_tests: db, specs, hostile input,
# the fuzz corpus replay, diff, writeup, ...), built with clang by scripts/sanitize_build.sh.
# Any report fails the run. The CLI tests drive the harness binary, which links LibTorch: an
# instrumented binary means compiling every LibTorch file of the project again with ASan, which
# does not fit CI's budget (docs/RELIABILITY.md); its torch-free code is covered here and by the
# fuzz targets (scripts/fuzz.sh), and the CLI and fault tests run against the ordinary build.
# Arguments go to the test binary.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${SANITIZE_BUILD_DIR:-$root/build-sanitize}
"$root/scripts/sanitize_build.sh" harness_unit_tests
printf '[asan] running the unit tests under ASan + UBSan\n' >&2
cd "$root"
ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:${ASAN_OPTIONS:-}" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
  "$build_dir/tests/harness_unit_tests" "$@"
