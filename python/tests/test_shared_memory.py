"""fiber.shared_memory and fiber.dummy: multiprocessing's modules of the
same names, for programs that change only their import.

A multiprocessing child shares its parent's resource tracker; a fiber job
has its own, which unlinked the master's block as soon as a job that had
only opened it ended (Python < 3.13).  These cases fail that way without
fiber.shared_memory.untrack_in_job."""
import os
import time

import pytest

import fiber
import fiber.dummy
import helpers
from fiber import shared_memory
from conftest import BACKEND


def _exists(name):
    return os.path.exists("/dev/shm/" + name.lstrip("/"))


@pytest.mark.local_only
def test_a_block_outlives_the_jobs_that_opened_it():
    shm = shared_memory.SharedMemory(create=True, size=16)
    try:
        shm.buf[:16] = bytes(16)
        for i in range(3):
            p = fiber.Process(target=helpers.shm_write,
                              args=(shm.name, i, 10 + i))
            p.start()
            p.join(30)
            assert p.exitcode == 0
            # The job's tracker (if it tracked the block) unlinks it when
            # the job's end closes its pipe: give it that moment.
            time.sleep(0.3)
            assert _exists(shm.name), "job %d's end unlinked the block" % i
        assert bytes(shm.buf[:4]) == bytes([10, 11, 12, 0])
    finally:
        shm.close()
        shm.unlink()          # raised FileNotFoundError before the fix
    assert not _exists(shm.name)


@pytest.mark.local_only
def test_pool_workers_open_the_block_and_leave_it():
    shm = shared_memory.SharedMemory(create=True, size=32)
    try:
        shm.buf[:32] = bytes(32)
        for _ in range(2):      # the second pool after the first's workers ended
            with fiber.Pool(2) as pool:
                got = pool.starmap(helpers.shm_write,
                                   [(shm.name, i, i + 1) for i in range(32)])
            pool.join()
            assert got == list(range(32))
            time.sleep(0.3)
            assert _exists(shm.name)
        assert bytes(shm.buf[:32]) == bytes(range(1, 33))
    finally:
        shm.close()
        shm.unlink()


@pytest.mark.local_only
def test_a_block_a_job_created_is_the_masters_after_the_job_ended():
    q = fiber.SimpleQueue()
    p = fiber.Process(target=helpers.shm_create_and_send,
                      args=(q, b"made in a job"))
    p.start()
    name = q.get()
    p.join(30)
    assert p.exitcode == 0
    time.sleep(0.3)
    shm = shared_memory.SharedMemory(name=name)
    try:
        assert bytes(shm.buf[:13]) == b"made in a job"
    finally:
        shm.close()
        shm.unlink()


@pytest.mark.local_only
def test_shareable_list_across_a_job():
    sl = shared_memory.ShareableList([1, 2, 3])
    try:
        p = fiber.Process(target=helpers.shareable_list_bump,
                          args=(sl.shm.name,))
        p.start()
        p.join(30)
        assert p.exitcode == 0
        time.sleep(0.3)
        assert list(sl) == [2, 3, 4]
    finally:
        sl.shm.close()
        sl.shm.unlink()


def test_a_missing_block_is_named_on_every_backend():
    name = "fiber-test-no-such-block-%d" % os.getpid()
    with fiber.Pool(1) as pool:
        msg = pool.apply(helpers.shm_open_error, (name,))
    assert msg is not None and name in msg
    if BACKEND == "local":
        assert "No such file" in msg
    else:
        assert ("runs on the %s backend" % BACKEND) in msg
        assert "fiber.put()" in msg


def test_no_leak_warnings_and_nothing_left(script):
    r = script(
        "import fiber, helpers\n"
        "from multiprocessing import shared_memory\n"   # an unchanged import
        "if __name__ == '__main__':\n"
        "    shm = shared_memory.SharedMemory(create=True, size=8)\n"
        "    with fiber.Pool(2) as p:\n"
        "        p.starmap(helpers.shm_write, [(shm.name, i, 7) for i in range(8)])\n"
        "    p.join()\n"
        "    print(bytes(shm.buf[:8]).hex(), shm.name)\n"
        "    shm.close(); shm.unlink()\n")
    assert r.returncode == 0, r.stderr
    data, name = r.stdout.split()
    assert data == "07" * 8
    assert "leaked shared_memory" not in r.stderr, r.stderr
    assert "resource_tracker" not in r.stderr, r.stderr
    assert not _exists(name)


def test_dummy_is_multiprocessings_thread_pool():
    import multiprocessing.dummy
    assert fiber.dummy.Pool is multiprocessing.dummy.Pool
    assert set(multiprocessing.dummy.__all__) <= set(dir(fiber.dummy))
    with fiber.dummy.Pool(3) as pool:
        # threads of this process: every task sees this process's pid
        assert set(pool.map(lambda _: os.getpid(), range(12))) == {os.getpid()}


@pytest.mark.local_only
def test_shared_memory_manager_unlinks_its_blocks_at_shutdown():
    from fiber.managers import SharedMemoryManager
    with SharedMemoryManager() as smm:
        shm = smm.SharedMemory(8)
        sl = smm.ShareableList([5, 6])
        shm.buf[:8] = bytes(8)
        p = fiber.Process(target=helpers.shm_write, args=(shm.name, 3, 99))
        p.start()
        p.join(30)
        assert p.exitcode == 0
        time.sleep(0.3)
        assert shm.buf[3] == 99
        names = [shm.name, sl.shm.name]
        assert all(_exists(n) for n in names)
    assert not any(_exists(n) for n in names)
    with pytest.raises(RuntimeError, match="not started"):
        SharedMemoryManager().SharedMemory(8)
