#!/usr/bin/env bash
# GPU check of the reliability guarantees (docs/RELIABILITY.md; runs ON the H200 image from the repo root, after dev/gpu/h200_build.sh):
#  1. kill -9 of the harness while a trial child holds GPU memory (a hang fault after its inputs
#     are on cuda:0): the child must be gone from nvidia-smi's compute apps, the run "abandoned".
#  2. the fault suite ([faults]) and the hostile-input CLI tests ([hostile]) on this machine.
# Prints "PASS: ..." per check and exits non-zero on the first failure.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build_dir=${BUILD_DIR:-$root/build-h200}
harness=$build_dir/harness/harness
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

HARNESS_ALLOW_FAULTS=1 "$harness" run "$root/tests/cli/faults.json" --device cuda:0 --db "$work/h.db" \
  --set 'variants={"fused":{"impl":"fused"},"hang":{"impl":"fused","fault":"hang"}}' --set timeout_s=600 >"$work/out" 2>"$work/err" &
parent=$!
child=""
for _ in $(seq 600); do  # up to 60 s for the child to start and allocate
  child=$(pgrep -P "$parent" -f "__trial --request .*\.hang\.request\.json" || true)
  if [[ -n "$child" ]] && nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -qw "$child"; then break; fi
  sleep 0.1
done
[[ -n "$child" ]] || fail "no trial child appeared"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | grep -w "$child" || fail "the child holds no GPU memory"
kill -9 "$parent"
wait "$parent" 2>/dev/null || true
for _ in $(seq 100); do
  nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -qw "$child" || break
  sleep 0.1
done
if nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -qw "$child"; then fail "child $child still holds GPU memory"; fi
echo "PASS: the trial child left the GPU when its parent was killed"
status=$("$harness" runs --json --db "$work/h.db" | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["status"])')
[[ "$status" == abandoned ]] || fail "run status $status, expected abandoned"
echo "PASS: the run is found abandoned"

"$build_dir/tests/harness_cli_tests" "[faults],[hostile]"
echo "PASS: fault suite and hostile-input CLI tests"
