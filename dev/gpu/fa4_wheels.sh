#!/usr/bin/env bash
# Runs on the development machine (with network), before the benchmark: downloads flash-attn-4 and
# the CuTe DSL wheels it needs for the H200 image (CPython 3.12, manylinux x86_64, CUDA 13), with
# `pip download --no-deps` and pinned versions, and splits them into two folders of at most 64 MiB
# each, the most one command sends to the GPU machine (the CUDA 13 libs wheel alone is 88 MiB, so
# it is cut in two):
#   .whl/fa4-part1   first half of nvidia_cutlass_dsl_libs_cu13                (~44 MiB)
#   .whl/fa4-part2   its second half + the other wheels + SHA256SUMS             (~54 MiB)
# A first command sends .whl/fa4-part1 (and .deps), a second one on the same machine .whl/fa4-part2
# (and .deps); dev/gpu/gpu_check_bench.sh keeps the first half in /tmp, then joins and installs
# them. Usage: dev/gpu/fa4_wheels.sh [download-dir (default .whl/fa4-download)]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
download=${1:-$root/.whl/fa4-download}
pip=${PIP:-${HARNESS_VENV:-$HOME/.cache/harness/venv}/bin/pip}
platform=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
          --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any)
# flash-attn-4's requirements (its METADATA), the CUDA 13 libs instead of the CUDA 12 ones (torch is
# cu130 on the H200; the CUDA 12 libs wheel is another 88 MiB that the cu13 build does not load).
wheels=(flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1
        nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 apache-tvm-ffi==0.1.15.post2
        torch-c-dlpack-ext==0.1.5 quack-kernels==0.6.5 einops==0.8.2 protobuf==7.36.2)
mkdir -p "$download"
for wheel in "${wheels[@]}"; do
  "$pip" download -q --no-deps "${platform[@]}" "$wheel" -d "$download"
done
part1=$root/.whl/fa4-part1 part2=$root/.whl/fa4-part2
rm -rf "$part1" "$part2" && mkdir -p "$part1" "$part2"
big=$(ls "$download"/nvidia_cutlass_dsl_libs_cu13-*.whl)
half=$(( ($(stat -c %s "$big") + 1) / 2 ))
split -b "$half" -d -a 1 "$big" "$part1/$(basename "$big").part"
mv "$part1/$(basename "$big").part1" "$part2/"
for wheel in "$download"/*.whl; do
  [[ $wheel == "$big" ]] || cp "$wheel" "$part2/"
done
(cd "$download" && sha256sum -- *.whl) >"$part2/SHA256SUMS"
du -sh "$download"/*.whl "$part1" "$part2"
