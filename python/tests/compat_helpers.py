"""Functions the Fiber-compatibility tests (test_fiber_compat.py) send to
workers: a module the jobs import by name."""
import os
import queue
import time


def fail_on_three(x):
    if x == 3:
        raise ValueError("three")
    return x * 10


def slow(x):
    time.sleep(3)
    return x


def fail_once(path):
    """Raises the first time it runs for path (it leaves a mark there),
    then returns "ok"."""
    if not os.path.exists(path):
        with open(path, "w"):
            pass
        raise RuntimeError("first run for %s" % path)
    return "ok"


def always_fails(x):
    raise RuntimeError("always %s" % x)


def push_reader(q, ready, out, ident):
    """A SimpleQueuePush reader: connects (a get that finds nothing),
    says so, then counts its items until None."""
    try:
        q.get(timeout=0.01)
    except queue.Empty:
        pass
    ready.put(ident)
    n = 0
    while q.get() is not None:
        n += 1
    out.put((ident, n))


def push_writer(q, n):
    for i in range(n):
        q.put(i)


def through_ends(q_in, q_out, n):
    """Uber Fiber's test_queue.get_queue: reads q_in and writes q_out,
    naming their reader and writer ends as Fiber's queues had them."""
    print("ends", q_in.reader, q_in.writer)
    for _ in range(n):
        q_out.writer.send(q_in.reader.recv())
