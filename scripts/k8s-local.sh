#!/usr/bin/env bash
# k8s-local.sh -- a throwaway single-node Kubernetes cluster on this host
# (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, and a
# kubelet running pods as containers of this host's Docker Engine), for
# fiber's Kubernetes backend tests.  docs/backends/kubernetes.md, "How it
# is tested", says what is real and what is not.
#
# Usage:
#   scripts/k8s-local.sh build          build/cache the four binaries (no-op if cached)
#   scripts/k8s-local.sh start          start the cluster (idempotent; builds
#                                       first if a binary is missing)
#   scripts/k8s-local.sh stop [--purge] stop it all (exit 0 if not running);
#                                       --purge also deletes the state dir
#   scripts/k8s-local.sh bootstrap      (re)create the namespaces and roles of a
#                                       running cluster (what start does)
#   scripts/k8s-local.sh status         exit 0 if /readyz answers "ok" and the kubelet,
#                                       scheduler and controller-manager run, else 1
#   scripts/k8s-local.sh env            print `export ...` lines; use as:
#                                       eval "$(scripts/k8s-local.sh env)"
#                                       (the FIBER_K8S_* ones are fiber's own
#                                       config keys: a fiber program run after
#                                       that talks to this cluster)
#   scripts/k8s-local.sh progress-note LOG
#                                       what the build log LOG says make is
#                                       doing now (one line; for the progress
#                                       lines, and tests/scripts/progress_test.sh)
#
# Progress: `build` and `start` print a line per stage with the time so
# far ("k8s-local: apt-get source kubernetes (3/6), 41s so far"), and a
# step that takes long (the go build: minutes) a line every 30 s
# (FIBER_PROGRESS_INTERVAL) saying what it is doing (scripts/progress.sh).
#
# Inputs (environment, all optional):
#   K8S_LOCAL_DIR        state dir (certs, tokens, etcd data, logs, pid files);
#                        default /tmp/fiber-k8s
#   K8S_LOCAL_CACHE      build cache, outside the repository;
#                        default /var/cache/fiber-k8s (binary: $CACHE/bin/kube-apiserver)
#   K8S_LOCAL_PORT       kube-apiserver secure port; default 16443
#   K8S_LOCAL_ETCD_PORT  etcd client port (peer port = this + 1); default 12379
#
# `env` prints:
#   FIBER_K8S_SERVER            https://127.0.0.1:16443
#   FIBER_K8S_CA_FILE           $DIR/ca.crt (self-signed CA that signed the serving cert)
#   FIBER_K8S_TOKEN_FILE        $DIR/fiber-test.token (bearer token of user "fiber", 0600)
#   K8S_LOCAL_ADMIN_TOKEN_FILE  $DIR/admin.token (user "admin", group system:masters, 0600)
#   FIBER_K8S_NAMESPACE         fiber-test
#
# What `start` sets up:
#   * openssl: CA ($DIR/ca.crt/.key), serving cert for IP 127.0.0.1,
#     DNS localhost/kubernetes/kubernetes.default[.svc] ($DIR/apiserver.crt/.key),
#     service-account key pair ($DIR/sa.key/sa.pub).
#   * static token file $DIR/tokens.csv (--token-auth-file): admin token
#     (user admin, group system:masters) and fiber token (user fiber, no groups).
#     Tokens are random and kept across restarts (regenerated only by --purge).
#   * etcd (Debian package etcd-server) on 127.0.0.1:12379 (peer 12380),
#     data in $DIR/etcd.
#   * kube-apiserver on 127.0.0.1:16443 (insecure port disabled), RBAC+Node
#     authorization, ServiceAccount and NodeRestriction admission (without
#     StorageObjectInUseProtection: no storage, claims are never bound).
#   * kube-controller-manager, kube-scheduler, and the kubelet of node
#     fiber-node (see the "node" section below).
#   * via curl + admin token: namespaces fiber-test and fiber-forbidden, Role
#     "fiber-test" + RoleBinding in fiber-test granting user "fiber" full
#     access to pods, pods/log, pods/status, secrets, persistentvolumeclaims,
#     events (core and events.k8s.io). "fiber" has no rights elsewhere
#     (fiber-forbidden gives 403).
#   Logs: $DIR/logs/{etcd,kube-apiserver}.log; pids: $DIR/run/*.pid.
#
#   Logs of the others: $DIR/logs/<name>.log.
#
# How the binaries are built (`build`; 325 s on 2 quiet cores, done once):
#   1. A deb-src entry for bookworm main is added if none exists
#      (/etc/apt/sources.list.d/fiber-deb-src.sources, deb822, reusing the
#      mirror URI and Signed-By of the existing bookworm "deb" entry: a one-line
#      deb-src without the same Signed-By makes apt fail with
#      "Conflicting values set for option Signed-By").
#   2. apt-get install golang-go rsync jq dpkg-dev golang-github-modern-go-reflect2-dev;
#      `apt-get source kubernetes` (1.20.5+really1.20.2) into $CACHE/src.
#   3. vendor/github.com/modern-go/reflect2 (1.0.1) is replaced with Debian's
#      1.0.2 (/usr/share/gocode/src/github.com/modern-go/reflect2): 1.0.1
#      crashes under Go >= 1.18 ("fatal error: fault" when encoding a pod).
#   4. The kubelet's two negative OOM score constants become 0
#      (patch_oom_constants), then `CGO_ENABLED=0 make WHAT="cmd/kube-apiserver
#      cmd/kubelet cmd/kube-scheduler cmd/kube-controller-manager"`. The
#      Kubernetes 1.20 make wrapper builds in GOPATH mode (GO111MODULE=off,
#      GOPATH=_output/local/go), so the vendor tree is used and no network is
#      needed; GOFLAGS is cleared (-mod=vendor would be rejected in GOPATH
#      mode) and GOPROXY=off for good measure. Version info comes from the
#      tarball's archive stamp (v1.20.2).
#   5. The results are copied to $CACHE/bin/; the source tree and
#      _output are then deleted (a rebuild starts from `apt-get source`).
set -eu
# shellcheck source=scripts/progress.sh
. "$(cd "$(dirname "$0")" && pwd)/progress.sh"

DIR=${K8S_LOCAL_DIR:-/tmp/fiber-k8s}
CACHE=${K8S_LOCAL_CACHE:-/var/cache/fiber-k8s}
PORT=${K8S_LOCAL_PORT:-16443}
ETCD_PORT=${K8S_LOCAL_ETCD_PORT:-12379}
ETCD_PEER_PORT=$((ETCD_PORT + 1))
NAMESPACE=fiber-test
FORBIDDEN_NAMESPACE=fiber-forbidden
APISERVER_BIN=$CACHE/bin/kube-apiserver
NODE_NAME=fiber-node
PAUSE_IMAGE=fiber-k8s/pause:1
SERVER=https://127.0.0.1:$PORT
READY_TIMEOUT=${K8S_LOCAL_READY_TIMEOUT:-60}

log() { echo "k8s-local: $*" >&2; }
die() { echo "k8s-local: ERROR: $*" >&2; exit 1; }

need_root() {
    [ "$(id -u)" = 0 ] || die "$1 needs root (apt-get); run as root or use a prebuilt $APISERVER_BIN"
}

# apt_get ARGS...: apt-get that waits (up to 10 min) for the dpkg/apt lock
# instead of failing when something else holds it, and for the project's
# other scripts (deps.sh, slurm-local.sh: /var/lock/fiber-apt.lock).
apt_get() {
    flock /var/lock/fiber-apt.lock apt-get -o DPkg::Lock::Timeout=600 "$@"
}

apt_install() {
    # apt_install PKG...: install what is missing (non-interactive).
    local missing=() p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    need_root "installing ${missing[*]}"
    mkdir -p "$CACHE"
    log "apt-get install ${missing[*]}"
    if ! DEBIAN_FRONTEND=noninteractive apt_get install -y -q "${missing[@]}" >"$CACHE/apt-install.log" 2>&1; then
        # Package lists may be missing or stale: update once and retry.
        apt_get update -q >"$CACHE/apt-update.log" 2>&1 || { tail -n 20 "$CACHE/apt-update.log" >&2; die "apt-get update failed"; }
        DEBIAN_FRONTEND=noninteractive apt_get install -y -q "${missing[@]}" >"$CACHE/apt-install.log" 2>&1 \
            || { tail -n 20 "$CACHE/apt-install.log" >&2; die "apt-get install ${missing[*]} failed"; }
    fi
}

# ---------------------------------------------------------------- build ----

ensure_deb_src() {
    local f=/etc/apt/sources.list.d/fiber-deb-src.sources
    [ -e "$f" ] && return 0
    # An existing deb-src for bookworm main (one-line or deb822) is enough.
    if grep -hsE '^[[:space:]]*deb-src[[:space:]].*[[:space:]]bookworm[[:space:]].*main' \
            /etc/apt/sources.list /etc/apt/sources.list.d/*.list | grep -q .; then
        return 0
    fi
    local s
    for s in /etc/apt/sources.list.d/*.sources; do
        [ -e "$s" ] || continue
        # paragraph-wise: Types containing deb-src and Suites containing bookworm
        if awk -v RS= '/Types:[^\n]*deb-src/ && /Suites:[^\n]*bookworm([ \t\n]|$)/ && !/Enabled:[ \t]*no/ {f=1} END {exit !f}' "$s"; then
            return 0
        fi
    done
    # Find the mirror (and Signed-By) of the existing "deb ... bookworm" entry.
    local uri="" signed=""
    for s in /etc/apt/sources.list.d/*.sources; do
        [ -e "$s" ] || continue
        read -r uri signed < <(awk -v RS= '
            /Types:[^\n]*deb/ && /Suites:[^\n]*bookworm([ \t\n]|$)/ {
                u=""; k="";
                n=split($0, L, "\n");
                for (i=1;i<=n;i++) {
                    if (L[i] ~ /^URIs:/)      { sub(/^URIs:[ \t]*/, "", L[i]); split(L[i], W, /[ \t]+/); u=W[1] }
                    if (L[i] ~ /^Signed-By:/) { sub(/^Signed-By:[ \t]*/, "", L[i]); k=L[i] }
                }
                if (u != "") { print u, k; exit }
            }' "$s") || true
        [ -n "$uri" ] && break
    done
    if [ -z "$uri" ]; then
        # one-line format: deb [opts] URI bookworm main ...
        local line
        line=$(grep -hsE '^[[:space:]]*deb[[:space:]].*[[:space:]]bookworm[[:space:]].*main' \
            /etc/apt/sources.list /etc/apt/sources.list.d/*.list | head -n1) || true
        if [ -n "$line" ]; then
            signed=$(sed -nE 's/.*signed-by=([^] ]+).*/\1/p' <<<"$line")
            uri=$(sed -E 's/^[[:space:]]*deb[[:space:]]+(\[[^]]*\][[:space:]]+)?//' <<<"$line" | awk '{print $1}')
        fi
    fi
    [ -n "$uri" ] || uri=http://deb.debian.org/debian
    log "adding deb-src entry $f ($uri bookworm main)"
    {
        echo "# added by fiber scripts/k8s-local.sh (apt-get source kubernetes)"
        echo "Types: deb-src"
        echo "URIs: $uri"
        echo "Suites: bookworm"
        echo "Components: main"
        [ -n "$signed" ] && echo "Signed-By: $signed"
    } >"$f"
}

# The four binaries, built together from one source tree (one `make`).
K8S_BINS="kube-apiserver kubelet kube-scheduler kube-controller-manager"

all_built() {
    local b
    for b in $K8S_BINS; do [ -x "$CACHE/bin/$b" ] || return 1; done
}

# patch_oom_constants SRC: processes on this kind of machine may not lower
# their OOM score (no CAP_SYS_RESOURCE), and runc then fails to create a
# container that asks for a negative oom_score_adj ("can't get final
# child's PID from pipe: EOF"). The kubelet asks for -998 for every pod
# sandbox and -997 for Guaranteed pods: both become 0.
patch_oom_constants() {
    local src=$1 f
    f=$src/pkg/kubelet/dockershim/docker_sandbox.go
    grep -q 'defaultSandboxOOMAdj int = -998' "$f" || die "$f: defaultSandboxOOMAdj -998 not found (source changed?)"
    sed -i 's/defaultSandboxOOMAdj int = -998/defaultSandboxOOMAdj int = 0/' "$f"
    f=$src/pkg/kubelet/qos/policy.go
    grep -q 'guaranteedOOMScoreAdj int = -997' "$f" || die "$f: guaranteedOOMScoreAdj -997 not found (source changed?)"
    sed -i 's/guaranteedOOMScoreAdj int = -997/guaranteedOOMScoreAdj int = 0/' "$f"
}

do_build() {
    if all_built; then
        log "already built: $CACHE/bin/{${K8S_BINS// /,}}"
        return 0
    fi
    need_root "building $K8S_BINS"
    mkdir -p "$CACHE/bin" "$CACHE/src"
    command -v flock >/dev/null || die "flock (util-linux) not found"
    # Serialize concurrent builds (e.g. two test runs calling start at once).
    exec 9>"$CACHE/.build.lock"
    flock 9
    if all_built; then
        log "built by a concurrent run: $CACHE/bin"
        exec 9>&-
        return 0
    fi
    local t0=$SECONDS
    progress_start k8s-local 6
    log "building the Kubernetes binaries once for this machine (5.5 to 15 minutes; cached in $CACHE/bin)"
    progress_stage 1 "apt-get update (with a deb-src entry for the Kubernetes source)"
    ensure_deb_src
    progress_run "apt-get update" apt_get_update_logged \
        || { tail -n 20 "$CACHE/apt-update.log" >&2; die "apt-get update failed"; }
    apt-cache showsrc kubernetes 2>/dev/null | grep -q '^Version: .*1\.20\.' \
        || die "no kubernetes 1.20 source package visible to apt (deb-src for bookworm main missing?)"
    progress_stage 2 "installing Go and the build tools (when missing)"
    progress_run "installing Go and the build tools" \
        apt_install golang-go rsync jq dpkg-dev golang-github-modern-go-reflect2-dev
    command -v go >/dev/null || die "go not found after installing golang-go"
    local r2=/usr/share/gocode/src/github.com/modern-go/reflect2
    [ -f "$r2/reflect2.go" ] || die "$r2 missing (package golang-github-modern-go-reflect2-dev)"

    local src
    rm -rf "${CACHE:?}/src"; mkdir -p "$CACHE/src"
    progress_stage 3 "apt-get source kubernetes -> $CACHE/src"
    progress_run "apt-get source kubernetes" apt_get_source_logged \
        || { tail -n 20 "$CACHE/apt-source.log" >&2; die "apt-get source kubernetes failed"; }
    src=$(ls -d "$CACHE"/src/kubernetes-*/ 2>/dev/null | head -n1)
    [ -n "$src" ] && [ -f "$src/Makefile" ] || die "unpacked kubernetes source not found under $CACHE/src"
    src=${src%/}

    progress_stage 4 "patching the source"
    log "replacing vendored modern-go/reflect2 1.0.1 with Debian's 1.0.2 (Go >= 1.18 fix)"
    rm -rf "$src/vendor/github.com/modern-go/reflect2"
    mkdir -p "$src/vendor/github.com/modern-go/reflect2"
    cp -a "$r2/." "$src/vendor/github.com/modern-go/reflect2/"
    log "patching the kubelet's negative OOM score constants to 0"
    patch_oom_constants "$src"

    local what="" b
    for b in $K8S_BINS; do what="$what cmd/$b"; done
    progress_stage 5 "building $K8S_BINS with $(go version | awk '{print $3}') (5.5 min on 2 quiet cores, up to 15 loaded; log: $CACHE/build.log)"
    mkdir -p "$CACHE/home"
    : >"$CACHE/build.log"
    if ! PROGRESS_NOTE_CMD="build_note \"\$CACHE/build.log\"" \
            progress_run "make" make_k8s "$src" "${what# }"; then
        tail -n 40 "$CACHE/build.log" >&2
        die "kubernetes build failed (full log: $CACHE/build.log)"
    fi
    progress_stage 6 "copying the binaries to $CACHE/bin"
    local out
    for b in $K8S_BINS; do
        out=$src/_output/local/bin/linux/amd64/$b
        [ -x "$out" ] || out=$src/_output/bin/$b
        [ -x "$out" ] || die "build finished but no $b binary in $src/_output"
        "$out" --version >/dev/null 2>&1 || die "built $out does not run"
        cp "$out" "$CACHE/bin/$b.tmp"
        mv -f "$CACHE/bin/$b.tmp" "$CACHE/bin/$b"
    done
    rm -rf "${CACHE:?}/src" "${CACHE:?}/home"   # ~2 GB of source + Go cache; the binaries are all we need
    log "built $("$APISERVER_BIN" --version): $K8S_BINS in $((SECONDS - t0)) s -> $CACHE/bin"
    exec 9>&-
}

# The build's long steps, each with its output in its log (progress_run
# prints to standard error meanwhile).
apt_get_update_logged() {
    apt_get update -q >"$CACHE/apt-update.log" 2>&1
}

apt_get_source_logged() {
    (cd "$CACHE/src" && apt_get -o APT::Sandbox::User=root source -q kubernetes) >"$CACHE/apt-source.log" 2>&1
}

# make_k8s SRC WHAT: the one make that builds the four binaries.
make_k8s() {
    (cd "$1" && env -u GOFLAGS -u GO111MODULE HOME="$CACHE/home" CGO_ENABLED=0 GOPROXY=off \
        make WHAT="$2") >"$CACHE/build.log" 2>&1
}

# build_note LOG: what make is doing, from its log: Kubernetes' build
# prints "+++ [date] Building go targets for linux/amd64:" and the targets,
# indented, for each go build: first the code generators (a few seconds
# each), then one build of the four binaries (the minutes).  Prints
# nothing before the first.
build_note() {
    awk '
        /Building go targets for/ { n++; t = ""; getting = 1; next }
        getting && /^[ \t]+[^ \t]/ { sub(/^[ \t]+/, ""); k = split($0, p, "/"); t = t (t ? " " : "") p[k]; next }
        { getting = 0 }
        END {
            if (n == 0) exit
            if (t ~ /kube-apiserver|kubelet/)
                print "compiling " t " (one go build, the long part)"
            else
                print "code generator " t " (go build " n ")"
        }' "$1" 2>/dev/null
}

# --------------------------------------------------------------- helpers ---

pidfile() { echo "$DIR/run/$1.pid"; }

# our_pid NAME: print the pid of our running NAME (etcd|kube-apiserver|...), if any.
# A pid counts only if its command line still mentions our state dir.
our_pid() {
    local f pid
    f=$(pidfile "$1")
    [ -s "$f" ] || return 1
    pid=$(cat "$f")
    [ -d "/proc/$pid" ] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$DIR/" || return 1
    echo "$pid"
}

# launched_alive NAME: the NAME this script has just launched (its pid file)
# is running.  Not our_pid: until the launching subshell has exec'd the
# binary, its command line is still this script's, without $DIR/, and a
# check that fast read a daemon that was starting as one that had exited
# (CI, 1 Dec 2026: "etcd exited" while etcd came up).  A zombie has exited.
launched_alive() {
    local pid state
    pid=$(cat "$(pidfile "$1")" 2>/dev/null) || return 1
    [ -n "$pid" ] || return 1
    state=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1) || return 1
    [ -n "$state" ] && [ "$state" != Z ]
}

# stray_pids: processes of ours (etcd and the kube-* binaries whose args mention $DIR/)
stray_pids() {
    local p exe cmd
    for p in /proc/[0-9]*; do
        exe=$(readlink "$p/exe" 2>/dev/null) || continue
        case "${exe##*/}" in etcd|kube-apiserver|kube-controller-manager|kube-scheduler|kubelet) ;; *) continue ;; esac
        cmd=$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null) || continue
        case "$cmd" in *"$DIR/"*) echo "${p#/proc/}" ;; esac
    done
}

# daemon LOG CMD...: runs CMD in the background in a session of its own,
# output to LOG, with no descriptor but 0-2 (a lock that a caller holds,
# such as `flock /tmp/fiber-engines.lock`, must not stay held by a daemon
# for as long as it runs).  $! is its pid.
daemon() {
    local logf=$1
    shift
    (
        for fd in /proc/self/fd/*; do
            fd=${fd##*/}
            [ "$fd" -gt 2 ] 2>/dev/null && eval "exec $fd>&-"
        done
        exec setsid nohup "$@" </dev/null >"$logf" 2>&1
    ) &
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

admin_token() { cat "$DIR/admin.token"; }

readyz() {
    [ -f "$DIR/ca.crt" ] && [ -f "$DIR/admin.token" ] || return 1
    local out
    out=$(curl -sS --max-time 5 --cacert "$DIR/ca.crt" -H "Authorization: Bearer $(admin_token)" \
        "$SERVER/readyz" 2>/dev/null) || return 1
    [ "$out" = ok ]
}

# api METHOD PATH [JSON]: admin REST call; prints body, returns HTTP code in $HTTP_CODE
api() {
    local method=$1 path=$2 data=${3:-} resp
    local args=(-sS --max-time 20 --cacert "$DIR/ca.crt" -H "Authorization: Bearer $(admin_token)"
        -H 'Accept: application/json' -X "$method" -w '\n%{http_code}')
    [ -n "$data" ] && args+=(-H 'Content-Type: application/json' --data-binary "$data")
    resp=$(curl "${args[@]}" "$SERVER$path") || die "curl $method $path failed"
    HTTP_CODE=${resp##*$'\n'}
    API_BODY=${resp%$'\n'*}
}

# ---------------------------------------------------------------- start ----

gen_pki() {
    mkdir -p "$DIR"
    chmod 700 "$DIR"
    command -v openssl >/dev/null || apt_install openssl
    if [ ! -s "$DIR/ca.crt" ] || [ ! -s "$DIR/ca.key" ]; then
        log "generating CA"
        openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 3650 \
            -keyout "$DIR/ca.key" -out "$DIR/ca.crt" -subj "/CN=fiber-k8s-local-ca" \
            -addext "basicConstraints=critical,CA:TRUE" \
            -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" 2>/dev/null \
            || die "openssl: CA generation failed"
        rm -f "$DIR/apiserver.crt"
    fi
    if [ ! -s "$DIR/apiserver.crt" ] || [ ! -s "$DIR/apiserver.key" ]; then
        log "generating serving certificate"
        openssl req -newkey rsa:2048 -nodes -sha256 -keyout "$DIR/apiserver.key" \
            -out "$DIR/apiserver.csr" -subj "/CN=kubernetes" 2>/dev/null \
            || die "openssl: serving key/CSR failed"
        cat >"$DIR/apiserver.ext" <<'EOF'
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc
EOF
        openssl x509 -req -sha256 -days 3650 -in "$DIR/apiserver.csr" -CA "$DIR/ca.crt" \
            -CAkey "$DIR/ca.key" -CAcreateserial -out "$DIR/apiserver.crt" \
            -extfile "$DIR/apiserver.ext" 2>/dev/null || die "openssl: signing serving cert failed"
        rm -f "$DIR/apiserver.csr" "$DIR/apiserver.ext"
    fi
    if [ ! -s "$DIR/sa.key" ] || [ ! -s "$DIR/sa.pub" ]; then
        log "generating service-account key pair"
        openssl genrsa -out "$DIR/sa.key" 2048 2>/dev/null || die "openssl: sa key failed"
        openssl rsa -in "$DIR/sa.key" -pubout -out "$DIR/sa.pub" 2>/dev/null || die "openssl: sa pub failed"
    fi
    if [ ! -s "$DIR/admin.token" ] || [ ! -s "$DIR/fiber-test.token" ] || [ ! -s "$DIR/node.token" ]; then
        log "generating tokens"
        (umask 077
         openssl rand -hex 24 >"$DIR/admin.token"
         openssl rand -hex 24 >"$DIR/fiber-test.token"
         openssl rand -hex 24 >"$DIR/node.token")
    fi
    chmod 600 "$DIR"/*.key "$DIR/admin.token" "$DIR/fiber-test.token" "$DIR/node.token"
    # token,user,uid[,"group1,group2"]: the node's identity is the one the
    # Node authorizer knows (system:node:NAME in group system:nodes).
    (umask 077
     printf '%s,admin,fiber-admin-uid,"system:masters"\n%s,fiber,fiber-uid\n%s,system:node:%s,fiber-node-uid,"system:nodes"\n' \
        "$(cat "$DIR/admin.token")" "$(cat "$DIR/fiber-test.token")" \
        "$(cat "$DIR/node.token")" "$NODE_NAME" >"$DIR/tokens.csv")
    if [ ! -s "$DIR/kubelet-client.crt" ] || [ ! -s "$DIR/kubelet-client.key" ]; then
        # The API server's client certificate towards the kubelet (pods/log,
        # exec): the kubelet accepts only certificates of this CA.
        log "generating the API server's kubelet client certificate"
        openssl req -newkey rsa:2048 -nodes -sha256 -keyout "$DIR/kubelet-client.key" \
            -out "$DIR/kubelet-client.csr" -subj "/O=system:masters/CN=kube-apiserver-kubelet-client" 2>/dev/null \
            || die "openssl: kubelet client key/CSR failed"
        printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n' \
            >"$DIR/kubelet-client.ext"
        openssl x509 -req -sha256 -days 3650 -in "$DIR/kubelet-client.csr" -CA "$DIR/ca.crt" \
            -CAkey "$DIR/ca.key" -CAcreateserial -out "$DIR/kubelet-client.crt" \
            -extfile "$DIR/kubelet-client.ext" 2>/dev/null || die "openssl: signing kubelet client cert failed"
        rm -f "$DIR/kubelet-client.csr" "$DIR/kubelet-client.ext"
        chmod 600 "$DIR/kubelet-client.key"
    fi
}

start_etcd() {
    if our_pid etcd >/dev/null; then return 0; fi
    command -v etcd >/dev/null || apt_install etcd-server
    command -v etcd >/dev/null || die "etcd not found (Debian package etcd-server)"
    local p
    for p in "$ETCD_PORT" "$ETCD_PEER_PORT"; do
        port_in_use "$p" && die "port 127.0.0.1:$p is already in use by something else (set K8S_LOCAL_ETCD_PORT)"
    done
    mkdir -p "$DIR/etcd" "$DIR/logs" "$DIR/run"
    chmod 700 "$DIR/etcd"
    log "starting etcd on 127.0.0.1:$ETCD_PORT"
    daemon "$DIR/logs/etcd.log" etcd --name fiber-k8s-local --data-dir "$DIR/etcd" \
        --listen-client-urls "http://127.0.0.1:$ETCD_PORT" \
        --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
        --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
        --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
        --initial-cluster "fiber-k8s-local=http://127.0.0.1:$ETCD_PEER_PORT" \
        --initial-cluster-state new --initial-cluster-token fiber-k8s-local \
        --logger zap --log-outputs stderr --quota-backend-bytes 1073741824
    echo $! >"$(pidfile etcd)"
    for _ in $(seq 1 60); do
        if curl -s --max-time 2 "http://127.0.0.1:$ETCD_PORT/health" 2>/dev/null | grep -q '"health":"true"'; then
            return 0
        fi
        launched_alive etcd || { tail -n 30 "$DIR/logs/etcd.log" >&2; die "etcd exited (log: $DIR/logs/etcd.log)"; }
        sleep 0.5
    done
    tail -n 30 "$DIR/logs/etcd.log" >&2
    die "etcd not healthy after 30 s (log: $DIR/logs/etcd.log)"
}

start_apiserver() {
    local pid
    if pid=$(our_pid kube-apiserver); then
        readyz && return 0
        # running but not ready: give it the usual time before restarting
        wait_ready && return 0
        log "kube-apiserver (pid $pid) not ready; restarting it"
        stop_one kube-apiserver
    fi
    port_in_use "$PORT" && die "port 127.0.0.1:$PORT is already in use by something else (set K8S_LOCAL_PORT)"
    mkdir -p "$DIR/logs" "$DIR/run"
    log "starting kube-apiserver on $SERVER"
    daemon "$DIR/logs/kube-apiserver.log" "$APISERVER_BIN" \
        --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
        --etcd-prefix=/registry \
        --bind-address=127.0.0.1 --advertise-address=127.0.0.1 \
        --secure-port="$PORT" --insecure-port=0 \
        --cert-dir="$DIR/cert-dir" \
        --tls-cert-file="$DIR/apiserver.crt" --tls-private-key-file="$DIR/apiserver.key" \
        --client-ca-file="$DIR/ca.crt" \
        --token-auth-file="$DIR/tokens.csv" \
        --authorization-mode=Node,RBAC \
        --service-account-key-file="$DIR/sa.pub" \
        --service-account-signing-key-file="$DIR/sa.key" \
        --service-account-issuer=https://kubernetes.default.svc \
        --service-cluster-ip-range=10.96.0.0/24 \
        --allow-privileged=true \
        --kubelet-client-certificate="$DIR/kubelet-client.crt" \
        --kubelet-client-key="$DIR/kubelet-client.key" \
        --kubelet-preferred-address-types=InternalIP \
        --enable-admission-plugins=NamespaceLifecycle,LimitRanger,ServiceAccount,DefaultTolerationSeconds,Priority,ResourceQuota,NodeRestriction \
        --disable-admission-plugins=StorageObjectInUseProtection \
        --profiling=false \
        --v=1
    echo $! >"$(pidfile kube-apiserver)"
    wait_ready || {
        log "---- tail of $DIR/logs/kube-apiserver.log ----"; tail -n 40 "$DIR/logs/kube-apiserver.log" >&2
        log "---- tail of $DIR/logs/etcd.log ----"; tail -n 10 "$DIR/logs/etcd.log" >&2
        die "kube-apiserver not ready after ${READY_TIMEOUT} s"
    }
}

wait_ready() {
    local end=$((SECONDS + READY_TIMEOUT))
    while [ $SECONDS -lt $end ]; do
        readyz && return 0
        launched_alive kube-apiserver || { log "kube-apiserver exited"; return 1; }
        sleep 1
    done
    return 1
}

# ensure METHOD-for-create PATH-collection NAME JSON: create, or replace if it exists
ensure_obj() {
    local coll=$1 name=$2 json=$3 replace=$4
    api POST "$coll" "$json"
    case "$HTTP_CODE" in
        201|200) return 0 ;;
        409)
            [ "$replace" = yes ] || return 0
            api PUT "$coll/$name" "$json"
            case "$HTTP_CODE" in 200|201) return 0 ;; esac ;;
    esac
    die "creating $coll/$name failed: HTTP $HTTP_CODE: $API_BODY"
}

bootstrap() {
    local ns
    for ns in "$NAMESPACE" "$FORBIDDEN_NAMESPACE"; do
        ensure_obj /api/v1/namespaces "$ns" \
            "{\"apiVersion\":\"v1\",\"kind\":\"Namespace\",\"metadata\":{\"name\":\"$ns\"}}" no
    done
    local verbs='["get","list","watch","create","update","patch","delete","deletecollection"]'
    ensure_obj "/apis/rbac.authorization.k8s.io/v1/namespaces/$NAMESPACE/roles" fiber-test "{
      \"apiVersion\":\"rbac.authorization.k8s.io/v1\",\"kind\":\"Role\",
      \"metadata\":{\"name\":\"fiber-test\",\"namespace\":\"$NAMESPACE\"},
      \"rules\":[
        {\"apiGroups\":[\"\"],\"resources\":[\"pods\",\"pods/log\",\"pods/status\",\"secrets\",\"persistentvolumeclaims\",\"events\"],\"verbs\":$verbs},
        {\"apiGroups\":[\"batch\"],\"resources\":[\"jobs\"],\"verbs\":$verbs},
        {\"apiGroups\":[\"events.k8s.io\"],\"resources\":[\"events\"],\"verbs\":$verbs}]}" yes
    ensure_obj "/apis/rbac.authorization.k8s.io/v1/namespaces/$NAMESPACE/rolebindings" fiber-test "{
      \"apiVersion\":\"rbac.authorization.k8s.io/v1\",\"kind\":\"RoleBinding\",
      \"metadata\":{\"name\":\"fiber-test\",\"namespace\":\"$NAMESPACE\"},
      \"roleRef\":{\"apiGroup\":\"rbac.authorization.k8s.io\",\"kind\":\"Role\",\"name\":\"fiber-test\"},
      \"subjects\":[{\"apiGroup\":\"rbac.authorization.k8s.io\",\"kind\":\"User\",\"name\":\"fiber\"},
                    {\"kind\":\"ServiceAccount\",\"name\":\"default\",\"namespace\":\"$NAMESPACE\"}]}" yes
}

# ----------------------------------------------------------------- node ----
#
# The control-plane controllers and the one node: kube-controller-manager
# (garbage collector, service-account tokens, node lifecycle, ...),
# kube-scheduler, and a kubelet that runs pods as containers of the Docker
# Engine of this host (its built-in dockershim), each pod with host
# networking.  They authenticate with bearer tokens through kubeconfig
# files: the controller-manager and the scheduler as admin, the kubelet as
# system:node:$NODE_NAME.

# kubeconfig NAME TOKEN_FILE: writes $DIR/NAME.kubeconfig.
kubeconfig() {
    (umask 077
     cat >"$DIR/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: fiber-k8s-local
  cluster:
    server: $SERVER
    certificate-authority: $DIR/ca.crt
users:
- name: $1
  user:
    token: $(cat "$2")
contexts:
- name: $1
  context:
    cluster: fiber-k8s-local
    user: $1
current-context: $1
EOF
    )
}

# start_daemon NAME ARGS...: starts $CACHE/bin/NAME in the background
# (log $DIR/logs/NAME.log, pid file), unless ours already runs.
start_daemon() {
    local name=$1
    shift
    our_pid "$name" >/dev/null && return 0
    mkdir -p "$DIR/logs" "$DIR/run"
    log "starting $name"
    daemon "$DIR/logs/$name.log" "$CACHE/bin/$name" "$@"
    echo $! >"$(pidfile "$name")"
}

start_controllers() {
    kubeconfig controller-manager "$DIR/admin.token"
    kubeconfig scheduler "$DIR/admin.token"
    start_daemon kube-controller-manager \
        --kubeconfig="$DIR/controller-manager.kubeconfig" \
        --leader-elect=false --port=0 --secure-port=0 \
        --use-service-account-credentials=false \
        --service-account-private-key-file="$DIR/sa.key" \
        --root-ca-file="$DIR/ca.crt" \
        --cluster-name=fiber-k8s-local \
        --v=1
    start_daemon kube-scheduler \
        --kubeconfig="$DIR/scheduler.kubeconfig" \
        --leader-elect=false --port=0 --secure-port=0 \
        --v=1
}

# The pause image: the static program of scripts/k8s-pause.c, the only
# file of an image FROM scratch (docker import of a one-file tar).
ensure_pause_image() {
    docker image inspect "$PAUSE_IMAGE" >/dev/null 2>&1 && return 0
    command -v cc >/dev/null || die "cc not found (the pause program is built with it)"
    local src tmp
    src=$(cd "$(dirname "$0")" && pwd)/k8s-pause.c
    [ -f "$src" ] || die "$src is missing"
    tmp=$(mktemp -d)
    cc -static -O2 -o "$tmp/pause" "$src" || { rm -rf "$tmp"; die "building the pause program failed (static libc: libc6-dev)"; }
    log "importing $PAUSE_IMAGE (FROM scratch: /pause, $(stat -c %s "$tmp/pause") bytes)"
    tar -C "$tmp" -c pause | docker import -c 'ENTRYPOINT ["/pause"]' - "$PAUSE_IMAGE" >/dev/null \
        || { rm -rf "$tmp"; die "docker import of $PAUSE_IMAGE failed"; }
    rm -rf "$tmp"
}

# Pods reach the API server at the in-cluster address the kubelet gives
# them (KUBERNETES_SERVICE_HOST/PORT: the "kubernetes" Service,
# 10.96.0.1:443).  There is no kube-proxy: one iptables rule sends that
# address to the API server, as kube-proxy's rules would.
SERVICE_RULE="-d 10.96.0.1/32 -p tcp --dport 443 -j DNAT --to-destination 127.0.0.1:$PORT -m comment --comment fiber-k8s-local"

add_service_rule() {
    command -v iptables >/dev/null || die "iptables not found (the kubernetes Service address needs one NAT rule)"
    # shellcheck disable=SC2086
    iptables -t nat -C OUTPUT $SERVICE_RULE 2>/dev/null || iptables -t nat -A OUTPUT $SERVICE_RULE \
        || die "iptables: cannot add the NAT rule for 10.96.0.1:443"
}

del_service_rule() {
    command -v iptables >/dev/null || return 0
    # shellcheck disable=SC2086
    while iptables -t nat -C OUTPUT $SERVICE_RULE 2>/dev/null; do
        iptables -t nat -D OUTPUT $SERVICE_RULE || break
    done
}

start_kubelet() {
    [ -S /var/run/docker.sock ] || die "no Docker Engine at /var/run/docker.sock: the kubelet runs pods as its containers"
    command -v docker >/dev/null || die "the docker command is needed (pause image import)"
    command -v conntrack >/dev/null || apt_install conntrack
    ensure_pause_image
    add_service_rule
    kubeconfig kubelet "$DIR/node.token"
    mkdir -p "$DIR/kubelet" "$DIR/kubelet-certs"
    # The node's address: the kubelet refuses a loopback one.  Pods with
    # host networking have it as their IP; the API server reaches the
    # kubelet there (pods/log), with a client certificate of our CA.
    local node_ip
    node_ip=$(ip -4 route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p')
    [ -n "$node_ip" ] || node_ip=$(hostname -I 2>/dev/null | awk '{print $1}')
    [ -n "$node_ip" ] || die "cannot find this host's address (ip route get) for the node"
    # The OOM scores: see patch_oom_constants (and --oom-score-adj=0 for the
    # kubelet itself).  cgroup v1 with the cgroupfs driver, as Docker here.
    start_daemon kubelet \
        --kubeconfig="$DIR/kubelet.kubeconfig" \
        --hostname-override="$NODE_NAME" --node-ip="$node_ip" \
        --address="$node_ip" --port=10250 --read-only-port=0 --healthz-port=0 \
        --anonymous-auth=false --client-ca-file="$DIR/ca.crt" \
        --authentication-token-webhook=false --authorization-mode=AlwaysAllow \
        --cert-dir="$DIR/kubelet-certs" --root-dir="$DIR/kubelet" \
        --container-runtime=docker --docker-endpoint=unix:///var/run/docker.sock \
        --pod-infra-container-image="$PAUSE_IMAGE" \
        --cgroup-driver=cgroupfs --cgroups-per-qos=false --enforce-node-allocatable= \
        --fail-swap-on=false --oom-score-adj=0 \
        --image-gc-high-threshold=100 --image-gc-low-threshold=99 \
        '--eviction-hard=memory.available<20Mi' --max-pods=250 \
        --serialize-image-pulls=false --register-node=true \
        --node-status-update-frequency=4s \
        --v="${K8S_LOCAL_KUBELET_V:-1}"
}

# wait_node: until the node is Ready and the namespace's default service
# account has its token (pods that mount it are refused before that).
wait_node() {
    local end=$((SECONDS + READY_TIMEOUT)) ready="" sa=""
    while [ $SECONDS -lt $end ]; do
        api GET "/api/v1/nodes/$NODE_NAME"
        if [ "$HTTP_CODE" = 200 ] && jq -e '.status.conditions[]? | select(.type=="Ready" and .status=="True")' \
                <<<"$API_BODY" >/dev/null 2>&1; then
            ready=yes
        fi
        api GET "/api/v1/namespaces/$NAMESPACE/serviceaccounts/default"
        if [ "$HTTP_CODE" = 200 ] && jq -e '(.secrets // []) | length > 0' <<<"$API_BODY" >/dev/null 2>&1; then
            sa=yes
        fi
        [ -n "$ready" ] && [ -n "$sa" ] && return 0
        launched_alive kubelet || { tail -n 30 "$DIR/logs/kubelet.log" >&2; die "the kubelet exited (log: $DIR/logs/kubelet.log)"; }
        launched_alive kube-controller-manager || { tail -n 30 "$DIR/logs/kube-controller-manager.log" >&2; die "kube-controller-manager exited"; }
        sleep 1
    done
    [ -n "$ready" ] || { tail -n 30 "$DIR/logs/kubelet.log" >&2; die "node $NODE_NAME not Ready after ${READY_TIMEOUT} s (log: $DIR/logs/kubelet.log)"; }
    die "service account $NAMESPACE/default has no token after ${READY_TIMEOUT} s (log: $DIR/logs/kube-controller-manager.log)"
}

# remove_pod_containers: the containers the kubelet made (it leaves them
# running when it stops): every container with a pod namespace label.
remove_pod_containers() {
    command -v docker >/dev/null && [ -S /var/run/docker.sock ] || return 0
    local ids
    ids=$(docker ps -aq --filter label=io.kubernetes.pod.namespace 2>/dev/null) || return 0
    [ -n "$ids" ] || return 0
    log "removing $(echo "$ids" | wc -w) pod containers"
    # shellcheck disable=SC2086
    docker rm -f $ids >/dev/null 2>&1 || true
}

# The kubelet bind-mounts its root dir (and pods' volumes under it).
unmount_kubelet_dir() {
    [ -d "$DIR/kubelet" ] || return 0
    local m
    for m in $(awk -v d="$DIR/kubelet" '$5 == d || index($5, d "/") == 1 {print $5}' /proc/self/mountinfo | sort -r); do
        umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done
}


do_start() {
    command -v curl >/dev/null || apt_install curl
    [ -x "$APISERVER_BIN" ] || do_build
    progress_start k8s-local 7
    progress_stage 1 "certificates and tokens"
    gen_pki
    command -v jq >/dev/null || apt_install jq
    progress_stage 2 "etcd"
    start_etcd
    progress_stage 3 "kube-apiserver"
    progress_run "waiting for kube-apiserver" start_apiserver
    progress_stage 4 "namespaces and roles"
    bootstrap
    progress_stage 5 "kube-controller-manager and kube-scheduler"
    start_controllers
    progress_stage 6 "the kubelet"
    start_kubelet
    progress_stage 7 "waiting for node $NODE_NAME to be Ready"
    progress_run "waiting for node $NODE_NAME" wait_node
    log "ready: $SERVER, node $NODE_NAME (state: $DIR), $(progress_elapsed); eval \"\$($0 env)\""
}

# ----------------------------------------------------------------- stop ----

stop_pid() {
    local pid=$1 name=$2
    kill -TERM "$pid" 2>/dev/null || return 0
    for _ in $(seq 1 40); do
        [ -d "/proc/$pid" ] || return 0
        # a zombie counts as gone
        grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null && return 0
        sleep 0.25
    done
    log "$name (pid $pid) did not exit on TERM; killing"
    kill -KILL "$pid" 2>/dev/null || true
    sleep 0.2
}

stop_one() {
    local pid
    if pid=$(our_pid "$1"); then
        log "stopping $1 (pid $pid)"
        stop_pid "$pid" "$1"
    fi
    rm -f "$(pidfile "$1")"
}

do_stop() {
    local purge=no
    case "${1:-}" in
        --purge) purge=yes ;;
        "") ;;
        *) die "usage: $0 stop [--purge]" ;;
    esac
    stop_one kubelet
    remove_pod_containers
    unmount_kubelet_dir
    del_service_rule
    stop_one kube-scheduler
    stop_one kube-controller-manager
    stop_one kube-apiserver
    stop_one etcd
    local pid
    for pid in $(stray_pids); do
        log "stopping leftover process $pid: $(tr '\0' ' ' <"/proc/$pid/cmdline" | cut -c1-100)"
        stop_pid "$pid" leftover
    done
    if [ "$purge" = yes ]; then
        case "$DIR" in /|/tmp|/var|/home|/root|"") die "refusing to purge $DIR" ;; esac
        log "removing $DIR"
        rm -rf "$DIR"
    fi
    return 0
}

# ---------------------------------------------------------------- main -----

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
    build) do_build ;;
    progress-note) [ $# -eq 1 ] || die "usage: $0 progress-note LOG"; build_note "$1" ;;
    start) do_start ;;
    bootstrap)
        readyz || die "the cluster is not running; run '$0 start'"
        bootstrap ;;
    stop) do_stop "$@" ;;
    status)
        # The API server alone is not a cluster: a kubelet that died (its
        # parent shell killed) left every pod Pending behind a ready API.
        for d in kubelet kube-scheduler kube-controller-manager; do
            our_pid "$d" >/dev/null || { echo "not running: $d is down"; exit 1; }
        done
        if readyz; then echo "running: $SERVER"; exit 0; else echo "not running"; exit 1; fi ;;
    env)
        [ -s "$DIR/ca.crt" ] && [ -s "$DIR/fiber-test.token" ] \
            || die "no state in $DIR; run '$0 start' first"
        echo "export FIBER_K8S_SERVER=$SERVER"
        echo "export FIBER_K8S_CA_FILE=$DIR/ca.crt"
        echo "export FIBER_K8S_TOKEN_FILE=$DIR/fiber-test.token"
        echo "export K8S_LOCAL_ADMIN_TOKEN_FILE=$DIR/admin.token"
        echo "export FIBER_K8S_NAMESPACE=$NAMESPACE"
        ;;
    *)
        sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//' >&2
        exit 2 ;;
esac
