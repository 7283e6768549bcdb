#!/usr/bin/env bash
# Run HERE: strips the binaries of BUILD_DIR (default build/) into .gpu/bin and the Debian shared
# libraries they need that the H200 image lacks (spdlog 1.10, fmt 9) into .gpu/lib, for
# scripts/h200_carried.sh; name `.gpu` in the device call's carry (a few MB, ignored by git).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build}
rm -rf "$root/.gpu/bin" "$root/.gpu/lib" && mkdir -p "$root/.gpu/bin" "$root/.gpu/lib"
for b in harness/harness tests/harness_unit_tests tests/harness_torch_tests tests/harness_cli_tests \
         bench/harness_bench_attention bench/harness_mask_describe python/libharness_ops.so \
         kernels/cuda/harness_attention_selftest; do
  [[ -f $build/$b ]] && strip -o "$root/.gpu/bin/$(basename "$b")" "$build/$b"
done
cp -L /lib/x86_64-linux-gnu/libspdlog.so.1.10 /lib/x86_64-linux-gnu/libfmt.so.9 "$root/.gpu/lib/"
grep -qx '/.gpu/' "$root/.git/info/exclude" 2>/dev/null || echo '/.gpu/' >>"$(git -C "$root" rev-parse --git-path info/exclude)"
du -sh "$root/.gpu/bin" "$root/.gpu/lib"
