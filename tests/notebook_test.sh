#!/usr/bin/env bash
# Executes notebooks/harness.ipynb headless (jupyter nbconvert) against a db, and checks that every
# cell ran without error and that it drew its plots. Exit 77 (CTest: skipped) with the reason when
# jupyter, pandas or matplotlib is missing.
# usage: notebook_test.sh NOTEBOOK DB OUT_DIR
set -euo pipefail
notebook=$1 db=$2 out_dir=$3
venv=${HARNESS_VENV:-$HOME/.cache/harness/venv}
if [[ -x "$venv/bin/jupyter" ]]; then
  bin="$venv/bin"
elif command -v jupyter >/dev/null; then
  bin=$(dirname "$(command -v jupyter)")
else
  echo "SKIPPED: jupyter not found in $venv or on PATH (scripts/setup.sh installs nbconvert and ipykernel)"
  exit 77
fi
if ! "$bin/python" -c 'import pandas, matplotlib, nbconvert, ipykernel' 2>/dev/null; then
  echo "SKIPPED: $bin/python lacks pandas, matplotlib, nbconvert or ipykernel"
  exit 77
fi
mkdir -p "$out_dir"
# The kernel is this interpreter's own (not whatever "python3" kernel the machine registered).
HARNESS_DB=$db "$bin/python" -m nbconvert --to notebook --execute \
  --ExecutePreprocessor.timeout=120 --ExecutePreprocessor.kernel_name=python3 \
  --output-dir "$out_dir" --output executed.ipynb "$notebook"
"$bin/python" - "$out_dir/executed.ipynb" <<'PY'
import json, sys
cells = json.load(open(sys.argv[1]))["cells"]
outputs = [o for c in cells if c["cell_type"] == "code" for o in c.get("outputs", [])]
errors = [o for o in outputs if o.get("output_type") == "error"]
images = [o for o in outputs if "image/png" in o.get("data", {})]
print(f"{len(cells)} cells, {len(outputs)} outputs, {len(images)} plots, {len(errors)} errors")
if errors:
    sys.exit("FAIL: " + "; ".join(f"{e['ename']}: {e['evalue']}" for e in errors))
# The demo db has one experiment under two envs (one bar chart per key metric) and one anchor sweep.
if len(images) < 3:
    sys.exit(f"FAIL: expected the across-env and anchor-sweep plots, got {len(images)} images")
PY
