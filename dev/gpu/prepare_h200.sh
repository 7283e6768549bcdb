#!/usr/bin/env bash
# Runs on the development machine (Debian, with network) before work on the GPU machine: the H200
# image has libsqlite3.so.0 but no sqlite3.h and no network, so Debian's libsqlite3-dev headers are
# unpacked into .deps/ (ignored by git), which goes to the GPU machine with the tree.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
mkdir -p "$root/.deps" && cd "$root/.deps"
if [[ ! -f sqlite3/usr/include/sqlite3.h ]]; then
  apt-get download libsqlite3-dev >/dev/null
  dpkg -x libsqlite3-dev_*.deb sqlite3
  rm -f libsqlite3-dev_*.deb
fi
# pytest for tests/python (dev/gpu/gpu_check_python.sh): pure-Python wheels unpacked into
# .deps/python, put on PYTHONPATH there when the image's python3 has no pytest.
if [[ ! -d python/pytest ]]; then
  python3 -m pip download -q --no-deps -d wheels pytest pluggy iniconfig packaging
  mkdir -p python && for wheel in wheels/*.whl; do python3 -m zipfile -e "$wheel" python; done
  rm -rf wheels
fi
# The GPU machine's copy of the tree has no .git: record the commit for the env fingerprint.
commit=$(git -C "$root" rev-parse HEAD)
[[ -z "$(git -C "$root" status --porcelain --untracked-files=no)" ]] || commit="$commit-dirty"
echo "$commit" >"$root/.deps/git_commit"
echo "ready: $root/.deps/sqlite3/usr/include/sqlite3.h"
