#!/bin/sh
# run.sh IMAGE PROGRAM CASE -- runs one case of a test program again with
# the docker backend, every job a container of IMAGE (made from PROGRAM by
# image.sh build).  Prints SKIP and succeeds where the engine's socket is
# absent.
set -u
sock=${FIBER_DOCKER_SOCKET:-/var/run/docker.sock}
if [ ! -S "$sock" ]; then
    echo "SKIP: $sock is absent: no Docker engine on this machine"
    exit 0
fi
FIBER_BACKEND=docker FIBER_IMAGE=$1
export FIBER_BACKEND FIBER_IMAGE
exec "$2" "$3"
