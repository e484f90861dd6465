#!/usr/bin/env bash
# Stops the one-machine Slurm of start.sh: slurmd, slurmctld, then munged, each by the
# pid in its pid file (SIGTERM, then SIGKILL after 10 s). Tasks that slurmd started
# and that outlived it are killed by the pids slurmd leaves in its spool. Safe to run
# twice or on a half-started state directory.
# usage: scripts/slurm-local/stop.sh [STATE_DIR] [--purge]   (--purge removes STATE_DIR)
set -uo pipefail
state=${1:-/tmp/mtnlg-slurm}
purge=${2:-}

stop_pid() {  # NAME PIDFILE
  local name=$1 file=$2 pid
  [ -f "$file" ] || return 0
  pid=$(cat "$file" 2>/dev/null)
  case "$pid" in ''|*[!0-9]*) rm -f "$file"; return 0 ;; esac
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      echo "slurm-local: $name ($pid) ignored SIGTERM; sending SIGKILL" >&2
      kill -KILL "$pid" 2>/dev/null
    fi
  fi
  rm -f "$file"
}

[ -d "$state" ] || exit 0
# Step daemons (slurmstepd) of this node: their pids are the target of the job's
# task processes; end them first so no rank keeps running after slurmd is gone.
if [ -f "$state/slurmd.pid" ]; then
  sd=$(cat "$state/slurmd.pid" 2>/dev/null)
  for p in $(pgrep -P "${sd:-0}" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
fi
for p in /proc/[0-9]*; do
  # slurmstepd processes started for this cluster: argv[0] is "slurmstepd: [JOB.STEP]"
  # and they hold our spool directory as their working directory.
  [ "$(readlink "$p/cwd" 2>/dev/null)" = "$state/spool" ] || continue
  case "$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null)" in slurmstepd*) kill -KILL "${p#/proc/}" 2>/dev/null ;; esac
done
stop_pid slurmd "$state/slurmd.pid"
stop_pid slurmctld "$state/slurmctld.pid"
stop_pid munged "$state/munged.pid"
if [ "$purge" = --purge ]; then
  rm -rf "$state"
fi
exit 0
