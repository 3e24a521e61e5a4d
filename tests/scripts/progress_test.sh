#!/bin/sh
# progress_test.sh -- scripts/progress.sh, the progress lines of the long
# steps (the first Kubernetes build, the test clusters' first start):
# stage lines, the heartbeat of a long step, notes that change, the
# command's status, a watcher that stops with its command, and the
# parsing of the Kubernetes build's log (scripts/k8s-local.sh
# progress-note).  ctest scripts.progress; a few seconds, with
# FIBER_PROGRESS_INTERVAL=1 instead of 30.
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
. "$top/scripts/progress.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0
check() { # check WHAT: the last command's status is 0
    if [ $? -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; failed=1; fi
}
FIBER_PROGRESS_INTERVAL=1
export FIBER_PROGRESS_INTERVAL

progress_start t 3
progress_stage 1 "first stage" 2>"$tmp/stage"
grep -qx 't: first stage (1/3), 0s so far' "$tmp/stage"
check "a stage line names the stage, N/TOTAL and the time so far: $(cat "$tmp/stage")"

progress_run "sleeping" sleep 3.5 2>"$tmp/beat"
check "progress_run returns the command's status 0"
n=$(grep -c '^t: sleeping, still running, [0-9]*s so far$' "$tmp/beat")
[ "$n" -ge 2 ] && [ "$n" -le 4 ]
check "a long step prints a heartbeat each interval: $n lines in 3.5 s at 1 s"

progress_run "failing" sh -c 'exit 3' 2>/dev/null
[ $? -eq 3 ]
check "progress_run returns the command's failure status (3)"

# The watcher stops with its command: nothing more after it returned.
progress_run "short" sleep 1.2 2>"$tmp/short"
before=$(wc -l <"$tmp/short")
sleep 2.5
after=$(wc -l <"$tmp/short")
[ "$before" = "$after" ]
check "no line after the command returned ($before then $after)"

# A note that changes is printed at once, and is part of the heartbeat.
: >"$tmp/notes"
( sleep 1.5; echo "step A" >>"$tmp/notes"; sleep 1.5; echo "step B" >>"$tmp/notes" ) &
PROGRESS_NOTE_CMD="cat '$tmp/notes'" progress_run "working" sleep 5 2>"$tmp/noted"
grep -q '^t: working: step A, [0-9]*s so far$' "$tmp/noted" &&
    grep -q '^t: working: step B, [0-9]*s so far$' "$tmp/noted" &&
    grep -q '^t: working, still running: step B, [0-9]*s so far$' "$tmp/noted"
check "notes: a line when one changes, and in the heartbeat"
[ "$(grep -c 'step A,' "$tmp/noted")" -eq 1 ]
check "an unchanged note is not repeated as a change"

# The Kubernetes build's log, as make writes it (the generators, then the
# four binaries in one go build).
cat >"$tmp/build.log" <<'LOG'
make[1]: Entering directory '/var/cache/fiber-k8s/src/kubernetes-1.20.5+really1.20.2'
+++ [1201 12:27:22] Building go targets for linux/amd64:
    ./vendor/k8s.io/code-generator/cmd/prerelease-lifecycle-gen
+++ [1201 12:27:26] Building go targets for linux/amd64:
    ./vendor/k8s.io/code-generator/cmd/deepcopy-gen
LOG
note=$("$top/scripts/k8s-local.sh" progress-note "$tmp/build.log")
[ "$note" = "code generator deepcopy-gen (go build 2)" ]
check "k8s build note while generating: '$note'"
cat >>"$tmp/build.log" <<'LOG'
make[2]: Leaving directory '/var/cache/fiber-k8s/src/kubernetes-1.20.5+really1.20.2'
+++ [1201 12:28:21] Building go targets for linux/amd64:
    cmd/kube-apiserver
    cmd/kubelet
    cmd/kube-scheduler
    cmd/kube-controller-manager
LOG
note=$("$top/scripts/k8s-local.sh" progress-note "$tmp/build.log")
[ "$note" = "compiling kube-apiserver kubelet kube-scheduler kube-controller-manager (one go build, the long part)" ]
check "k8s build note while compiling: '$note'"
: >"$tmp/empty.log"
note=$("$top/scripts/k8s-local.sh" progress-note "$tmp/empty.log")
[ -z "$note" ]
check "k8s build note before make printed anything: empty"

exit "$failed"
