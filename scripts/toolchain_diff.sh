#!/usr/bin/env bash
# Two real toolchains diffed, at CPU scale, on this machine:
#   1. two Python environments with different PyTorch versions run flex_fusion_py (the
#      torch.compile(flex_attention) probe): the harness's venv (torch 2.11.0) and a second venv
#      with TORCH_B (default 2.5.1) in ~/.cache/harness/venv-torch$TORCH_B;
#   2. two builds of the harness that differ in the host compiler run bwd_fusion: build/ (GCC, as
#      scripts/setup.sh makes it) and build-clang/ (clang++, CLI only).
# Each pair runs twice in alternating order, then `harness diff --env A --env B` compares the
# latest run of each experiment under each env. Everything goes to DB (default toolchain_diff.db).
#   scripts/toolchain_diff.sh [DB]        env: TORCH_B, REPEATS (default 7)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
db=$(realpath -m "${1:-toolchain_diff.db}")
torch_b=${TORCH_B:-2.5.1}
repeats=${REPEATS:-7}
venv_a=${HARNESS_VENV:-$HOME/.cache/harness/venv}
venv_b=$HOME/.cache/harness/venv-torch$torch_b
log() { printf '[toolchain-diff] %s\n' "$*" >&2; }

"$root/scripts/setup.sh"  # build/ with GCC and the torch 2.11.0 venv
if ! "$venv_b/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$torch_b')" 2>/dev/null; then
  log "installing torch==$torch_b into $venv_b"
  python3 -m venv "$venv_b"
  "$venv_b/bin/pip" install -q --disable-pip-version-check "torch==$torch_b" numpy
fi
if ! command -v clang++ >/dev/null; then
  log "installing clang"
  sudo_cmd=(); [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq clang >/dev/null
fi
HARNESS_SKIP_APT=1 BUILD_DIR="$root/build-clang" BUILD_TARGETS=harness \
  CMAKE_EXTRA_ARGS="-DCMAKE_CXX_COMPILER=clang++ -DHARNESS_WITH_TESTS=OFF" "$root/scripts/setup.sh"

gcc_harness=$root/build/harness/harness
clang_harness=$root/build-clang/harness/harness
run() { "$@" --device cpu --db "$db" --experiments-dir "$root/experiments" >/dev/null; }
env_of() { "$gcc_harness" runs --db "$db" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["env_id"])'; }

log "flex_fusion_py under torch $("$venv_a/bin/python" -c 'import torch; print(torch.__version__)') and torch $torch_b"
run "$gcc_harness" run flex_fusion_py --python "$venv_a/bin/python"; torch_env_a=$(env_of)
run "$gcc_harness" run flex_fusion_py --python "$venv_b/bin/python"; torch_env_b=$(env_of)
run "$gcc_harness" run flex_fusion_py --python "$venv_a/bin/python"

log "bwd_fusion built with GCC and with Clang ($repeats repeats each, alternating)"
run "$gcc_harness" run bwd_fusion --set repeats="$repeats"; gcc_env=$(env_of)
run "$clang_harness" run bwd_fusion --set repeats="$repeats"; clang_env=$(env_of)
run "$clang_harness" run bwd_fusion --set repeats="$repeats"
run "$gcc_harness" run bwd_fusion --set repeats="$repeats"

echo "== torch $torch_b (A) against the harness venv's torch (B): flex_fusion_py"
"$gcc_harness" diff --env "$torch_env_b" --env "$torch_env_a" --experiment flex_fusion_py --db "$db"
echo
echo "== GCC build (A) against Clang build (B): bwd_fusion"
"$gcc_harness" diff --env "$gcc_env" --env "$clang_env" --experiment bwd_fusion --changes-only --db "$db"
