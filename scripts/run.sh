#!/usr/bin/env bash
# The main job: set up and build (scripts/setup.sh), then run the founding experiment,
# bwd_fusion, on cuda:0 when a GPU is present, else on the spec's CPU profile, storing the run
# in ./harness.db. Extra arguments go to `harness run` (e.g. --device cuda:2, --set dims.anchors=256).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_TARGETS=harness "$root/scripts/setup.sh"
exec "${BUILD_DIR:-$root/build}/harness/harness" run bwd_fusion --db "${HARNESS_DB:-./harness.db}" "$@"
