#!/usr/bin/env bash
# The clang build with AddressSanitizer + UBSan shared by scripts/asan.sh and scripts/fuzz.sh
# (one build folder, so the objects both need are compiled once): configures build-sanitize/
# (no CUDA; -fsanitize=fuzzer-no-link so the same objects link into the libFuzzer targets) and
# builds the targets given as arguments.
# Env: SANITIZE_BUILD_DIR (default build-sanitize), CLANG_CXX (clang++-14, else clang++),
#      SANITIZE_JOBS (2).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${SANITIZE_BUILD_DIR:-$root/build-sanitize}
log() { printf '[sanitize] %s\n' "$*" >&2; }

cxx=${CLANG_CXX:-}
if [[ -z "$cxx" ]]; then
  for candidate in clang++-14 clang++; do
    if command -v "$candidate" >/dev/null; then cxx=$candidate; break; fi
  done
fi
if [[ -z "$cxx" ]]; then
  log "no clang++ found (Debian: apt-get install clang-14 libclang-rt-14-dev)"
  exit 3
fi
venv=${HARNESS_VENV:-$HOME/.cache/harness/venv}
torch_prefix=$("$venv/bin/python" -c 'import torch; print(torch.utils.cmake_prefix_path)')

launcher=()
if command -v ccache >/dev/null; then
  export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
if [[ ! -f "$build_dir/build.ninja" ]]; then
  log "configuring $build_dir with $cxx"
  # TORCH_CUDA_ARCH_LIST: without CUDA here, LibTorch's CMake would otherwise probe for GPUs.
  TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a} cmake -S "$root" -B "$build_dir" -G Ninja "${launcher[@]}" \
    -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHARNESS_WITH_CUDA=OFF -DHARNESS_FUZZ=ON \
    -DHARNESS_SANITIZE=address,undefined \
    -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link -fno-sanitize-recover=undefined" \
    -DCMAKE_PREFIX_PATH="$torch_prefix" >"$build_dir.configure.log" 2>&1 \
    || { cat "$build_dir.configure.log" >&2; exit 3; }
fi
log "building $* in $build_dir"
nice -n 10 cmake --build "$build_dir" --target "$@" -j "${SANITIZE_JOBS:-2}"
