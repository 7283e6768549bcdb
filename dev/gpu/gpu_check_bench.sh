#!/usr/bin/env bash
# Runs ON the H200 (from the repo root): the fair attention benchmark (bench/attention_vs_flex.py).
#  1. flash-attn-4 (peers flex-flash and fa4) from the wheels dev/gpu/fa4_wheels.sh prepared, when
#     .whl/fa4-part1 and .whl/fa4-part2 are both on the machine (sent by two commands to one
#     machine: a command sent with part1 leaves a copy in /tmp/fa4-part1, where the next finds it);
#     installed into /tmp/fa4-site (FA4_SITE). Without them those two peers say "not installed"
#     in the table and everything else runs.
#  2. builds harness_bench_attention and harness_mask_describe (dev/gpu/h200_build.sh, build-h200/).
#  3. bench/attention_vs_flex.py with a wall-time budget; table and JSON into $OUT (or out/).
# Knobs: CASES (default dflash-128,dflash-512,causal-128; "all" = 20 cases), PEERS (default all),
# BUDGET_S (default 480: fits a 10-minute command after the build), REPS (20), REPEATS (1),
# BENCH_ARGS (more flags). SKIP_BUILD=1 reuses build-h200/ from an earlier command; BUILD_ONLY=1
# stops after the build (a first command, sent with .whl/fa4-part1).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
out=${OUT:-$root/out}
mkdir -p "$out"
build_dir=${BUILD_DIR:-$root/build-h200}
start=$(date +%s)

# shellcheck source=dev/gpu/fa4_env.sh
source "$root/dev/gpu/fa4_env.sh"
site=$fa4_site
fa4_install "$root"
if [[ -f $site/.installed ]]; then
  fa4_path
  python3 -c 'import flash_attn.cute, importlib.metadata as m; print("flash-attn-4", m.version("flash-attn-4"))' \
    || echo "flash_attn.cute does not import: flex-flash and fa4 will say why in the table"
fi

if [[ -z ${SKIP_BUILD:-} ]]; then
  echo "== building harness_bench_attention (build-h200)"
  BUILD_DIR=$build_dir BUILD_TARGETS="harness_bench_attention harness_mask_describe" "$root/dev/gpu/h200_build.sh" >"$out/build.log" 2>&1 \
    || { tail -40 "$out/build.log"; exit 3; }
fi
echo "== build done after $(( $(date +%s) - start )) s"
[[ -z ${BUILD_ONLY:-} ]] || exit 0

python3 bench/attention_vs_flex.py --binary "$build_dir/bench/harness_bench_attention" \
  --cases "${CASES:-dflash-128,dflash-512,causal-128}" --peers "${PEERS:-all}" --budget-s "${BUDGET_S:-480}" \
  --reps "${REPS:-20}" --repeats "${REPEATS:-1}" --json-out "$out/bench.json" --md-out "$out/bench.md" ${BENCH_ARGS:-}
echo "== total $(( $(date +%s) - start )) s; table: $out/bench.md, numbers: $out/bench.json"
