#!/usr/bin/env bash
# tests/python/test_evidence.py under CTest: capsules load with safetensors, a safetensors step from
# Python replays, --trace names the phases. Skips (77) when the venv lacks safetensors or pytest.
set -u
binary=$1
venv=${HARNESS_VENV:-$HOME/.cache/harness/venv}
python=$venv/bin/python
[[ -x $python ]] || python=python3
if ! "$python" -c 'import safetensors, pytest, torch' 2>/dev/null; then
  echo "SKIPPED: $python lacks safetensors, pytest or torch (pip install safetensors pytest)"
  exit 77
fi
HARNESS_BIN=$binary exec "$python" -m pytest -q -p no:cacheprovider "$(dirname "$0")/python/test_evidence.py"
