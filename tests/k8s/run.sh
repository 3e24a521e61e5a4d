#!/bin/sh
# run.sh PROGRAM [ARGS...] -- runs a test program's case (or a benchmark)
# with the kubernetes backend, on the cluster that cluster.sh started:
# every job is a pod that kube-scheduler puts on the node and the kubelet
# runs as a container of image fiber-test/<program's name>:ci (made by
# `fiber image build`, fixture docker_image_<program>; FIBER_IMAGE
# overrides it), never pulled (k8s_pull_policy Never), on the node's
# network (k8s_host_network: the test cluster has no pod network), so
# that the pods dial the master on loopback.  Skipped (exit 77; a failure
# under CI, see tests/skip.sh) where there is no cluster.
set -u
. "$(dirname "$0")/../skip.sh"
state=${K8S_LOCAL_DIR:-/tmp/fiber-k8s}/fiber-tests
[ -f "$state/env" ] ||
    skip_engine "no Kubernetes test cluster (tests/k8s/cluster.sh start did not run or found none)"
# scripts/k8s-local.sh's variables are not fiber configuration keys, and
# fiber refuses unknown FIBER_ variables: drop every FIBER_K8S_* first.
for v in $(env | sed -n 's/^\(FIBER_K8S_[A-Za-z0-9_]*\)=.*/\1/p'); do
    unset "$v"
done
set -a
. "$state/env"
set +a
FIBER_BACKEND=kubernetes
FIBER_IMAGE=${FIBER_IMAGE:-fiber-test/$(basename "$1"):ci}
FIBER_K8S_HOST_NETWORK=true
FIBER_K8S_PULL_POLICY=Never
FIBER_LISTEN_HOST=127.0.0.1
export FIBER_BACKEND FIBER_IMAGE FIBER_K8S_HOST_NETWORK FIBER_K8S_PULL_POLICY \
    FIBER_LISTEN_HOST
exec "$@"
