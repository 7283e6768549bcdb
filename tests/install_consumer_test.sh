#!/usr/bin/env bash
# The install rules, as a user meets them: `cmake --install BUILD --prefix P`, then from
# another folder the installed binary lists and runs the specs it finds under P/share (no
# --experiments-dir), and a C++ project finds the kernels library with find_package(harness) and
# runs the fused attention against the dense reference (tests/install_consumer/).
# Usage: install_consumer_test.sh BUILD_DIR TORCH_DIR [GENERATOR]
set -euo pipefail
build=$1 torch_dir=$2 generator=${3:-Ninja}
source_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/install_consumer
work=$(mktemp -d /tmp/harness-install-consumer.XXXXXX)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" > "$work/install.log"
mkdir "$work/elsewhere" && cd "$work/elsewhere"

"$prefix/bin/harness" list > list.txt
grep -q "$prefix/share/harness/experiments/bwd_fusion.json" list.txt \
  || { echo "installed binary did not list its own specs:"; cat list.txt; exit 1; }
"$prefix/bin/harness" run bwd_fusion --device cpu --db "$work/elsewhere/harness.db" --json > run.json
python3 -c 'import json, sys; run = json.load(open("run.json"))["run"]; sys.exit(run["status"] != "ok")' \
  || { echo "bwd_fusion from the prefix did not end ok:"; head -c 2000 run.json; exit 1; }
echo "installed binary: specs from $prefix/share/harness/experiments, bwd_fusion ok"

cmake -S "$source_dir" -B "$work/consumer" -G "$generator" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" -DTorch_DIR="$torch_dir" > "$work/configure.log" 2>&1 \
  || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/consumer" > "$work/build.log" 2>&1 || { tail -50 "$work/build.log"; exit 1; }
"$work/consumer/consumer"
