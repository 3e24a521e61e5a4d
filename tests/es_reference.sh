# es_reference.sh -- sourced by tests/slurm/es_requeue.sh and
# tests/k8s/es_requeue.sh.  es_reference FILE: the uninterrupted run that
# a stopped and resumed one must match, on the local backend ("$ES"
# $common --checkpoint FILE, $common holding --iters $N; its output in
# FILE.out); it must end with
# status 1 after its $N iterations, else fail (the caller's) says why.
es_reference() {
    _status=0
    FIBER_BACKEND=local "$ES" $common --checkpoint "$1" >"$1.out" 2>&1 ||
        _status=$?
    [ $_status -eq 1 ] && grep -q "after $N iterations" "$1.out" ||
        fail "reference run: status $_status: $(tail -3 "$1.out")"
}

# es_reference_like FILE OUTPUT: the reference for a run whose last
# master's output is OUTPUT: N, the iterations of its "not solved: ...
# after N iterations" line (a run with es --after-resumes ends where its
# last life got to), then es_reference FILE with --iters N added to
# $common.
es_reference_like() {
    N=$(sed -n 's/^not solved: .* after \([0-9][0-9]*\) iterations.*/\1/p' "$2" | tail -1)
    [ -n "$N" ] || fail "the last master did not finish"
    common="$common --iters $N"
    es_reference "$1"
}
