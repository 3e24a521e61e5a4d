"""fiber.connection: multiprocessing.connection's names; wait() over fiber
Pipe ends, SimpleQueue readers, sentinels and anything multiprocessing's
wait takes."""
import multiprocessing.connection as mpc
import time

import pytest

import fiber
import fiber.connection as fc
import helpers


def test_wait_collects_every_message_and_each_end_of_stream():
    """The multiprocessing docs' example: four children each send ten
    messages and close; the master waits on the four readers until each
    has reported its end (EOFError)."""
    readers, procs = [], []
    for k in range(4):
        r, w = fiber.Pipe(duplex=False)
        p = fiber.Process(target=helpers.send_then_close,
                          args=(w, 10, 0.2 * k))
        p.start()
        w.close()
        readers.append(r)
        procs.append(p)
    got, ended = [], 0
    deadline = time.monotonic() + 120
    while readers and time.monotonic() < deadline:
        for r in fc.wait(readers, timeout=10):
            try:
                got.append(r.recv())
            except EOFError:
                readers.remove(r)
                ended += 1
    for p in procs:
        p.join(60)
    assert ended == 4 and not readers
    assert sorted(i for i, _ in got) == sorted(list(range(10)) * 4)
    assert len({name for _, name in got}) == 4


def test_wait_times_out_with_an_empty_list():
    r, w = fiber.Pipe(duplex=False)
    t0 = time.monotonic()
    assert fc.wait([r], timeout=0.3) == []
    took = time.monotonic() - t0
    assert 0.25 <= took < 5, took
    w.send("x")
    assert fc.wait([r], timeout=30) == [r]
    assert r.recv() == "x"
    assert fc.wait([r], timeout=0) == []


def test_wait_mixes_fiber_ends_sentinels_and_multiprocessing_objects():
    a, b = fiber.Pipe()
    q = fiber.SimpleQueue()
    mp_r, mp_w = mpc.Pipe(duplex=False)
    p = fiber.Process(target=helpers.sleep_then, args=(None, 0.5))
    p.start()
    reader = q.reader
    objs = [a, reader, mp_r, p.sentinel]
    assert fc.wait(objs, timeout=0) == []
    mp_w.send("mp")
    assert fc.wait(objs, timeout=30) == [mp_r]
    assert mp_r.recv() == "mp"
    q.put("queued")
    assert fc.wait(objs, timeout=30) == [reader]
    assert reader.recv() == "queued"
    b.send("piped")
    assert fc.wait(objs, timeout=30) == [a]
    assert a.recv() == "piped"
    assert fc.wait(objs, timeout=60) == [p.sentinel]
    p.join(30)


def test_multiprocessings_own_names():
    assert fc.Listener is mpc.Listener and fc.Client is mpc.Client
    assert isinstance(fc.Pipe()[0], fc.Connection)
    # multiprocessing's own wait cannot take a fiber end: it says why.
    r, _ = fiber.Pipe(duplex=False)
    with pytest.raises(OSError, match="no file descriptor"):
        mpc.wait([r], timeout=0)


def test_wait_refuses_what_cannot_be_waited_on():
    """As multiprocessing's wait: a closed end, a writing end and an object
    that is neither an end nor a file raise, naming the problem."""
    r, w = fiber.Pipe(duplex=False)
    with pytest.raises(OSError, match="write-only"):
        fc.wait([w], timeout=0)
    with pytest.raises(ValueError, match="Invalid file object"):
        fc.wait([r, object()], timeout=0)
    r.close()
    with pytest.raises(OSError, match="closed"):
        fc.wait([r], timeout=0)
