"""Targets for test_mp_api.py's child processes (a module jobs import by
name).  Every wait has a timeout, so that a broken object fails a test
instead of hanging it."""
import time

T = 30  # seconds: a hang guard, never a speed requirement


def count_under_lock(lock, counter, n):
    """counter is a RawValue: its read-modify-write is two operations, so
    only the lock keeps increments from being lost."""
    for _ in range(n):
        assert lock.acquire(timeout=T)
        try:
            counter.value = counter.value + 1
        finally:
            lock.release()


def count_value(v, n):
    for _ in range(n):
        with v.get_lock():
            v.value += 1


def fill_array(arr, start, step, value):
    for i in range(start, len(arr), step):
        arr[i] = value + i


def wait_event_then_put(ev, q):
    q.put(ev.wait(T))


def notify_when_told(cond, flag):
    with cond:
        flag.value = 1
        cond.notify_all()


def wait_on_condition(cond, flag, q):
    with cond:
        ok = cond.wait_for(lambda: flag.value == 1, T)
    q.put(ok)


def hold_semaphore(sem, inside, most, hold_s):
    """Counts how many holders are inside at once (most keeps the
    maximum seen)."""
    assert sem.acquire(timeout=T)
    try:
        with inside.get_lock():
            inside.value += 1
            now = inside.value
        with most.get_lock():
            most.value = max(most.value, now)
        time.sleep(hold_s)
        with inside.get_lock():
            inside.value -= 1
    finally:
        sem.release()


def barrier_party(barrier, before, q):
    with before.get_lock():
        before.value += 1
    index = barrier.wait(T)
    # After the barrier every party has arrived.
    q.put((index, before.value))


def consume(jq, out):
    while True:
        item = jq.get(timeout=T)
        if item is None:
            jq.task_done()
            return
        out.put(item * 2)
        jq.task_done()


def put_child_info(q):
    import fiber
    p = fiber.parent_process()
    q.put((p is not None and p.name, fiber.current_process().authkey))


def sleep_for(seconds):
    time.sleep(seconds)


def objects_made_in_a_job(q):
    """What fiber.Lock() and fiber.Value() are in a job: multiprocessing's
    own, usable by the job and refusing to travel."""
    import pickle
    import fiber
    lock = fiber.Lock()
    v = fiber.Value("i", 3)
    with v.get_lock():
        v.value += 1
    try:
        pickle.dumps(lock)
        travels = True
    except RuntimeError:
        travels = False
    q.put((type(lock).__module__, lock.acquire(timeout=T), v.value, travels))


def take_and_die(lock, taken):
    assert lock.acquire(timeout=T)
    taken.set()
    import os
    os._exit(3)


def add_under_lock(v, n):
    for _ in range(n):
        with v.get_lock():
            v.value += 1
    return n
