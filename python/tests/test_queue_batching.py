"""fiber.Queue's send buffer (python/src/queue.c): puts on an unbounded
queue gather in the binding and cross into C in batches.  These cases
check what must hold whatever the batching does: nothing lost, order per
producer, a lone put (and the tail of a burst) visible without any flush
or exit, a producer that returns at once delivers everything, maxsize
still blocks, and a consumer killed mid-stream loses only what its gets
returned (docs/python.md, "Queues")."""
import pickle
import queue
import threading
import time

import pytest

import fiber
import helpers
from conftest import BACKEND


def _check_per_producer_order(items):
    last = {}
    for ident, i in items:
        assert i > last.get(ident, -1), \
            "producer %r: %d came after %d" % (ident, i, last[ident])
        last[ident] = i


def test_one_producer_order_and_nothing_lost():
    q = fiber.Queue()
    n = 20000
    p = fiber.Process(target=helpers.put_numbered, args=(q, "a", n))
    p.start()
    got = [q.get(timeout=30) for _ in range(n)]
    p.join(30)
    assert p.exitcode == 0
    assert got == [("a", i) for i in range(n)]
    with pytest.raises(queue.Empty):
        q.get(timeout=0.2)


def test_several_producers_and_consumers_order_per_producer():
    q, out = fiber.Queue(), fiber.Queue()
    producers, consumers, n = 3, 3, 4000
    ps = [fiber.Process(target=helpers.put_numbered, args=(q, j, n))
          for j in range(producers)]
    cs = [fiber.Process(target=helpers.get_all_until_none, args=(q, out))
          for _ in range(consumers)]
    for p in ps + cs:
        p.start()
    for p in ps:
        p.join(60)
        assert p.exitcode == 0
    for _ in cs:
        q.put(None)
    lists = [out.get(timeout=60) for _ in cs]
    for c in cs:
        c.join(60)
        assert c.exitcode == 0
    for got in lists:
        _check_per_producer_order(got)
    everything = sorted(item for got in lists for item in got)
    assert everything == sorted((j, i) for j in range(producers)
                                for i in range(n))


def test_threads_of_one_process_keep_their_own_order():
    # several threads fill one handle's send buffer at once: batches
    # must neither overflow nor mix up a thread's order
    q = fiber.Queue()
    n, threads = 10000, 4
    ts = [threading.Thread(target=helpers.put_numbered, args=(q, t, n))
          for t in range(threads)]
    for t in ts:
        t.start()
    got = [q.get(timeout=30) for _ in range(threads * n)]
    for t in ts:
        t.join()
    _check_per_producer_order(got)
    assert sorted(got) == sorted((t, i) for t in range(threads)
                                 for i in range(n))


def test_a_lone_put_is_seen_without_a_flush_or_an_exit():
    q = fiber.Queue()
    # the child puts once and stays alive: only the put itself (or the
    # send buffer's own flushing) can make the item visible
    p = fiber.Process(target=helpers.put_numbered, args=(q, "lone", 1, 30))
    p.start()
    try:
        assert q.get(timeout=30) == ("lone", 0)
    finally:
        p.terminate()
        p.join(30)


def test_the_tail_of_a_burst_is_seen_without_a_flush_or_an_exit():
    q = fiber.Queue()
    n = 3001   # not a multiple of any batch size
    p = fiber.Process(target=helpers.put_numbered, args=(q, "b", n, 30))
    p.start()
    try:
        got = [q.get(timeout=30) for _ in range(n)]
        assert got == [("b", i) for i in range(n)]
    finally:
        p.terminate()
        p.join(30)


def test_in_one_process_a_get_sees_the_puts_before_it():
    q = fiber.Queue()
    for i in range(1000):
        q.put(i)
        assert q.get(timeout=5) == i
    for i in range(1000):
        q.put(i)
    assert q.qsize() == 1000 and not q.empty()
    assert [q.get(timeout=5) for _ in range(1000)] == list(range(1000))


def test_a_producer_that_returns_at_once_loses_nothing():
    q = fiber.Queue()
    n = 5001
    p = fiber.Process(target=helpers.put_numbered, args=(q, "x", n))
    p.start()
    p.join(60)
    assert p.exitcode == 0
    # joined: everything it put is in the queue already
    assert q.qsize() == n
    assert [q.get(timeout=5) for _ in range(n)] == [("x", i)
                                                   for i in range(n)]


def test_pool_tasks_puts_are_in_the_queue_when_the_task_is_done():
    q = fiber.Queue()
    with fiber.Pool(2) as pool:
        pool.starmap(helpers.put_numbered, [(q, j, 300) for j in range(4)])
        # the tasks returned: their puts were handed over before that
        assert q.qsize() == 1200
    got = [q.get(timeout=5) for _ in range(1200)]
    _check_per_producer_order(got)


def test_maxsize_blocks_a_producer_process():
    q, out = fiber.Queue(maxsize=2), fiber.Queue()
    p = fiber.Process(target=helpers.put_each_then_report,
                      args=(q, list(range(6)), out))
    p.start()
    try:
        # the producer fills the queue and then blocks in put
        deadline = time.monotonic() + 30
        while q.qsize() < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        assert q.qsize() == 2 and q.full()
        with pytest.raises(queue.Empty):
            out.get(timeout=0.5)
        assert [q.get(timeout=30) for _ in range(6)] == list(range(6))
        assert out.get(timeout=30) == "all put"
    finally:
        p.join(30)
    assert p.exitcode == 0


def test_an_unpicklable_object_raises_in_put():
    q = fiber.Queue()
    q.put(1)
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        q.put(lambda: 0)
    with pytest.raises(TypeError):
        q.put(threading.Lock())
    q.put(2)
    # what was put around the failures is there, in order
    assert [q.get(timeout=5), q.get(timeout=5)] == [1, 2]


def test_a_killed_consumer_loses_only_what_its_gets_returned():
    q, out = fiber.Queue(), fiber.Queue()
    n, k = 2000, 10
    for i in range(n):
        q.put(i)
    c = fiber.Process(target=helpers.take_some_then_hang, args=(q, k, out))
    c.start()
    taken = out.get(timeout=60)
    assert taken == list(range(k))
    # it holds prefetched items it never returned; killing it gives them
    # back to the queue, in their order
    c.kill()
    c.join(30)
    rest = [q.get(timeout=30) for _ in range(n - k)]
    if BACKEND == "local":
        # its process is gone when join returns: the items are back at
        # the front, in order
        assert rest == list(range(k, n))
    else:
        # a pod's container can stop after join reported the job ended
        # (python.kubernetes: items 10..63 came back after 64..1999);
        # none is lost
        assert sorted(rest) == list(range(k, n))
    with pytest.raises(queue.Empty):
        q.get(timeout=0.2)


def test_join_thread_and_cancel_join_thread():
    q = fiber.Queue()
    with pytest.raises(AssertionError):
        q.join_thread()          # as multiprocessing: close() first
    q.put("before close")
    q.cancel_join_thread()
    q.close()
    q.join_thread()
    with pytest.raises(ValueError):
        q.put("after close")


def test_bad_timeouts_are_refused():
    q = fiber.Queue()
    with pytest.raises(ValueError):
        q.put(1, timeout=-1)
    with pytest.raises(ValueError):
        q.get(timeout=-1)
    # The extension's own put and get, which fiber.Queue's methods call.
    with pytest.raises(ValueError):
        q._q.get_mp(True, -5)
    with pytest.raises(TypeError):
        q._q.put_mp()
