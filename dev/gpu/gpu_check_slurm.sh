#!/usr/bin/env bash
# GPU check for Slurm runs, run on the H200 image from the repo root (no Slurm there, so this
# checks what a Slurm task relies on, not Slurm itself):
#  1. `--device cuda` resolves to the first GPU of CUDA_VISIBLE_DEVICES, which is how a task gets
#     "the GPU Slurm gave it": with CUDA_VISIBLE_DEVICES=i the env sees exactly one GPU, the i-th.
#  2. The batch script for a GPU run asks for --gpus-per-task and runs the trials on device cuda.
# Expected output: one "ok" line per GPU, then "ok: batch script", and exit 0.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build_dir=${BUILD_DIR:-$root/build-h200}
[[ -x $build_dir/harness/harness ]] || BUILD_TARGETS=harness "$root/dev/gpu/h200_build.sh"
harness=$build_dir/harness/harness
count=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
for ((i = 0; i < count; i++)); do
  expected=$(nvidia-smi -i "$i" --query-gpu=name --format=csv,noheader)
  env_json=$(CUDA_VISIBLE_DEVICES=$i "$harness" env --device cuda --json)
  python3 - "$i" "$expected" "$env_json" <<'PY'
import json, sys
index, expected, env = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
env = env.get("env", env)
assert env["gpu_count"] == 1, f"CUDA_VISIBLE_DEVICES={index}: the env sees {env['gpu_count']} GPUs, expected 1"
assert env["gpu_name"].strip() == expected.strip(), f"GPU {index}: env names {env['gpu_name']!r}, nvidia-smi {expected!r}"
print(f"ok: CUDA_VISIBLE_DEVICES={index} -> --device cuda is {env['gpu_name']}")
PY
done
script=$("$harness" run bwd_fusion --slurm-dry-run --gpus-per-task 1 --db /tmp/gpu_check_slurm.db)
grep -q '^#SBATCH --gpus-per-task=1$' <<<"$script" || { echo "FAIL: no --gpus-per-task=1 in the batch script" >&2; exit 1; }
grep -q 'on device cuda (the first GPU Slurm gives the task)' <<<"$script" || { echo "FAIL: the trials do not run on device cuda" >&2; exit 1; }
[[ ! -e /tmp/gpu_check_slurm.db ]] || { echo "FAIL: the dry run wrote a db" >&2; exit 1; }
echo "ok: batch script"
