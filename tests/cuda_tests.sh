#!/usr/bin/env bash
# CTest `cuda`: the [cuda] cases of the torch and CLI test binaries. Without a CUDA device it exits
# 77, which CTest reports as skipped (the cases themselves skip too); with one, every case must run
# and pass. Usage: cuda_tests.sh TORCH_TESTS CLI_TESTS PYTHON
set -uo pipefail
torch_tests=$1 cli_tests=$2 python=$3
if ! "$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null &&
   ! nvidia-smi -L >/dev/null 2>&1; then
  echo "SKIPPED: no CUDA device (the [cuda] cases run on a GPU machine: ctest -R cuda)"
  exit 77
fi
"$torch_tests" "[cuda]" && "$cli_tests" "[cuda]"
