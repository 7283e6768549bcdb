#!/usr/bin/env bash
# Runs ON the H200 (from the repo root): Nsight Compute on our attention kernels at the benchmark's
# cases, to say where a kernel's limit is (which pipe, which stall). For each case
# one forward and one backward launch of the kernels `case_flags` names (forced, autotune off; the
# D 96 and 192/128 cases' are the autotuner's picks in the bench on the H100), profiled with the
# clocks left alone (--clock-control none: the GPU's own clock behaviour, as in training):
#   SpeedOfLight (SM and memory throughput), ComputeWorkloadAnalysis (pipe utilization: the tensor
#   pipe is what matters), WarpStateStats and the stall-reason metrics (why warps stall: warps
#   stalled per issued instruction, by reason), Occupancy, LaunchStats.
# PEER_CASES ("CASE:PEER ...", e.g. "causal-128:fa4 dflash-512:flex-flash") profiles a peer's kernels
# the same way, side by side with ours: bench/attention_vs_flex.py writes that peer's worker job
# (--write-jobs), and the worker runs under Nsight Compute, which profiles the first PEER_KERNELS
# (default 6) launches whose names match PEER_KERNEL_REGEX (default [Ff]lash: flash-attn-4's CuTe DSL
# kernels, which flex's FLASH backend also runs): the first call's forward and backward kernels.
# The peer ours on a generic case ("dilated_window-8k:ours") profiles our kernels on the generic
# path the same way (default regex: our forward and backward main kernels, 2 launches).
# Env: BENCH (harness_bench_attention), CASES ("causal-128 dflash-512 dflash-128"), OUT.
# Writes $OUT/ncu_<case>_<fwd|bwd>.txt (ours) and $OUT/ncu_<case>_<peer>.txt, and prints a short
# summary per kernel.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=${OUT:-$root/out}
mkdir -p "$out"
bench=${BENCH:?set BENCH to harness_bench_attention}
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[[ -x $ncu ]] || { echo "ncu: not found"; exit 2; }
case_flags() {  # a case -> harness_bench_attention flags: the bench's case (bench/attention_vs_flex.py
  # --binary-flags) and the kernels profiled there
  local kernels
  case $1 in
    causal-128) kernels="--fwd-kernel wgmma_m128_n128 --bwd-kernel wgmma_atomic" ;;
    causal-128-pingpong) kernels="--fwd-kernel wgmma_m128_n128_pingpong --bwd-kernel wgmma_atomic" ;;
    dflash-512 | dflash-128) kernels="--fwd-kernel wgmma_m64_n64 --bwd-kernel wgmma_atomic" ;;
    causal-8k-hd96 | causal-8k-hd192v128) kernels="--fwd-kernel wgmma_m128_n128_pingpong_kv_major --bwd-kernel wgmma" ;;
    dflash-512-hd96) kernels="--fwd-kernel wgmma_m128_n128_pingpong --bwd-kernel wgmma" ;;
    *) echo "unknown case $1 (known: causal-128 causal-128-pingpong dflash-512 dflash-128 causal-8k-hd96 dflash-512-hd96 causal-8k-hd192v128)" >&2; return 1 ;;
  esac
  echo "$(python3 "$root/bench/attention_vs_flex.py" --binary-flags "${1%-pingpong}") $kernels"
}
sections=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section Occupancy
          --section LaunchStats --section MemoryWorkloadAnalysis
          --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio')
profile() {  # SECONDS FILE NCU-FILTER... -- COMMAND...: the launches the filter picks, autotuner off, into FILE
  local seconds=$1 file=$2
  shift 2
  local filter=()
  while [[ $1 != -- ]]; do filter+=("$1"); shift; done
  shift
  HARNESS_AUTOTUNE=off timeout "$seconds" "$ncu" --clock-control none --target-processes all "${filter[@]}" \
    "${sections[@]}" --print-units base "$@" >"$file" 2>&1
}
summary() {  # FILE: the figures that say where each kernel in it is limited
  grep -E '^\s+(Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per Thread|Achieved Occupancy|Issue Slots Busy|Executed Ipc Active|SM Busy|Warp Cycles Per Issued Instruction|Dynamic Shared Memory Per Block|Grid Size|Block Size)\b' "$1" | head -14
  grep -oE '[A-Za-z]+ is the highest-utilized pipeline \([0-9.]+%\)' "$1" | head -1
  # The three largest stall reasons (warps stalled per issued instruction).
  grep -E 'smsp__average_warps_issue_stalled_' "$1" | awk '{print $NF, $1}' | sort -gr | head -3 |
    sed -E 's/smsp__average_warps_issue_stalled_([a-z_]+)_per_issue_active.ratio/stalled \1/'
}
for c in ${CASES:-causal-128 dflash-512 dflash-128}; do
  flags=$(case_flags "$c") || continue
  for phase in fwd bwd; do
    if [[ $phase == fwd ]]; then kernel='regex:attention_fwd'; else kernel='regex:attention_bwd_(atomic|wgmma)_kernel'; fi
    file=$out/ncu_${c}_${phase}.txt
    # Skip the 3 warm-up launches; profile one.
    profile 240 "$file" -k "$kernel" -s 3 -c 1 -- "$bench" $flags --impl fused --reps 1
    echo "== $c $phase (rc=$?): $(grep -m1 -oE 'attention_[a-z_]+kernel' "$file")"
    summary "$file"
  done
done
jobs_dir=$(mktemp -d)
for pc in ${PEER_CASES:-}; do
  c=${pc%%:*} peer=${pc#*:}
  python3 "$root/bench/attention_vs_flex.py" --binary "$bench" --cases "$c" --peers "$peer" --reps 2 \
    --write-jobs "$jobs_dir" >/dev/null 2>"$out/ncu_${c}_${peer}.jobs.log"
  job=$jobs_dir/${c}_${peer}.json
  # The bench runs ours on a named case through harness_bench_attention, with no worker job: such a
  # case is profiled through CASES instead (case_flags).
  [[ -f $job ]] || { echo "== $c $peer: no job written ($(tail -1 "$out/ncu_${c}_${peer}.jobs.log"); ours on a named case: put it in NCU_CASES)"; continue; }
  file=$out/ncu_${c}_${peer}.txt
  # ours (harness.attention on a generic mask): our forward and backward main kernels, the kernels
  # the heuristic picks (the autotuner off, as above, so that its trials are not what is profiled).
  if [[ $peer == ours ]]; then regex=${PEER_KERNEL_REGEX:-attention_(fwd|bwd_(atomic|wgmma)_kernel)} count=${PEER_KERNELS:-2}
  else regex=${PEER_KERNEL_REGEX:-[Ff]lash} count=${PEER_KERNELS:-6}
  fi
  profile 300 "$file" -k "regex:$regex" -c "$count" -- python3 "$root/bench/attention_vs_flex.py" \
    --worker "$job" "$jobs_dir/result.json"
  echo "== $c $peer (rc=$?)"
  # One block per profiled kernel: its header line names it (", Context N, Stream M, Device D").
  awk -v dir="$jobs_dir" '/, Context [0-9]+, Stream [0-9]+/ {n++} n {print > (dir "/kernel" n ".txt")}' "$file"
  for k in "$jobs_dir"/kernel*.txt; do
    [[ -f $k ]] || continue
    echo "-- $(head -1 "$k" | sed -E 's/^ +//; s/\(([0-9]+, ?){2}[0-9]+\)x.*//' | cut -c1-120)"
    summary "$k"
    rm -f "$k"
  done
done
rm -rf "$jobs_dir"
