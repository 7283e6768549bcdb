#!/usr/bin/env bash
# Runs ON the H200 image: everything that needs the GPU in one command, so that one machine start
# serves it all: build (dev/gpu/h200_build.sh), the [cuda] tests, the experiments
# at the real dims (bwd_fusion, anchor_scaling under a 96 GiB cap, the python probes, the warm-up
# race on the GPU), explain-oom and replay of the founding OOM, writeups, and (unless skipped) the
# kernel benchmark against torch.compile(flex_attention).
# Logs go to $OUT; a short summary is printed.
# First, on the development machine: dev/gpu/prepare_h200.sh (.deps goes to the GPU machine with the tree). Steps: STEPS="build tests bwd scaling
# replay python race writeup bench selftest" (default: all but bench and selftest).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
out=${OUT:-$root/out}
mkdir -p "$out"
build=${BUILD_DIR:-$root/build-h200}
export BUILD_DIR=$build
steps=" ${STEPS:-build tests bwd scaling replay python race writeup} "
harness=$build/harness/harness
db=$out/h200.db

step() { printf '\n== %s (%s)\n' "$1" "$(date +%T)"; }
want() { [[ $steps == *" $1 "* ]]; }

if want build; then
  step build
  if ! dev/gpu/h200_build.sh >"$out/build.log" 2>&1; then
    tail -40 "$out/build.log"
    exit 1
  fi
  grep -E '^-- harness' "$out/build.log"
fi

if want selftest; then
  # The kernels alone (nvcc only): every forward and backward kernel against an fp32 GPU reference
  # (and float64 on the CPU for small shapes), poisoned outputs, bitwise reproducibility, timings.
  step "kernel self-test (every kernel, real dims timed)"
  timeout 300 "$build/bench/harness_attention_selftest" --log "$out/selftest.log" >/dev/null 2>&1; echo "rc=$?"
  grep -E '^\||PASSED|FAILED|ERROR' "$out/selftest.log"
fi

if want tests; then
  step "unit tests (Catch2 v3)"
  "$build/tests/harness_unit_tests" >"$out/unit.log" 2>&1; echo "rc=$?"; tail -2 "$out/unit.log"
  step "[cuda] tests"
  timeout 300 "$build/tests/harness_torch_tests" "[cuda]" >"$out/cuda_tests.log" 2>&1; echo "rc=$?"; tail -3 "$out/cuda_tests.log"
  step "CLI end to end on the GPU"
  timeout 300 "$build/tests/harness_cli_tests" "[cuda]" >"$out/cli_cuda.log" 2>&1; echo "rc=$?"; tail -3 "$out/cli_cuda.log"
fi

"$harness" env --device cuda:0 >"$out/env.txt" 2>&1

if want bwd; then
  step "harness run bwd_fusion --device cuda:0"
  "$harness" run bwd_fusion --device cuda:0 --db "$db" 2>&1 | tee "$out/bwd_fusion.txt"
fi

if want scaling; then
  # The founding failure on a 96 GB GPU, reproduced on the H200's 141 GB by capping each trial.
  step "anchor_scaling (128/256/512 anchors × 1/5 layers) --memory-limit 96GiB"
  "$harness" run anchor_scaling --device cuda:0 --db "$db" --memory-limit 96GiB 2>&1 | tee "$out/anchor_scaling.txt"
  "$harness" show "$("$harness" runs --experiment anchor_scaling --db "$db" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["id"])')" \
    --db "$db" >"$out/anchor_scaling_show.txt" 2>&1
  step "explain-oom: the founding message and the measured request"
  "$harness" explain-oom "Tried to allocate 15.09 GiB ... 84.07 GiB in use" --spec anchor_scaling 2>&1 | tee "$out/explain_founding.txt"
  "$harness" explain-oom --bytes 17179869184 --spec anchor_scaling 2>&1 | tee "$out/explain_measured.txt"
fi

if want replay; then
  step "replay the dense OOM at 512 anchors × 5 layers, then with the fused variant"
  run_id=$("$harness" runs --experiment anchor_scaling --db "$db" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["id"])')
  trial_id=$("$harness" show "$run_id" --db "$db" --json | python3 -c '
import json, sys
run = json.load(sys.stdin)
ooms = [t for t in run["trials"] if t["variant"] == "dense" and t["status"] == "oom"]
ooms.sort(key=lambda t: (t["point"].get("dims.anchors", 0), t["point"].get("dims.layers", 0)))
print(ooms[-1]["id"] if ooms else "")')
  echo "dense OOM trial: ${trial_id:-none}"
  if [[ -n $trial_id ]]; then
    "$harness" replay "$run_id" --trial "$trial_id" --db "$db" --memory-limit 96GiB 2>&1 | tee "$out/replay_dense.txt"
    "$harness" replay "$run_id" --trial "$trial_id" --variant fused --db "$db" --memory-limit 96GiB 2>&1 | tee "$out/replay_fused.txt"
  fi
fi

if want python; then
  step "python probes: flex_fusion_py, triton_autotune_race_py"
  "$harness" run flex_fusion_py --device cuda:0 --db "$db" 2>&1 | tee "$out/flex_fusion_py.txt"
  "$harness" run triton_autotune_race_py --device cuda:0 --db "$db" 2>&1 | tee "$out/triton_race_py.txt"
fi

if want race; then
  step "warmup_race and cache_corruption on the GPU machine (threads on one GPU)"
  "$harness" run warmup_race cache_corruption --devices cuda:0 --db "$db" 2>&1 | tee "$out/race.txt"
fi

if want writeup; then
  step "writeups"
  mkdir -p "$out/writeups"
  for experiment in bwd_fusion anchor_scaling; do
    "$harness" writeup "$experiment" --db "$db" -o "$out/writeups/$experiment.md" --html 2>&1 | tail -3
  done
fi

if want bench; then
  step "benchmark: ours vs torch.compile(flex_attention)"
  PYTHONUNBUFFERED=1 python3 bench/attention_vs_flex.py --binary "$build/bench/harness_bench_attention" \
    --json-out "$out/bench.json" ${BENCH_ARGS:-} 2>&1 | tee "$out/bench.txt" | tail -20
fi
step done
