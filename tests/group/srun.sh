#!/bin/bash
# srun.sh [--ranks N] [--port P] -- PROGRAM [ARGS...]
# Starts a one-node Slurm (Debian's slurm-wlm 22.05 and munge) in this host's
# /tmp, runs `srun -n N PROGRAM ARGS` under it with MASTER_ADDR/MASTER_PORT
# exported, and succeeds only when every rank printed "every byte right" and
# rank 0 said its place came from Slurm. Meant for a Soft-RoCE VM:
#   cmake/softroce/rdx-run-rdma -- tests/group/srun.sh --ranks 8 -- build/release/examples/alltoall -s 16K -n 5 -e
# Exit 77 when Slurm or munge is not installed (scripts/install-slurm.sh installs them).
set -u
ranks=4 port=29530
while (($#)); do
  case $1 in
    --ranks) ranks=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "srun.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
(($#)) || { echo "usage: srun.sh [--ranks N] [--port P] -- PROGRAM [ARGS...]" >&2; exit 2; }
for c in slurmctld slurmd srun sinfo munged; do
  command -v $c >/dev/null || { echo "srun.sh: SKIP: $c is not installed (scripts/install-slurm.sh)" >&2; exit 77; }
done
[ -r /etc/munge/munge.key ] || { echo "srun.sh: SKIP: no /etc/munge/munge.key (scripts/install-slurm.sh)" >&2; exit 77; }

d=$(mktemp -d /tmp/rdx-slurm.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  munged --stop --socket="$d/munge.socket" >/dev/null 2>&1
}
trap cleanup EXIT
mkdir -p "$d"/{state,spool,log}
chmod 755 "$d"  # munge wants its socket's directory open to all
# slurmd needs a cgroup file system; the Soft-RoCE VM (RDX_VM=1) mounts none.
if [ "${RDX_VM:-0}" = 1 ] && ! grep -q " /sys/fs/cgroup " /proc/mounts; then
  mount -t cgroup2 none /sys/fs/cgroup || { echo "srun.sh: cannot mount cgroup2 in the VM" >&2; exit 1; }
  mkdir -p /sys/fs/cgroup/system.slice  # where slurmd puts its steps' scope
fi
host=$(hostname)
cpus=$((ranks > 1 ? ranks : 1))
cat >"$d/slurm.conf" <<CONF
ClusterName=rdx
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$d/munge.socket
CredType=cred/munge
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd.pid
SlurmctldLogFile=$d/log/slurmctld.log
SlurmdLogFile=$d/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/linear
ReturnToService=2
SlurmdParameters=config_overrides
SchedulerType=sched/builtin
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=rdx Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
# cgroup v2 without systemd (the VM runs none): slurmd makes its own scope.
printf 'CgroupPlugin=cgroup/v2\nIgnoreSystemd=yes\n' >"$d/cgroup.conf"
export SLURM_CONF=$d/slurm.conf
# munge refuses a key another user could read; a copy of the installed one, for this run.
install -m 0400 /etc/munge/munge.key "$d/munge.key"
munged --force --key-file="$d/munge.key" --socket="$d/munge.socket" --log-file="$d/log/munged.log" \
  --pid-file="$d/munged.pid" --seed-file="$d/munged.seed" || { echo "srun.sh: munged did not start" >&2; exit 1; }
slurmctld -D -i >"$d/log/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D >"$d/log/slurmd.out" 2>&1 &
pids+=($!)
for _ in $(seq 1 150); do
  sinfo -h -o %T 2>/dev/null | grep -qE '^idle' && break
  sleep 0.2
done
if ! sinfo -h -o %T 2>/dev/null | grep -qE '^idle'; then
  echo "srun.sh: the Slurm node never came up:" >&2
  tail -n 8 "$d"/log/*.log "$d"/log/*.out >&2
  exit 1
fi
echo "srun.sh: Slurm $(sinfo -V | cut -d' ' -f2) up on $host; srun -n $ranks $*"
out=$(MASTER_ADDR=127.0.0.1 MASTER_PORT=$port srun -n "$ranks" --export=ALL "$@" 2>&1)
rc=$?
printf '%s\n' "$out"
right=$(printf '%s\n' "$out" | grep -c "every byte right")
if [ $rc -ne 0 ] || [ "$right" -ne "$ranks" ]; then
  echo "srun.sh: FAILED: srun exited $rc, $right of $ranks ranks right" >&2
  exit 1
fi
printf '%s\n' "$out" | grep -q "ranks (Slurm)" || { echo "srun.sh: FAILED: rank 0 did not take its place from Slurm" >&2; exit 1; }
echo "srun.sh: ok: $ranks ranks under srun, every byte right on each"
