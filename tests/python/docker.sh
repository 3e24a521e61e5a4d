#!/bin/sh
# docker.sh VENV -- the Python package's suite again with every job a
# container: builds an image of this Python environment and the test
# folder with `python -m fiber.image build` (no registry, FROM scratch),
# runs python/tests with FIBER_BACKEND=docker and that image, and removes
# the image.  Cases marked local_only or host_files are left out
# (python/tests/conftest.py).  Without a Docker engine it skips (exit 77),
# or fails under CI (tests/skip.sh).
set -u
venv=$1
top=$(cd "$(dirname "$0")/../.." && pwd)
. "$top/tests/skip.sh"
sock=${FIBER_DOCKER_SOCKET:-/var/run/docker.sock}
[ -S "$sock" ] || skip_engine "$sock is absent: no Docker engine on this machine"
tag=fiber-test/python:ci-$$
PYTHONPATH="$top/python"
export PYTHONPATH
"$venv/bin/python" -m fiber.image build --tag "$tag" "$top/python/tests/helpers.py" || exit 1
FIBER_BACKEND=docker FIBER_IMAGE=$tag "$top/tests/python/pytest.sh" "$venv"
rc=$?
curl -s -o /dev/null --unix-socket "$sock" -X DELETE "http://localhost/images/$tag?force=1" ||
    docker rmi -f "$tag" >/dev/null 2>&1
exit $rc
