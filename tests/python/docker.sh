#!/bin/sh
# docker.sh VENV -- the Python package's suite again with every job a
# container: builds an image of this Python environment and the test
# folder with `python -m fiber.image build` (no registry, FROM scratch),
# runs python/tests with FIBER_BACKEND=docker and that image, and removes
# the image.  Cases marked local_only or host_files are left out
# (python/tests/conftest.py).  Without a Docker engine it exits 77
# (skipped), or fails under CI=true: CI must exercise every backend.
set -u
venv=$1
top=$(cd "$(dirname "$0")/../.." && pwd)
sock=${FIBER_DOCKER_SOCKET:-/var/run/docker.sock}
if [ ! -S "$sock" ]; then
    echo "SKIP: $sock is absent: no Docker engine on this machine"
    [ "${CI:-}" = true ] && { echo "CI=true: an engine case may not skip" >&2; exit 1; }
    exit 77
fi
tag=fiber-test/python:ci-$$
PYTHONPATH="$top/python"
export PYTHONPATH
"$venv/bin/python" -m fiber.image build --tag "$tag" "$top/python/tests/helpers.py" || exit 1
FIBER_BACKEND=docker FIBER_IMAGE=$tag "$top/tests/python/pytest.sh" "$venv"
rc=$?
curl -s -o /dev/null --unix-socket "$sock" -X DELETE "http://localhost/images/$tag?force=1" ||
    docker rmi -f "$tag" >/dev/null 2>&1
exit $rc
