#!/usr/bin/env bash
# Runs the [slurm] cases of harness_cli_tests against a one-node Slurm started here for them
# (scripts/slurm_local.sh) and stopped afterwards, whatever happens. Exit 77 (CTest: skipped), with
# the reason on stderr, where Slurm is not installed or does not come up.
set -uo pipefail
tests=${1:?usage: slurm_test.sh PATH/TO/harness_cli_tests [catch args]}
shift
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# A folder and ports of its own, so that a cluster someone started by hand is left alone.
export HARNESS_SLURM_DIR=${HARNESS_SLURM_TEST_DIR:-/tmp/harness-slurm-test-$$}
export HARNESS_SLURM_PORT=${HARNESS_SLURM_TEST_PORT:-16917}
if ! command -v slurmctld >/dev/null || ! command -v sbatch >/dev/null; then
  echo "SKIPPED: Slurm is not installed (apt-get install slurmctld slurmd slurm-client)" >&2
  exit 77
fi
trap '"$root/scripts/slurm_local.sh" stop' EXIT
if ! started=$("$root/scripts/slurm_local.sh" start); then
  echo "SKIPPED: the local Slurm cluster did not start (see above)" >&2
  exit 77
fi
eval "$started"
echo "local Slurm up: SLURM_CONF=$SLURM_CONF"
"$tests" "[slurm]" "$@"
