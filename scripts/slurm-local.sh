#!/bin/bash
# slurm-local.sh -- a throwaway Slurm cluster on this one host, for tests.
#
# Usage: scripts/slurm-local.sh start | stop [--purge] | status | env | install
#
#   start   Installs the Debian packages if missing (slurmctld slurmd
#           slurm-client munge; via sudo when not root), writes slurm.conf
#           and starts, without systemd, in the background: a private
#           munged, slurmctld and one slurmd per fake node (Slurm's
#           multiple-slurmd mode: every node is a slurmd on 127.0.0.1
#           with its own port).  Jobs recovered from the state of an
#           earlier start that was killed without `stop` are cancelled
#           before the nodes register (their masters are gone).  Waits
#           (<= 60 s) until every node is idle, then runs one tiny job
#           (named slurm-local-warmup) to the end.
#           If the cluster already runs it says so and exits 0.
#   stop    Cancels all jobs, stops the daemons and makes sure nothing of
#           this cluster is left running.  Exit 0 even if not running.
#           Keeps the state directory; --purge removes it as well.
#   status  Prints sinfo and exits 0 if the cluster runs, else exits 1.
#   env     Prints shell lines for clients:
#               eval "$(scripts/slurm-local.sh env)"; sbatch ...
#           Slurm commands find slurm.conf via SLURM_CONF, and slurm.conf's
#           AuthInfo=socket=... points them at the private munged.
#   install Only installs the missing packages (exit 1 if it cannot).
#
# Progress: start prints a line per stage with the time so far
# ("slurm-local: waiting for the 4 nodes to be idle (5/6), 3s so far"),
# and the package install, which may take minutes, a line every 30 s
# (FIBER_PROGRESS_INTERVAL; scripts/progress.sh).
#
# Everything lives under one directory, ${SLURM_LOCAL_DIR:-/tmp/fiber-slurm}:
#   slurm.conf            the cluster configuration
#   munge/                munge.key munge.socket munged.pid munged.log munged.seed
#   ctld/                 slurmctld StateSaveLocation (job ids survive restarts)
#   spool/nX/             SlurmdSpoolDir of node nX
#   log/                  slurmctld.log slurmd-nX.log (+ *.out: daemon stdio;
#                         *.old: the previous start's)
#   run/                  slurmctld.pid slurmd-nX.pid
#
# Defaults (environment overrides): SLURM_LOCAL_NODES=4 nodes n1..n4,
# SLURM_LOCAL_CPUS=16 CPUs per node (fake: more than the host has, which
# is fine for tests), SLURM_LOCAL_MEM=2048 MB per node,
# SLURM_LOCAL_PORT=16817: slurmctld port; node nX listens on PORT+X,
# SLURM_LOCAL_MIN_JOB_AGE=300: seconds finished jobs stay visible (MinJobAge;
# Slurm purges them up to a minute later still),
# SLURM_LOCAL_CRED_EXPIRE=30: the lifetime of a job's credential
# (AuthInfo cred_expire, Slurm's default 120), which is also how long a
# requeued job is held (Reason=BeginTime) before it may start again: a
# slurmd refuses to launch a job whose previous start it saw revoked
# within that time ("Job credential revoked"), so the hold must not be
# cut short.
# Partitions: debug (default) and other, both on all nodes.
#
# Daemons run as the invoking user (root on the test machines), so jobs
# run as whoever submits them.  Debian 12 ships Slurm 22.05.
set -eu
# shellcheck source=scripts/progress.sh
. "$(cd "$(dirname "$0")" && pwd)/progress.sh"

DIR=${SLURM_LOCAL_DIR:-/tmp/fiber-slurm}
NODES=${SLURM_LOCAL_NODES:-4}
CPUS=${SLURM_LOCAL_CPUS:-16}
MEM=${SLURM_LOCAL_MEM:-2048}
PORT=${SLURM_LOCAL_PORT:-16817}
MINAGE=${SLURM_LOCAL_MIN_JOB_AGE:-300}
CRED_EXPIRE=${SLURM_LOCAL_CRED_EXPIRE:-30}
CONF=$DIR/slurm.conf
MDIR=$DIR/munge
SOCK=$MDIR/munge.socket
# Marker put in the daemons' environment; slurmstepd inherits it, which is
# how stop finds step daemons left behind by a killed slurmd.
MARK="SLURM_LOCAL_CLUSTER=$DIR"
PKGS="slurmctld slurmd slurm-client munge"

die() { echo "slurm-local: $*" >&2; exit 1; }
say() { echo "slurm-local: $*" >&2; }

case "$DIR" in /*) ;; *) die "SLURM_LOCAL_DIR must be an absolute path: $DIR" ;; esac
case "$NODES$CPUS$MEM$PORT$MINAGE" in
  *[!0-9]*) die "SLURM_LOCAL_NODES/CPUS/MEM/PORT/MIN_JOB_AGE must be numbers" ;;
esac
[ "$NODES" -ge 1 ] || die "SLURM_LOCAL_NODES must be >= 1"

# Nodes: those of the running cluster's slurm.conf if there is one, so that
# status/stop do not depend on SLURM_LOCAL_NODES being the same as at start.
node_names() {
  if [ -s "$CONF" ] && [ "${1:-}" != new ]; then
    sed -n 's/^NodeName=\([^ ]*\) .*/\1/p' "$CONF"
  else
    i=1; while [ "$i" -le "$NODES" ]; do echo "n$i"; i=$((i + 1)); done
  fi
}

# --- processes ------------------------------------------------------------

# pid from a pid file, if that process is alive.
pid_of() {
  [ -s "$1" ] || return 1
  p=$(tr -dc '0-9' < "$1")
  [ -n "$p" ] && alive "$p" && { echo "$p"; return 0; }
  return 1
}

# A process exists and is not a zombie (PID 1 here may reap late).
alive() {
  kill -0 "$1" 2>/dev/null || return 1
  st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null) || return 1
  case "$st" in Z*|X*) return 1 ;; esac
  return 0
}

# Every process of this cluster: daemons whose command line names our
# conf/socket, and processes carrying our marker (slurmstepd and friends).
# Matched on fixed strings, and the daemons also on argv[0], so that a shell
# whose command line merely mentions the path is not taken for a daemon.
ours() {
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    { [ "$p" = "$$" ] || [ "$p" = "$PPID" ]; } && continue
    cmd=$(tr '\0' ' ' 2>/dev/null < "$d/cmdline") || continue
    [ -n "$cmd" ] || continue
    exe=${cmd%% *}; exe=${exe##*/}
    case "$exe" in
      slurmctld|slurmd) case "$cmd" in *" $CONF "*|*" $CONF") echo "$p"; continue ;; esac ;;
      munged) case "$cmd" in *"--socket=$SOCK"*) echo "$p"; continue ;; esac ;;
    esac
    if tr '\0' '\n' 2>/dev/null < "$d/environ" | grep -qxF "$MARK"; then echo "$p"; fi
  done
}

# All descendants of the given pids (job processes under a slurmstepd).
descendants() {
  todo="$*"; all=""
  while [ -n "${todo// /}" ]; do
    next=""
    for p in $todo; do
      next="$next $(cat /proc/"$p"/task/*/children 2>/dev/null | tr '\n' ' ')"
    done
    all="$all $next"; todo=$next
  done
  echo "$all"
}

# kill_wait SECONDS PID...: SIGTERM, wait, then SIGKILL what is left.
kill_wait() {
  t=$1; shift
  [ $# -gt 0 ] || return 0
  kill -TERM "$@" 2>/dev/null || true
  n=$((t * 10))
  while [ "$n" -gt 0 ]; do
    left=""
    for p in "$@"; do alive "$p" && left="$left $p"; done
    [ -z "$left" ] && return 0
    sleep 0.1; n=$((n - 1))
  done
  # shellcheck disable=SC2086
  kill -KILL $left 2>/dev/null || true
}

running() {
  pid_of "$MDIR/munged.pid" >/dev/null || return 1
  pid_of "$DIR/run/slurmctld.pid" >/dev/null || return 1
  for n in $(node_names); do pid_of "$DIR/run/slurmd-$n.pid" >/dev/null || return 1; done
  return 0
}

use_conf() { export SLURM_CONF="$CONF"; }

log_tails() {
  for f in "$MDIR/munged.log" "$DIR/log/slurmctld.log" "$DIR"/log/slurmd-*.log; do
    # A daemon that died before opening its log said why on stderr (.out).
    [ -s "$f" ] || f=${f%.log}.out
    [ -s "$f" ] || continue
    echo "----- tail $f" >&2
    tail -n 8 "$f" >&2
  done
}

# --- start ----------------------------------------------------------------

install_pkgs() {
  missing=""
  for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
      missing="$missing $p"
  done
  [ -z "$missing" ] && return 0
  say "installing missing packages:$missing"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 || die "need root or sudo to install:$missing"
    SUDO=sudo
  fi
  export DEBIAN_FRONTEND=noninteractive
  # Waits for the dpkg lock (10 min) and for the project's other scripts
  # (scripts/deps.sh, k8s-local.sh) instead of failing while they install.
  apt="$SUDO flock /var/lock/fiber-apt.lock apt-get -o DPkg::Lock::Timeout=600"
  [ -n "${_PG_T0:-}" ] || progress_start slurm-local 1
  progress_run "apt-get update" $apt update -qq || die "apt-get update failed"
  # shellcheck disable=SC2086
  progress_run "installing$missing" $apt install -y -qq --no-install-recommends $missing >/dev/null ||
    die "apt-get install failed:$missing"
}

write_conf() {
  user=$(id -un)
  tmp=$CONF.tmp
  cat > "$tmp" <<EOF
# Written by scripts/slurm-local.sh: a throwaway single-host test cluster.
ClusterName=fiber
SlurmctldHost=$(hostname -s)(127.0.0.1)
SlurmctldPort=$PORT
SlurmUser=$user
SlurmdUser=$user
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SOCK,cred_expire=$CRED_EXPIRE
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
MailProg=/bin/true
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$DIR/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
LaunchType=launch/slurm
SelectType=select/cons_tres
# CR_LLN: place jobs on the least loaded node (spread, do not pack n1).
SelectTypeParameters=CR_Core,CR_LLN
SchedulerType=sched/backfill
# batch_sched_delay=0: slurmctld schedules batch jobs in its once-a-second
# background loop (never at submit); the default 3 s delay would make a job
# wait 1-3 s before it starts.  sched_interval=5: the main loop that
# tests every pending job runs every 5 s (default 60), so a requeued job
# starts within seconds of its hold's end.
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,sched_interval=5
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# Nodes declare more CPUs than the host has: do not drain them for that.
SlurmdParameters=config_overrides
ReturnToService=2
# Finished jobs stay visible to scontrol/squeue for MinJobAge seconds.
MinJobAge=$MINAGE
KillWait=2
InactiveLimit=0
SlurmdTimeout=60
MessageTimeout=10
EOF
  i=1
  for n in $(node_names new); do
    echo "NodeName=$n NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((PORT + i)) CPUs=$CPUS RealMemory=$MEM State=UNKNOWN" >> "$tmp"
    i=$((i + 1))
  done
  cat >> "$tmp" <<EOF
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
PartitionName=other Nodes=ALL Default=NO MaxTime=INFINITE State=UP
EOF
  mv "$tmp" "$CONF"
  # An empty plugstack: keep /etc/slurm/plugstack.conf's SPANK plugins out.
  : > "$DIR/plugstack.conf"
}

# without_fds CMD...: runs CMD with descriptors 3-9 closed, so that a
# daemon never keeps a lock its caller holds (`flock
# /tmp/fiber-engines.lock scripts/slurm-local.sh start` would otherwise
# stay locked for as long as munged or slurmd runs).
close_fds() {
  for fd in 3 4 5 6 7 8 9; do eval "exec $fd>&-"; done
}

without_fds() {
  (
    close_fds
    exec "$@"
  )
}

start_munged() {
  command -v munged >/dev/null || die "munged not found (package munge)"
  if [ ! -s "$MDIR/munge.key" ]; then
    if command -v mungekey >/dev/null 2>&1; then
      mungekey --create --keyfile="$MDIR/munge.key" 2>/dev/null ||
        dd if=/dev/urandom of="$MDIR/munge.key" bs=1024 count=1 2>/dev/null
    else
      dd if=/dev/urandom of="$MDIR/munge.key" bs=1024 count=1 2>/dev/null
    fi
    chmod 600 "$MDIR/munge.key"
  fi
  rm -f "$SOCK" "$SOCK.lock" "$MDIR/munged.pid"
  # munged forks into the background itself and writes its pid file.
  without_fds env "$MARK" setsid munged --socket="$SOCK" --key-file="$MDIR/munge.key" \
      --pid-file="$MDIR/munged.pid" --log-file="$MDIR/munged.log" \
      --seed-file="$MDIR/munged.seed" --num-threads=4 \
      < /dev/null >> "$MDIR/munged.log" 2>&1 9>&- ||
    { log_tails; die "munged failed to start"; }
  n=50
  while ! { [ -S "$SOCK" ] && pid_of "$MDIR/munged.pid" >/dev/null; }; do
    n=$((n - 1)); [ "$n" -gt 0 ] || { log_tails; die "munged did not come up"; }
    sleep 0.1
  done
  echo ok | munge --socket="$SOCK" | unmunge --socket="$SOCK" >/dev/null 2>&1 ||
    { log_tails; die "munge self-test failed"; }
}

# spawn PIDFILE LOGNAME CMD...: a daemon in the foreground mode, detached from
# our stdio, session and job control; waits until it wrote its pid file.
spawn() {
  pf=$1; out=$2; shift 2
  rm -f "$pf"
  # A backgrounded subshell that execs: no shell of ours stays behind
  # holding the start/stop lock (or ctest's log) while the daemon runs.
  ( close_fds; exec env "$MARK" setsid "$@" ) < /dev/null >> "$DIR/log/$out.out" 2>&1 &
  child=$!
  n=100
  while ! pid_of "$pf" >/dev/null; do
    if ! kill -0 "$child" 2>/dev/null; then log_tails; die "$* exited at once"; fi
    n=$((n - 1)); [ "$n" -gt 0 ] || { log_tails; die "$* wrote no pid file $pf"; }
    sleep 0.1
  done
}

wait_idle() {
  use_conf
  t0=$(date +%s)
  while :; do
    states=$(sinfo -h -N -o '%T' 2>/dev/null | sort -u | tr '\n' ' ') || states=""
    [ "$states" = "idle " ] && [ "$(sinfo -h -N -o '%N' 2>/dev/null | sort -u | wc -l)" -eq "$NODES" ] && return 0
    if [ $(( $(date +%s) - t0 )) -ge 60 ]; then
      sinfo -N -l >&2 || true
      log_tails
      die "nodes not all idle after 60 s (states: ${states:-none})"
    fi
    sleep 0.2
  done
}

# Jobs that slurmctld recovered from its state directory belong to an
# earlier start of this cluster whose daemons were killed without `stop`
# (a session or CI run cut off): their masters are gone.  A job recovered
# as running would hold its node "mixed" for minutes, until slurmctld
# gives up on it (the node's new slurmd purges it at once but does not
# tell slurmctld), and a pending one would start a worker with no master.
# Cancel them all before the nodes register; job ids keep counting.
cancel_recovered() {
  ids=$(squeue -h -o %F 2>/dev/null | sort -un | tr '\n' ' ')
  [ -n "${ids// /}" ] || return 0
  say "cancelling jobs left from an earlier start: $ids"
  # shellcheck disable=SC2086
  scancel --full --quiet $ids 2>/dev/null || true
}

# Run one tiny job to the end: proves that jobs launch, and makes slurmctld
# read SchedulerParameters (it does so on its first scheduling pass, which
# comes up to 3 s after start; until then batch_sched_delay is 3 s).
warm_up() {
  id=$(cd "$DIR" && sbatch --parsable -J slurm-local-warmup -o /dev/null --wrap true 2>&1) ||
    { log_tails; die "test job not accepted: $id"; }
  n=150
  while :; do
    st=$(scontrol show job "$id" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
    case "$st" in
      COMPLETED) return 0 ;;
      FAILED|CANCELLED|TIMEOUT|NODE_FAIL|BOOT_FAIL|OUT_OF_MEMORY)
        scontrol show job "$id" >&2 || true; log_tails; die "test job $id ended $st" ;;
    esac
    n=$((n - 1)); [ "$n" -gt 0 ] || { log_tails; die "test job $id did not finish in 30 s (${st:-?})"; }
    sleep 0.2
  done
}

start_failed() {
  rc=$?
  [ "$rc" = 0 ] && return 0
  say "start failed; stopping what it started (logs stay in $DIR/log)"
  do_stop >/dev/null 2>&1 || true
  exit "$rc"
}

do_start() {
  if running; then
    say "already running ($CONF)"
    use_conf; sinfo
    return 0
  fi
  progress_start slurm-local 6
  progress_stage 1 "Slurm's packages (installed when missing)"
  install_pkgs
  # Half-running (a daemon died)?  Start over cleanly.
  [ -z "$(ours)" ] || { say "stopping leftovers of an earlier run"; do_stop >/dev/null 2>&1; }
  mkdir -p "$DIR" "$MDIR" "$DIR/ctld" "$DIR/log" "$DIR/run"
  chmod 755 "$MDIR"   # munged insists others may traverse its socket dir
  for n in $(node_names new); do mkdir -p "$DIR/spool/$n"; done
  # Fresh logs per start (the previous run's are kept as *.old).
  for f in "$DIR"/log/*.log "$DIR"/log/*.out "$MDIR/munged.log"; do
    if [ -f "$f" ]; then mv -f "$f" "$f.old"; fi
  done
  write_conf
  # A failed start leaves nothing running (its logs are kept).
  trap start_failed EXIT
  progress_stage 2 "munged"
  start_munged
  progress_stage 3 "slurmctld"
  spawn "$DIR/run/slurmctld.pid" slurmctld slurmctld -D -f "$CONF"
  use_conf
  n=100
  until scontrol ping 2>/dev/null | grep -q 'is UP'; do
    n=$((n - 1)); [ "$n" -gt 0 ] || { log_tails; die "slurmctld does not answer"; }
    sleep 0.1
  done
  cancel_recovered
  progress_stage 4 "$NODES slurmd"
  for n in $(node_names); do
    spawn "$DIR/run/slurmd-$n.pid" "slurmd-$n" slurmd -D -N "$n" -f "$CONF"
  done
  progress_stage 5 "waiting for the $NODES nodes to be idle"
  wait_idle
  progress_stage 6 "one test job, to the end"
  warm_up
  trap - EXIT
  say "running: $NODES nodes x $CPUS CPUs, slurmctld port $PORT, state in $DIR ($(progress_elapsed) to start)"
  say "clients: eval \"\$($0 env)\""
  sinfo
}

# --- stop -----------------------------------------------------------------

do_stop() {
  use_conf
  # Everything of ours now, to wait below until it is really gone.
  seen=$(ours | tr '\n' ' ')
  if pid_of "$DIR/run/slurmctld.pid" >/dev/null && [ -s "$CONF" ]; then
    scancel --full --quiet --user="$(id -un)" 2>/dev/null || true
    scancel --full --quiet 2>/dev/null || true   # root: every user's jobs
    # Let slurmd's reap the jobs (KillWait=2), at most ~10 s.
    n=50
    while [ -n "$(squeue -h -t running,completing,pending,configuring -o %i 2>/dev/null)" ] &&
          [ "$n" -gt 0 ]; do
      sleep 0.2; n=$((n - 1))
    done
  fi
  # Every daemon takes ~2 s to exit on SIGTERM: stop them all at once.
  pids=""
  for f in "$DIR"/run/slurmd-*.pid "$DIR/run/slurmctld.pid" "$MDIR/munged.pid"; do
    p=$(pid_of "$f") && pids="$pids $p"
  done
  # shellcheck disable=SC2086
  kill_wait 10 $pids
  # Make sure: anything still running of ours (a stray slurmstepd, its
  # jobs, a daemon whose pid file is gone) is killed.
  left=$(ours | tr '\n' ' ')
  if [ -n "${left// /}" ]; then
    # shellcheck disable=SC2086
    kids=$(descendants $left)
    # shellcheck disable=SC2086
    kill -KILL $left $kids 2>/dev/null || true
    sleep 0.2
  fi
  left=$(ours | tr '\n' ' ')
  [ -z "${left// /}" ] || die "could not stop pids: $left"
  # The daemons were reparented to PID 1, which may reap them a moment
  # later: wait (<= 5 s) until not even their zombies show in pgrep.
  n=50
  for p in $seen; do
    while [ -e "/proc/$p" ] && [ "$n" -gt 0 ]; do sleep 0.1; n=$((n - 1)); done
  done
  rm -f "$DIR"/run/*.pid "$MDIR/munged.pid" "$SOCK" "$SOCK.lock"
  if [ "${1:-}" = "--purge" ]; then
    rm -rf "$DIR"
    say "stopped; removed $DIR"
  else
    say "stopped (state kept in $DIR)"
  fi
}

# --- main -----------------------------------------------------------------

# start and stop of one state directory take turns (parallel test runs).
lock() {
  mkdir -p "$DIR" || die "cannot create $DIR"
  if command -v flock >/dev/null 2>&1; then
    exec 9>"$DIR/.lock"
    if ! flock -n 9; then
      say "waiting for another start or stop of $DIR (up to 180 s)"
      flock -w 180 9 || die "another start/stop of $DIR takes too long"
    fi
  fi
}

case "${1:-}" in
  start)  lock; do_start ;;
  stop)   shift
          case "${1:-}" in ""|--purge) ;; *) die "usage: $0 stop [--purge]" ;; esac
          [ ! -d "$DIR" ] || lock
          do_stop "${1:-}" ;;
  status)
    if running; then
      use_conf
      sinfo || exit 1
    else
      say "not running ($DIR)"; exit 1
    fi ;;
  install) install_pkgs ;;
  env)
    echo "export SLURM_CONF=$CONF"
    echo "export SLURM_LOCAL_DIR=$DIR" ;;
  *) echo "usage: $0 start | stop [--purge] | status | env | install" >&2; exit 2 ;;
esac
