#!/bin/sh
# restart_test.sh -- scripts/slurm-local.sh starts cleanly after a cluster
# of the same state directory was killed without `stop` (a session or CI
# run cut off while jobs ran): the jobs slurmctld recovers from its state
# are cancelled before the nodes register, the nodes come up idle at once
# (a recovered running job held its node "mixed" for minutes: the start
# gave up after 60 s), no old job runs again, and job ids keep counting.
#
# A private two-node cluster in its own folder and on its own ports
# (SLURM_LOCAL_PORT 16917..16919), beside the test run's shared one.
# ctest slurm_local.restart_after_kill (needs Slurm's packages, which
# fixture slurm_cluster installs); about 30 s.
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
. "$top/tests/skip.sh"
command -v slurmctld >/dev/null 2>&1 && command -v sbatch >/dev/null 2>&1 ||
    skip_engine "Slurm is not installed"
script="$top/scripts/slurm-local.sh"
SLURM_LOCAL_DIR=$(mktemp -d /tmp/fiber-slurm-restart.XXXXXX)
chmod 755 "$SLURM_LOCAL_DIR"   # munged: others must traverse to its socket
SLURM_LOCAL_PORT=16917
SLURM_LOCAL_NODES=2
export SLURM_LOCAL_DIR SLURM_LOCAL_PORT SLURM_LOCAL_NODES
trap '"$script" stop --purge >/dev/null 2>&1; rm -rf "$SLURM_LOCAL_DIR"' EXIT
failed=0
check() { # check WHAT: the last command's status is 0
    if [ $? -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; failed=1; fi
}
die() { echo "FAIL $*"; exit 1; }

"$script" start >"$SLURM_LOCAL_DIR/start1.txt" 2>&1 ||
    { cat "$SLURM_LOCAL_DIR/start1.txt"; die "the first start"; }
eval "$("$script" env)"
cd "$SLURM_LOCAL_DIR" || exit 1
marker="sleep 1000.$$"   # what the jobs run: pgrep finds them by it
running=$(sbatch --parsable -o /dev/null --wrap "$marker") ||
    die "sbatch of a running job"
array=$(sbatch --parsable -o /dev/null -a 0-2 --wrap "$marker") ||
    die "sbatch of an array"
held=$(sbatch --parsable -o /dev/null --begin=now+10 --wrap "touch $SLURM_LOCAL_DIR/held-ran") ||
    die "sbatch of a held job"
# Until the jobs run and slurmctld has saved its state after the last
# submission (it does so within seconds, not at once).
t0=$(date +%s)
while :; do
    nrun=$(squeue -h -t running -o %i | wc -l)
    if [ "$nrun" -eq 4 ] && [ -n "$(find ctld/job_state -newer start1.txt -newermt "@$t0" 2>/dev/null)" ]; then
        break
    fi
    [ $(( $(date +%s) - t0 )) -lt 60 ] || die "4 running jobs and a saved state within 60 s ($nrun running)"
    sleep 0.5
done
echo "ok   jobs $running, ${array}_[0-2] running, $held held"

# Cut off: every daemon SIGKILLed, as when the machine's processes end.
for f in run/*.pid munge/munged.pid; do kill -KILL "$(cat "$f")" 2>/dev/null; done
sleep 0.5

t1=$(date +%s)
"$script" start >"$SLURM_LOCAL_DIR/start2.txt" 2>&1
check "the start after the kill succeeds"
took=$(( $(date +%s) - t1 ))
[ "$took" -le 30 ]
check "and takes at most 30 s: $took s"
grep -q "cancelling jobs left from an earlier start" start2.txt
check "it names the jobs it cancels: $(grep cancelling start2.txt)"
[ -z "$(squeue -h -o %i)" ]
check "no job of the earlier start is in the queue: [$(squeue -h -o %i | tr '\n' ' ')]"
! pgrep -fx "$marker" >/dev/null
check "no process of the earlier start's jobs is left"
new=$(sbatch --parsable -o /dev/null --wrap true)
check "a new job is accepted: $new"
[ "$new" -gt "$held" ]
check "job ids keep counting: $new after $held"
sleep 11
[ ! -e held-ran ]
check "the held job never ran after its hold ended"
[ $failed -eq 0 ] || { cat start2.txt; exit 1; }
