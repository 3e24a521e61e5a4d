"""multiprocessing's public API in fiber: every name of
multiprocessing.__all__ exists in fiber and in its context with a
compatible signature, and the synchronisation objects and shared ctypes
work across processes.  Every wait has a timeout (a hang guard)."""
import ctypes
import inspect
import multiprocessing
import multiprocessing.connection
import os
import pickle
import queue
import threading
import time

import pytest

import fiber
import mp_helpers as mh

T = mh.T

# Names that exist but raise NotImplementedError when used, with why
# (docs/python.md lists them).  None today.
NOT_IMPLEMENTED = {}


def _compatible(mp_sig, fb_sig):
    """fiber's signature accepts every call multiprocessing's accepts:
    the same parameters by name, kind and position; anything extra is
    optional."""
    fb = list(fb_sig.parameters.values())
    fb_by_name = {p.name: p for p in fb}
    for i, p in enumerate(mp_sig.parameters.values()):
        q = fb_by_name.get(p.name)
        if q is None:
            if p.kind == p.VAR_KEYWORD and any(
                    x.kind == x.VAR_KEYWORD for x in fb):
                continue
            return "missing parameter %r" % p.name
        if q.kind != p.kind:
            return "%r is %s, not %s" % (p.name, q.kind, p.kind)
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and \
                fb.index(q) != i:
            return "%r is at position %d, not %d" % (p.name, fb.index(q), i)
        # None for an empty {} default (no shared mutable default) is
        # the same call.
        same = q.default == p.default or (q.default is None and
                                          p.default in ({}, [], ()))
        if p.default is not p.empty and not same:
            return "%r defaults to %r, not %r" % (p.name, q.default,
                                                   p.default)
    mp_names = set(mp_sig.parameters)
    for q in fb:
        if q.name not in mp_names and q.default is q.empty and \
                q.kind not in (q.VAR_POSITIONAL, q.VAR_KEYWORD):
            return "extra required parameter %r" % q.name
    return None


def _signature(obj):
    try:
        return inspect.signature(obj)
    except (TypeError, ValueError):
        return None


@pytest.mark.parametrize("name", sorted(multiprocessing.__all__))
def test_every_multiprocessing_name_exists_with_its_signature(name):
    ctx = fiber.get_context()
    mp_obj = getattr(multiprocessing, name)
    for where, holder in (("fiber", fiber), ("fiber.get_context()", ctx)):
        assert hasattr(holder, name), "%s lacks %s" % (where, name)
        obj = getattr(holder, name)
        if name in NOT_IMPLEMENTED:
            continue
        if isinstance(mp_obj, type) and issubclass(mp_obj, BaseException):
            assert isinstance(obj, type) and issubclass(obj, mp_obj), name
            continue
        if inspect.ismodule(mp_obj):
            assert inspect.ismodule(obj), name
            continue
        assert callable(obj), "%s.%s is not callable" % (where, name)
        mp_sig, fb_sig = _signature(mp_obj), _signature(obj)
        if mp_sig is None:
            continue
        assert fb_sig is not None, name
        why = _compatible(mp_sig, fb_sig)
        assert why is None, "%s.%s%s vs multiprocessing's %s: %s" % (
            where, name, fb_sig, mp_sig, why)


def test_no_name_is_missing():
    missing = set(multiprocessing.__all__) - set(dir(fiber))
    assert not missing
    assert set(multiprocessing.__all__) <= set(fiber.__all__)


# multiprocessing's submodules that a program imports by name, and the
# public names of each that fiber's module of the same name must have.
# Left out: managers.Token (the address of an object on a multiprocessing
# server; fiber's proxies hold a manager object instead) and context's
# classes of other start methods.
SUBMODULES = {
    "pool": None, "queues": None, "managers": {"Token"}, "connection": None,
    "synchronize": None, "process": None, "sharedctypes": None,
    "shared_memory": None, "dummy": None,
}


@pytest.mark.parametrize("sub", sorted(SUBMODULES))
def test_submodules_have_multiprocessing_s_public_names(sub):
    import importlib
    mp_mod = importlib.import_module("multiprocessing." + sub)
    fb_mod = importlib.import_module("fiber." + sub)
    names = getattr(mp_mod, "__all__", None) or [
        n for n in dir(mp_mod) if not n.startswith("_")]
    missing = set(names) - set(dir(fb_mod)) - set(
        n for n in names if hasattr(fb_mod, n))
    assert missing <= (SUBMODULES[sub] or set()), (
        "fiber.%s lacks %s" % (sub, sorted(missing)))


def test_submodule_names_are_fiber_s_objects():
    import fiber.pool
    import fiber.process
    import fiber.queues
    import multiprocessing.pool
    import fiber.joinable
    assert fiber.queues.JoinableQueue is fiber.joinable.JoinableQueue
    jq = fiber.queues.JoinableQueue()
    jq.put(1)
    assert jq.get(timeout=30) == 1
    jq.task_done()
    assert jq.join(30)
    assert fiber.process.BaseProcess is fiber.Process
    assert fiber.process.parent_process() is None        # the master
    assert fiber.pool.ThreadPool is multiprocessing.pool.ThreadPool
    with fiber.pool.ThreadPool(2) as tp:                 # threads, here
        assert tp.map(abs, [-1, -2]) == [1, 2]


def test_sharedctypes_copy_and_synchronized():
    from fiber import sharedctypes as sc
    v = fiber.RawValue("d", 2.5)
    c = sc.copy(v)
    v.value = 1.0
    assert c.value == 2.5 and v.value == 1.0
    a = fiber.RawArray("i", [1, 2, 3])
    b = sc.copy(a)
    a[0] = 9
    assert b[:] == [1, 2, 3] and a[:] == [9, 2, 3]
    chars = sc.copy(fiber.RawArray("c", b"hello"))
    assert chars.raw == b"hello"
    sv = sc.synchronized(v)
    with sv.get_lock():
        sv.value += 1
    assert sv.value == 2.0 and sv.get_obj() is v
    lock = fiber.Lock()
    sa = sc.synchronized(a, lock)
    assert sa.get_lock() is lock and sa[:] == [9, 2, 3]
    with pytest.raises(TypeError, match="already synchronized"):
        sc.synchronized(sv)
    n = sc.copy(sc.synchronized(fiber.RawValue("i", 7)))   # its raw object
    assert n.value == 7
    p = fiber.Process(target=mh.add_under_lock, args=(sv, 5))
    p.start()
    p.join(30)
    assert p.exitcode == 0 and sv.value == 7.0


# ---- context and start methods -------------------------------------------------

def test_context_and_start_methods():
    ctx = fiber.get_context()
    assert fiber.get_context("spawn") is ctx
    assert ctx.get_context() is ctx
    for bad in ("fork", "forkserver"):
        with pytest.raises(ValueError, match="spawn"):
            fiber.get_context(bad)
    with pytest.raises(ValueError):
        fiber.get_context("nonsense")
    assert fiber.get_all_start_methods() == ["spawn"]
    assert fiber.get_start_method() == "spawn"
    with pytest.raises(ValueError, match="fork"):
        fiber.set_start_method("fork", force=True)
    fiber.set_start_method("spawn", force=True)
    with pytest.raises(RuntimeError):
        fiber.set_start_method("spawn")
    assert fiber.get_start_method(allow_none=True) == "spawn"
    fiber.set_start_method(None, force=True)
    assert fiber.get_start_method(allow_none=True) is None
    assert fiber.get_start_method() == "spawn"
    with pytest.raises(NotImplementedError, match="copyreg"):
        ctx.reducer = None
    assert fiber.parent_process() is None
    assert fiber.freeze_support() is None
    assert fiber.get_logger() is multiprocessing.get_logger()
    with pytest.raises(TypeError):
        fiber.set_forkserver_preload([1])
    with pytest.raises(ValueError, match="not an executable"):
        fiber.set_executable("/nonexistent/python")


def test_context_pool_runs_work():
    ctx = fiber.get_context("spawn")
    with ctx.Pool(2) as pool:
        assert pool.map(abs, [-1, -2, 3], chunksize=1) == [1, 2, 3]


def test_parent_process_and_authkey_in_a_child():
    q = fiber.Queue()
    key = os.urandom(16)
    p = fiber.Process(target=mh.put_child_info, args=(q,))
    assert p.authkey == fiber.current_process().authkey
    p.authkey = key
    p.start()
    name, child_key = q.get(timeout=T)
    p.join(T)
    assert p.exitcode == 0
    assert name == "MainProcess"
    assert child_key == key


def test_sentinel_with_connection_wait():
    p = fiber.Process(target=mh.sleep_for, args=(0.5,))
    with pytest.raises(ValueError, match="not started"):
        p.sentinel
    p.start()
    s = p.sentinel
    assert isinstance(s, int) and p.sentinel == s
    ready = multiprocessing.connection.wait([s], timeout=T)
    assert ready == [s]
    p.join(T)
    assert p.exitcode == 0
    before = os.fstat(s)
    p.close()
    # Closed with the process object. Another thread (the runtime, a
    # backend's client) may reuse the number at once, so the check is
    # that s no longer names the sentinel's file, not that it is unused.
    try:
        after = os.fstat(s)
    except OSError:
        return
    assert (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino)


# ---- locks -------------------------------------------------------------------------

def test_lock_mutual_exclusion_across_processes():
    lock = fiber.Lock()
    counter = fiber.RawValue("i", 0)
    ps = [fiber.Process(target=mh.count_under_lock, args=(lock, counter, 200))
          for _ in range(3)]
    for p in ps:
        p.start()
    for p in ps:
        p.join(T * 2)
        assert p.exitcode == 0
    assert counter.value == 600


def test_lock_and_rlock_semantics():
    lock = fiber.Lock()
    assert lock.acquire()
    assert lock.acquire(False) is False
    assert lock.acquire(timeout=0.05) is False
    lock.release()
    with pytest.raises(RuntimeError):
        lock.release()
    r = fiber.RLock()
    with r:
        with r:
            pass
    with pytest.raises(RuntimeError):
        r.release()
    assert pickle.loads(pickle.dumps(lock)).acquire(False)


# ---- shared ctypes --------------------------------------------------------------------

def test_value_increments_under_get_lock():
    v = fiber.Value("i", 0)
    ps = [fiber.Process(target=mh.count_value, args=(v, 150))
          for _ in range(3)]
    for p in ps:
        p.start()
    for p in ps:
        p.join(T * 2)
        assert p.exitcode == 0
    assert v.value == 450


def test_value_types_follow_ctypes():
    v = fiber.Value("i", 2 ** 31 - 1, lock=False)
    v.value = v.value + 1  # c_int wraps around
    assert v.value == -2 ** 31
    assert not hasattr(v, "get_lock")
    assert fiber.Value("d", 1.25).value == 1.25
    assert fiber.Value("f", 0.1).value == ctypes.c_float(0.1).value
    assert fiber.Value("c", b"x").value == b"x"
    assert fiber.Value(ctypes.c_bool, True).value is True
    assert fiber.Value("Q", 2 ** 64 - 1).value == 2 ** 64 - 1
    assert fiber.Value("h").value == 0
    v = fiber.Value("i", 5, lock=fiber.RLock())
    with v:
        v.value += 1
    assert v.value == 6
    with pytest.raises(TypeError, match="typecode"):
        fiber.Value("x")
    with pytest.raises(NotImplementedError, match="pointer"):
        fiber.Value(ctypes.c_char_p)

    class Point(ctypes.Structure):
        _fields_ = [("x", ctypes.c_int)]
    with pytest.raises(NotImplementedError, match="structure"):
        fiber.Value(Point)


def test_array_items_slices_and_chars():
    a = fiber.Array("i", 5)
    assert a[:] == [0] * 5 and len(a) == 5
    a[1] = 7
    a[2:4] = [8, 9]
    assert a[:] == [0, 7, 8, 9, 0] and a[-1] == 0 and a[::2] == [0, 8, 0]
    assert list(a) == [0, 7, 8, 9, 0]
    with pytest.raises(IndexError):
        a[5]
    with pytest.raises(ValueError):
        a[0:2] = [1]
    with a.get_lock():
        a[0] += 1
    assert a[0] == 1
    d = fiber.Array("d", [0.5, 1.5], lock=False)
    assert d[:] == [0.5, 1.5]
    s = fiber.Array("c", b"hello")
    assert s.value == b"hello"
    s.value = b"hi"
    assert s.value == b"hi" and s.raw[:3] == b"hi\0"
    assert s[0] == b"h"


def test_raw_array_writes_of_many_processes_are_all_kept():
    # 3000 ints span three 4 KiB chunks; three processes write
    # interleaved items, so each chunk is changed by all of them.
    n = 3000
    arr = fiber.RawArray("i", n)
    ps = [fiber.Process(target=mh.fill_array, args=(arr, k, 3, 1000000))
          for k in range(3)]
    for p in ps:
        p.start()
    for p in ps:
        p.join(T * 4)
        assert p.exitcode == 0
    assert arr[:] == [1000000 + i for i in range(n)]


# ---- events, conditions, semaphores, barriers ---------------------------------------

def test_event_set_wakes_a_waiting_child():
    ev = fiber.Event()
    q = fiber.Queue()
    assert not ev.is_set() and ev.wait(0.01) is False
    p = fiber.Process(target=mh.wait_event_then_put, args=(ev, q))
    p.start()
    time.sleep(0.2)
    ev.set()
    assert q.get(timeout=T) is True
    p.join(T)
    assert ev.is_set()
    ev.clear()
    assert not ev.is_set()


@pytest.mark.parametrize("with_lock", [False, True])
def test_condition_notify_wakes_a_waiting_child(with_lock):
    cond = fiber.Condition(fiber.RLock() if with_lock else None)
    flag = fiber.Value("i", 0)
    q = fiber.Queue()
    waiter = fiber.Process(target=mh.wait_on_condition, args=(cond, flag, q))
    waiter.start()
    time.sleep(0.3)
    notifier = fiber.Process(target=mh.notify_when_told, args=(cond, flag))
    notifier.start()
    assert q.get(timeout=T) is True
    for p in (waiter, notifier):
        p.join(T)
        assert p.exitcode == 0


def test_condition_wait_times_out_and_needs_the_lock():
    for cond in (fiber.Condition(), fiber.Condition(fiber.Lock()),
                 fiber.Condition(fiber.RLock())):
        with cond:
            assert cond.wait(0.05) is False
            cond.notify()  # nobody waits: nothing happens
        assert cond.acquire(False)  # wait gave the lock back
        cond.release()
    with pytest.raises(RuntimeError):
        fiber.Condition().notify()
    with pytest.raises(RuntimeError):
        fiber.Condition(fiber.RLock()).wait(0.01)
    with pytest.raises(TypeError):
        fiber.Condition(threading.Lock())


def test_semaphore_counts_its_holders():
    sem = fiber.Semaphore(2)
    inside = fiber.Value("i", 0)
    most = fiber.Value("i", 0)
    ps = [fiber.Process(target=mh.hold_semaphore,
                        args=(sem, inside, most, 0.3)) for _ in range(4)]
    for p in ps:
        p.start()
    for p in ps:
        p.join(T * 2)
        assert p.exitcode == 0
    assert most.value <= 2
    assert sem.get_value() == 2
    assert sem.acquire(timeout=T) and sem.acquire(timeout=T)
    assert sem.get_value() == 0
    assert sem.acquire(False) is False
    sem.release()
    assert sem.get_value() == 1
    sem.release()


def test_bounded_semaphore_refuses_extra_release():
    b = fiber.BoundedSemaphore(1)
    with pytest.raises(ValueError):
        b.release()
    assert b.get_value() == 1
    assert b.acquire(timeout=T)
    assert b.acquire(False) is False
    b.release()
    with pytest.raises(ValueError):
        b.release()


def test_barrier_releases_n_parties_together():
    n = 3
    barrier = fiber.Barrier(n)
    before = fiber.Value("i", 0)
    q = fiber.Queue()
    ps = [fiber.Process(target=mh.barrier_party, args=(barrier, before, q))
          for _ in range(n)]
    for p in ps:
        p.start()
    got = [q.get(timeout=T) for _ in range(n)]
    for p in ps:
        p.join(T)
        assert p.exitcode == 0
    assert sorted(i for i, _ in got) == list(range(n))
    assert all(seen == n for _, seen in got)
    assert barrier.parties == n and not barrier.broken


def test_barrier_timeout_abort_reset_and_action():
    b = fiber.Barrier(2, timeout=0.05)
    with pytest.raises(threading.BrokenBarrierError):
        b.wait()
    assert b.broken
    with pytest.raises(threading.BrokenBarrierError):
        b.wait(T)
    b.reset()
    assert not b.broken
    b.abort()
    assert b.broken
    b.reset()
    calls = []
    one = fiber.Barrier(1, action=lambda: calls.append(1))
    assert one.wait(T) == 0 and calls == [1]

    def boom():
        raise KeyError("action")
    bad = fiber.Barrier(1, action=boom)
    with pytest.raises(KeyError):
        bad.wait(T)
    assert bad.broken


# ---- JoinableQueue --------------------------------------------------------------------

def test_joinable_queue_task_done_and_join():
    jq = fiber.JoinableQueue()
    out = fiber.Queue()
    workers = [fiber.Process(target=mh.consume, args=(jq, out))
               for _ in range(2)]
    for w in workers:
        w.start()
    for i in range(10):
        jq.put(i)
    assert jq.join(T) is True
    assert sorted(out.get(timeout=T) for _ in range(10)) == \
        [2 * i for i in range(10)]
    for _ in workers:
        jq.put(None)
    assert jq.join(T) is True
    for w in workers:
        w.join(T)
        assert w.exitcode == 0
    with pytest.raises(ValueError):
        jq.task_done()


def test_joinable_queue_join_waits_for_task_done():
    jq = fiber.JoinableQueue(maxsize=1)
    jq.put("a")
    with pytest.raises(queue.Full):
        jq.put("b", timeout=0.05)
    assert jq.join(0.1) is False  # "a" is not done
    assert jq.get(timeout=T) == "a"
    jq.task_done()
    assert jq.join(T) is True


# ---- where the objects live -------------------------------------------------------

def test_objects_made_in_a_job_are_multiprocessing_s_own():
    q = fiber.Queue()
    p = fiber.Process(target=mh.objects_made_in_a_job, args=(q,))
    p.start()
    module, acquired, value, travels = q.get(timeout=T)
    p.join(T)
    assert p.exitcode == 0
    assert module.startswith("multiprocessing")
    assert acquired and value == 4 and not travels


def test_an_object_never_pickled_is_freed_with_its_last_reference():
    import gc
    kept = fiber.Lock()
    pickle.dumps(kept)  # may live elsewhere now: kept until the run ends
    kept_mobj = kept._h.mobj
    dropped = fiber.Lock()
    dropped_mobj = dropped._h.mobj
    del kept, dropped
    gc.collect()
    assert kept_mobj.op(fiber._fiber.OP_LOCK_ACQUIRE, 0, 0) is None
    with pytest.raises(fiber.FiberError, match="not a valid"):
        dropped_mobj.op(fiber._fiber.OP_LOCK_ACQUIRE, 0, 0)


def test_a_lock_held_by_a_dead_process_is_released():
    lock = fiber.Lock()
    taken = fiber.Event()
    p = fiber.Process(target=mh.take_and_die, args=(lock, taken))
    p.start()
    assert taken.wait(T)
    p.join(T)
    assert p.exitcode == 3
    assert lock.acquire(timeout=T)
    lock.release()


def test_condition_notify_after_a_wait_without_the_lock_does_not_hang():
    cond = fiber.Condition(fiber.RLock())
    with pytest.raises(RuntimeError):
        cond.wait(0.01)

    def notify():
        with cond:
            cond.notify()
    t = threading.Thread(target=notify, daemon=True)
    t.start()
    t.join(T)
    assert not t.is_alive(), "notify waits for a sleeper that never slept"


def test_shared_objects_travel_in_pool_tasks():
    v = fiber.Value("q", 0)
    with fiber.get_context().Pool(2) as pool:
        results = [pool.apply_async(mh.add_under_lock, (v, 50))
                   for _ in range(4)]
        assert [r.get(T) for r in results] == [50] * 4
    assert v.value == 200


def test_multiprocessing_docs_shared_memory_example_runs_unchanged(script):
    # "Sharing state between processes" in the multiprocessing docs, with
    # its import changed.
    r = script("""
from fiber import Process, Value, Array

def f(n, a):
    n.value = 3.1415927
    for i in range(len(a)):
        a[i] = -a[i]

if __name__ == '__main__':
    num = Value('d', 0.0)
    arr = Array('i', range(10))

    p = Process(target=f, args=(num, arr))
    p.start()
    p.join()

    print(num.value)
    print(arr[:])
""", timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == [
        "3.1415927", str([-i for i in range(10)])]


@pytest.mark.parametrize("fork_server", ["true", "false"])
def test_jobs_see_the_masters_sys_argv(script, fork_server):
    # multiprocessing's spawn gives each child the parent's sys.argv, so a
    # main module that parses its arguments at import time (argparse at
    # module level) imports in the children too.
    r = script("""
import argparse, sys
import fiber

ap = argparse.ArgumentParser()
ap.add_argument("--lr", type=float, required=True)
ap.add_argument("rest", nargs="*")
ARGS = ap.parse_args()

def argv(_=None):
    return sys.argv[1:], ARGS.lr

def put_argv(q):
    q.put(argv())

if __name__ == "__main__":
    want = (["--lr", "0.5", "x y"], 0.5)
    with fiber.Pool(2) as pool:
        assert pool.map(argv, range(4)) == [want] * 4
    q = fiber.SimpleQueue()
    p = fiber.Process(target=put_argv, args=(q,))
    p.start()
    assert q.get() == want
    p.join(60)
    assert p.exitcode == 0, p.exitcode
    print("OK")
""", args=["--lr", "0.5", "x y"], env={"FIBER_FORK_SERVER": fork_server},
               timeout=180)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "OK", (r.stdout, r.stderr)


def _default_manager_pids():
    """The pids of this master's Shared-objects job (local backend)."""
    import helpers
    pids = []
    parents = helpers.job_parents()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as f:
                cmd = f.read()
            with open("/proc/%s/stat" % entry) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid in parents and b"--fiber-job=Shared-objects" in cmd:
            pids.append(int(entry))
    return pids


@pytest.mark.local_only
def test_a_dead_default_manager_fails_waits_and_is_replaced():
    import signal
    ev = fiber.Event()
    got = []

    def waiter():
        try:
            got.append(ev.wait(T))
        except Exception as e:
            got.append(e)
    t = threading.Thread(target=waiter, daemon=True)
    t.start()
    time.sleep(0.2)
    pids = _default_manager_pids()
    assert len(pids) == 1
    os.kill(pids[0], signal.SIGKILL)
    t.join(T)
    assert not t.is_alive()
    assert isinstance(got[0], fiber.ClosedError), got
    with pytest.raises(fiber.ClosedError):
        ev.set()
    # A new object gets a new manager, and works across processes.
    lock = fiber.Lock()
    counter = fiber.RawValue("i", 0)
    p = fiber.Process(target=mh.count_under_lock, args=(lock, counter, 10))
    p.start()
    p.join(T)
    assert p.exitcode == 0 and counter.value == 10
    assert len(_default_manager_pids()) == 1


def test_small_things_as_multiprocessing_has_them():
    import multiprocessing.pool
    import re
    import fiber.connection
    with fiber.Pool(1) as pool:
        with pytest.raises(ZeroDivisionError) as info:
            pool.apply(divmod, (1, 0))
    cause = info.value.__cause__
    assert type(cause) is multiprocessing.pool.RemoteTraceback
    assert "ZeroDivisionError" in str(cause)
    assert fiber.connection.families == multiprocessing.connection.families
    ev = fiber.Event()
    assert re.fullmatch(r"<Event at 0x[0-9a-f]+ unset>", repr(ev))
    ev.set()
    assert repr(ev).endswith(" set>")
