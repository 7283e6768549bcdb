#!/usr/bin/env bash
# Runs ON the GPU machine (from the repo root): every forward and every backward kernel on the
# bench's cases, each forced in its own harness_bench_attention process with the autotuner off,
# then the case with nothing forced and the autotuner on; prints one table per case (ms, median of
# REPS launches, cold L2, as the bench times them). A kernel without an instantiation for the case's
# head dims says so. What it answers: whether the kernel the heuristic or the autotuner runs at a
# shape is the fastest there, and by how much the others miss.
# Env: BENCH (harness_bench_attention), SWEEP_CASES (named-mask cases of bench/attention_vs_flex.py,
# default the head-dim ones), REPS (default 20).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bench=${BENCH:?set BENCH to harness_bench_attention}
fwd_kernels="mma_m128_n64 wgmma_m128_n128 wgmma_m128_n64 wgmma_m64_n64 wgmma_m128_n128_pingpong wgmma_m64_n64_overlap
  wgmma_m64_n128_overlap wgmma_m64_n64_overlap_kv_major wgmma_m128_n128_pingpong_kv_major wgmma_m64_n128_overlap_kv_major"
bwd_kernels="wgmma_atomic wgmma mma"
row() {  # LABEL FLAGS...: one bench process, one table row
  local label=$1 json
  shift
  json=$(timeout 120 "$bench" "$@" --impl fused --reps "${REPS:-20}" 2>/dev/null)
  python3 -c '
import json, sys
label = sys.argv[1]
try:
    r = json.loads(sys.argv[2])
except ValueError:
    print(f"| {label} | no output | |"); sys.exit()
why = r.get("unsupported") or r.get("error")
if why or not r.get("results"):
    print("| %s | %s | |" % (label, (why or "no result").splitlines()[0][:100])); sys.exit()
x = r["results"][0]
print("| %s | %.3f (%.0f) | %.3f (%.0f) |" % (label, x["fwd_ms"], x["fwd_tflops"], x["bwd_ms"], x["bwd_tflops"]))
' "$label" "$json"
}
for c in ${SWEEP_CASES:-causal-8k-hd96 dflash-512-hd96 causal-8k-hd192v128 causal-8k-hd256}; do
  flags=$(python3 "$root/bench/attention_vs_flex.py" --binary-flags "$c") || continue
  printf '\n%s (%s)\n\n| kernel forced | fwd ms (TFLOP/s) | bwd ms (TFLOP/s) |\n|---|---|---|\n' "$c" "$flags"
  # shellcheck disable=SC2086
  for k in $fwd_kernels; do HARNESS_AUTOTUNE=off row "fwd $k" $flags --fwd-kernel "$k"; done
  # shellcheck disable=SC2086
  for k in $bwd_kernels; do HARNESS_AUTOTUNE=off row "bwd $k" $flags --bwd-kernel "$k"; done
  # shellcheck disable=SC2086
  HARNESS_AUTOTUNE=off row "heuristic" $flags
  # shellcheck disable=SC2086
  row "autotuner" $flags
done
