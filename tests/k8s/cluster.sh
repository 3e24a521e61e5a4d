#!/bin/sh
# cluster.sh start | stop -- the Kubernetes test cluster of
# scripts/k8s-local.sh for the kubernetes tests: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler and one kubelet that runs every
# pod as a container of this host's Docker Engine.  ctest runs `start` as
# the fixture k8s_cluster's setup and `stop` as its cleanup.
#
# start: starts the cluster (k8s-local.sh start; `make test` has built its
# binaries before, `make engines`), deletes what fiber left in the test
# namespace when no other test run uses it, and writes $STATE/env, which
# run.sh reads.  Where the cluster cannot be had (no script, its binaries
# not built and no root to build them, no curl or flock) it is skipped:
# exit 77, and so is every kubernetes case; under CI (tests/skip.sh) that
# is a failure, and the cases are then "Not Run".  A cluster that is there
# but does not come up is a failure.
# stop: deletes the pods and Secrets fiber left in the namespace, and stops
# the cluster if start started it.
#
# Several test runs (build directories) may share the cluster at once:
# each start records its ctest's pid in $STATE/users (under a lock), and
# only the last stop of a live user stops anything.
#
# env holds what scripts/k8s-local.sh prints: the FIBER_K8S_* variables
# (fiber's own keys k8s_server, k8s_ca_file, k8s_token_file,
# k8s_namespace) and the admin token as K8S_ADMIN_TOKEN_FILE (for tests
# that play the cluster's administrator).
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
. "$top/tests/skip.sh"
script=$top/scripts/k8s-local.sh
k8s_dir=${K8S_LOCAL_DIR:-/tmp/fiber-k8s}
cache=${K8S_LOCAL_CACHE:-/var/cache/fiber-k8s}
state=$k8s_dir/fiber-tests
envfile=$state/env

# admin_delete COLLECTION [API]: deletes fiber's objects of the collection
# (API: the group's path, /api/v1 by default).
admin_delete() {
    [ -n "${FIBER_K8S_SERVER:-}" ] || return 0
    curl -sS --max-time 20 --cacert "$FIBER_K8S_CA_FILE" \
        -H "Authorization: Bearer $(cat "$K8S_LOCAL_ADMIN_TOKEN_FILE")" \
        -X DELETE -o /dev/null \
        "$FIBER_K8S_SERVER${2:-/api/v1}/namespaces/$FIBER_K8S_NAMESPACE/$1?labelSelector=app.kubernetes.io%2Fmanaged-by%3Dfiber&gracePeriodSeconds=0&propagationPolicy=Background" || true
}

# Deletes what fiber's tests leave: the Jobs of requeueable masters first
# (else their controller makes new pods), then pods and Secrets.
admin_delete_all() {
    admin_delete jobs /apis/batch/v1
    admin_delete pods
    admin_delete secrets
}

skip() { skip_engine "$*: the kubernetes cases are skipped too"; }

fail() {
    echo "cluster.sh: $*" >&2
    exit 1
}

# users_prune: keeps the users (ctest pids) that still run.
users_prune() {
    [ -f "$state/users" ] || return 0
    : >"$state/users.new"
    while read -r u; do
        case $u in ''|*[!0-9]*) continue ;; esac
        [ -d "/proc/$u" ] && echo "$u" >>"$state/users.new"
    done <"$state/users"
    mv -f "$state/users.new" "$state/users"
}

users_count() {
    if [ -f "$state/users" ]; then grep -c . "$state/users" || true; else echo 0; fi
}

built() {
    for b in kube-apiserver kubelet kube-scheduler kube-controller-manager; do
        [ -x "$cache/bin/$b" ] || return 1
    done
}

case ${1:-} in
start)
    rm -f "$envfile"
    [ -x "$script" ] || skip "$script is missing"
    if ! built && [ "$(id -u)" != 0 ]; then
        skip "the Kubernetes binaries are not built ($cache/bin) and building them needs root"
    fi
    [ -S /var/run/docker.sock ] || skip "no Docker Engine at /var/run/docker.sock (the kubelet runs pods as its containers)"
    command -v curl >/dev/null || skip "curl is not installed"
    command -v flock >/dev/null || skip "flock (util-linux) is not installed"
    mkdir -p "$state"
    exec 8>"$state/lock"
    if ! flock -n 8; then
        echo "cluster.sh: waiting for another test run's start or stop of the cluster (up to 600 s)"
        flock -w 600 8 || fail "$state/lock stays locked"
    fi
    users_prune
    if ! "$script" status >/dev/null 2>&1; then
        # k8s-local.sh prints a line per stage (and, building the binaries
        # the first time, a line every 30 s) on standard error.
        built || echo "cluster.sh: the Kubernetes binaries are not built yet: building them first (5.5 to 15 minutes, once)"
        # Bounded below ctest's own timeout, so that the reason is printed.
        timeout 1400 "$script" start 8>&- || fail "scripts/k8s-local.sh start failed"
        touch "$state/stop-cluster"
    fi
    eval "$("$script" env)" || fail "scripts/k8s-local.sh env failed"
    # A cluster started by an older script lacks the newer roles.
    "$script" bootstrap 8>&- || fail "scripts/k8s-local.sh bootstrap failed"
    if [ "$(users_count)" -eq 0 ]; then
        # Alone: start afresh, with nothing left from earlier runs.
        admin_delete_all
    fi
    echo "$PPID" >>"$state/users"
    cat >"$envfile" <<EOT
FIBER_K8S_SERVER=$FIBER_K8S_SERVER
FIBER_K8S_CA_FILE=$FIBER_K8S_CA_FILE
FIBER_K8S_TOKEN_FILE=$FIBER_K8S_TOKEN_FILE
FIBER_K8S_NAMESPACE=$FIBER_K8S_NAMESPACE
K8S_ADMIN_TOKEN_FILE=$K8S_LOCAL_ADMIN_TOKEN_FILE
EOT
    echo "kubernetes test cluster ready: $FIBER_K8S_SERVER (kubelet, scheduler, controller-manager: $k8s_dir/logs)"
    ;;
stop)
    mkdir -p "$state"
    exec 8>"$state/lock"
    flock -w 300 8 || fail "$state/lock stays locked"
    if [ -f "$state/users" ]; then
        grep -vx "$PPID" "$state/users" >"$state/users.new" || true
        mv -f "$state/users.new" "$state/users"
    fi
    users_prune
    if [ "$(users_count)" -gt 0 ]; then
        echo "cluster.sh: other test runs still use the cluster; leaving it"
        exit 0
    fi
    if "$script" status >/dev/null 2>&1; then
        eval "$("$script" env)"
        admin_delete_all
    fi
    rm -f "$envfile"
    if [ -f "$state/stop-cluster" ]; then
        rm -f "$state/stop-cluster"
        "$script" stop 8>&-
    fi
    ;;
*)
    echo "usage: cluster.sh start | stop" >&2
    exit 2
    ;;
esac
