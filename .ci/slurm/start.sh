#!/usr/bin/env bash
# Start a one-node Slurm cluster on this machine (munged + slurmctld + slurmd), for CI and
# for trying `snakemake --profile slurm` locally. Needs Debian's slurm-wlm and munge.
#
#   eval "$(.ci/slurm/start.sh)"     # starts the cluster, exports SLURM_CONF
#   sbatch --wrap hostname; squeue
#   .ci/slurm/stop.sh
#
# Everything (munge key, sockets, spool, state, logs) lives under $LATENTSTRAT_SLURM_DIR
# (default /tmp/latentstrat-slurm); nothing in /etc is touched. stdout carries only the
# `export SLURM_CONF=...` line; progress goes to stderr. Idempotent: if the cluster under
# that directory already answers, it just prints the export line.
set -euo pipefail

STATE=${LATENTSTRAT_SLURM_DIR:-/tmp/latentstrat-slurm}
PARTITION=${LATENTSTRAT_SLURM_PARTITION:-debug}
CTLD_PORT=${LATENTSTRAT_SLURMCTLD_PORT:-6817}
SLURMD_PORT=${LATENTSTRAT_SLURMD_PORT:-6818}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export SLURM_CONF=$STATE/slurm.conf

log() { echo "[slurm-ci] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

for bin in munged slurmctld slurmd sinfo sbatch squeue; do
    command -v "$bin" >/dev/null || die "$bin not found (apt-get install slurm-wlm munge)"
done

if [[ -f $SLURM_CONF ]] && timeout 5 sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
    log "cluster under $STATE already up"
    echo "export SLURM_CONF=$SLURM_CONF"
    exit 0
fi

HOST=$(hostname -s)
CPUS=$(nproc)
MEM_MB=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
mkdir -p "$STATE"/{munge,ctld,spool,log}
chmod 700 "$STATE/munge"

# munge: a fresh key for this cluster, daemon on a private socket
if [[ ! -s $STATE/munge/munge.key ]]; then
    dd if=/dev/urandom of="$STATE/munge/munge.key" bs=1024 count=1 status=none
fi
chmod 400 "$STATE/munge/munge.key"
if ! [[ -S $STATE/munge/munge.socket ]] || ! munge -n -S "$STATE/munge/munge.socket" >/dev/null 2>&1; then
    rm -f "$STATE/munge/munge.socket"*
    munged --force --key-file="$STATE/munge/munge.key" --socket="$STATE/munge/munge.socket" \
        --pid-file="$STATE/munge/munged.pid" --log-file="$STATE/log/munged.log" \
        --seed-file="$STATE/munge/munged.seed"
fi
munge -n -S "$STATE/munge/munge.socket" | unmunge -S "$STATE/munge/munge.socket" >/dev/null \
    || die "munge round trip failed (see $STATE/log/munged.log)"
log "munged up ($STATE/munge/munge.socket)"

sed -e "s|@HOST@|$HOST|g" -e "s|@USER@|$(id -un)|g" -e "s|@STATE@|$STATE|g" \
    -e "s|@CPUS@|$CPUS|g" -e "s|@MEM_MB@|$MEM_MB|g" -e "s|@PARTITION@|$PARTITION|g" \
    -e "s|@CTLD_PORT@|$CTLD_PORT|g" -e "s|@SLURMD_PORT@|$SLURMD_PORT|g" \
    "$HERE/slurm.conf.in" > "$SLURM_CONF"
# Jobs (srun inside sbatch) and plain `sinfo` look in /etc/slurm/slurm.conf, not at the
# submitter's SLURM_CONF: link ours there when that place is free (stop.sh removes the link).
if [[ ! -e /etc/slurm/slurm.conf && -w /etc/slurm ]] || [[ -L /etc/slurm/slurm.conf ]]; then
    ln -sfn "$SLURM_CONF" /etc/slurm/slurm.conf
fi

[[ -f $STATE/slurmctld.pid ]] && kill -0 "$(cat "$STATE/slurmctld.pid")" 2>/dev/null \
    || slurmctld -f "$SLURM_CONF"
[[ -f $STATE/slurmd.pid ]] && kill -0 "$(cat "$STATE/slurmd.pid")" 2>/dev/null \
    || slurmd -f "$SLURM_CONF"

for _ in $(seq 60); do
    state=$(timeout 5 sinfo -h -n "$HOST" -o %T 2>/dev/null || true)
    case $state in
        idle|mixed|allocated) log "node $HOST $state (partition $PARTITION, $CPUS CPUs, $MEM_MB MB)"
             echo "export SLURM_CONF=$SLURM_CONF"; exit 0 ;;
        *down*|*drain*) scontrol -f "$SLURM_CONF" update nodename="$HOST" state=resume 2>/dev/null || true ;;
    esac
    sleep 1
done
die "node $HOST did not become idle (sinfo: '${state:-no answer}'); see $STATE/log/"
