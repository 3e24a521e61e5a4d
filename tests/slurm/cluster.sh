#!/bin/sh
# cluster.sh start|stop -- the ctest fixture around scripts/slurm-local.sh.
#
# start: starts the throwaway cluster, installing Debian's Slurm packages
# first if they are missing (`make test` installs them before ctest
# starts: scripts/deps.sh engines).  If the packages cannot be installed
# here (no package archive, not root), it is skipped (exit 77), and the
# slurm cases are skipped too; under CI (tests/skip.sh) that is a failure,
# and the cases are then "Not Run".  A cluster that is installed but does
# not come up is a failure.
# stop: stops it, leaving nothing running.
#
# Several test runs (build trees) may share the one cluster: each start
# leaves a marker named after its build tree in users/ of the cluster's
# folder, each stop removes its own, and the cluster stops with the last.
# A cluster that was running before any test run started stays up.
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
. "$top/tests/skip.sh"
script="$top/scripts/slurm-local.sh"
users="${SLURM_LOCAL_DIR:-/tmp/fiber-slurm}/users"
me=$(pwd | cksum | cut -d' ' -f1)
case "${1:-}" in
start)
    if ! command -v slurmctld >/dev/null 2>&1 ||
       ! command -v slurmd >/dev/null 2>&1 ||
       ! command -v sbatch >/dev/null 2>&1 ||
       ! command -v munged >/dev/null 2>&1; then
        "$script" install ||
            skip_engine "Slurm is not installed and could not be installed"
    fi
    if "$script" status >/dev/null 2>&1 && [ ! -d "$users" ]; then
        echo "slurm-local: already running (left running afterwards)"
        exit 0
    fi
    "$script" start || exit 1
    mkdir -p "$users" && touch "$users/$me"
    ;;
stop)
    [ -d "$users" ] || exit 0       # not started by a test run
    rm -f "$users/$me"
    if [ -n "$(ls -A "$users" 2>/dev/null)" ]; then
        echo "slurm-local: still used by another test run: left running"
        exit 0
    fi
    rmdir "$users" 2>/dev/null
    exec "$script" stop
    ;;
*)
    echo "usage: $0 start|stop" >&2
    exit 2
    ;;
esac
