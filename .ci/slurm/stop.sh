#!/usr/bin/env bash
# Stop the one-node cluster started by .ci/slurm/start.sh (same $LATENTSTRAT_SLURM_DIR).
# Cancels remaining jobs, stops slurmd, slurmctld and munged by their pid files.
# Pass --clean to also delete the state directory.
set -uo pipefail

STATE=${LATENTSTRAT_SLURM_DIR:-/tmp/latentstrat-slurm}
export SLURM_CONF=$STATE/slurm.conf
log() { echo "[slurm-ci] $*" >&2; }

if [[ -f $SLURM_CONF ]]; then
    timeout 10 scancel --user="$(id -un)" 2>/dev/null || true
fi
stop_pid() {  # name pidfile
    local pidfile=$2 pid
    [[ -f $pidfile ]] || return 0
    pid=$(cat "$pidfile")
    if kill -0 "$pid" 2>/dev/null; then
        kill "$pid"
        for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
        log "stopped $1 ($pid)"
    fi
    rm -f "$pidfile"
}
stop_pid slurmd "$STATE/slurmd.pid"
stop_pid slurmctld "$STATE/slurmctld.pid"
stop_pid munged "$STATE/munge/munged.pid"
if [[ -L /etc/slurm/slurm.conf && $(readlink /etc/slurm/slurm.conf) == "$SLURM_CONF" ]]; then
    rm -f /etc/slurm/slurm.conf
fi
if [[ ${1:-} == --clean ]]; then
    rm -rf "$STATE"
    log "removed $STATE"
fi
exit 0
