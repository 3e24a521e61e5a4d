# progress.sh -- progress lines for the long steps of the project's scripts
# (the first build of the Kubernetes binaries, the test clusters' first
# start, package installs), so that minutes of work are not minutes of
# silence.  Sourced by scripts/k8s-local.sh, scripts/slurm-local.sh and
# scripts/deps.sh (POSIX sh: dash and bash both read it).
#
#   progress_start PREFIX TOTAL
#       starts the clock of a piece of work of TOTAL stages; lines are
#       prefixed "PREFIX: ".
#   progress_stage N WHAT
#       prints "PREFIX: WHAT (N/TOTAL), 1m30s so far" on standard error.
#   progress_run WHAT CMD [ARGS...]
#       runs CMD in the foreground (its status is progress_run's) while a
#       watcher prints "PREFIX: WHAT, still running, 2m0s so far" every
#       FIBER_PROGRESS_INTERVAL seconds (default 30).  With
#       PROGRESS_NOTE_CMD set, the watcher evaluates it every second; its
#       output (one line) is appended to each heartbeat ("PREFIX: WHAT,
#       still running: <note>, 2m0s so far"), and when it changes a line
#       is printed at once ("PREFIX: WHAT: <note>, 40s so far").  The
#       watcher stops when CMD returns, or within a second of the calling
#       script's end.  CMD's own output is CMD's business: redirect it
#       inside CMD, not around progress_run, or the lines go there too.
#   progress_elapsed
#       prints the time since progress_start as "45s" or "3m7s".
#
# Times are whole seconds of the wall clock (date +%s).

progress_start() {
    _PG_PREFIX=$1
    _PG_TOTAL=$2
    _PG_T0=$(date +%s)
}

progress_elapsed() {
    local s
    s=$(( $(date +%s) - ${_PG_T0:-$(date +%s)} ))
    if [ "$s" -ge 60 ]; then
        echo "$((s / 60))m$((s % 60))s"
    else
        echo "${s}s"
    fi
}

progress_say() {
    echo "${_PG_PREFIX:-progress}: $*" >&2
}

progress_stage() {
    progress_say "$2 ($1/${_PG_TOTAL:-?}), $(progress_elapsed) so far"
}

# _progress_watch WHAT PARENT: the watcher, run in the background.  Its
# one-second sleep is a child it waits for, so that when it is told to
# stop (TERM) it takes the sleep with it at once: nothing of it outlives
# progress_run.
_progress_watch() {
    local what=$1 parent=$2 interval=${FIBER_PROGRESS_INTERVAL:-30}
    local last note="" now n nap=""
    trap '[ -z "$nap" ] || kill "$nap" 2>/dev/null; exit 0' TERM
    last=$(date +%s)
    while kill -0 "$parent" 2>/dev/null; do
        sleep 1 &
        nap=$!
        wait "$nap" || true
        nap=""
        now=$(date +%s)
        if [ -n "${PROGRESS_NOTE_CMD:-}" ]; then
            n=$(eval "$PROGRESS_NOTE_CMD" 2>/dev/null | tail -n 1) || n=""
            if [ -n "$n" ] && [ "$n" != "$note" ]; then
                note=$n
                progress_say "$what: $note, $(progress_elapsed) so far"
                last=$now
                continue
            fi
        fi
        if [ $((now - last)) -ge "$interval" ]; then
            progress_say "$what, still running${note:+: $note}, $(progress_elapsed) so far"
            last=$now
        fi
    done
}

progress_run() {
    local what=$1 watcher rc=0
    shift
    [ -n "${_PG_T0:-}" ] || progress_start progress 1
    # $$ is the script's pid in every subshell, so the watcher also ends
    # when the script is killed in the middle of CMD.  It keeps standard
    # error only: no lock or pipe of the script's stays open through it.
    _progress_watch "$what" $$ </dev/null >/dev/null 3>&- 4>&- 5>&- 6>&- 7>&- 8>&- 9>&- &
    watcher=$!
    "$@" || rc=$?
    kill "$watcher" 2>/dev/null || true
    wait "$watcher" 2>/dev/null || true
    return "$rc"
}
