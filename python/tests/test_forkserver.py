"""Jobs forked from the local backend's fork server (fiber._forkserver,
src/backend/local/forkserver.c), and the spawn path it falls back to.

Each case runs a program of its own (its own master, its own fork
server) with a timeout, so a hang fails the case instead of the suite.
The programs print what they see; the assertions are here.
"""
import os
import subprocess
import sys

import pytest

import conftest
import helpers

pytestmark = pytest.mark.local_only

TOOL = os.path.join(conftest.PKG, "..", "build", "bin", "fiber")


def ok(r):
    assert r.returncode == 0 and "OK" in r.stdout, (
        "exit %s\nstdout:\n%s\nstderr:\n%s" % (r.returncode, r.stdout,
                                              r.stderr))
    return dict(line.split(" ", 1) for line in r.stdout.splitlines()
                if " " in line)


# What every program below starts with: a job reports its parent and pid.
PRELUDE = '''
import os, signal, sys, time
import fiber

def parent(q):
    q.put((os.getpid(), os.getppid()))

def sleep_long():
    time.sleep(60)

def ignore_term_then_sleep(q):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    q.put("ignoring")
    time.sleep(60)

def kill_self(sig):
    os.kill(os.getpid(), sig)

def first_parent():
    q = fiber.Queue()
    p = fiber.Process(target=parent, args=(q,))
    p.start()
    pid, ppid = q.get(timeout=60)
    p.join(60)
    return pid, ppid
'''


def test_jobs_are_forked_and_keep_their_exit_codes(script):
    """A job's parent is the fork server, not the master; sys.exit codes,
    a raised exception, a signal, terminate and kill read as they do for
    a spawned job."""
    v = ok(script(PRELUDE + '''
if __name__ == "__main__":
    pid, ppid = first_parent()
    print("forked", ppid != os.getpid())
    codes = []
    for target, args in [(sys.exit, (7,)), (sys.exit, (0,)),
                         (kill_self, (signal.SIGKILL,)),
                         (kill_self, (signal.SIGSEGV,)),
                         (int, ("not a number",))]:
        p = fiber.Process(target=target, args=args)
        p.start()
        p.join(60)
        codes.append(p.exitcode)
    print("codes", codes)
    for stop in ("terminate", "kill"):
        p = fiber.Process(target=sleep_long)
        p.start()
        time.sleep(0.5)
        getattr(p, stop)()
        p.join(60)
        print(stop, p.exitcode)
    print("OK")
''', timeout=120))
    assert v["forked"] == "True"
    assert v["codes"] == "[7, 0, -9, -11, 1]"
    assert v["terminate"] == "-15"
    assert v["kill"] == "-9"


def test_terminate_escalates_to_sigkill(script):
    """A forked job that ignores SIGTERM is killed after
    terminate_grace_ms, through the pidfd the fork server handed over."""
    v = ok(script(PRELUDE + '''
if __name__ == "__main__":
    fiber.init(terminate_grace_ms=300)
    q = fiber.Queue()
    p = fiber.Process(target=ignore_term_then_sleep, args=(q,))
    p.start()
    assert q.get(timeout=60) == "ignoring"
    t = time.time()
    p.terminate()
    p.join(30)
    print("code", p.exitcode)
    print("took", round(time.time() - t, 1))
    print("OK")
''', timeout=90))
    assert v["code"] == "-9"
    assert float(v["took"]) < 10


def test_a_job_gets_the_masters_environment_directory_and_output_now(
        script, tmp_path):
    """What the master changes after the fork server started (a variable,
    its working directory, where its stdout goes) reaches a job forked
    later, as it reaches a spawned one."""
    (tmp_path / "elsewhere").mkdir()
    v = ok(script(PRELUDE + '''
def show(q):
    print("job printed this")
    sys.stdout.flush()
    q.put((os.environ.get("LATE_VAR"), os.getcwd(),
           [k for k in os.environ if k.startswith(("FIBER_FORKSERVER",
                                                   "FIBER_PY_"))]))

if __name__ == "__main__":
    first_parent()                       # the fork server is up
    os.environ["LATE_VAR"] = "set later"
    os.chdir("elsewhere")
    out = os.open("job.out", os.O_WRONLY | os.O_CREAT, 0o600)
    saved = os.dup(1)
    sys.stdout.flush()
    os.dup2(out, 1)
    q = fiber.Queue()
    p = fiber.Process(target=show, args=(q,))
    p.start()
    var, cwd, leaks = q.get(timeout=60)
    p.join(60)
    os.dup2(saved, 1)
    print("var", var)
    print("cwd", os.path.basename(cwd))
    print("leaks", leaks)
    print("file", open("job.out").read().strip())
    print("OK")
'''))
    assert v["var"] == "set later"
    assert v["cwd"] == "elsewhere"
    assert v["leaks"] == "[]"
    assert v["file"] == "job printed this"


def test_forked_jobs_do_not_share_random_state(script):
    """Python's random and numpy's global generator differ between jobs
    forked from one server (numpy is reseeded in each)."""
    pytest.importorskip("numpy")
    v = ok(script('''
import os, random
import numpy as np
import fiber

# Drawn at import time, so the fork server's generators are initialised
# (numpy seeds its global generator lazily) before it forks.
np.random.rand()
random.random()

def draw(q):
    q.put((os.getpid(), os.getppid(), random.random(), np.random.rand()))

if __name__ == "__main__":
    q = fiber.Queue()
    ps = [fiber.Process(target=draw, args=(q,)) for _ in range(4)]
    for p in ps:
        p.start()
    got = [q.get(timeout=60) for _ in ps]
    for p in ps:
        p.join(60)
    print("pids", len({g[0] for g in got}))
    print("servers", len({g[1] for g in got}), os.getpid() in {g[1] for g in got})
    print("random", len({g[2] for g in got}))
    print("numpy", len({g[3] for g in got}))
    print("OK")
''', timeout=120))
    assert v["pids"] == "4"
    assert v["servers"] == "1 False"
    assert v["random"] == "4"
    assert v["numpy"] == "4"


def test_many_concurrent_starts(script):
    """64 pool workers at once, each a distinct forked job that runs a
    task (each task waits until 64 have started, so no worker runs two)."""
    v = ok(script('''
import os, time
import fiber

def wait_for_all(arg):
    folder, n = arg
    open(os.path.join(folder, str(os.getpid())), "w").close()
    deadline = time.time() + 90
    while len(os.listdir(folder)) < n and time.time() < deadline:
        time.sleep(0.01)
    return os.getpid(), os.getppid()

if __name__ == "__main__":
    os.mkdir("pids")
    n = 64
    with fiber.Pool(n) as pool:
        got = pool.map(wait_for_all, [("pids", n)] * n, chunksize=1)
    print("distinct", len({g[0] for g in got}))
    print("parents", len({g[1] for g in got}), os.getpid() in {g[1] for g in got})
    print("OK")
''', timeout=240))
    assert v["distinct"] == "64"
    assert v["parents"] == "1 False"


def test_fiber_ps_shows_forked_jobs_by_name(script):
    if not os.path.exists(TOOL):
        pytest.skip("no build/bin/fiber")
    v = ok(script(PRELUDE + '''
import subprocess
if __name__ == "__main__":
    ps = [fiber.Process(target=sleep_long, name="sleeper-%d" % i)
          for i in range(2)]
    for p in ps:
        p.start()
    deadline = time.time() + 60
    while time.time() < deadline:
        out = subprocess.run([sys.argv[1], "ps", fiber.run_id()],
                             capture_output=True, text=True).stdout
        # A job shows the fork server's name for the moment between its
        # fork and the rewrite of its identity.
        if all(("%s " % p.name) in out and "pid %d" % p.pid in out
               for p in ps):
            break
        time.sleep(0.2)
    for p in ps:
        line = [l for l in out.splitlines() if "pid %d" % p.pid in l]
        print(p.name, line[0].split()[0] if line else "missing")
    for p in ps:
        p.terminate()
        p.join(30)
    print("OK")
'''.replace("sys.argv[1]", repr(os.path.abspath(TOOL))), timeout=120))
    assert v["sleeper-0"] == "sleeper-0"
    assert v["sleeper-1"] == "sleeper-1"


def test_a_killed_fork_server_falls_back_to_spawn(script):
    """SIGKILL the fork server mid-run: a job it forked still ends with
    its code, the next job is spawned (the master is its parent), the
    master says so once, and nothing hangs."""
    r = script(PRELUDE + '''
def wait_then_exit(q, code):
    q.put(os.getppid())
    time.sleep(1)
    sys.exit(code)

if __name__ == "__main__":
    q = fiber.Queue()
    a = fiber.Process(target=wait_then_exit, args=(q, 5))
    a.start()
    server = q.get(timeout=60)
    os.kill(server, signal.SIGKILL)
    a.join(60)
    print("old_job", a.exitcode)
    pid, ppid = first_parent()
    print("spawned", ppid == os.getpid())
    with fiber.Pool(3) as pool:
        print("pool", sorted(pool.map(abs, [-1, -2, -3])))
    print("OK")
''', timeout=120)
    v = ok(r)
    assert v["old_job"] == "5"
    assert v["spawned"] == "True"
    assert v["pool"] == "[1, 2, 3]"
    assert r.stderr.count("starting jobs with posix_spawn") == 1, r.stderr


def test_spawn_when_turned_off(script):
    """fork_server = false (FIBER_FORK_SERVER=0): every job is spawned by
    the master, with the same exit codes."""
    v = ok(script(PRELUDE + '''
if __name__ == "__main__":
    pid, ppid = first_parent()
    print("spawned", ppid == os.getpid())
    p = fiber.Process(target=kill_self, args=(signal.SIGKILL,))
    p.start()
    p.join(60)
    print("code", p.exitcode)
    print("OK")
''', env={"FIBER_FORK_SERVER": "0"}, timeout=120))
    assert v["spawned"] == "True"
    assert v["code"] == "-9"


def test_a_main_module_that_cannot_be_imported_falls_back(script):
    """When the main module fails to import in the fork server, jobs are
    spawned (and each says why, as before), so tasks defined elsewhere
    still run."""
    r = script('''
import os
import fiber
from helpers import getpid

if __name__ != "__main__":
    raise RuntimeError("only as the main program")

with fiber.Pool(2) as pool:
    print("ran", len(pool.map(getpid, range(4))) == 4)
print("OK")
''', timeout=120)
    v = ok(r)
    assert v["ran"] == "True"
    assert "cannot serve: cannot import the program's main module" in \
        r.stderr, r.stderr


def test_jobs_and_the_fork_server_end_when_the_master_is_killed(tmp_path):
    """SIGKILL the master: its forked jobs (watching their connection)
    and its fork server (watching the master's pidfd) are gone within
    seconds, leaving no orphans."""
    import time
    prog = tmp_path / "prog.py"
    prog.write_text(PRELUDE + '''
if __name__ == "__main__":
    ps = [fiber.Process(target=sleep_long) for _ in range(3)]
    for p in ps:
        p.start()
    pid, server = first_parent()
    print(" ".join(str(x) for x in [server] + [p.pid for p in ps]),
          flush=True)
    time.sleep(60)
''')
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [conftest.PKG, conftest.HERE] +
        [p for p in [env.get("PYTHONPATH")] if p])
    master = subprocess.Popen([sys.executable, str(prog)], cwd=str(tmp_path),
                              env=env, stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(x) for x in master.stdout.readline().split()]
    finally:
        master.kill()
        master.wait(30)
    assert len(pids) == 4, pids

    running = helpers.process_running
    deadline = time.time() + 20
    while time.time() < deadline and any(running(p) for p in pids):
        time.sleep(0.1)
    assert not [p for p in pids if running(p)]
