"""fiber.experimental.Ring: Fiber's Ring API over the C core's rings."""
import pytest

import fiber
from fiber.experimental import Ring
from fiber.experimental import ring as fring

COLLECTIVES = r'''
import sys
import numpy as np
import fiber
from fiber.experimental import Ring
from fiber.experimental import ring as fring

def member(rank, size):
    r = fring.current()
    assert r.rank == rank and r.size == size == 4
    # sum, mean and max of float32 and float64 arrays, in place
    a = np.arange(100000, dtype=np.float32) * (rank + 1)
    assert fring.allreduce(a, op="sum") is a
    assert np.array_equal(a, np.arange(100000, dtype=np.float32) * 10)
    b = np.full((3, 5), float(rank), dtype=np.float64)
    r.allreduce(b, op="mean")
    assert np.all(b == 1.5), b
    c = np.array([rank, -rank, 7.0], dtype=np.float64)
    r.allreduce(c, op="max")
    assert list(c) == [3.0, 0.0, 7.0], c
    # broadcast of raw bytes from rank 2
    buf = bytearray(b"member %d" % rank)
    r.broadcast(buf, root=2)
    assert bytes(buf) == b"member 2", buf
    # a buffer a ring cannot reduce is refused, and the ring goes on
    try:
        r.allreduce(np.zeros(4, dtype=np.int32))
    except TypeError as e:
        assert "float32" in str(e), e
    else:
        raise AssertionError("int32 accepted")
    try:
        r.allreduce(np.zeros(4, dtype=np.float32), op="median")
    except ValueError as e:
        assert "median" in str(e)
    else:
        raise AssertionError("op median accepted")
    d = np.ones(8, dtype=np.float32)
    r.allreduce(d)
    assert np.all(d == 4)
    # every node was filled in before the ring formed
    nodes = list(r.members)
    assert [n.rank for n in nodes] == [0, 1, 2, 3], nodes
    assert all(n.connected and n.ip == "127.0.0.1" and 0 < n.port < 65536
               for n in nodes), nodes
    print("member %d ok" % rank, flush=True)

def init(ring):
    assert fring.current() is ring
    print("init %d" % ring.rank, flush=True)

if __name__ == "__main__":
    Ring(4, member, initializer=init).run(timeout=120)
    print("run ok")
'''


def test_allreduce_broadcast_and_members_on_four_members(script):
    r = script(COLLECTIVES, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "run ok" in r.stdout, r.stdout + r.stderr


DEATH = r'''
import functools, os, time
import numpy as np
import fiber
from fiber.experimental import Ring
from fiber.experimental import ring as fring

def member(q, rank, size):
    a = np.ones(1 << 16, dtype=np.float32)
    fring.allreduce(a)                      # all four take part
    if rank == 1:
        os._exit(9)                         # dies before the second
    try:
        fring.allreduce(a, timeout=60)
    except Exception as e:
        q.put("rank %d: %s: %s" % (rank, type(e).__name__, e))
        raise SystemExit(3)
    q.put("rank %d: second allreduce returned" % rank)

if __name__ == "__main__":
    # The members report through a queue: on Slurm or Kubernetes a job's
    # output is not the master's.
    q = fiber.SimpleQueue()
    t0 = time.monotonic()
    try:
        Ring(4, functools.partial(member, q), members=False).run(timeout=120)
    except RuntimeError as e:
        print("run:", e)
    for _ in range(3):
        print(q.get())
    print("took %.1f s" % (time.monotonic() - t0))
'''


def test_a_member_that_dies_fails_the_others_instead_of_hanging(script):
    r = script(DEATH, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    # every survivor's call failed with the ring's error, none returned
    assert "second allreduce returned" not in out, out
    for rank in (0, 2, 3):
        assert "rank %d: ClosedError" % rank in out or \
            "rank %d: FiberTimeoutError" % rank in out, out
    assert "run: ring members failed: 0 (exit code 3), 1 (exit code 9), " \
        "2 (exit code 3), 3 (exit code 3)" in out, out


def test_bad_arguments_are_refused_in_the_master():
    with pytest.raises(ValueError, match="at least 1 member"):
        Ring(0, print)
    with pytest.raises(TypeError, match="int"):
        Ring("4", print)
    with pytest.raises(TypeError, match="callable"):
        Ring(2, 42)
    ring = Ring(2, print, members=False)
    with pytest.raises(ValueError, match="not a member"):
        ring.allreduce(bytearray(8))
    with pytest.raises(ValueError, match="not inside a ring member"):
        fring.allreduce(bytearray(8))
    assert fring.current() is None


def test_a_ring_pickles_without_its_creator_handle():
    import pickle
    ring = Ring(3, fiber.cpu_count, members=False)
    copy = pickle.loads(pickle.dumps(ring))
    assert copy.size == 3 and copy._creator is None and copy._member is None
    assert copy._ser == ring._ser
