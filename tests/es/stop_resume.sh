#!/bin/sh
# stop_resume.sh ES_BINARY -- an ES run stopped by the cluster's signals and
# resumed ends bit for bit where an uninterrupted run of the same seed
# ends (docs/examples/es.md, "Stop and resume").
#
#   1. uninterrupted: N iterations, the final checkpoint is the reference;
#   2. in pieces: N/3 iterations, then --resume up to N on 3 workers, not
#      2 (results are combined in record order, whatever worker ran them);
#   4. (below) ended twice right after its stop callback, as a requeued
#      master ends, and restarted;
#   3. stopped twice: SIGTERM once iteration N/15 is reported (exit 3, the
#      stop callback and the loop save), restarted with FIBER_RESUMED=1;
#      SIGUSR1 (Slurm's warning) once iteration 2N/5 is reported, restarted
#      with FIBER_RESUMED=2; then it runs to N.
# Each final checkpoint (parameters, Adam's moments, observation
# statistics, iteration, the master's generator) must equal the
# reference byte for byte.  The target is out of reach, so every run
# updates the policy in every iteration.  Backend: FIBER_BACKEND (local).
#
# In 3 and 4 the lives that are signalled have no iteration bound (es
# --after-resumes 2:K): a fast machine cannot finish before the signal
# comes, and the last life ends K iterations after its resume; the
# reference for 3 and 4 is then an uninterrupted run of as many
# iterations.
set -eu
ES=$1
N=${N:-150}
dir=$(mktemp -d /tmp/fiber-es-resume.XXXXXX)
trap 'rm -rf "$dir"' EXIT
export FIBER_BACKEND=${FIBER_BACKEND:-local}
unset FIBER_RESUMED SLURM_RESTART_COUNT 2>/dev/null || true
common="--env cartpole --target 1e9 --workers 2 --seed 7"

fail() { echo "FAIL: $*" >&2; exit 1; }

# Runs es in the background with its output in $dir/$1.out; signals it
# with $3 once its output has a line for iteration $2; returns its status.
run_and_signal() {
    name=$1 at=$2 sig=$3
    shift 3
    "$ES" $common "$@" >"$dir/$name.out" 2>&1 &
    pid=$!
    pattern=$(printf 'iter %5d ' "$at")
    i=0
    while ! grep -q "^$pattern" "$dir/$name.out"; do
        kill -0 "$pid" 2>/dev/null || break
        i=$((i + 1))
        [ $i -lt 6000 ] || { kill -KILL "$pid"; fail "$name: no iteration $at"; }
        sleep 0.01
    done
    kill "-$sig" "$pid" 2>/dev/null || true
    status=0
    wait "$pid" || status=$?
    return $status
}

status=0
"$ES" $common --iters "$N" --checkpoint "$dir/ref.ckpt" >"$dir/ref.out" 2>&1 \
    || status=$?
[ $status -eq 1 ] || fail "uninterrupted run: status $status: $(tail -3 "$dir/ref.out")"
grep -q "after $N iterations" "$dir/ref.out" || fail "uninterrupted: $(tail -2 "$dir/ref.out")"

status=0
"$ES" $common --iters $((N / 3)) --checkpoint "$dir/pieces.ckpt" \
    >"$dir/p1.out" 2>&1 || status=$?
[ $status -eq 1 ] || fail "first piece: status $status"
status=0
"$ES" $common --iters "$N" --checkpoint "$dir/pieces.ckpt" --resume --workers 3 \
    >"$dir/p2.out" 2>&1 || status=$?
[ $status -eq 1 ] || fail "second piece: status $status: $(tail -3 "$dir/p2.out")"
grep -q "resumed cartpole from $dir/pieces.ckpt after iteration $((N / 3))" \
    "$dir/p2.out" || fail "second piece did not resume: $(head -3 "$dir/p2.out")"
cmp "$dir/ref.ckpt" "$dir/pieces.ckpt" || fail "run in pieces differs"

# ref_to FILE.out: an uninterrupted run of as many iterations as the run
# whose last output is FILE.out, saved to $dir/ref-<iterations>.ckpt;
# prints that path.
ref_to() {
    n=$(sed -n 's/^not solved: .* after \([0-9][0-9]*\) iterations.*/\1/p' "$1" | tail -1)
    [ -n "$n" ] || fail "$1: the last life did not finish: $(tail -2 "$1")"
    if [ ! -f "$dir/ref-$n.ckpt" ]; then
        _st=0
        "$ES" $common --iters "$n" --checkpoint "$dir/ref-$n.ckpt" \
            >"$dir/ref-$n.out" 2>&1 || _st=$?
        [ $_st -eq 1 ] || fail "reference of $n iterations: status $_st"
    fi
    echo "$dir/ref-$n.ckpt"
}
K=10 # a short last life: its reference run is as long as the whole run
lives="--after-resumes 2:$K"

status=0
run_and_signal s1 $((N / 15)) TERM $lives --checkpoint "$dir/stop.ckpt" \
    || status=$?
[ $status -eq 3 ] || fail "first stop: status $status, want 3: $(tail -3 "$dir/s1.out")"
# (The loop may save and end before the stop callback runs: the callback's
# own save is required in the requeue mode below, where nothing follows it.)
grep -q "^stopped by signal 15 after iteration" "$dir/s1.out" \
    || fail "first stop: $(tail -2 "$dir/s1.out")"
it1=$(sed -n 's/^stopped by signal 15 after iteration \([0-9]*\),.*/\1/p' "$dir/s1.out")

status=0
FIBER_RESUMED=1 run_and_signal s2 $((N * 2 / 5)) USR1 $lives \
    --checkpoint "$dir/stop.ckpt" || status=$?
[ $status -eq 3 ] || fail "second stop: status $status, want 3: $(tail -3 "$dir/s2.out")"
grep -q "resumed cartpole from $dir/stop.ckpt after iteration $it1" \
    "$dir/s2.out" || fail "the restart did not resume: $(head -3 "$dir/s2.out")"
grep -q "^stopped by signal 10 after iteration" "$dir/s2.out" \
    || fail "second stop: $(tail -2 "$dir/s2.out")"

status=0
FIBER_RESUMED=2 "$ES" $common $lives --checkpoint "$dir/stop.ckpt" \
    >"$dir/s3.out" 2>&1 || status=$?
[ $status -eq 1 ] || fail "last restart: status $status: $(tail -3 "$dir/s3.out")"
grep -q "^resume 2 of 2: ending after iteration" "$dir/s3.out" ||
    fail "last restart did not bound its iterations: $(head -4 "$dir/s3.out")"
ref=$(ref_to "$dir/s3.out")
cmp "$ref" "$dir/stop.ckpt" || fail "the stopped and resumed run differs"
# 4. as a master of `fiber run --requeue` (FIBER_BOOT_REQUEUE=1): it ends
#    with 75 as soon as the stop callback returns, in the middle of an
#    iteration, so the checkpoint must be the one the callback saved.
for at in $((N / 5)) $((N / 2)); do
    status=0
    FIBER_BOOT_REQUEUE=1 FIBER_RESUMED=$((at / (N / 5) - 1)) \
        run_and_signal "rq$at" "$at" USR1 $lives \
        --checkpoint "$dir/rq.ckpt" || status=$?
    [ $status -eq 75 ] || fail "requeue mode: status $status, want 75: $(tail -3 "$dir/rq$at.out")"
    grep -q "es: stop requested (signal 10): saved iteration" "$dir/rq$at.out" ||
        fail "requeue mode: the callback did not save: $(tail -3 "$dir/rq$at.out")"
done
status=0
FIBER_RESUMED=2 "$ES" $common $lives --checkpoint "$dir/rq.ckpt" \
    >"$dir/rq.out" 2>&1 || status=$?
[ $status -eq 1 ] || fail "requeue mode, last life: status $status"
ref=$(ref_to "$dir/rq.out")
cmp "$ref" "$dir/rq.ckpt" || fail "the run ended twice by its stop callback differs"

echo "stopped after iterations $it1 and $(sed -n 's/^stopped by signal 10 after iteration \([0-9]*\),.*/\1/p' "$dir/s2.out"), resumed twice: final checkpoint identical to an uninterrupted run's ($(wc -c <"$dir/ref.ckpt") bytes)"
