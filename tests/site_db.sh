#!/usr/bin/env bash
# The db the site's browser test and the exports' pandas round trip read (CTest fixture site_db):
# real CPU runs of every shipped spec, bwd_fusion again under a second env (OMP_NUM_THREADS=1, a
# two-toolchain diff with a called change), and a bisect over the probe wheels of the bisect tests
# (flips and a regression between real runs), all in OUT_DIR/harness.db with its artifacts.
#
#   site_db.sh HARNESS_BINARY OUT_DIR PYTHON BISECT_FIXTURE_DIR
#
# The bisect reuses the wheels and env cache the bisect tests keep in BISECT_FIXTURE_DIR (made here
# when missing, the same way). Each step's time is printed.
set -euo pipefail
binary=$1 out=$2 python=$3 fixture=$4
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
rm -rf "$out"
mkdir -p "$out"
db=$out/harness.db

step() {
  local start=$SECONDS
  "$@" >"$out/step.log" 2>&1 || { cat "$out/step.log" >&2; echo "FAILED: $*" >&2; exit 1; }
  echo "$(( SECONDS - start )) s: ${*:2}"
}

# Every shipped spec on its CPU profile (the python ones with the test interpreter); --trace on
# bwd_fusion, so its run pages link Chrome traces.
step "$binary" run bwd_fusion --device cpu --trace --db "$db"
for spec in anchor_scaling warmup_race cache_corruption; do
  step "$binary" run "$spec" --device cpu --db "$db"
done
for spec in flex_fusion_py triton_autotune_race_py; do
  step "$binary" run "$spec" --device cpu --python "$python" --db "$db"
done
# The same spec under another env: one OpenMP thread instead of the machine's.
step env OMP_NUM_THREADS=1 "$binary" run bwd_fusion --device cpu --db "$db"

# The bisect: harness_probe_pkg 1.0 .. 1.7, behaviour and peak memory flipping at 1.5.
wheels=$fixture/wheels
if [[ ! -d $wheels ]]; then
  mkdir -p "$fixture"
  temporary=$wheels.tmp-$$
  python3 "$here/python/make_bisect_wheels.py" "$temporary" >/dev/null
  mv -T "$temporary" "$wheels" 2>/dev/null || rm -rf "$temporary"  # another process may have made them meanwhile
fi
step "$binary" bisect "$here/cli/bisect_probe.json" --package harness_probe_pkg --find-links "$wheels" --no-index \
  --installer pip --env-cache "$fixture/envs" --device cpu --good 1.0 --bad 1.7 --db "$db"
rm -f "$out/step.log"
"$binary" runs --limit 0 --db "$db"
