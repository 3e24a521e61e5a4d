#!/bin/sh
# run.sh IMAGE PROGRAM CASE -- runs one case of a test program again with
# the docker backend, every job a container of IMAGE (made from PROGRAM by
# image.sh build).  Skipped (exit 77; a failure under CI, see
# tests/skip.sh) where the engine's socket is absent.
set -u
. "$(dirname "$0")/../skip.sh"
sock=${FIBER_DOCKER_SOCKET:-/var/run/docker.sock}
[ -S "$sock" ] || skip_engine "$sock is absent: no Docker engine on this machine"
FIBER_BACKEND=docker FIBER_IMAGE=$1
export FIBER_BACKEND FIBER_IMAGE
exec "$2" "$3"
