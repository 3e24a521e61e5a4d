#!/bin/sh
# run.sh PROGRAM [ARGS...] -- runs a test program's case (or a benchmark)
# with the kubernetes backend, on the control plane and node agent that
# cluster.sh started (every job is a pod, run by the agent as a local
# process).  Prints SKIP and succeeds where there is none.
set -u
state=${K8S_LOCAL_DIR:-/tmp/fiber-k8s}/fiber-tests
if [ ! -f "$state/env" ]; then
    echo "SKIP: no Kubernetes test cluster (tests/k8s/cluster.sh start did not run or found none)"
    exit 0
fi
# scripts/k8s-local.sh's variables are not fiber configuration keys, and
# fiber refuses unknown FIBER_ variables: drop every FIBER_K8S_* first.
for v in $(env | sed -n 's/^\(FIBER_K8S_[A-Za-z0-9_]*\)=.*/\1/p'); do
    unset "$v"
done
set -a
. "$state/env"
set +a
# The agent runs pods as processes of this host: they dial the master on
# loopback.  It ignores images, but the backend requires one.
FIBER_BACKEND=kubernetes
FIBER_IMAGE=${FIBER_IMAGE:-fiber-test/agent-runs-local-programs:1}
FIBER_LISTEN_HOST=127.0.0.1
export FIBER_BACKEND FIBER_IMAGE FIBER_LISTEN_HOST
exec "$@"
