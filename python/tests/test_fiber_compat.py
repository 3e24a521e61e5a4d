"""Uber Fiber 0.2.1's names and behaviours in fiber (issue 25): the
fiber.config module and Fiber's .fiberconfig, Pool(error_handling=...),
fiber.queues.SimpleQueuePush/SimpleQueuePull, imap iterators that go on
after an item raises and take next(timeout), and a manager proxy stored
inside another managed object.  Fiber's own suite runs separately
(tests/python/fiber_suite.py)."""
import multiprocessing
import textwrap

import pytest

import compat_helpers
import fiber


@pytest.fixture(scope="module")
def pool():
    p = fiber.Pool(2)
    yield p
    p.terminate()


# ---- imap and imap_unordered ---------------------------------------------

def _drain(it):
    """Every item of it, an exception standing for the item that raised."""
    out = []
    while True:
        try:
            out.append(it.next(timeout=120))
        except StopIteration:
            return out
        except ValueError as e:
            out.append(("raised", str(e)))


def test_imap_raises_at_the_failed_item_and_goes_on(pool):
    it = pool.imap(compat_helpers.fail_on_three, range(6))
    assert _drain(it) == [0, 10, 20, ("raised", "three"), 40, 50]


def test_imap_with_chunks_raises_once_for_the_chunk_and_goes_on(pool):
    it = pool.imap(compat_helpers.fail_on_three, range(8), chunksize=2)
    assert _drain(it) == [0, 10, ("raised", "three"), 40, 50, 60, 70]


def test_imap_unordered_goes_on_after_an_item_raises(pool):
    got = _drain(pool.imap_unordered(compat_helpers.fail_on_three, range(6)))
    assert sorted(x for x in got if not isinstance(x, tuple)) == \
        [0, 10, 20, 40, 50]
    assert [x for x in got if isinstance(x, tuple)] == [("raised", "three")]


@pytest.mark.parametrize("method", ["imap", "imap_unordered"])
def test_imap_next_with_a_timeout(pool, method):
    it = getattr(pool, method)(compat_helpers.slow, [7])
    with pytest.raises(multiprocessing.TimeoutError):
        it.next(timeout=0.05)      # the task sleeps 3 s
    assert it.next(timeout=120) == 7   # the result was not lost
    with pytest.raises(StopIteration):
        it.next(timeout=120)
    assert iter(it) is it


# ---- Pool(error_handling=True) -------------------------------------------

@pytest.mark.local_only
def test_error_handling_runs_a_task_that_raised_again(tmp_path):
    paths = [str(tmp_path / n) for n in ("a", "b", "c")]
    with fiber.Pool(2, error_handling=True) as p:
        assert p.map(compat_helpers.fail_once, paths, chunksize=1) == \
            ["ok"] * 3
        assert p.stats()["workers_lost"] >= 3
    # Without it, as in multiprocessing, the exception reaches the caller.
    with fiber.Pool(1) as p:
        with pytest.raises(RuntimeError, match="first run"):
            p.apply(compat_helpers.fail_once, (str(tmp_path / "d"),))


def test_error_handling_gives_up_on_a_task_that_always_raises():
    with fiber.Pool(1, error_handling=True, max_task_crashes=2) as p:
        with pytest.raises(fiber.TaskCrashedError):
            p.apply(compat_helpers.always_fails, (1,))


# ---- SimpleQueuePush and SimpleQueuePull ---------------------------------

def test_simple_queue_push_deals_items_in_turn():
    q = fiber.queues.SimpleQueuePush()
    ready, out = fiber.Queue(), fiber.Queue()
    procs = [fiber.Process(target=compat_helpers.push_reader,
                           args=(q, ready, out, i)) for i in range(3)]
    for p in procs:
        p.start()
    assert sorted(ready.get(timeout=120) for _ in procs) == [0, 1, 2]
    for i in range(30):
        q.put(i)
    for _ in procs:
        q.put(None)
    counts = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(60)
    # Round robin among the connected readers, busy or not: 10 each.
    assert counts == {0: 10, 1: 10, 2: 10}


def test_simple_queue_push_from_jobs_to_the_master():
    q = fiber.queues.SimpleQueuePush()
    p = fiber.Process(target=compat_helpers.push_writer, args=(q, 5))
    p.start()
    assert [q.get(timeout=120) for _ in range(5)] == list(range(5))
    p.join(60)
    assert p.exitcode == 0


def test_simple_queue_pull_is_fibers_queue():
    q = fiber.queues.SimpleQueuePull()
    q.put("x")
    assert q.get(timeout=60) == "x"
    assert isinstance(q, fiber.SimpleQueue)


def test_simple_queue_reader_and_writer_ends():
    q_in, q_out = fiber.SimpleQueue(), fiber.SimpleQueue()
    p = fiber.Process(target=compat_helpers.through_ends,
                      args=(q_in, q_out, 3))
    p.start()
    for i in range(3):
        q_in.writer.send(i)
    assert [q_out.reader.recv() for _ in range(3)] == [0, 1, 2]
    p.join(60)
    assert p.exitcode == 0
    assert not q_out.reader.poll()
    with pytest.raises(OSError):
        q_out.reader.send(1)


# ---- a proxy inside another managed object -------------------------------

NESTED = """
import fiber

def bump(outer):
    outer[0]["n"] += 1
    outer[1].append("from a job")

if __name__ == "__main__":
    manager = fiber.Manager()
    outer = manager.list([manager.dict({"n": 1}), manager.list()])
    first = outer[0]
    first["a"] = 2
    p = fiber.Process(target=bump, args=(outer,))
    p.start()
    p.join(60)
    print(p.exitcode, sorted(outer[0].items()), list(outer[1]))
    # The multiprocessing docs' example, as written there.
    outer = manager.list([manager.dict() for i in range(3)])
    first_inner = outer[0]
    first_inner["a"] = 1
    first_inner["b"] = 2
    outer[1]["c"] = 3
    outer[2]["d"] = 4
    print(outer[0], outer[1], outer[2])
"""


def test_proxy_stored_inside_another_managed_object(script):
    r = script(NESTED, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "0 [('a', 2), ('n', 2)] ['from a job']",
        "{'a': 1, 'b': 2} {'c': 3} {'d': 4}"]


# ---- fiber.config and Fiber's .fiberconfig -------------------------------

CONFIG = """
import logging, fiber, fiber.config as fc
from fiber import _fiber
if __name__ == "__main__":  # a job imports this file again
    print("backend", fc.default_backend, fc.backend)
    print("file", fc.image, fc.log_level == logging.INFO, fc.kubernetes_namespace)
    fc.log_level = "warning"
    print("level", _fiber.config_get("log_level"), fc.log_level == logging.WARNING)
    fc.debug = True
    print("debug", _fiber.config_get("log_level"), fc.debug)
    import os
    fiber.init(default_image="other:1", log_file="logs/x.log")
    print("init", _fiber.config_get("image"), _fiber.config_get("log_file"),
          fc.log_file, sorted(os.listdir("logs")))
    q = fiber.SimpleQueue()
    p = fiber.Process(target=q.put, args=("from a job",), name="Logged-1")
    p.start()
    print("job", q.get(), end=" ")
    p.join()
    print(p.exitcode, sorted(os.listdir("logs")))
    fiber.init(log_file=None)      # Fiber's way back to the default
    print("log_file", repr(_fiber.config_get("log_file")), fc.log_file)
    fc.cpu_per_job = 2
    fc.mem_per_job = 512
    from fiber.process import _job_meta
    print("meta", _job_meta(print) == {"cpu": 2, "memory": 512, "gpu": 0})
    for key, value, err in [("ipc_active", False, NotImplementedError),
                            ("use_push_queue", False, NotImplementedError),
                            ("log_level", "loud", fiber.ConfigError),
                            ("bogus_key", 1, fiber.ConfigError)]:
        try:
            setattr(fc, key, value)
            print("accepted", key)
        except err as e:
            print("refused", key, type(e).__name__)
    fc.ipc_active = True
    fiber.reset()
    print("reset", _fiber.config_get("log_level"), _fiber.config_get("image"),
          fc.cpu_per_job)
    try:
        fc.no_such_key
    except AttributeError as e:
        print("unknown", "default_backend" in str(e))
"""


def test_fiber_config_reflects_and_sets_the_configuration(script, tmp_path):
    (tmp_path / ".fiberconfig").write_text(
        "[default]\nlog_level = info\ndefault_image = fiber-test:latest\n"
        "kubernetes_namespace = research\n")
    r = script(CONFIG, env={"FIBER_BACKEND": "local"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "backend local local",
        "file fiber-test:latest True research",
        "level warn True",
        "debug debug True",
        "init other:1 logs/x.log logs/x.log ['x.log.MainProcess']",
        "job from a job 0 ['x.log.Logged-1', 'x.log.MainProcess']",
        "log_file '' None",
        "meta True",
        "refused ipc_active NotImplementedError",
        "refused use_push_queue NotImplementedError",
        "refused log_level ConfigError",
        "refused bogus_key ConfigError",
        "reset info fiber-test:latest None",
        "unknown True",
    ]


def test_fiberconfig_refuses_fibers_keys_without_a_counterpart(script,
                                                                tmp_path):
    (tmp_path / ".fiberconfig").write_text("[default]\nipc_active = false\n")
    r = script("import fiber\nfiber.init()\n")
    assert r.returncode != 0
    assert "Uber Fiber's key 'ipc_active'" in r.stderr
    assert "always dial their master" in r.stderr


def test_fibers_pool_class_names():
    from fiber.pool import ResilientZPool, ZPool
    assert ZPool is fiber.Pool
    p = ResilientZPool(1)
    try:
        assert p._error_handling and isinstance(p, fiber.Pool)
    finally:
        p.terminate()
