#!/usr/bin/env bash
# Runs pytest files with the harness's torch venv (HARNESS_VENV, default ~/.cache/harness/venv) or
# python3; exits 77 (CTest: skipped) with the reason when neither has torch and pytest.
set -uo pipefail
python=${HARNESS_VENV:-$HOME/.cache/harness/venv}/bin/python
[[ -x $python ]] || python=python3
if ! "$python" -c 'import torch, pytest' 2>/dev/null; then
  echo "skipped: $python has no torch or pytest" >&2
  exit 77
fi
exec "$python" -m pytest -q -p no:cacheprovider "$@"
