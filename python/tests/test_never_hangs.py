"""Programs written for multiprocessing that used to hang or fail on fiber,
and every blocking call waking with an error when the other side dies
(docs/python.md, "When the other side dies").

Each case runs its program in a process of its own with a timeout
(``script``), which is the hang guard: a case that hangs fails with
subprocess.TimeoutExpired instead of stopping the suite.
"""
import os
import subprocess

import pytest

import conftest

local_only = pytest.mark.local_only


def ok(r):
    """The program printed OK and exited 0; its output otherwise."""
    assert r.returncode == 0 and "OK" in r.stdout, (
        "exit %s\nstdout:\n%s\nstderr:\n%s" % (r.returncode, r.stdout,
                                              r.stderr))


# ---- 1. a pipe whose reader waits first ---------------------------------

def test_pipe_message_arrives_when_the_reader_waits_first(script):
    """recv() or poll() on the master's end before the child's send: the
    child dials the waiting end, sends and exits before the master's end
    answers; the message arrived 1 time in 10 before the fix."""
    ok(script('''
import fiber

def sender(conn, n):
    for i in range(n):
        conn.send(("msg", i))

if __name__ == "__main__":
    for rnd in range(4):
        a, b = fiber.Pipe()
        assert not a.poll(0)            # the master's end waits first
        p = fiber.Process(target=sender, args=(b, 2))
        p.start()
        got = [a.recv(), a.recv()]      # may block before the send
        p.join(60)
        assert got == [("msg", 0), ("msg", 1)], got
        assert p.exitcode == 0
        # The child went away: the next recv ends the stream.
        try:
            a.recv()
            raise SystemExit("recv after the sender exited returned")
        except EOFError:
            pass
    for rnd in range(4):
        a, b = fiber.Pipe(duplex=False)  # a reads, b writes
        assert not a.poll(0)
        p = fiber.Process(target=sender, args=(b, 1))
        p.start()
        p.join(60)                       # sent and gone before we look
        assert a.poll(30), "poll() never saw the message"
        assert a.recv() == ("msg", 0)
    print("OK")
''', timeout=180))


# ---- 2. a process started and dropped -----------------------------------

def test_a_started_and_dropped_process_runs_to_its_end(script):
    """multiprocessing's docs' "queue workers" example: Process(...).start()
    without keeping the object.  fiber kept started processes in a weak
    set, so the dropped object's job was terminated at once."""
    ok(script('''
import os, time
import fiber

def calculate(func, args):
    return func(*args)

def mul(a, b):
    return a * b

def worker(tasks, done):
    for func, args in iter(tasks.get, "STOP"):
        done.put(calculate(func, args))

if __name__ == "__main__":
    tasks, done = fiber.Queue(), fiber.Queue()
    for i in range(8):
        tasks.put((mul, (i, 7)))
    for i in range(2):
        fiber.Process(target=worker, args=(tasks, done)).start()
    assert len(fiber.active_children()) >= 1
    got = sorted(done.get(timeout=60) for _ in range(8))
    assert got == [i * 7 for i in range(8)], got
    for i in range(2):
        tasks.put("STOP")
    t0 = time.monotonic()
    while fiber.active_children() and time.monotonic() - t0 < 60:
        time.sleep(0.05)
    assert fiber.active_children() == []
    print("OK")
''', timeout=180))


def test_a_joined_process_leaves_active_children(script):
    ok(script('''
import fiber, time

def nap():
    time.sleep(0.2)

if __name__ == "__main__":
    p = fiber.Process(target=nap)
    p.start()
    assert fiber.active_children() == [p]
    p.join(60)
    assert fiber.active_children() == []
    print("OK")
''', timeout=120))


# ---- 3. fiber objects handed to multiprocessing children ---------------

# Over TCP too (the slurm rerun's transport, and any cluster's): a child
# that is not a job encrypts as the master does.  It used to send in the
# clear (net/'s settings were handed down only by fiber_init or a job's
# boot), the master dropped it, and the master's recv waited forever.
@pytest.mark.parametrize("transport", [None, "tcp"])
def test_fiber_pipe_and_queue_in_a_multiprocessing_spawn_child(script,
                                                               transport):
    """Uber Fiber's test_sharing_pipe_with_multiprocessing: the child is
    not a job of the run, only a process on the same host that was handed
    the objects; it authenticates with the run's token from the handle."""
    env = {"FIBER_TRANSPORT": "tcp", "FIBER_LISTEN_HOST": "127.0.0.1"} \
        if transport else None
    ok(script('''
import multiprocessing as mp
import fiber

def write_pipe(conn, data):
    conn.send(data)

def put_queue(q, data):
    q.put(data)

def echo_pipe(conn):
    conn.send(conn.recv().upper())

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    reader, writer = fiber.Pipe()
    p = ctx.Process(target=write_pipe, args=(writer, b"hello"))
    p.start()
    assert reader.recv() == b"hello"
    p.join(60)
    assert p.exitcode == 0
    q = fiber.Queue()
    p = ctx.Process(target=put_queue, args=(q, {"x": 1}))
    p.start()
    assert q.get(timeout=60) == {"x": 1}
    p.join(60)
    assert p.exitcode == 0
    mine, theirs = fiber.Pipe()
    p = ctx.Process(target=echo_pipe, args=(theirs,))
    p.start()
    mine.send("abc")
    assert mine.recv() == "ABC"
    p.join(60)
    assert p.exitcode == 0
    print("OK")
''', timeout=180, env=env))


def test_an_end_handed_on_by_a_child_that_then_exits(script):
    """Uber Fiber's test_sharing_pipe_with_fiber_and_multiprocessing: a
    fiber child hands its end to a multiprocessing child and exits before
    that one opens it; the end is not gone (HANDED), the message
    arrives."""
    ok(script('''
import multiprocessing as mp
import time
import fiber

def write_pipe(conn, data):
    time.sleep(0.5)             # after the fiber child has exited
    conn.send(data)

def hand_on(conn):
    p = mp.get_context("spawn").Process(target=write_pipe,
                                        args=(conn, "from its mp child"))
    p.start()

if __name__ == "__main__":
    reader, writer = fiber.Pipe()
    p = fiber.Process(target=hand_on, args=(writer,))
    p.start()
    assert reader.recv() == "from its mp child"
    p.join(60)
    print("OK")
''', timeout=120))


def test_fiber_queue_in_a_multiprocessing_fork_child_fails_at_once(script):
    """A forked child shares its parent's connections: it cannot use them,
    and says so at once (exit 1, the reason on its stderr) instead of
    mixing its messages into the parent's or hanging."""
    r = script('''
import multiprocessing as mp
import fiber

def put_queue(q, data):
    q.put(data)

if __name__ == "__main__":
    q = fiber.Queue()
    q.put("before")
    p = mp.get_context("fork").Process(target=put_queue, args=(q, "x"))
    p.start()
    p.join(60)
    assert p.exitcode == 1, p.exitcode
    # The parent's queue is untouched and still works.
    assert q.get(timeout=30) == "before"
    q.put("after")
    assert q.get(timeout=30) == "after"
    print("OK")
''', timeout=120)
    ok(r)
    assert "forked from process" in r.stderr
    assert "spawn" in r.stderr


# ---- 4. a target defined only under if __name__ == "__main__" -----------

def test_a_process_whose_target_is_only_in_the_main_block_says_why(script):
    r = script('''
import fiber

if __name__ == "__main__":
    def hidden():
        print("never runs")
    p = fiber.Process(target=hidden)
    p.start()
    p.join(60)
    print("exitcode", p.exitcode)
    print("run", fiber.run_id())
''', timeout=120)
    assert r.returncode == 0, r.stderr
    assert "exitcode 1" in r.stdout
    assert "never runs" not in r.stdout
    said = r.stderr
    if conftest.BACKEND != "local":
        # The job's stderr is in its log, which `fiber logs RUN` prints.
        tool = os.path.join(conftest.PKG, "..", "build", "bin", "fiber")
        if not os.path.exists(tool):
            pytest.skip("no build/bin/fiber to read the job's log with")
        run = r.stdout.split("run ")[1].split()[0]
        said = subprocess.run([tool, "logs", run], capture_output=True,
                              text=True, timeout=60).stdout
    assert "cannot load its target" in said, said
    assert "hidden" in said
    assert 'if __name__ == "__main__":' in said


# ---- 5. the other side dies ---------------------------------------------

@local_only
def test_recv_on_a_linked_pipe_whose_peer_was_killed_raises_eoferror(script):
    ok(script('''
import os, signal, time
import fiber

def echo_then_sleep(conn):
    conn.send(conn.recv())
    time.sleep(600)

if __name__ == "__main__":
    a, b = fiber.Pipe()
    p = fiber.Process(target=echo_then_sleep, args=(b,))
    p.start()
    a.send("ping")
    assert a.recv() == "ping"
    os.kill(p.pid, signal.SIGKILL)
    p.join(60)
    try:
        a.recv()
        raise SystemExit("recv returned")
    except EOFError:
        pass
    try:
        a.send("more")
        raise SystemExit("send returned")
    except BrokenPipeError:
        pass
    print("OK")
''', timeout=120))


@local_only
def test_recv_after_a_peer_that_sent_and_was_killed_before_the_link(script):
    """The child used its end first (it waited for a link that never came,
    so its message went through the master's queue) and was killed: the
    master's recv returns that message, then raises EOFError (it waited
    forever before)."""
    ok(script('''
import os, signal
import fiber

def send_and_die(conn):
    conn.send("last words")
    conn._p.close()      # flushed: the message is on the master's queue
    os.kill(os.getpid(), signal.SIGKILL)

def send_and_exit(conn):
    conn.send("bye")

if __name__ == "__main__":
    for target, word in ((send_and_die, "last words"),
                         (send_and_exit, "bye")):
        a, b = fiber.Pipe()
        p = fiber.Process(target=target, args=(b,))
        p.start()
        p.join(60)
        assert a.recv() == word
        try:
            a.recv()
            raise SystemExit("recv returned")
        except EOFError:
            pass
        assert a.poll(0)        # as a socket at its end: readable, EOF
    print("OK")
''', timeout=120))


def test_closing_the_masters_copy_of_a_childs_end(script):
    """multiprocessing's idiom: the parent closes its copy of the end it
    handed to the child; the child's copy carries on, and the parent reads
    EOF when the child closes it or ends, even one that never used it
    (closing the master's copy closed the child's sending direction
    before: recv raised EOFError at once, the message lost)."""
    ok(script('''
import fiber

def talk(conn):
    conn.send("hi")
    conn.close()

def ignore(conn):
    pass

if __name__ == "__main__":
    a, b = fiber.Pipe()
    p = fiber.Process(target=talk, args=(b,))
    p.start()
    b.close()
    assert a.recv() == "hi"
    try:
        a.recv()
        raise SystemExit("recv returned")
    except EOFError:
        pass
    p.join(60)
    a, b = fiber.Pipe()
    p = fiber.Process(target=ignore, args=(b,))
    p.start()
    b.close()
    try:
        a.recv()            # the child ends without a word
        raise SystemExit("recv returned")
    except EOFError:
        pass
    p.join(60)
    print("OK")
''', timeout=120))


@local_only
def test_manager_dying_fails_proxy_calls_and_its_queue(script):
    ok(script('''
import os, signal, queue
import fiber
from fiber.managers import BaseManager

class Where:
    def pid(self):
        return os.getpid()

class M(BaseManager):
    pass

M.register("Where", Where)

if __name__ == "__main__":
    m = M()
    m.start()
    w = m.Where()
    pid = w.pid()
    assert pid != os.getpid()
    os.kill(pid, signal.SIGKILL)
    try:
        w.pid()
        raise SystemExit("a call on a dead manager returned")
    except fiber.FiberError:
        pass
    mgr = fiber.Manager()
    d = mgr.dict()
    q = mgr.Queue()
    d["x"] = 1
    pid = mgr._create_python(Where, (), {}, fiber.managers.BaseProxy,
                             ["pid"])._callmethod("pid")
    os.kill(pid, signal.SIGKILL)
    for call in (lambda: d["x"], lambda: q.get(), lambda: q.put(1)):
        try:
            call()
            raise SystemExit("a call on a dead manager returned")
        except fiber.FiberError:
            pass
    print("OK")
''', timeout=120))


@local_only
def test_queue_get_when_the_server_is_gone_raises(script):
    """A queue's server is the master (or a manager); the only producer
    dying is not the end of a queue (anyone may still put, as with
    multiprocessing: get(timeout) is the way to bound the wait), but the
    server dying is: a get waiting on it raises instead of hanging."""
    ok(script('''
import os, signal, queue, threading, time
import fiber

def produce_and_die(q):
    q.put("one")
    os.kill(os.getpid(), signal.SIGKILL)

if __name__ == "__main__":
    q = fiber.Queue()
    p = fiber.Process(target=produce_and_die, args=(q,))
    p.start()
    assert q.get(timeout=60) == "one"
    p.join(60)
    try:
        q.get(timeout=0.5)
        raise SystemExit("got something from nobody")
    except queue.Empty:
        pass
    q.put("still works")
    assert q.get(timeout=30) == "still works"

    mgr = fiber.Manager()
    mq = mgr.Queue()
    got = []
    def waiter():
        try:
            mq.get()
            got.append("returned")
        except fiber.FiberError as e:
            got.append(e)
    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.5)                 # the get is waiting on the manager
    mgr.shutdown()                  # its server goes away
    t.join(60)
    assert not t.is_alive(), "get() still waits on a gone server"
    assert got and isinstance(got[0], fiber.FiberError), got
    print("OK")
''', timeout=120))


@local_only
def test_a_pool_worker_killed_mid_task_reruns_the_task(script, tmp_path):
    ok(script('''
import os, signal, sys, time
import fiber

MARK = sys.argv[1] if len(sys.argv) > 1 else None

def task(x, mark, q):
    if not os.path.exists(mark):
        open(mark, "w").close()
        q.put(os.getpid())
        time.sleep(600)          # killed here the first time
    return x * 2

if __name__ == "__main__":
    mark = os.path.join(os.getcwd(), "mark")
    q = fiber.Queue()
    with fiber.Pool(2) as pool:
        r = pool.apply_async(task, (21, mark, q))
        os.kill(q.get(timeout=60), signal.SIGKILL)
        assert r.get(timeout=120) == 42
    print("OK")
''', timeout=240))


# Ctrl-C in a wait on a lock, semaphore, event, condition or barrier:
# each waits in the run's manager with the GIL released, and before the
# fix a KeyboardInterrupt came only when the wait ended (never, without a
# timeout).  Each wait here has a 60 s timeout, and SIGINT comes 0.5 s in.
INTERRUPTED_WAITS = r"""
import json, os, signal, sys, threading, time
import fiber

def sigint_soon():
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGINT)

def interrupted(wait):
    threading.Thread(target=sigint_soon, daemon=True).start()
    t = time.monotonic()
    try:
        wait()
    except KeyboardInterrupt:
        return round(time.monotonic() - t, 2)
    return "not interrupted"

def notify_later(cond):
    with cond:
        cond.notify_all()

def wait_at(barrier, q):
    try:
        barrier.wait(60)
        q.put("passed")
    except threading.BrokenBarrierError:
        q.put("broken")

if __name__ == "__main__":
    out = {}
    held = fiber.Lock(); held.acquire()
    out["lock"] = interrupted(lambda: held.acquire(timeout=60))
    held.release()
    rlock = fiber.RLock()
    holder = threading.Thread(target=rlock.acquire)   # another thread's
    holder.start()
    holder.join()
    out["rlock"] = interrupted(lambda: rlock.acquire(timeout=60))
    out["sem"] = interrupted(lambda: fiber.Semaphore(0).acquire(timeout=60))
    out["event"] = interrupted(lambda: fiber.Event().wait(60))
    m = fiber.Manager()
    out["manager lock"] = interrupted(
        lambda: (lambda l: (l.acquire(), l.acquire(timeout=60)))(m.Lock()))
    out["manager event"] = interrupted(lambda: m.Event().wait(60))

    cond = fiber.Condition()
    cond.acquire()
    out["condition"] = interrupted(lambda: cond.wait(60))
    cond.release()       # held again after the interrupt, as threading's
    out["condition lock held again"] = True
    # The condition still works: a wait is notified by another process.
    cond.acquire()
    n = fiber.Process(target=notify_later, args=(cond,))
    n.start()
    out["condition notified after"] = cond.wait(60)
    cond.release()
    n.join(30)

    barrier = fiber.Barrier(3)
    q = fiber.SimpleQueue()
    other = fiber.Process(target=wait_at, args=(barrier, q))
    other.start()
    out["barrier"] = interrupted(lambda: barrier.wait(60))
    out["barrier other party"] = q.get()
    other.join(30)
    print(json.dumps(out))
"""


def test_ctrl_c_ends_waits_on_sync_objects(script):
    import json
    r = script(INTERRUPTED_WAITS, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    for kind in ("lock", "rlock", "sem", "event", "manager lock", "manager event",
                 "condition", "barrier"):
        assert isinstance(out[kind], float) and out[kind] < 10, (kind, out)
    assert out["condition lock held again"] is True
    assert out["condition notified after"] is True
    assert out["barrier other party"] == "broken"


def test_several_processes_write_to_one_pipe_end():
    """multiprocessing lets workers share one Connection (CPython's
    test_thousand does); a fiber pipe end handed to several processes
    stays on the relayed queues instead of linking one of them directly
    and refusing the others ("already connected directly")."""
    import fiber
    import helpers
    r, w = fiber.Pipe(duplex=False)
    assert not r.poll(0)     # the master's end waits first (the hard case)
    procs = [fiber.Process(target=helpers.send_numbers, args=(w, k, 200))
             for k in range(4)]
    for p in procs:
        p.start()
    got = {k: [] for k in range(4)}
    for _ in range(800):
        assert r.poll(60)
        tag, i = r.recv()
        got[tag].append(i)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert all(got[k] == list(range(200)) for k in range(4))
