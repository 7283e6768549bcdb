#!/usr/bin/env bash
# ThreadSanitizer over the autotuner and the experiments that race it: builds a small torch-free
# test binary with -fsanitize=thread (only the sources these tests need, not the whole project,
# which needs LibTorch) and runs the [autotune], [race] and [cache] tests. Any data race report
# fails the run. The race experiment's shared-state model races logically but not in the C++
# sense (its shared state is atomic), so it runs clean here too; the per-call autotuner and
# sequential warm-up must.
# Env: TSAN_BUILD_DIR (default build-tsan), CXX (default c++), TSAN_JOBS (parallel compiles, 2).
# Arguments go to the test binary.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${TSAN_BUILD_DIR:-$root/build-tsan}
cxx=${CXX:-c++}
log() { printf '[tsan] %s\n' "$*" >&2; }

sources=(tests/main.cpp tests/test_autotune.cpp tests/test_autotune_race.cpp tests/test_cache_corruption.cpp
         core/files.cpp kernels/autotune.cpp trials/autotune_race.cpp experiments/kinds/autotune_race_info.cpp
         trials/cache_corruption.cpp experiments/kinds/cache_corruption_info.cpp)
flags=(-std=c++20 -O1 -g -fsanitize=thread -fno-omit-frame-pointer -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers -I"$root")  # as tests/CMakeLists.txt
launcher=()
if command -v ccache >/dev/null; then
  export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1
  launcher=(ccache)
fi

mkdir -p "$build_dir"
log "compiling ${#sources[@]} sources into $build_dir"
objects=()
for source in "${sources[@]}"; do objects+=("$build_dir/$(echo "$source" | tr / _).o"); done
# Two at a time by default: CI has two cores.
compile() { "${launcher[@]}" "$cxx" "${flags[@]}" -c "$root/$1" -o "$2"; }
running=()
for i in "${!sources[@]}"; do
  compile "${sources[i]}" "${objects[i]}" &
  running+=($!)
  if ((${#running[@]} >= ${TSAN_JOBS:-2})); then
    wait "${running[0]}"
    running=("${running[@]:1}")
  fi
done
for pid in "${running[@]}"; do wait "$pid"; done
"$cxx" -fsanitize=thread "${objects[@]}" -o "$build_dir/tsan_tests" -pthread

# GCC 12's libtsan cannot map its shadow memory with the address-space randomization of newer
# kernels (mmap_rnd_bits > 28): run without randomization when setarch can turn it off.
run=("$build_dir/tsan_tests")
if command -v setarch >/dev/null && setarch "$(uname -m)" -R true 2>/dev/null; then
  run=(setarch "$(uname -m)" -R "${run[@]}")
fi
log "running the [autotune], [race] and [cache] tests"
cd "$root"
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}" "${run[@]}" "[autotune],[race],[cache]" "$@"
