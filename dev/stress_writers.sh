#!/usr/bin/env bash
# Concurrent writers at a chosen scale (the fault suite runs 3 x 2): WRITERS harness processes,
# each running RUNS runs of a one-trial spec into one db, then checks that every run and trial
# is stored, every run ended ok, and SQLite's integrity_check is ok. Prints one line of figures.
# Usage: dev/stress_writers.sh [WRITERS=8] [RUNS=12]   (BUILD_DIR: where harness is built)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
harness=${BUILD_DIR:-$root/build}/harness/harness
writers=${1:-8}
runs=${2:-12}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
specs=()
for _ in $(seq "$runs"); do specs+=("$root/tests/cli/faults.json"); done
start=$(date +%s)
pids=()
for w in $(seq "$writers"); do
  HARNESS_ALLOW_FAULTS=1 "$harness" run "${specs[@]}" --device cpu --db "$work/h.db" \
    --set 'variants={"fused":{"impl":"fused"}}' >"$work/out.$w" 2>"$work/err.$w" &
  pids+=($!)
done
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=$((failed + 1)); done
seconds=$(($(date +%s) - start))
python3 - "$work/h.db" "$writers" "$runs" "$failed" "$seconds" <<'PY'
import sqlite3, sys
db, writers, runs, failed, seconds = sys.argv[1], *map(int, sys.argv[2:])
c = sqlite3.connect(db)
ok = c.execute("select count(*) from runs where status = 'ok'").fetchone()[0]
trials = c.execute("select count(*) from trials where status = 'ok'").fetchone()[0]
integrity = c.execute("pragma integrity_check").fetchone()[0]
print(f"writers={writers} runs_each={runs} expected={writers * runs} runs_ok={ok} trials_ok={trials} "
      f"failed_processes={failed} integrity={integrity} seconds={seconds}")
sys.exit(0 if ok == trials == writers * runs and failed == 0 and integrity == "ok" else 1)
PY
