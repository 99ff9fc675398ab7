#!/usr/bin/env bash
# A one-node Slurm cluster in a folder of its own, for kiln's launch tests.
#
#   scripts/slurm/local-cluster.sh start DIR   installs Debian's Slurm and munge if missing,
#                                              writes DIR/slurm.conf, starts munged, slurmctld
#                                              and slurmd, and waits until the node is idle
#   scripts/slurm/local-cluster.sh stop DIR    stops the daemons that `start DIR` started
#   scripts/slurm/local-cluster.sh env DIR     prints `export SLURM_CONF=...` for the clients
#
# Everything the cluster writes (munge key and socket, slurm.conf, state, spool, logs, pid
# files) lies in DIR; the daemons listen on free ports above 20000, not Slurm's defaults,
# so a real Slurm on the host is untouched. `start` is idempotent (a cluster already up
# in DIR is reused) and stops what it started when a step fails. The node declares
# KILN_SLURM_CPUS CPUs (default 4, more than this machine's 2 cores, so that 4 tasks fit:
# kiln's multi-rank tests run one OpenMP thread per rank). Needs root (the daemons run as
# root, SlurmUser=root). Exits 2 when Slurm cannot start here, with the reason on stderr;
# callers skip on 2.
#
# Debian 12's packages: slurmctld, slurmd, slurm-client 22.05 and munge 0.5; the PMIx
# plugin (srun --mpi=pmix) comes with slurm-wlm-basic-plugins and loads libpmix2, which
# libopenmpi-dev brings.
set -euo pipefail

die() { echo "local-cluster: $*" >&2; exit 1; }
cannot() { echo "local-cluster: Slurm cannot start here: $*" >&2; exit 2; }

[ $# -eq 2 ] || die "usage: $0 start|stop|env DIR"
cmd="$1"
if [ "$cmd" = start ]; then mkdir -p "$2" || cannot "cannot create $2"; fi
if [ ! -d "$2" ]; then
  [ "$cmd" = stop ] && exit 0  # nothing was started there
  die "$2: no such directory (start a cluster there first)"
fi
dir="$(cd "$2" && pwd)"
conf="$dir/slurm.conf"

# The pid of daemon $1 started in DIR, if that process still runs and is that daemon (not
# a zombie, not a reused pid).
pid_of() {
  local pid stat
  pid="$(cat "$dir/$1.pid" 2>/dev/null)" || return 1
  stat="$(cat "/proc/$pid/stat" 2>/dev/null)" || return 1
  [[ "$stat" == "$pid ($1) "[!Z]* ]] && echo "$pid"
}

# Every job of this cluster: cancelled (SIGTERM: kiln saves), and killed with everything
# it started if it is still there after 10 s.
end_jobs() {
  pid_of slurmctld >/dev/null || return 0
  local jobs
  jobs="$(SLURM_CONF="$conf" timeout 5 squeue -h -o %i 2>/dev/null)" || return 0
  [ -n "$jobs" ] || return 0
  SLURM_CONF="$conf" timeout 5 scancel $jobs 2>/dev/null || true
  for _ in $(seq 50); do
    [ -z "$(SLURM_CONF="$conf" timeout 5 squeue -h -o %i 2>/dev/null)" ] && return 0
    sleep 0.2
  done
  SLURM_CONF="$conf" timeout 5 scancel --full --signal=KILL $jobs 2>/dev/null || true
  sleep 1
}

stop_cluster() {
  local name pid
  end_jobs
  for name in slurmd slurmctld munged; do
    pid="$(pid_of "$name")" || continue
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$dir/$name.pid"
  done
}

# A TCP port above 20000 that nothing on this host listens on (Slurm's defaults are
# 6817/6818; a real Slurm keeps them).
free_port() {
  local port
  while :; do
    port=$((20000 + RANDOM % 40000))
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || { echo "$port"; return; }
  done
}

write_conf() {
  local host="$1" ctld_port="$2" slurmd_port="$3" cpus="${KILN_SLURM_CPUS:-4}"
  local mem_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 2 ))
  cat >"$conf" <<EOF
# Written by scripts/slurm/local-cluster.sh: a one-node test cluster in $dir.
ClusterName=kiln-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# cred_expire: a requeued job waits this long (Slurm's default 120 s) before it may start
# again, so that the node no longer holds its revoked credential.
AuthInfo=socket=$dir/munge/munge.socket,cred_expire=5
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups: the tests run in containers where they may be absent or read-only.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
# The node's CPUs and memory are what this file says, not what slurmd finds.
SlurmdParameters=config_overrides
ReturnToService=2
# Seconds between SIGTERM and SIGKILL when a job is cancelled or requeued: kiln's grace to
# save a checkpoint.
KillWait=30
MinJobAge=2
JobRequeue=1
SchedulerParameters=sched_interval=1
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=kiln Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
  # slurmd 22.05 loads a cgroup plugin even when no other plugin uses it; autodetect fails
  # where no cgroup file system is mounted (a chroot), the v1 plugin only when used.
  cat >"$dir/cgroup.conf" <<EOF
CgroupPlugin=cgroup/v1
CgroupAutomount=no
EOF
}

# Whether the node became idle within 30 s.
wait_idle() {
  local state="" deadline=$((SECONDS + 30))
  while [ "$SECONDS" -lt "$deadline" ]; do
    state="$(SLURM_CONF="$conf" timeout 3 sinfo -h -N -o %T 2>/dev/null | head -1)" || true
    case "$state" in
      idle | mixed | allocated) return 0 ;;
      down* | drain*) SLURM_CONF="$conf" scontrol update NodeName="$(hostname -s)" State=RESUME \
                        >/dev/null 2>&1 || true ;;
    esac
    sleep 0.2
  done
  return 1
}

start_cluster() {
  [ "$(id -u)" -eq 0 ] || cannot "not root (the test cluster's daemons run as root)"
  if pid_of slurmctld >/dev/null && pid_of slurmd >/dev/null && pid_of munged >/dev/null; then
    wait_idle && return 0
  fi
  stop_cluster
  # shellcheck source=../lib/common.sh
  source "$(dirname "${BASH_SOURCE[0]}")/../lib/common.sh"
  kiln_apt_install "${KILN_SLURM_PACKAGES[@]}" || cannot "could not install ${KILN_SLURM_PACKAGES[*]}"
  trap 'stop_cluster' ERR
  mkdir -p "$dir/munge" "$dir/state" "$dir/spool" "$dir/log"
  chmod 755 "$dir/munge"  # munged wants its socket folder searchable by all
  [ -s "$dir/munge/munge.key" ] || mungekey --create --keyfile="$dir/munge/munge.key" >/dev/null
  munged --force --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/munged.pid" --log-file="$dir/log/munged.log" \
    --seed-file="$dir/munge/munged.seed" 2>>"$dir/log/munged.log" ||
    { stop_cluster; cannot "munged did not start (see $dir/log/munged.log)"; }
  local host ctld_port slurmd_port
  host="$(hostname -s)"
  ctld_port="$(free_port)"
  slurmd_port="$(free_port)"
  [ "$slurmd_port" != "$ctld_port" ] || slurmd_port="$(free_port)"
  write_conf "$host" "$ctld_port" "$slurmd_port"
  slurmctld -c -f "$conf" 2>>"$dir/log/slurmctld.log" ||
    { stop_cluster; cannot "slurmctld did not start (see $dir/log/slurmctld.log)"; }
  slurmd -f "$conf" 2>>"$dir/log/slurmd.log" ||
    { stop_cluster; cannot "slurmd did not start (see $dir/log/slurmd.log)"; }
  if ! wait_idle; then
    tail -n 5 "$dir/log/slurmctld.log" "$dir/log/slurmd.log" >&2 || true
    stop_cluster
    cannot "the node did not become idle within 30 s (logs in $dir/log)"
  fi
  trap - ERR
}

case "$cmd" in
  start) start_cluster ;;
  stop) stop_cluster ;;
  env) echo "export SLURM_CONF=$conf" ;;
  *) die "unknown command '$cmd' (start, stop, env)" ;;
esac
