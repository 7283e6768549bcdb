#!/usr/bin/env bash
# Runs ON the H200 (from the repo root): an A/B of our attention kernels by Nsight Compute kernel
# durations (--clock-control none, gpu__time_duration.sum), one process per (case, setting):
# the kernels forced (autotune off), every attention_* kernel's median over its launches printed
# per case and setting. The settings are values of one environment variable (default
# HARNESS_SCHEDULE_ORDER = batch, kv_head: the schedule-order table of kernels/cuda/README.md).
# Env: BENCH (harness_bench_attention), AB_VAR (HARNESS_SCHEDULE_ORDER), AB_VALUES ("batch kv_head"),
# AB_CASES (names below), ROUNDS (1), REPS (3 ops per process), OUT (CSV files kept under $OUT/ncu_ab).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bench=${BENCH:?set BENCH to harness_bench_attention}
out=${OUT:-$root/out}/ncu_ab
mkdir -p "$out"
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[[ -x $ncu ]] || { echo "ncu: not found"; exit 2; }
var=${AB_VAR:-HARNESS_SCHEDULE_ORDER}
[[ $var =~ ^[A-Z_][A-Z0-9_]*$ ]] || { echo "AB_VAR '$var' is not an environment variable name"; exit 2; }
case_flags() {  # case -> harness_bench_attention flags (the bench's case dims, the kernels the autotuner picks there)
  local sw="--mask sliding_window --anchors 512 --context 0 --window 1024" dc="--mask document_causal --anchors 512 --context 0"
  case $1 in
    dflash-512) echo "--mask dflash --anchors 512 --fwd-kernel wgmma_m64_n64_overlap --bwd-kernel wgmma_atomic" ;;
    dflash-512-det) echo "--mask dflash --anchors 512 --fwd-kernel wgmma_m128_n128_pingpong --bwd-kernel wgmma" ;;
    dflash-128) echo "--mask dflash --anchors 128 --fwd-kernel wgmma_m64_n64_overlap --bwd-kernel wgmma_atomic" ;;
    dflash-512-hd64) echo "--mask dflash --anchors 512 --head-dim 64 --fwd-kernel wgmma_m64_n64_overlap --bwd-kernel wgmma_atomic" ;;
    causal-128) echo "--mask causal --anchors 128 --fwd-kernel wgmma_m128_n128_pingpong --bwd-kernel wgmma_atomic" ;;
    sliding_window-8k) echo "$sw --fwd-kernel wgmma_m64_n64_overlap --bwd-kernel wgmma" ;;
    sliding_window-8k-atomic) echo "$sw --fwd-kernel wgmma_m128_n128_pingpong --bwd-kernel wgmma_atomic" ;;
    document_causal-8k) echo "$dc --fwd-kernel wgmma_m128_n128_pingpong --bwd-kernel wgmma" ;;
    *) echo "unknown case '$1' (known: dflash-512 dflash-512-det dflash-128 dflash-512-hd64 causal-128 sliding_window-8k sliding_window-8k-atomic document_causal-8k)" >&2; return 2 ;;
  esac
}
for round in $(seq 1 "${ROUNDS:-1}"); do
  for c in ${AB_CASES:-dflash-512 dflash-512-det dflash-128 causal-128 sliding_window-8k document_causal-8k}; do
    flags=$(case_flags "$c") || exit 2
    for value in ${AB_VALUES:-batch kv_head}; do
      csv=$out/${c}_${value}_r$round.csv
      # shellcheck disable=SC2086
      env "$var=$value" HARNESS_AUTOTUNE=off timeout 180 "$ncu" --clock-control none --metrics gpu__time_duration.sum \
        -k regex:attention_ --csv --print-units base "$bench" $flags --impl fused --reps "${REPS:-3}" >"$csv" 2>"$csv.err"
      python3 - "$csv" "$c" "$var=$value" <<'PY'
import csv, io, re, statistics, sys
path, case, setting = sys.argv[1:]
lines = [line for line in open(path).read().splitlines() if line.startswith('"')]
rows = list(csv.reader(io.StringIO("\n".join(lines))))
if len(rows) < 2:
    print(f"{case:26s} {setting:32s} no kernels profiled (see {path}.err)")
    sys.exit()
head = rows[0]
name_at, value_at = head.index("Kernel Name"), head.index("Metric Value")
durations = {}
for row in rows[1:]:
    # "void harness::...::attention_fwd_wgmma_kernel<...>(...)" -> attention_fwd_wgmma_kernel
    name = re.match(r"[\w:]+", re.sub(r"^void ", "", row[name_at])).group(0).split("::")[-1]
    durations.setdefault(name, []).append(float(row[value_at].replace(",", "")) / 1000.0)  # ns -> us
parts = [f"{name} {statistics.median(v):.1f} us (n{len(v)})" for name, v in durations.items()
         if "schedule" not in name and "bits" not in name]
print(f"{case:26s} {setting:32s} " + " | ".join(parts))
PY
    done
  done
done
