#!/bin/sh
# run.sh PROGRAM CASE -- runs one case of a test program with the slurm
# backend, on the cluster that scripts/slurm-local.sh runs on this host
# (every job of the case is a Slurm job).  Skipped (exit 77; a failure
# under CI, see tests/skip.sh) where that cluster is not running
# (cluster.sh start found no Slurm to use).
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
. "$top/tests/skip.sh"
"$top/scripts/slurm-local.sh" status >/dev/null 2>&1 ||
    skip_engine "no Slurm cluster running (scripts/slurm-local.sh start)"
eval "$("$top/scripts/slurm-local.sh" env)"
# The nodes are on this host: the master's loopback address reaches them
# (on a real cluster listen_host stays "auto": the default route's address).
FIBER_BACKEND=slurm FIBER_LISTEN_HOST=127.0.0.1
export FIBER_BACKEND FIBER_LISTEN_HOST
exec "$1" "$2"
