#!/bin/sh
# cluster.sh start AGENT | stop -- the Kubernetes control plane of
# scripts/k8s-local.sh (etcd + kube-apiserver on this host) and the test
# node agent (node_agent.c, a stand-in for a kubelet) for the kubernetes
# tests.  ctest runs `start` as the fixture k8s_cluster's setup and `stop`
# as its cleanup.
#
# start: starts the control plane (building kube-apiserver first when it is
# not cached: 7-15 minutes, once per machine), starts the node agent on
# namespace fiber-test, and writes $STATE/env, which run.sh reads.  Where
# the control plane cannot be had (no script, not root and nothing cached,
# the build failed) it prints SKIP and succeeds without writing env, so that
# every kubernetes test prints SKIP too.
# stop: stops the agent, deletes the pods and Secrets fiber left in the
# namespace, and stops the control plane if start started it.
#
# Several test runs (build directories) may share the cluster at once:
# each start records its ctest's pid in $STATE/users (under a lock), and
# only the last stop of a live user stops anything; start reuses a running
# agent and cleans the namespace only when no other user is left.
#
# env holds what scripts/k8s-local.sh prints: the FIBER_K8S_* variables
# (fiber's own keys k8s_server, k8s_ca_file, k8s_token_file,
# k8s_namespace) and the admin token as K8S_ADMIN_TOKEN_FILE (for tests
# that play the cluster's administrator).
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
script=$top/scripts/k8s-local.sh
k8s_dir=${K8S_LOCAL_DIR:-/tmp/fiber-k8s}
cache=${K8S_LOCAL_CACHE:-/var/cache/fiber-k8s}
state=$k8s_dir/fiber-tests
envfile=$state/env

# The agent's pid, if it is running (checked against its command line).
agent_pid() {
    [ -s "$state/agent.pid" ] || return 1
    pid=$(cat "$state/agent.pid")
    case $pid in ''|*[!0-9]*) return 1 ;; esac
    [ "$pid" -gt 1 ] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q node_agent || return 1
    echo "$pid"
}

stop_agent() {
    if pid=$(agent_pid); then
        kill -TERM "$pid" 2>/dev/null
        i=0
        while [ $i -lt 50 ] && [ -d "/proc/$pid" ]; do sleep 0.1; i=$((i + 1)); done
        [ -d "/proc/$pid" ] && kill -KILL "$pid" 2>/dev/null
    fi
    rm -f "$state/agent.pid"
}

# admin_delete COLLECTION: deletes fiber's objects of the collection.
admin_delete() {
    [ -n "${FIBER_K8S_SERVER:-}" ] || return 0
    curl -sS --max-time 20 --cacert "$FIBER_K8S_CA_FILE" \
        -H "Authorization: Bearer $(cat "$K8S_LOCAL_ADMIN_TOKEN_FILE")" \
        -X DELETE -o /dev/null \
        "$FIBER_K8S_SERVER/api/v1/namespaces/$FIBER_K8S_NAMESPACE/$1?labelSelector=app.kubernetes.io%2Fmanaged-by%3Dfiber&gracePeriodSeconds=0" || true
}

skip() {
    echo "SKIP: $*: the kubernetes tests will print SKIP"
    exit 0
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

case ${1:-} in
start)
    agent=${2:?usage: cluster.sh start AGENT}
    rm -f "$envfile"
    [ -x "$script" ] || skip "$script is missing"
    if [ ! -x "$cache/bin/kube-apiserver" ] && [ "$(id -u)" != 0 ]; then
        skip "kube-apiserver is not built ($cache/bin) and building it needs root"
    fi
    command -v curl >/dev/null || skip "curl is not installed"
    command -v flock >/dev/null || skip "flock (util-linux) is not installed"
    mkdir -p "$state"
    exec 8>"$state/lock"
    # Bounded: a holder that never lets go must not hang the suite.
    flock -w 600 8 || skip "$state/lock stays locked"
    users_prune
    if ! "$script" status >/dev/null 2>&1; then
        # Bounded below ctest's own timeout, so that SKIP can be printed.
        timeout 1400 "$script" start 8>&- || skip "scripts/k8s-local.sh start failed"
        touch "$state/stop-cluster"
    fi
    eval "$("$script" env)" || skip "scripts/k8s-local.sh env failed"
    if [ "$(users_count)" -eq 0 ] || ! agent_pid >/dev/null; then
        # Alone: start afresh, with nothing left from earlier runs.
        stop_agent
        admin_delete pods
        admin_delete secrets
        rm -rf "$state/agent"
        mkdir -p "$state/agent"
        setsid "$agent" --server "$FIBER_K8S_SERVER" --ca "$FIBER_K8S_CA_FILE" \
            --token-file "$K8S_LOCAL_ADMIN_TOKEN_FILE" \
            --sa-token-file "$FIBER_K8S_TOKEN_FILE" \
            --namespace "$FIBER_K8S_NAMESPACE" --state-dir "$state/agent" \
            </dev/null >"$state/agent.log" 2>&1 8>&- &
        echo $! >"$state/agent.pid"
    fi
    echo "$PPID" >>"$state/users"
    i=0
    while [ ! -f "$state/agent/ready" ]; do
        i=$((i + 1))
        if [ $i -gt 100 ] || ! agent_pid >/dev/null; then
            cat "$state/agent.log"
            echo "cluster.sh: the node agent did not start" >&2
            exit 1
        fi
        sleep 0.1
    done
    cat >"$envfile" <<EOT
FIBER_K8S_SERVER=$FIBER_K8S_SERVER
FIBER_K8S_CA_FILE=$FIBER_K8S_CA_FILE
FIBER_K8S_TOKEN_FILE=$FIBER_K8S_TOKEN_FILE
FIBER_K8S_NAMESPACE=$FIBER_K8S_NAMESPACE
K8S_ADMIN_TOKEN_FILE=$K8S_LOCAL_ADMIN_TOKEN_FILE
K8S_AGENT_DIR=$state/agent
EOT
    echo "kubernetes test cluster ready: $FIBER_K8S_SERVER, node agent pid $(cat "$state/agent.pid")"
    ;;
stop)
    mkdir -p "$state"
    exec 8>"$state/lock"
    flock -w 300 8 || { echo "cluster.sh: $state/lock stays locked" >&2; exit 1; }
    if [ -f "$state/users" ]; then
        grep -vx "$PPID" "$state/users" >"$state/users.new" || true
        mv -f "$state/users.new" "$state/users"
    fi
    users_prune
    if [ "$(users_count)" -gt 0 ]; then
        echo "cluster.sh: other test runs still use the cluster; leaving it"
        exit 0
    fi
    stop_agent
    if "$script" status >/dev/null 2>&1; then
        eval "$("$script" env)"
        admin_delete pods
        admin_delete secrets
    fi
    rm -f "$envfile"
    if [ -f "$state/stop-cluster" ]; then
        rm -f "$state/stop-cluster"
        "$script" stop 8>&-
    fi
    ;;
*)
    echo "usage: cluster.sh start AGENT | stop" >&2
    exit 2
    ;;
esac
