#!/bin/sh
# es_requeue.sh CASE -- the ES example as a Slurm master that the
# cluster stops and requeues, on the cluster scripts/slurm-local.sh runs
# on this host (run through tests/slurm/run.sh, which skips without it).
# ES_REQUEUE_TOOL and ES_BIN name the fiber command and the es program.
#
#   time_limit: `fiber run --backend slurm --signal 45 --requeue` with a
#     1-minute time limit (slurm_time_limit = 1, the workers' too): each
#     warning (SIGUSR1, 45 s before the limit) runs the stop callback,
#     which saves; the master ends with status 75 and its batch script
#     requeues it; it resumes from its checkpoint (FIBER_RESUMED), at
#     least twice;
#   scontrol_requeue: `fiber run --backend slurm --requeue`, and
#     `scontrol requeue` of the master mid-run (SIGTERM: the callback
#     saves), which Slurm itself requeues.
# The training has no iteration bound until it has been resumed as often
# as the case wants (es --after-resumes R:M: 2 for time_limit, 1 for
# scontrol_requeue), and ends M iterations after that resume, so how far
# it gets does not depend on the machine's speed: a fast machine once
# finished a fixed 5,000 iterations before the second time limit came.
# The run must end with the final checkpoint of an uninterrupted run of
# as many iterations with the same seed (run afterwards on the local
# backend: a run is a function of its seed and iteration, on any backend
# and number of workers), byte for byte.
#
# Slurm holds a requeued job (Reason=BeginTime) for the credential
# lifetime, cred_expire, before it may start again: the test cluster sets
# 30 s (scripts/slurm-local.sh; 120 s is Slurm's default).  The hold is
# not cut short: this script once moved the start time to now, and a job
# that Slurm then placed on the node it had just left was refused there
# ("Killing non-startable batch JobId=...: Job credential revoked") and
# ended FAILED with exit code 1 and no output.  The job is not touched.
set -eu
FIBER=$ES_REQUEUE_TOOL ES=$ES_BIN CASE=$1
unset ES_REQUEUE_TOOL
dir=$(mktemp -d "${TMPDIR:-/tmp}/fiber-es-requeue.XXXXXX")
trap 'rm -rf "$dir"' EXIT
unset FIBER_RESUMED SLURM_RESTART_COUNT 2>/dev/null || true
# On failure the masters' output and error files (every start of the job
# appends to them) go to ctest's output before the scratch folder goes.
fail() {
    echo "FAIL: $*" >&2
    for f in "${out:-}" "${err:-}"; do
        [ -n "$f" ] && [ -f "$f" ] && [ "$f" != "${shown:-}" ] || continue
        shown=$f
        echo "--- $f, last 80 lines:" >&2
        tail -80 "$f" >&2
    done
    exit 1
}

# RESUMES: the resumes after which the run ends, AFTER iterations past
# the last (a few seconds of training here, well under a minute under
# ASan, so the time limit's next warning does not come first).
case $CASE in
time_limit) RESUMES=2 ;;
scontrol_requeue) RESUMES=1 ;;
*) echo "usage: $0 time_limit|scontrol_requeue" >&2; exit 2 ;;
esac
AFTER=${AFTER:-50}
common="--env cartpole --target 1e9 --workers 2 --seed 11"
. "$(dirname "$0")/../es_reference.sh"

if [ "$CASE" = time_limit ]; then
    export FIBER_SLURM_TIME_LIMIT=1
    flags="--signal 45 --requeue"
else
    flags="--requeue"
fi
"$FIBER" run --backend slurm $flags --detach -- \
    "$ES" $common --after-resumes "$RESUMES:$AFTER" \
    --checkpoint "$dir/run.ckpt" >"$dir/run.txt" 2>&1 ||
    fail "fiber run: $(cat "$dir/run.txt")"
run=$(grep -o 'fiber-[0-9a-f]\{8\}' "$dir/run.txt" | head -1)
[ -n "$run" ] || fail "no run name in: $(cat "$dir/run.txt")"
id=$(squeue -h --name="$run-master" -o %i | head -1)
[ -n "$id" ] || fail "no master job for $run"
echo "run $run, master job $id"

field() { scontrol -o show job "$id" 2>/dev/null | tr ' ' '\n' |
          sed -n "s/^$1=//p" | head -1; }
out=$(field StdOut) err=$(field StdErr)
requeued_by_us=0
t0=$(date +%s)
while :; do
    state=$(field JobState)
    case $state in
    COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY)
        break ;;
    PENDING) ;;
    RUNNING)
        if [ "$CASE" = scontrol_requeue ] && [ $requeued_by_us -eq 0 ] &&
           grep -q '^iter  *[0-9]*[05]00 ' "$out" 2>/dev/null; then
            scontrol requeue "$id" || fail "scontrol requeue $id"
            requeued_by_us=1
            echo "scontrol requeue $id at $(grep '^iter' "$out" | tail -1 | cut -c1-10)"
        fi ;;
    esac
    [ $(($(date +%s) - t0)) -lt 1200 ] || fail "the run did not end in 20 minutes"
    sleep 1
done
restarts=$(field Restarts) code=$(field ExitCode)
cat "$out" "$err" >"$dir/all.txt" 2>/dev/null || true
echo "master job $id: $state, exit code $code, restarts $restarts, $(($(date +%s) - t0)) s"
grep -E '^(resumed|stopped|not solved)|stop requested|requeue' "$dir/all.txt" || true
[ "$code" = "1:0" ] || fail "the last master ended with $code, not 1 (iterations done): $(tail -5 "$out")"
if [ "$CASE" = time_limit ]; then
    [ "$restarts" -ge 2 ] || fail "requeued $restarts times, want 2 or more"
    [ "$(grep -c 'es: stop requested (signal 10): saved iteration' "$dir/all.txt")" -ge 2 ] ||
        fail "the warnings did not reach the stop callback: $(tail -5 "$out")"
else
    [ "$restarts" -eq 1 ] || fail "requeued $restarts times, want 1"
    grep -q 'es: stop requested (signal 15): saved iteration' "$dir/all.txt" ||
        fail "scontrol requeue did not reach the stop callback: $(tail -5 "$out")"
fi
[ "$(grep -c '^resumed cartpole from' "$out")" -eq "$restarts" ] ||
    fail "not every restart resumed from the checkpoint"
grep -q "^resume $restarts of $RESUMES: ending after iteration" "$out" ||
    fail "the last master did not bound its iterations after resume $restarts"
# The reference: uninterrupted for as many iterations, on the local backend.
es_reference_like "$dir/ref.ckpt" "$out"
cmp "$dir/ref.ckpt" "$dir/run.ckpt" || fail "the requeued run's final checkpoint differs"
echo "requeued $restarts times; final checkpoint at iteration $N identical to the uninterrupted run's"
