# skip.sh -- sourced by the test scripts (tests/*/run.sh, cluster.sh,
# image.sh): how a case that cannot run says so.  The same convention as
# TH_SKIP/TH_SKIP_ENGINE in tests/harness.h:
#
#   skip REASON          prints "SKIP: REASON" and exits 77, which every
#                        test's SKIP_RETURN_CODE names (cmake/FiberSkip.cmake):
#                        ctest reports the case as skipped, never as passed.
#   skip_engine REASON   the same for a case that needs an engine (Docker,
#                        Slurm, Kubernetes); under CI (CI set to anything but
#                        "", "0" or "false") every engine must be there, so it
#                        prints FAIL and exits 1 instead.

skip() {
    echo "SKIP: $*"
    echo "SKIP: $*" >&2
    exit 77
}

under_ci() {
    case ${CI:-} in '' | 0 | false) return 1 ;; esac
    return 0
}

skip_engine() {
    if under_ci; then
        echo "FAIL: $*: an engine case cannot run under CI=$CI" >&2
        exit 1
    fi
    skip "$@"
}
