#!/usr/bin/env bash
# Start a real single-machine Slurm (munged, slurmctld, slurmd) with typed GPU GRES, for allocopt's Slurm
# tests and benchmark (tests/test_slurm.py, benchmarks/bench_slurm.py). Idempotent: installs the Debian
# packages if missing, (re)writes /etc/slurm/{slurm.conf,gres.conf}, restarts the daemons only when the
# configuration changed or one is down, then waits until every node is idle. Needs root.
#
# Cluster (count-only GPUs: gres.conf points File= at placeholder device files, AutoDetect=off):
#   partition "allocopt" (default): node gpu-a (2 x gpu:a100) and node gpu-v (2 x gpu:v100)
#   partition "bench":             nodes gpu-big-a (256 x gpu:a100) and gpu-big-v (256 x gpu:v100)
#   partition "elastic":           nodes gpu-e1 and gpu-e2 (2 x gpu:a100 each: one job spans both; the
#                                  node-loss test marks one down)
# Every node carries one GPU type (allocopt slurm pins a job's type by excluding the other types' nodes).
# The four nodes are slurmd daemons of this one machine (slurmd -N NAME, one port each).
# Exit status: 0 ready; 1 could not install or start (the message says which daemon and its log).
set -euo pipefail

log() { echo "slurm-setup: $*" >&2; }
die() { log "error: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (it installs packages and starts daemons)"

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
    log "installing slurm-wlm and munge"
    export DEBIAN_FRONTEND=noninteractive
    (apt-get update -q && apt-get install -y -q slurm-wlm munge) >/tmp/allocopt-slurm-apt.log 2>&1 \
        || die "apt-get install slurm-wlm munge failed; see /tmp/allocopt-slurm-apt.log"
fi

HOST=$(hostname -s)
LOGDIR=/var/log/slurm
DEVDIR=/var/lib/allocopt-slurm/dev
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd "$LOGDIR" "$DEVDIR" /run/munge /var/lib/munge /var/log/munge
# placeholder GPU "device files" (Slurm only counts them: TaskPlugin=task/none does no device binding)
for t in a100 v100; do
    for i in $(seq 0 255); do [ -e "$DEVDIR/$t$i" ] || : > "$DEVDIR/$t$i"; done
done

# ----- munge ------------------------------------------------------------------------------
if [ ! -s /etc/munge/munge.key ]; then
    (mungekey --create --force 2>/dev/null || dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 2>/dev/null)
fi
chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge
chmod 0700 /etc/munge; chmod 0400 /etc/munge/munge.key; chmod 0755 /run/munge
if ! munge -n </dev/null | unmunge >/dev/null 2>&1; then
    log "starting munged"
    runuser -u munge -- /usr/sbin/munged --force || die "munged did not start; see /var/log/munge/munged.log"
    for _ in $(seq 50); do munge -n </dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
    munge -n </dev/null | unmunge >/dev/null 2>&1 || die "munged is not answering; see /var/log/munge/munged.log"
fi

# ----- configuration ----------------------------------------------------------------------
CONF=$(mktemp); GRES=$(mktemp)
cat >"$CONF" <<CONF
# written by allocopt .ci/slurm-setup.sh
ClusterName=allocopt
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd/%n
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd-%n.pid
SlurmctldLogFile=$LOGDIR/slurmctld.log
SlurmdLogFile=$LOGDIR/slurmd-%n.log
SlurmctldPort=6817
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
GresTypes=gpu
SlurmdParameters=config_overrides
# a node set down by "scontrol update state=down" stays down until "state=resume" (one that stopped
# answering returns when its slurmd registers again)
ReturnToService=1
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
# allocopt preempts by "scontrol requeuehold": batch jobs are requeueable, the job gets SIGTERM
# and KillWait seconds to checkpoint before SIGKILL
JobRequeue=1
KillWait=5
MinJobAge=600
MaxJobCount=20000
SchedulerType=sched/backfill
SchedulerParameters=sched_min_interval=200000
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
Waittime=0
NodeName=gpu-a NodeHostname=$HOST Port=17001 CPUs=4 RealMemory=4000 Gres=gpu:a100:2 State=UNKNOWN
NodeName=gpu-v NodeHostname=$HOST Port=17002 CPUs=4 RealMemory=4000 Gres=gpu:v100:2 State=UNKNOWN
NodeName=gpu-big-a NodeHostname=$HOST Port=17003 CPUs=256 RealMemory=8000 Gres=gpu:a100:256 State=UNKNOWN
NodeName=gpu-big-v NodeHostname=$HOST Port=17004 CPUs=256 RealMemory=8000 Gres=gpu:v100:256 State=UNKNOWN
NodeName=gpu-e1 NodeHostname=$HOST Port=17005 CPUs=4 RealMemory=4000 Gres=gpu:a100:2 State=UNKNOWN
NodeName=gpu-e2 NodeHostname=$HOST Port=17006 CPUs=4 RealMemory=4000 Gres=gpu:a100:2 State=UNKNOWN
PartitionName=allocopt Nodes=gpu-a,gpu-v Default=YES MaxTime=INFINITE State=UP
PartitionName=bench Nodes=gpu-big-a,gpu-big-v MaxTime=INFINITE State=UP
PartitionName=elastic Nodes=gpu-e[1-2] MaxTime=INFINITE State=UP
CONF
cat >"$GRES" <<GRES
# written by allocopt .ci/slurm-setup.sh: count-only GPUs (placeholder files, no detection)
AutoDetect=off
NodeName=gpu-a Name=gpu Type=a100 File=$DEVDIR/a100[0-1]
NodeName=gpu-v Name=gpu Type=v100 File=$DEVDIR/v100[0-1]
NodeName=gpu-big-a Name=gpu Type=a100 File=$DEVDIR/a100[0-255]
NodeName=gpu-big-v Name=gpu Type=v100 File=$DEVDIR/v100[0-255]
NodeName=gpu-e[1-2] Name=gpu Type=a100 File=$DEVDIR/a100[0-1]
GRES
changed=0
cmp -s "$CONF" /etc/slurm/slurm.conf || { mv "$CONF" /etc/slurm/slurm.conf; changed=1; }
cmp -s "$GRES" /etc/slurm/gres.conf || { mv "$GRES" /etc/slurm/gres.conf; changed=1; }
rm -f "$CONF" "$GRES"
chmod 0644 /etc/slurm/slurm.conf /etc/slurm/gres.conf

NODES="gpu-a gpu-v gpu-big-a gpu-big-v gpu-e1 gpu-e2"
running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
stop() {  # stop the daemon of pid file $1, waiting for it to exit
    if running "$1"; then
        local pid; pid=$(cat "$1"); kill "$pid"
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
    fi
}
if [ "$changed" = 1 ]; then
    log "configuration changed: (re)starting the Slurm daemons"
    stop /run/slurmctld.pid
    for pidfile in /run/slurmd-*.pid; do [ -e "$pidfile" ] && stop "$pidfile"; done
fi

# ----- daemons ----------------------------------------------------------------------------
if ! running /run/slurmctld.pid; then
    log "starting slurmctld"
    /usr/sbin/slurmctld -i || die "slurmctld did not start; see $LOGDIR/slurmctld.log"
fi
for n in $NODES; do
    if ! running "/run/slurmd-$n.pid"; then
        mkdir -p "/var/spool/slurmd/$n"
        log "starting slurmd -N $n"
        /usr/sbin/slurmd -N "$n" || die "slurmd -N $n did not start; see $LOGDIR/slurmd-$n.log"
    fi
done

# ----- wait until every node is idle ------------------------------------------------------
for _ in $(seq 120); do
    states=$(sinfo --noheader --Node --format='%N %t' 2>/dev/null | sort -u || true)
    alive=1
    for n in $NODES; do running "/run/slurmd-$n.pid" || alive=0; done
    [ "$alive" = 1 ] || die "a slurmd exited after starting; see $LOGDIR/slurmd-*.log"
    if [ -n "$states" ] && ! echo "$states" | grep -qvE ' (idle|mix|alloc)$'; then
        log "ready: $(echo "$states" | tr '\n' ' ')"
        exit 0
    fi
    for n in $NODES; do  # a node left down by an earlier run comes back
        echo "$states" | grep -qE "^$n (down|drain|drng|fail)" && scontrol update nodename="$n" state=resume 2>/dev/null || true
    done
    sleep 0.5
done
die "nodes not idle after 60 s: $(sinfo --noheader --Node --format='%N %t %E' 2>&1 | tr '\n' ';'); see $LOGDIR/"
