#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for the Slurm tests and for trying `harness run --slurm`
# without a real cluster. Debian 12's packages (apt-get install slurm-wlm: 22.05), no systemd, no
# munge, no slurmdbd: slurmctld and slurmd on 127.0.0.1 with AuthType=auth/none, every file (config,
# state, spool, logs, pids) under one folder that `stop` removes.
#
#   scripts/slurm_local.sh start    # writes slurm.conf, starts both daemons, waits for the node to be idle,
#                                   # prints `export SLURM_CONF=...` (eval it, or source the printed line)
#   scripts/slurm_local.sh status   # exit 0 only if the cluster answers and its node can take jobs
#   scripts/slurm_local.sh stop     # cancels this cluster's jobs, stops both daemons, removes the folder
#
# Environment: HARNESS_SLURM_DIR (default /tmp/harness-slurm), HARNESS_SLURM_PORT (slurmctld's port,
# default 16817; slurmd uses the next one: not Slurm's default 6817/6818, so that a system Slurm on
# the same machine is left alone). Must run as root or as the user the daemons run as (SlurmUser =
# the calling user, so a non-root user gets a cluster whose jobs run as that user).
set -euo pipefail

dir=${HARNESS_SLURM_DIR:-/tmp/harness-slurm}
ctld_port=${HARNESS_SLURM_PORT:-16817}
slurmd_port=$((ctld_port + 1))
conf=$dir/etc/slurm.conf
cluster=harness-local

die() { echo "slurm_local.sh: $*" >&2; exit 1; }

pid_of() {  # the pid recorded in a daemon's pid file, if that process is still alive
  local file=$1 pid
  [[ -s $file ]] || return 1
  pid=$(<"$file")
  [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

node_state() { SLURM_CONF=$conf timeout 10 sinfo -h -N -o '%t' 2>/dev/null | head -1; }

usable() {
  pid_of "$dir/run/slurmctld.pid" >/dev/null || return 1
  pid_of "$dir/run/slurmd.pid" >/dev/null || return 1
  case $(node_state) in idle|mix|alloc|comp) return 0 ;; *) return 1 ;; esac
}

write_conf() {
  local host cpus mem user hw
  host=$(hostname -s)
  # slurmd -C reports what slurmd itself will detect; declaring exactly that keeps the node from
  # being drained for "Low RealMemory" or a CPU-count mismatch.
  hw=$(slurmd -C | head -1) || die "slurmd -C failed (is slurm-wlm installed? apt-get install -y slurm-wlm)"
  cpus=$(sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' <<<"$hw")
  mem=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$hw")
  [[ -n $cpus && -n $mem ]] || die "cannot read CPUs/RealMemory from: $hw"
  user=$(id -un)
  mkdir -p "$dir"/{etc,state,spool,log,run}
  cat >"$conf" <<EOF
# Written by scripts/slurm_local.sh: a one-node test cluster, everything under $dir.
ClusterName=$cluster
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=$user
SlurmdUser=$user
# No munge: tests run on one machine, 127.0.0.1 only.
AuthType=auth/none
CredType=cred/none
# No cgroups needed (containers often lack a writable cgroup tree).
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# Without a default a job that names no --mem is given the whole node's memory (one job at a time).
DefMemPerCPU=$((mem / cpus))
MpiDefault=none
# No slurmdbd: nothing is accounted, so sacct does not work here; scontrol does, as long as the
# finished job stays in slurmctld's memory: MinJobAge keeps it a day.
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
MinJobAge=86400
JobRequeue=1
ReturnToService=2
# Short waits so that the tests' scancel / requeue take seconds, not minutes.
KillWait=2
MessageTimeout=10
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
}

start() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null ||
    die "slurmctld/slurmd/sbatch not found: apt-get install -y slurm-wlm"
  if usable; then
    echo "export SLURM_CONF=$conf"
    return 0
  fi
  # A half-started or stale cluster from an earlier run: stop it first.
  stop >/dev/null 2>&1 || true
  write_conf
  # -c: cold start, no state from an earlier cluster in this folder.
  slurmctld -c -f "$conf" || die "slurmctld did not start; see $dir/log/slurmctld.log"
  slurmd -f "$conf" || die "slurmd did not start; see $dir/log/slurmd.log"
  local waited=0
  while ! usable; do
    if ((waited >= 60)); then
      echo "--- slurmctld.log" >&2; tail -20 "$dir/log/slurmctld.log" >&2 || true
      echo "--- slurmd.log" >&2; tail -20 "$dir/log/slurmd.log" >&2 || true
      die "the node is not idle after 30 s (state: $(node_state || echo none))"
    fi
    # A node that registered DOWN (e.g. after an unclean stop) is brought back.
    if [[ $(node_state) == down* ]]; then
      SLURM_CONF=$conf scontrol update NodeName="$(hostname -s)" State=RESUME 2>/dev/null || true
    fi
    sleep 0.5; waited=$((waited + 1))
  done
  echo "export SLURM_CONF=$conf"
}

stop() {
  local pid pids=() i
  if pid_of "$dir/run/slurmctld.pid" >/dev/null; then
    # Cancel this cluster's jobs so that no job step outlives its slurmd.
    SLURM_CONF=$conf timeout 10 scancel --user="$(id -un)" 2>/dev/null || true
    for ((i = 0; i < 20; i++)); do
      [[ -z $(SLURM_CONF=$conf timeout 5 squeue -h -t running,completing -o %i 2>/dev/null) ]] && break
      sleep 0.5
    done
  fi
  for f in slurmd slurmctld; do
    if pid=$(pid_of "$dir/run/$f.pid"); then kill "$pid" 2>/dev/null || true; pids+=("$pid"); fi
  done
  for pid in "${pids[@]}"; do
    for ((i = 0; i < 40; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null || true
  done
  rm -rf "$dir"
}

case ${1:-} in
  start) start ;;
  stop) stop ;;
  status)
    if usable; then echo "up: SLURM_CONF=$conf, node $(node_state)"; exit 0; fi
    echo "down (no usable cluster under $dir)"; exit 1 ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
