#!/usr/bin/env bash
# tests/python/test_evidence.py under CTest: capsules load with safetensors, a safetensors step from
# Python replays, --trace names the phases. Fails when the venv lacks safetensors or pytest
# (scripts/setup.sh installs them): a skip here once hid, on a fresh machine, that setup.sh did not.
set -u
binary=$1
venv=${HARNESS_VENV:-$HOME/.cache/harness/venv}
python=$venv/bin/python
[[ -x $python ]] || python=python3
if ! "$python" -c 'import safetensors, pytest, torch' 2>/dev/null; then
  echo "FAILED: $python lacks safetensors, pytest or torch (scripts/setup.sh installs them)"
  exit 1
fi
HARNESS_BIN=$binary exec "$python" -m pytest -q -p no:cacheprovider "$(dirname "$0")/python/test_evidence.py"
