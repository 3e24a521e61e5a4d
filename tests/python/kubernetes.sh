#!/bin/sh
# kubernetes.sh VENV -- the Python package's suite again with every job a
# pod of the test cluster (tests/k8s/cluster.sh, the fixture k8s_cluster):
# builds an image of this Python environment and the test folder with
# `python -m fiber.image build` (no registry, FROM scratch), runs
# python/tests through tests/k8s/run.sh (FIBER_BACKEND=kubernetes, host
# network, never pulled) with that image, and removes the image.  Cases
# marked local_only or host_files are left out, as on docker
# (python/tests/conftest.py).  Without the cluster it skips (exit 77), or
# fails under CI (tests/skip.sh).
set -u
venv=$1
top=$(cd "$(dirname "$0")/../.." && pwd)
. "$top/tests/skip.sh"
state=${K8S_LOCAL_DIR:-/tmp/fiber-k8s}/fiber-tests
[ -f "$state/env" ] ||
    skip_engine "no Kubernetes test cluster (tests/k8s/cluster.sh start did not run or found none)"
sock=${FIBER_DOCKER_SOCKET:-/var/run/docker.sock}
tag=fiber-test/python-k8s:ci-$$
PYTHONPATH="$top/python"
export PYTHONPATH
"$venv/bin/python" -m fiber.image build --tag "$tag" "$top/python/tests/helpers.py" || exit 1
FIBER_IMAGE=$tag "$top/tests/k8s/run.sh" "$top/tests/python/pytest.sh" "$venv"
rc=$?
curl -s -o /dev/null --unix-socket "$sock" -X DELETE "http://localhost/images/$tag?force=1" ||
    docker rmi -f "$tag" >/dev/null 2>&1
exit $rc
