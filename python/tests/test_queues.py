import gc
import os
import pickle
import queue
import time

import pytest

import fiber
import helpers


def test_queue_put_get_and_sizes():
    q = fiber.Queue(maxsize=2)
    assert q.empty() and q.qsize() == 0 and not q.full()
    q.put({"a": 1})
    q.put_nowait([1, 2])
    assert q.full() and q.qsize() == 2
    with pytest.raises(queue.Full):
        q.put_nowait(3)
    t0 = time.monotonic()
    with pytest.raises(queue.Full):
        q.put(3, timeout=0.1)
    assert time.monotonic() - t0 >= 0.08
    assert q.get() == {"a": 1}
    assert q.get_nowait() == [1, 2]
    with pytest.raises(queue.Empty):
        q.get_nowait()
    with pytest.raises(queue.Empty):
        q.get(timeout=0.05)
    with pytest.raises(queue.Empty):
        q.get(block=False)
    q.close()
    with pytest.raises(ValueError):
        q.put(1)


def test_put_and_get_in_c_take_multiprocessing_arguments():
    # An unbounded queue's put and get are the extension's (put_mp,
    # get_mp): the same arguments and errors as multiprocessing's.
    q = fiber.Queue()
    assert "put_mp" in repr(q.put) and "get_mp" in repr(q.get)
    q.put(1, True, None)
    q.put(2, block=False)
    q.put(obj=3, timeout=5)
    assert [q.get(), q.get(True, 1), q.get(timeout=1.5)] == [1, 2, 3]
    with pytest.raises(queue.Empty):
        q.get(False)
    with pytest.raises(queue.Empty):
        q.get(block=True, timeout=0)
    with pytest.raises(ValueError, match="non-negative"):
        q.get(timeout=-1)
    with pytest.raises(TypeError, match="unexpected keyword"):
        q.put(1, blok=False)
    with pytest.raises(TypeError, match="multiple values"):
        q.put(1, True, block=True)
    with pytest.raises(TypeError, match="at most"):
        q.get(True, 1, 2)
    with pytest.raises(TypeError, match="missing"):
        q.put(block=True)
    with pytest.raises(TypeError):
        q.get(timeout="soon")
    q.close()
    with pytest.raises(ValueError, match="closed"):
        q.put(1)
    with pytest.raises(ValueError, match="closed"):
        q.get()


def test_a_queues_bound_put_and_get_pickle():
    # Process(target=q.put, ...) pickles the bound method, as
    # multiprocessing's does; put and get are the extension's here.
    q = fiber.Queue()
    put = pickle.loads(pickle.dumps(q.put))
    get = pickle.loads(pickle.dumps(q.get))
    put("via a pickled put")
    assert q.get(timeout=5) == "via a pickled put"
    q.put(7)
    assert get(timeout=5) == 7
    with pytest.raises(queue.Empty):
        get(timeout=0.01)


def test_a_process_whose_target_is_a_queues_put():
    q = fiber.Queue()
    p = fiber.Process(target=q.put, args=("from a job",))
    p.start()
    p.join(60)
    assert p.exitcode == 0
    assert q.get(timeout=30) == "from a job"


class _CountingQueue(fiber.Queue):
    def __init__(self):
        super().__init__()
        self.puts = 0

    def put(self, obj, block=True, timeout=None):
        self.puts += 1
        super().put(obj, block, timeout)


def test_a_subclass_that_overrides_put_keeps_its_own():
    q = _CountingQueue()
    q.put("a")
    q.put("b", timeout=1)
    assert q.puts == 2
    assert [q.get(timeout=5), q.get(timeout=5)] == ["a", "b"]


def test_a_forked_child_cannot_use_an_inherited_queue():
    q = fiber.Queue()
    q.put(1)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            q.put(2)
            msg = b"no error"
        except RuntimeError as e:
            msg = str(e).encode()[:200]
        os.write(w, msg)
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        said = f.read()
    os.waitpid(pid, 0)
    assert b"forked from process" in said, said
    assert q.get(timeout=5) == 1


def test_queue_passes_to_processes_and_pool_tasks():
    q = fiber.Queue()
    ps = [fiber.Process(target=helpers.put_to, args=(q, i)) for i in range(4)]
    for p in ps:
        p.start()
    got = sorted(q.get(timeout=30) for _ in ps)
    for p in ps:
        p.join(30)
    assert got == [0, 1, 2, 3]
    with fiber.Pool(2) as pool:
        pool.starmap(helpers.put_to, [(q, "x%d" % i) for i in range(10)])
    assert sorted(q.get(timeout=10) for _ in range(10)) == \
        sorted("x%d" % i for i in range(10))


def test_simple_queue():
    q = fiber.SimpleQueue()
    assert q.empty()
    q.put(("t", 1))
    assert not q.empty()
    assert q.get() == ("t", 1)


def test_pipe_duplex_with_a_child():
    a, b = fiber.Pipe()
    p = fiber.Process(target=helpers.echo_pipe, args=(b,))
    p.start()
    for msg in ("hi", 2, [3]):
        a.send(msg)
        assert a.recv() == ("echo", msg)
    a.send(None)
    p.join(30)
    assert p.exitcode == 0


def test_pipe_bytes_poll_and_eof():
    r, w = fiber.Pipe(duplex=False)
    assert r.readable and not r.writable and w.writable and not w.readable
    assert not r.poll(0.05)
    w.send_bytes(b"hello world", 6, 5)
    assert r.poll(5)
    assert r.recv_bytes() == b"world"
    w.send_bytes(b"abc")
    buf = bytearray(5)
    assert r.recv_bytes_into(buf, 1) == 3 and bytes(buf) == b"\0abc\0"
    # Too long for the buffer: BufferTooShort carries the whole message,
    # which is consumed (as in multiprocessing); bad offsets are refused
    # before anything is read.
    w.send_bytes(b"0123456789")
    w.send_bytes(b"next")
    with pytest.raises(ValueError, match="negative offset"):
        r.recv_bytes_into(buf, -1)
    with pytest.raises(ValueError, match="offset too large"):
        r.recv_bytes_into(buf, 6)
    with pytest.raises(fiber.BufferTooShort) as short:
        r.recv_bytes_into(buf, 2)
    assert short.value.args[0] == b"0123456789"
    assert r.recv_bytes_into(buf) == 4 and bytes(buf[:4]) == b"next"
    w.send(b"x" * 10)
    with pytest.raises(OSError, match="bad message length"):
        r.recv_bytes(maxlength=4)
    with pytest.raises(OSError):
        w.recv()
    w.close()
    with pytest.raises(EOFError):
        r.recv()
    with pytest.raises(OSError):
        w.send(1)


def _rss_kib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * (os.sysconf("SC_PAGESIZE") // 1024)


def test_a_queue_never_pickled_is_freed_with_its_object():
    """A Queue whose handle never left this process is freed on the server
    when it is garbage-collected; one that was pickled stays (its copies may
    live in children).  Each queue holds a 16 KiB message when dropped: 3,000
    leaked would be 48 MiB, 30 times the bound."""
    big = b"x" * 16384

    def one(pickled):
        q = fiber.Queue()
        q.put(big)
        q.put(big)
        q.get(timeout=10)
        if pickled:
            pickle.dumps(q)

    for _ in range(300):  # warm up: arenas, the server's first queues
        one(False)
    gc.collect()
    before = _rss_kib()
    for _ in range(3000):
        one(False)
    gc.collect()
    grew = _rss_kib() - before
    assert grew < 1536, "RSS grew %d KiB over 3000 freed queues" % grew
    # The control: pickled ones are only detached, and must show.
    before = _rss_kib()
    for _ in range(300):
        one(True)
    gc.collect()
    kept = _rss_kib() - before
    assert kept > 300 * 16384 // 1024 // 2, "RSS grew only %d KiB" % kept


def test_a_pickled_queue_outlives_the_masters_object():
    q = fiber.Queue()
    q.put("still here")
    data = pickle.dumps(q)
    del q
    gc.collect()
    again = pickle.loads(data)
    assert again.get(timeout=10) == "still here"
