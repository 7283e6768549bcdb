#!/usr/bin/env bash
# Which PyTorch release refused eager flex_attention's backward on the CPU? A real `harness
# bisect` at CPU scale on this machine: flex_fusion_py (the torch.compile(flex_attention) probe,
# CPU profile) under every torch release between GOOD (default 2.5.1: the eager backward runs)
# and BAD (default 2.11.0: "FlexAttention does not support backward on CPU"), bisecting the
# trial status of the `eager` variant (the verdict reads `compiled`, which runs on the CPU under
# neither version, so it is INVALID at both ends and cannot be bisected). Each probed version
# gets its own cached env (uv when found; the torch wheels from PyPI pull their CUDA libraries:
# 3-5 GB per CUDA generation, which uv's cache shares between envs through hard links).
# Afterwards: the bisect's writeup (table, plot, package diff) into docs/writeups/.
#   scripts/bisect_torch_demo.sh [DB]    env: GOOD, BAD, HARNESS (binary), PYTHON (base interpreter),
#                                             OUT (writeup path, default docs/writeups/bisect_torch.md)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
db=$(realpath -m "${1:-bisect_torch.db}")
good=${GOOD:-2.5.1}
bad=${BAD:-2.11.0}
python=${PYTHON:-python3}
harness=${HARNESS:-$root/build/harness/harness}
out=${OUT:-$root/docs/writeups/bisect_torch.md}
log() { printf '[bisect-torch] %s\n' "$*" >&2; }

[[ -x $harness ]] || BUILD_TARGETS=harness "$root/scripts/setup.sh"
# uv: one cache of unpacked wheels hard-linked into every env (pip would copy 4-6 GB per version).
if ! command -v uv >/dev/null; then
  tools=$HOME/.cache/harness/tools
  if [[ ! -x $tools/bin/uv ]]; then
    log "installing uv into $tools (pip install uv)"
    python3 -m venv "$tools"
    "$tools/bin/pip" install -q --disable-pip-version-check uv
  fi
  export PATH=$tools/bin:$PATH
fi
log "harness bisect flex_fusion_py over torch $good .. $bad (status of eager, CPU profile); db $db"
result=$(mktemp)
trap 'rm -f "$result"' EXIT
"$harness" bisect flex_fusion_py --package torch --good "$good" --bad "$bad" --status eager \
  --extra numpy --python "$python" --device cpu --db "$db" --json --experiments-dir "$root/experiments" >"$result"
id=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["id"])' "$result")
"$harness" bisect show "$id" --db "$db"
"$harness" writeup --bisect "$id" -o "$out" --db "$db"
log "writeup: $out"
