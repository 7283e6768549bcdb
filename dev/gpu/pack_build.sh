#!/usr/bin/env bash
# Runs on the development machine (Debian 12): strips the binaries of BUILD_DIR (default build/)
# into .gpu/bin and the Debian shared libraries they need that the H200 image lacks (spdlog 1.10,
# fmt 9) into .gpu/lib, for dev/gpu/run_prebuilt.sh on the GPU machine; copy `.gpu` (or the packed
# `.gpu-pack`) to the GPU machine with the tree (both are ignored by git).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${BUILD_DIR:-$root/build}
rm -rf "$root/.gpu/bin" "$root/.gpu/lib" && mkdir -p "$root/.gpu/bin" "$root/.gpu/lib"
for b in harness/harness tests/harness_unit_tests tests/harness_torch_tests tests/harness_cli_tests \
         bench/harness_bench_attention bench/harness_mask_describe bench/harness_bench_prep_bandwidth python/libharness_ops.so \
         bench/harness_attention_selftest; do
  [[ -f $build/$b ]] && strip -o "$root/.gpu/bin/$(basename "$b")" "$build/$b"
done
# The commit the binaries were built from (-dirty: tracked files differed), for the bench's header.
commit=$(git -C "$root" rev-parse --short HEAD)
[[ -z "$(git -C "$root" status --porcelain --untracked-files=no)" ]] || commit="$commit-dirty"
echo "$commit" >"$root/.gpu/bin/git_commit"
cp -L /lib/x86_64-linux-gnu/libspdlog.so.1.10 /lib/x86_64-linux-gnu/libfmt.so.9 "$root/.gpu/lib/"
grep -qx '/.gpu/' "$root/.git/info/exclude" 2>/dev/null || echo '/.gpu/' >>"$(git -C "$root" rev-parse --git-path info/exclude)"
du -sh "$root/.gpu/bin" "$root/.gpu/lib"
# The same, packed (about a third of the size): copy `.gpu-pack` instead of `.gpu` where the files
# sent with one command are limited (64 MiB) and wheels must fit beside the binaries.
mkdir -p "$root/.gpu-pack"
tar -C "$root" -czf "$root/.gpu-pack/gpu.tar.gz" .gpu/bin .gpu/lib
grep -qx '/.gpu-pack/' "$root/.git/info/exclude" 2>/dev/null || echo '/.gpu-pack/' >>"$(git -C "$root" rev-parse --git-path info/exclude)"
du -sh "$root/.gpu-pack/gpu.tar.gz"
