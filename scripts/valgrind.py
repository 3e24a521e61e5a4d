#!/usr/bin/env python3
"""Runs ctest's cases under valgrind memcheck (`make valgrind`).

    scripts/valgrind.py BUILD_DIR [REGEX]

Each case's command (as `ctest --show-only=json-v1` lists it, with its
environment and working directory) runs under

    valgrind --trace-children=yes --leak-check=full
             --errors-for-leak-kinds=definite,indirect --error-exitcode=97

so a fiber child started by the case (a process's target, a pool worker,
a manager: the same test program run again by posix_spawn) is checked as
well as the master.  Children must be traced: under valgrind the master's
/proc/self/exe is valgrind's own tool, so the local backend then starts
children by the program's path (src/backend/local/local.c), which valgrind
follows.  Every process writes its own log
(BUILD_DIR/valgrind/<case>.pid-<pid>.log); a case fails if it fails, or times out, or if any of its processes
reports an error (invalid reads and writes, uninitialised values, a
definitely or indirectly lost block) -- whatever exit code the master saw.
A case passes by ctest's own rules (PASS_REGULAR_EXPRESSION,
FAIL_REGULAR_EXPRESSION, WILL_FAIL; else exit code 0) and a clean log.

REGEX (or VALGRIND_TESTS) selects cases by name, as `ctest -R` does; the
default is every case.  Cases are left out (see SKIP) that cannot run under
valgrind: they need a docker engine or a cluster, build and install other
programs, or train for minutes.  Timeouts are the cases' own TIMEOUT times
VALGRIND_TIMEOUT_SCALE (default 20).  VALGRIND_JOBS (default 2) cases run at
once.  A case that exits 77 ("SKIP: why", tests/harness.h) is reported as
skipped, with its reason, not as passed.  Exits 0 when every selected case
passed or skipped.
"""
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

# Cases never run under valgrind, and why.
SKIP = [
    (r"docker|\.slurm\.|\.k8s\.|\.kubernetes\.|^test_kubernetes\.|^k8s_|"
     r"^test_slurm\.|^slurm_",
     "needs a docker engine or a cluster (or its stand-in script); a "
     "container or cluster job does not run under valgrind"),
    (r"^install\.", "configures, builds and installs with cmake and cc"),
    (r"^python\.", "the Python suite runs the interpreter, not a fiber "
     "program built here (make test runs it; the extension's C is the "
     "library's, which the other cases check)"),
    (r"^es\.cartpole$|^soak\.", "trains or soaks for minutes natively"),
    (r"^es\.stop_resume$", "a shell script that runs the ES example four "
     "times with mktemp and cmp (which valgrind would check too, and whose "
     "own leaks it reports); es.selftest runs the ES code under valgrind"),
    (r"^docs\.|^scripts\.", "checks the docs and the scripts: runs python, "
     "the C compiler and sh (docs.config_keys's one fiber call, "
     "fiber_config_get, is covered by test_config)"),
    (r"^test_tool\.", "runs the fiber command, a shell and cmake"),
    (r"^test_local\.",
     "the local backend's own cases assert what valgrind changes: a pidfd "
     "for every job (valgrind 3.19 does not know pidfd_open; the runtime "
     "falls back to polling) and exec failures reported by posix_spawn "
     "(valgrind runs its child as a fork).  Every multi-process case runs "
     "the backend under valgrind anyway"),
    (r"^test_process\.children_exit_when_master_is_killed$",
     "execs /proc/self/exe itself, which under valgrind is valgrind's tool"),
    (r"^test_manager\.start_failure_is_clear$",
     "expects the exec failure's message; valgrind runs posix_spawn's child "
     "as a fork, so the job starts and then exits 127 instead"),
    (r"^test_process\.terminate_escalates_to_sigkill$|"
     r"^test_pool\.chaos_random_worker_killed_every_50ms$|"
     r"^test_pool\.results_of_slow_tasks_are_not_held_back$|"
     r"^test_pool\.imap_stream_survives_killed_workers$|"
     r"^test_pool\.imap_stream_unordered_flows_past_a_slow_input$",
     "timing: 20 to 50 times slower, a child misses a 300 ms or 50 ms "
     "window that the case depends on (or, with 40 fast tasks behind a "
     "1.5 s one, a 1.5 s window)"),
    (r"^test_pool\.imap_stream_lets_the_pool_choose_chunks$",
     "counts the messages the pool sends, which depends on how fast the "
     "workers answer next to the reader, and valgrind changes both.  The "
     "stream's code runs under valgrind in "
     "imap_stream_ordered_variable_inputs_within_its_window"),
]

OPTIONS = [
    "--trace-children=yes",
    "--leak-check=full",
    "--show-leak-kinds=definite,indirect",
    "--errors-for-leak-kinds=definite,indirect",
    "--error-exitcode=97",
    "--num-callers=30",
]


def skipped(name):
    for pattern, why in SKIP:
        if re.search(pattern, name):
            return why
    return None


def load_cases(build):
    out = subprocess.run(["ctest", "--show-only=json-v1"], cwd=build,
                         check=True, capture_output=True, text=True).stdout
    cases = []
    for t in json.loads(out)["tests"]:
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        cases.append({
            "name": t["name"],
            "command": t.get("command", []),
            "timeout": float(props.get("TIMEOUT", 1500)),
            "env": props.get("ENVIRONMENT", []),
            "cwd": props.get("WORKING_DIRECTORY", build),
            "labels": props.get("LABELS", []),
            "pass_re": props.get("PASS_REGULAR_EXPRESSION", []),
            "fail_re": props.get("FAIL_REGULAR_EXPRESSION", []),
            "will_fail": bool(props.get("WILL_FAIL", False)),
        })
    return cases


def errors_in(log):
    """The error summary of one process's log, or None if clean."""
    try:
        with open(log, errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    m = re.search(r"ERROR SUMMARY: (\d+) errors", text)
    if m and int(m.group(1)) > 0:
        return text
    return None


def passed(case, rc, output):
    """Whether the case passed by ctest's own rules: a case with
    PASS_REGULAR_EXPRESSION passes when its output matches one of them
    (whatever its exit code), FAIL_REGULAR_EXPRESSION fails it on a match,
    WILL_FAIL inverts the verdict.  A timeout always fails."""
    if not isinstance(rc, int):
        return False
    if case["pass_re"]:
        ok = any(re.search(r, output, re.M) for r in case["pass_re"])
    else:
        ok = rc == 0
    if any(re.search(r, output, re.M) for r in case["fail_re"]):
        ok = False
    return ok != case["will_fail"]


def run_case(case, logdir, scale):
    env = dict(os.environ)
    for kv in case["env"]:
        k, _, v = kv.partition("=")
        env[k] = v
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", case["name"])
    mine = re.compile(re.escape(safe) + r"\.pid-\d+\.log$")
    for old in os.listdir(logdir):
        if mine.match(old):
            os.unlink(os.path.join(logdir, old))
    log = os.path.join(logdir, safe + ".pid-%p.log")
    cmd = ["valgrind", "--log-file=" + log] + OPTIONS + case["command"]
    timeout = case["timeout"] * scale
    start = time.monotonic()
    # A session of its own, so that a case that times out is ended with
    # every process it started.
    p = subprocess.Popen(cmd, cwd=case["cwd"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, errors="replace", start_new_session=True)
    try:
        output, _ = p.communicate(timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        output, _ = p.communicate()
        rc = "timeout after %.0f s" % timeout
    took = time.monotonic() - start
    bad = []
    for name in sorted(os.listdir(logdir)):
        if mine.match(name):
            if errors_in(os.path.join(logdir, name)):
                bad.append(os.path.join(logdir, name))
    return case["name"], rc, took, output, bad, passed(case, rc, output)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    build = os.path.abspath(sys.argv[1])
    regex = sys.argv[2] if len(sys.argv) > 2 else os.environ.get(
        "VALGRIND_TESTS", "")
    scale = float(os.environ.get("VALGRIND_TIMEOUT_SCALE", "20"))
    jobs = int(os.environ.get("VALGRIND_JOBS", "2"))
    logdir = os.path.join(build, "valgrind")
    os.makedirs(logdir, exist_ok=True)

    chosen = []
    for case in load_cases(build):
        if regex and not re.search(regex, case["name"]):
            continue
        why = skipped(case["name"])
        if why:
            print("skip %s: %s" % (case["name"], why))
            continue
        chosen.append(case)
    if not chosen:
        sys.exit("valgrind: no case matches %r" % regex)
    print("valgrind: %d cases, %d at a time, timeouts x%g" %
          (len(chosen), jobs, scale), flush=True)

    start = time.monotonic()
    failed, skips = [], []
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for name, rc, took, output, bad, good in pool.map(
                lambda c: run_case(c, logdir, scale), chosen):
            ok = good and not bad
            if rc == 77 and not bad:
                why = [ln for ln in output.splitlines()
                       if ln.startswith("SKIP: ")]
                skips.append((name, why[0] if why else "SKIP: (no reason)"))
                print("%-6s %-70s %7.1f s" % ("skip", name, took), flush=True)
                continue
            print("%-6s %-70s %7.1f s" % ("ok" if ok else "FAIL", name, took),
                  flush=True)
            if not ok:
                failed.append(name)
                if not good:
                    print("  exit: %s\n%s" % (rc, output[-3000:]))
                for log in bad:
                    print("  errors in %s:\n%s" % (log, errors_in(log)[-6000:]))
    print("valgrind: %d of %d cases passed, %d skipped, in %.0f s" %
          (len(chosen) - len(failed) - len(skips), len(chosen), len(skips),
           time.monotonic() - start))
    for name, why in skips:
        print("  skipped %s: %s" % (name, why))
    if failed:
        print("failed:\n  " + "\n  ".join(failed))
        sys.exit(1)


if __name__ == "__main__":
    main()
