#!/usr/bin/env bash
# Runs ON the H200 image (Ubuntu 24.04, torch 2.11.0+cu130 in python3, nvcc 13, Catch2 v3, no
# sqlite3.h, no network): configures and builds with the SQLite headers sent with the tree (see
# dev/gpu/prepare_h200.sh), registering the [cuda] tests. BUILD_DIR defaults to build-h200.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build_dir=${BUILD_DIR:-$root/build-h200}
sqlite_include=$root/.deps/sqlite3/usr/include
[[ -f $sqlite_include/sqlite3.h ]] || { echo "missing $sqlite_include/sqlite3.h: run dev/gpu/prepare_h200.sh on the development machine and send .deps with the tree" >&2; exit 2; }
sqlite_lib=$(ls /usr/lib/x86_64-linux-gnu/libsqlite3.so.0 2>/dev/null || ldconfig -p | awk '/libsqlite3.so.0 /{print $NF; exit}')
torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo} \
  -DCMAKE_PREFIX_PATH="$torch_prefix" -DSQLite3_INCLUDE_DIR="$sqlite_include" -DSQLite3_LIBRARY="$sqlite_lib" \
  -DHARNESS_TEST_CUDA=ON -DHARNESS_GIT_COMMIT_OVERRIDE="$(cat "$root/.deps/git_commit" 2>/dev/null)" ${CMAKE_EXTRA_ARGS:-}
cmake --build "$build_dir" -j "$(nproc)" ${BUILD_TARGETS:+--target $BUILD_TARGETS} ${BUILD_KEEP_GOING:+-- -k 0}
