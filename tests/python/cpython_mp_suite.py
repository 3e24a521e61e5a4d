"""CPython's own multiprocessing tests, run against fiber.

    build/venv/bin/python tests/python/cpython_mp_suite.py [-j N] [NAME...]

Lib/test/_test_multiprocessing.py (the interpreter's test package) builds
its "processes" test classes from a mixin whose attributes are
multiprocessing's Process, Pool, Pipe, Queue, Lock, ... This program puts
fiber's in their place (PYTHONPATH must reach fiber: the script adds the
checkout's python/ folder), lets the module install its test classes with
the "spawn" start method, and runs each test in a process of its own with
a time limit (a test that hangs is cut off and counted as such).

It prints each test's outcome, then a tally, and compares the failures
with EXPECTED below: each test there fails for a reason that is fiber's
design or the test's reliance on multiprocessing's insides, said next to
it. It exits 1 if a test outside EXPECTED fails (a regression, or a test
of a newer CPython), and names the tests in EXPECTED that now pass.

Not part of `make test`: it takes minutes, and the figures go to
docs/python.md ("CPython's multiprocessing tests").
"""
import argparse
import os
import subprocess
import sys
import time
import unittest
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.join(HERE, "..", "..", "python")

# The mixin's attributes that become fiber's (the rest stay
# multiprocessing's: the manager and thread variants are not run).
NAMES = ["Process", "Pool", "Pipe", "Queue", "JoinableQueue", "Lock",
         "RLock", "Semaphore", "BoundedSemaphore", "Condition", "Event",
         "Barrier", "Value", "Array", "RawValue", "RawArray",
         "current_process", "parent_process", "active_children",
         "set_executable"]

_INSIDES = "uses multiprocessing's insides"
_MP_OBJ = ("hands multiprocessing's own objects (heap buffers, locks, "
           "pipes) to a fiber job, which refuses them: they cannot reach "
           "another host")
_NESTED = "a job starting processes (only the master starts jobs)"
_NO_FD = "a fiber pipe end has no file descriptor (it may span hosts)"

EXPECTED = {
    # Bunch / _DummyList: multiprocessing.heap and multiprocessing.Lock
    "WithProcessesTestBarrier.test_abort": _MP_OBJ,
    "WithProcessesTestBarrier.test_abort_and_reset": _MP_OBJ,
    "WithProcessesTestBarrier.test_action": _MP_OBJ,
    "WithProcessesTestBarrier.test_barrier": _MP_OBJ,
    "WithProcessesTestBarrier.test_barrier_10": _MP_OBJ,
    "WithProcessesTestBarrier.test_default_timeout": _MP_OBJ,
    "WithProcessesTestBarrier.test_reset": _MP_OBJ,
    "WithProcessesTestBarrier.test_timeout": _MP_OBJ,
    "WithProcessesTestBarrier.test_wait_return": _MP_OBJ,
    "WithProcessesTestCondition.test_notify": _INSIDES + " (_sleeping_count)",
    "WithProcessesTestCondition.test_notify_all": _INSIDES + " (_sleeping_count)",
    "WithProcessesTestCondition.test_notify_n": _INSIDES + " (_sleeping_count)",
    "WithProcessesTestConnection.test_connection": _NO_FD,
    "WithProcessesTestConnection.test_fd_transfer": _NO_FD,
    "WithProcessesTestConnection.test_large_fd_transfer": _NO_FD,
    "WithProcessesTestConnection.test_missing_fd_transfer": _NO_FD,
    "WithProcessesTestLogging.test_level": _MP_OBJ + " (a multiprocessing.Pipe; the job's end is not the master's descriptor, and the test hangs)",
    "WithProcessesTestPicklingConnections.test_pickling": _INSIDES + " (multiprocessing.reduction's descriptor passing)",
    "WithProcessesTestPoll.test_boundaries": "the master reads a pipe end that a job used over a direct link (refused: the link was the job's)",
    "WithProcessesTestPool.test_make_pool": _INSIDES + " (Pool._pool)",
    "WithProcessesTestPool.test_map_unplicklable": "an argument that cannot be pickled raises fiber's PicklingError (naming the task), not the pickler's own exception",
    "WithProcessesTestProcess.test_kill": _INSIDES + " (multiprocessing.Process.kill on a fiber Process)",
    "WithProcessesTestProcess.test_terminate": _INSIDES + " (multiprocessing.Process.terminate on a fiber Process)",
    "WithProcessesTestProcess.test_parent_process": _NESTED,
    "WithProcessesTestProcess.test_recursion": _NESTED,
    "WithProcessesTestProcess.test_set_executable": "set_executable after the run's first job (fiber fixes the job command then)",
    "WithProcessesTestQueue.test_queue_feeder_donot_stop_onexc": "Queue.put pickles at once and raises there, where multiprocessing's feeder thread prints the error later",
    "WithProcessesTestSharedCTypes.test_sharedctypes": _MP_OBJ + " (multiprocessing.sharedctypes.Value)",
    "WithProcessesTestSharedCTypes.test_synchronize": _MP_OBJ + " (multiprocessing.sharedctypes.Value)",
}


def install(globs):
    """The test classes, with fiber's objects in the mixin."""
    sys.path.insert(0, os.path.abspath(PKG))
    import fiber
    import fiber.connection
    import test._test_multiprocessing as T
    for n in NAMES:
        v = getattr(fiber, n)
        setattr(T.ProcessesMixin, n, v if isinstance(v, type)
                else staticmethod(v))
    T.ProcessesMixin.connection = fiber.connection
    T.install_tests_in_module_dict(globs, "spawn", only_type="processes")


def test_names():
    globs = {"__name__": "cpython_mp_suite"}
    install(globs)
    names = []

    def walk(suite):
        for t in suite:
            if isinstance(t, unittest.TestSuite):
                walk(t)
            else:
                names.append(t.id().split(".", 1)[1])
    loader = unittest.defaultTestLoader
    for obj in globs.values():
        if isinstance(obj, type) and issubclass(obj, unittest.TestCase):
            walk(loader.loadTestsFromTestCase(obj))
    return sorted(names)


def run_one(name, timeout):
    t0 = time.monotonic()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.abspath(PKG)] + [p for p in [env.get("PYTHONPATH")] if p])
    try:
        r = subprocess.run([sys.executable, os.path.abspath(__file__),
                            "--one", name], capture_output=True, text=True,
                           timeout=timeout, env=env)
        outcome = "pass" if r.returncode == 0 else "fail"
        tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
    except subprocess.TimeoutExpired:
        outcome, tail = "hang", ["cut off after %d s" % timeout]
    return name, outcome, time.monotonic() - t0, tail


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-j", type=int, default=1, help="tests at once")
    ap.add_argument("--timeout", type=int, default=120)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("names", nargs="*")
    a = ap.parse_args()
    if a.one:               # in the test's own process
        install(globals())
        unittest.main(module=sys.modules[__name__], argv=[sys.argv[0], a.one],
                      verbosity=1)
        return
    names = a.names or test_names()
    results = []
    with ThreadPoolExecutor(max(1, a.j)) as ex:
        for name, outcome, secs, tail in ex.map(
                lambda n: run_one(n, a.timeout), names):
            results.append((name, outcome))
            print("%-4s %6.1fs %s" % (outcome, secs, name), flush=True)
            if outcome != "pass" and name not in EXPECTED:
                for line in tail:
                    print("      " + line)
    failed = {n for n, o in results if o != "pass"}
    unexpected = sorted(failed - set(EXPECTED))
    now_pass = sorted(n for n, o in results if o == "pass" and n in EXPECTED)
    print("\n%d tests: %d passed, %d failed or hung (%d of them expected)"
          % (len(results), len(results) - len(failed), len(failed),
             len(failed & set(EXPECTED))))
    for n in unexpected:
        print("UNEXPECTED: %s" % n)
    for n in now_pass:
        print("now passes (remove from EXPECTED): %s: %s" % (n, EXPECTED[n]))
    sys.exit(1 if unexpected else 0)


if __name__ == "__main__":
    main()
elif __name__ == "__mp_main__":
    # A job imports this file as its main module under that name: the
    # test classes its Process targets name must exist there too.
    install(globals())
