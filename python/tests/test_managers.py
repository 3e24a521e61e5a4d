import threading

import pytest

import fiber
import helpers
from fiber.managers import BaseManager


@pytest.fixture(scope="module")
def manager():
    m = fiber.Manager()
    yield m
    m.shutdown()


def test_dict_and_list_shared_with_children(manager):
    d = manager.dict()
    lst = manager.list([0])
    lock = manager.Lock()
    d["a"] = 1
    assert d["a"] == 1 and "a" in d and len(d) == 1
    assert d.get("zz", 5) == 5
    with pytest.raises(KeyError):
        d["missing"]
    ps = [fiber.Process(target=helpers.bump, args=(d, "n", 25, lock))
          for _ in range(3)]
    ps += [fiber.Process(target=helpers.append_many, args=(lst, 10 * i, 5))
           for i in range(1, 3)]
    for p in ps:
        p.start()
    for p in ps:
        p.join(60)
        assert p.exitcode == 0
    assert d["n"] == 75
    assert sorted(d.keys()) == ["a", "n"]
    assert len(lst) == 11 and sorted(lst.copy())[:1] == [0]
    assert sorted(list(lst)) == sorted([0] + list(range(10, 15)) +
                                       list(range(20, 25)))
    lst += [99]
    assert lst[-1] == 99


def test_value_array_namespace(manager):
    v = manager.Value("i", 3)
    assert v.value == 3
    v.value = 7
    assert v.get() == 7
    arr = manager.Array("d", [1.0, 2.0])
    arr[1] = 5.0
    assert len(arr) == 2 and list(arr) == [1.0, 5.0]
    ns = manager.Namespace()
    ns.x = 10
    assert ns.x == 10
    del ns.x
    with pytest.raises(AttributeError):
        ns.x


def test_locks_events_semaphores(manager):
    lock = manager.Lock()
    assert lock.acquire()
    assert not lock.acquire(timeout=0.05)
    assert not lock.acquire(blocking=False)
    lock.release()
    with pytest.raises(RuntimeError):
        lock.release()
    r = manager.RLock()
    with r:
        with r:
            pass
    ev = manager.Event()
    assert not ev.is_set() and not ev.wait(0.05)
    q = fiber.Queue()
    p = fiber.Process(target=helpers.wait_event, args=(ev, q))
    p.start()
    ev.set()
    assert q.get(timeout=30) is True
    p.join(30)
    s = manager.Semaphore(2)
    assert s.acquire() and s.acquire() and not s.acquire(timeout=0.05)
    s.release()
    s.release()
    b = manager.BoundedSemaphore(1)
    assert b.acquire()
    b.release()
    with pytest.raises(ValueError):
        b.release()


def test_barrier_and_condition(manager):
    bar = manager.Barrier(3)
    assert bar.parties == 3
    q = fiber.Queue()
    ps = [fiber.Process(target=helpers.barrier_party, args=(bar, q))
          for _ in range(2)]
    for p in ps:
        p.start()
    mine = bar.wait(30)
    got = sorted([mine, q.get(timeout=30), q.get(timeout=30)])
    assert got == [0, 1, 2]
    for p in ps:
        p.join(30)
    broken = manager.Barrier(2)
    with pytest.raises(threading.BrokenBarrierError):
        broken.wait(0.05)
    c = manager.Condition()
    with c:
        assert c.wait(0.05) is False
        c.notify()
    with pytest.raises(RuntimeError):
        c.notify()


@pytest.mark.parametrize("kind", ["Lock", "RLock"])
def test_condition_over_a_lock_of_the_manager(manager, kind):
    """manager.Condition(lock) (multiprocessing's SyncManager takes one):
    a child waits on it, the master notifies holding the same lock."""
    import mp_helpers
    lock = getattr(manager, kind)()
    cond = manager.Condition(lock)
    flag = manager.Value("i", 0)
    q = fiber.Queue()
    p = fiber.Process(target=mp_helpers.wait_on_condition,
                      args=(cond, flag, q))
    p.start()
    with cond:
        assert cond.wait(0.05) is False  # nobody notifies: it times out
    with lock:  # the condition's lock is the caller's lock
        flag.value = 1
        cond.notify_all()
    assert q.get(timeout=60) is True
    p.join(60)
    assert p.exitcode == 0
    with pytest.raises(RuntimeError):
        cond.wait(0.01)  # not holding the lock
    with pytest.raises(TypeError, match="needs a Lock or RLock"):
        manager.Condition(threading.Lock())


def test_manager_queue(manager):
    q = manager.Queue()
    p = fiber.Process(target=helpers.put_to, args=(q, "from child"))
    p.start()
    assert q.get(timeout=30) == "from child"
    p.join(30)


class MyManager(BaseManager):
    pass


MyManager.register("Counter", helpers.Counter)


def test_register_custom_class_methods_run_in_the_manager():
    with MyManager() as m:
        c = m.Counter(5)
        assert c.incr() == 6
        assert c.incr(4) == 10
        assert c.value() == 10
        with pytest.raises(ValueError, match="counter says no"):
            c.fail()
        with fiber.Pool(2) as pool:
            pool.map(_incr, [c] * 20)
        assert c.value() == 30


def _incr(counter):
    return counter.incr()


def test_async_manager_calls_return_results_to_wait_on():
    m = fiber.AsyncManager()
    m.start()
    d = m.dict()
    futures = [d.__setitem__(i, i * i) for i in range(50)]
    for f in futures:
        f.get(10)
    got = [d.get(i) for i in range(50)]
    assert [g.get(10) for g in got] == [i * i for i in range(50)]
    m.shutdown()


def test_manager_not_started_and_bad_use():
    m = BaseManager()
    with pytest.raises(RuntimeError, match="not started"):
        m._create_python(dict, (), {}, None, None)
    with pytest.raises(ValueError):
        BaseManager(address=("127.0.0.1", 5000))
