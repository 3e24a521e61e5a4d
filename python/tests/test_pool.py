import functools
import itertools
import multiprocessing
import os
import random
import signal
import socket
import threading
import time

import pytest

import fiber
import helpers


@pytest.fixture(scope="module")
def pool():
    p = fiber.Pool(2)
    yield p
    p.terminate()


def test_automatic_chunks_keep_order_and_errors(pool):
    assert pool.map(helpers.square, range(1001)) == [x * x for x in range(1001)]
    assert pool.map(helpers.square, iter(range(10))) == \
        [x * x for x in range(10)]
    with pytest.raises(ValueError, match="three"):
        pool.map(helpers.boom, ["three"] * 50)


def test_map_starmap_apply(pool):
    assert pool.map(helpers.square, range(100)) == [x * x for x in range(100)]
    assert pool.map(helpers.square, []) == []
    assert pool.starmap(helpers.add, [(1, 2), (3, 4)]) == [3, 7]
    assert pool.apply(helpers.kw, (1,), {"b": 2, "c": 3}) == (1, 2, 3)
    assert pool.map(helpers.square, range(50), chunksize=7) == \
        [x * x for x in range(50)]


def test_imap_in_order_and_unordered(pool):
    assert list(pool.imap(helpers.square, range(300))) == \
        [x * x for x in range(300)]
    assert list(pool.imap(helpers.square, range(30), chunksize=4)) == \
        [x * x for x in range(30)]
    got = list(pool.imap_unordered(helpers.square, range(300)))
    assert sorted(got) == sorted(x * x for x in range(300))
    got = list(pool.imap_unordered(helpers.square, range(30), chunksize=4))
    assert sorted(got) == sorted(x * x for x in range(30))


def test_imap_unordered_yields_what_finished_before_a_slow_first_item():
    # Tasks of 0.2 s and more: the pool has measured them long, so each
    # worker holds one at a time, and the slow first item (3 s) runs on one
    # worker while the other runs the rest.  The iterating thread takes
    # whichever task of its window finished: those come out before it.
    with fiber.Pool(2) as p:
        assert p.wait_until_workers_up(timeout=600)
        p.starmap(helpers.sleep_then, [(0, 0.3), (1, 0.3)], 1)
        got = list(p.imap_unordered(helpers.slow_on_zero, range(5)))
    assert sorted(got) == list(range(5))
    assert got[0] != 0 and got[-1] == 0, got


def test_apply_async_results_are_independent(pool):
    it = pool.imap_unordered(helpers.square, [3])
    assert list(it) == [9]
    # A slow task and a fast one: each result arrives when its own task is
    # done (which worker runs which is the pool's choice, so no order is
    # asserted).
    res = [pool.apply_async(helpers.sleep_then, (i, 0.5 if i == 0 else 0))
           for i in range(2)]
    assert res[1].get(10) == 1
    assert res[0].get(10) == 0
    assert res[0].ready() and res[1].ready()


def test_apply_async_callbacks_run_off_the_callers_thread(pool):
    got, errors, threads = [], [], []
    done = threading.Event()

    def cb(v):
        got.append(v)
        threads.append(threading.current_thread())
        if len(got) == 10:
            done.set()

    rs = [pool.apply_async(helpers.square, (i,), callback=cb) for i in range(10)]
    assert [r.get(10) for r in rs] == [i * i for i in range(10)]
    assert done.wait(10)
    assert sorted(got) == [i * i for i in range(10)]
    assert threading.current_thread() not in threads
    r = pool.apply_async(helpers.boom, ("bad",), error_callback=errors.append)
    with pytest.raises(ValueError, match="bad"):
        r.get(10)
    assert len(errors) == 1 and isinstance(errors[0], ValueError)
    assert r.ready() and not r.successful()


def test_map_async_and_callback(pool):
    box = []
    r = pool.map_async(helpers.square, range(10), callback=box.append)
    assert r.get(10) == [i * i for i in range(10)]
    r.wait(5)
    assert box == [[i * i for i in range(10)]]
    assert pool.starmap_async(helpers.add, [(1, 1)]).get(10) == [2]


def test_every_callback_runs_on_the_one_callback_thread(pool):
    """apply_async's, map_async's and starmap_async's callbacks and
    error_callbacks all run on the pool's one callback thread (as on
    multiprocessing's result handler), one at a time; no thread is started
    per map."""
    seen, lock = [], threading.Lock()
    before = set(threading.enumerate())

    def note(kind):
        def cb(v):
            with lock:
                seen.append((kind, v, threading.current_thread()))
        return cb

    maps = [pool.map_async(helpers.square, range(20), callback=note("map"))
            for _ in range(4)]
    bad = pool.map_async(helpers.boom, ["m"], error_callback=note("merr"))
    star = pool.starmap_async(helpers.add, [(1, 2)], callback=note("star"))
    applies = [pool.apply_async(helpers.square, (i,), callback=note("apply"))
               for i in range(10)]
    for r in maps + [star] + applies:
        r.get(20)
    with pytest.raises(ValueError, match="m"):
        bad.get(20)
    for r in maps + [bad, star] + applies:
        r.wait(20)
    assert len(seen) == 16
    threads = {t for _, _, t in seen}
    assert len(threads) == 1
    (thread,) = threads
    assert thread.name == "fiber-pool-callbacks"
    assert thread is not threading.current_thread()
    assert [v for k, v, _ in seen if k == "map"] == \
        [[i * i for i in range(20)]] * 4
    assert [type(v) for k, v, _ in seen if k == "merr"] == [ValueError]
    assert [v for k, v, _ in seen if k == "star"] == [[3]]
    started = set(threading.enumerate()) - before - {thread}
    assert not [t for t in started if "callback" in t.name]


def test_apply_async_callbacks_come_in_completion_order(pool):
    """As multiprocessing's: a task that finishes first has its callback
    run first, whatever the order of submission."""
    order, done = [], threading.Event()

    def cb(v):
        order.append(v)
        if len(order) == 2:
            done.set()

    pool.apply_async(helpers.sleep_then, ("slow", 1.0), callback=cb)
    pool.apply_async(helpers.sleep_then, ("fast", 0), callback=cb)
    assert done.wait(20)
    assert order == ["fast", "slow"]


def test_get_timeout_raises_multiprocessing_timeout(pool):
    r = pool.apply_async(helpers.sleep_then, (1, 1.0))
    with pytest.raises(multiprocessing.TimeoutError):
        r.get(0.05)
    assert not r.ready()
    with pytest.raises(ValueError):
        r.successful()
    assert r.get(10) == 1
    assert r.successful()


def test_task_error_fails_only_its_own_result(pool):
    rs = [pool.apply_async(helpers.boom if i == 3 else helpers.square,
                           ("three",) if i == 3 else (i,)) for i in range(6)]
    for i, r in enumerate(rs):
        if i == 3:
            with pytest.raises(ValueError) as e:
                r.get(10)
            assert str(e.value) == "three"
            assert "helpers.py" in str(e.value.__cause__)
            assert "boom" in str(e.value.__cause__)
        else:
            assert r.get(10) == i * i
    with pytest.raises(helpers.CustomError) as e:
        pool.apply(helpers.custom_boom, (7,))
    assert e.value.code == 7 and e.value.text == "custom 7"
    with pytest.raises(ValueError, match="three"):
        pool.map(helpers.boom, ["three"])


def test_unpicklable_argument_and_result_name_the_task(pool):
    with pytest.raises(fiber.PicklingError, match="square"):
        pool.apply(helpers.square, (threading.Lock(),))
    with pytest.raises(fiber.PicklingError, match="unpicklable_result"):
        pool.apply(helpers.unpicklable_result, (1,))
    assert pool.apply(helpers.square, (3,)) == 9  # the pool is fine


def test_function_the_worker_cannot_import(script):
    r = script('''
import fiber, sys, types
if __name__ == "__main__":
    mod = types.ModuleType("only_in_master")   # not in the jobs
    exec("def f(x):\\n    return x", mod.__dict__)
    mod.f.__module__ = "only_in_master"
    sys.modules["only_in_master"] = mod
    with fiber.Pool(1) as pool:
        try:
            pool.apply(mod.f, (1,))
        except Exception as e:
            print(type(e).__name__, e)
''')
    assert r.returncode == 0, r.stderr
    assert "PicklingError" in r.stdout
    assert "only_in_master" in r.stdout
    assert "cannot load the task's function" in r.stdout


def test_a_program_read_from_standard_input(script):
    # `python - < prog.py`: __main__ has no file (its __file__ is
    # "<stdin>").  Jobs must not try to run it again (a traceback on
    # every job's stderr); functions from modules work, and one defined
    # in that __main__ fails with an error that says why.
    r = script('''
import os, fiber
def sq(x):
    return x * x
if __name__ == "__main__":
    with fiber.Pool(2) as pool:
        print(sorted(pool.map(abs, [-1, -2, 3])))
        try:
            pool.map(sq, [1, 2])
        except Exception as e:
            print(type(e).__name__, e)
''', from_stdin=True)
    assert r.returncode == 0, r.stderr
    assert "[1, 2, 3]" in r.stdout
    assert "PicklingError" in r.stdout
    assert "has no file to run here" in r.stdout
    assert "cannot import the program's main module" not in r.stderr
    assert "<stdin>" not in r.stderr


def test_function_defined_under_the_main_guard(script):
    r = script('''
import fiber
if __name__ == "__main__":
    def sq(x):
        return x * x
    with fiber.Pool(1) as pool:
        try:
            pool.map(sq, [1, 2])
        except Exception as e:
            print(type(e).__name__, e)
''')
    assert r.returncode == 0, r.stderr
    assert "PicklingError" in r.stdout
    assert "top level of the script" in r.stdout


def test_numpy_arrays_round_trip_out_of_band(pool):
    np = pytest.importorskip("numpy")
    a = np.arange(1 << 18, dtype=np.float64)   # 2 MiB: out of band
    assert pool.apply(helpers.numpy_sum, (a,)) == float(a.sum())
    b = pool.apply(helpers.numpy_double, (a,))
    assert b.dtype == a.dtype and (b == a * 2).all()
    b += 1                                       # results are writable
    small = np.arange(10)
    assert (pool.apply(helpers.numpy_double, (small,)) == small * 2).all()


def test_map_sends_out_of_band_buffers_without_joining_them(pool):
    # map's payloads of numpy arrays (and bytearrays) of 64 KiB and more
    # leave as parts (the pickle, then each buffer), sent back to back:
    # every buffer, several in one task among them, reaches its task whole
    # and in order, with chunksize 1, automatic chunks and starmap.
    np = pytest.importorskip("numpy")
    arrays = [np.arange(i, i + 20000 + 3 * i, dtype=np.float64)
              for i in range(40)]
    want = [helpers.numpy_double(a) for a in arrays]
    for chunksize in (1, None):
        got = pool.map(helpers.numpy_double, arrays, chunksize)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and np.array_equal(g, w)
    pairs = [(a, bytearray(a.tobytes()[::-1])) for a in arrays[:10]]
    got = pool.starmap(helpers.array_and_bytes_digest, pairs)
    assert got == [helpers.array_and_bytes_digest(a, b) for a, b in pairs]
    # A Fortran-ordered array and a non-contiguous view (pickled in band).
    f = np.asfortranarray(np.arange(300 * 200, dtype=np.int64)
                          .reshape(300, 200))
    v = np.arange(400000, dtype=np.int32)[::3]
    got = pool.map(helpers.numpy_double, [f, v], 1)
    assert np.array_equal(got[0], f * 2) and np.array_equal(got[1], v * 2)


def test_a_running_pool_refuses_functions_that_ask_for_other_resources():
    # The workers started with the first function's resources (none
    # here); a later function whose @fiber.meta, or whose object's, asks
    # for others is refused with what differs, and nothing is sent.
    with fiber.Pool(1) as p:
        assert p.apply(helpers.square, (3,)) == 9
        with pytest.raises(RuntimeError, match="other resources"):
            p.apply(helpers.square_wanting_2_cpus, (3,))
        with pytest.raises(RuntimeError, match="other resources"):
            p.map(helpers.MetaObject().square, [1, 2])
        assert p.map(helpers.square, [1, 2]) == [1, 4]


def test_map_payloads_that_are_not_bytes_or_buffers_are_refused(pool):
    # The binding's map takes bytes, or a tuple of contiguous buffers per
    # task; anything else is refused with what and where, and nothing runs.
    np = pytest.importorskip("numpy")
    pool.map(helpers.square, [1])          # the C pool exists
    with pytest.raises(TypeError, match="payload 1 must be bytes or a "
                       "tuple of buffers, not int"):
        pool._pool.map_async([b"x", 7], 1)
    with pytest.raises(TypeError, match="payload 0: part 1 is not a "
                       "contiguous buffer"):
        pool._pool.map_async([(b"x", np.arange(10)[::2])], 1)
    with pytest.raises(TypeError, match="part 1 is not a contiguous "
                       "buffer \\(str\\)"):
        pool._pool.map_async([(b"x", "text")], 1)
    # The streamed imap's put the same, and a negative window.
    stream = pool._pool.imap_stream(0, True, 8)
    with pytest.raises(TypeError, match="imap payload 1 must be bytes or "
                       "a tuple of buffers, not int"):
        stream.put([b"x", 7])
    with pytest.raises(ValueError, match="must be >= 0"):
        pool._pool.imap_stream(0, True, -1)
    assert pool.map(helpers.square, [2, 3]) == [4, 9]


def test_initializer_runs_in_every_worker():
    with fiber.Pool(2, initializer=helpers.set_state,
                    initargs=("k", "v")) as p:
        assert set(p.map(helpers.get_state, ["k"] * 20)) == {"v"}


def test_failing_initializer_fails_tasks_with_its_message():
    p = fiber.Pool(1, initializer=helpers.init_fails)
    with pytest.raises(fiber.FiberError, match="no GPU here"):
        p.apply(helpers.square, (2,))
    p.terminate()


def test_maxtasksperchild_replaces_workers():
    with fiber.Pool(1, maxtasksperchild=2) as p:
        pids = [p.apply(helpers.process_token) for _ in range(6)]
        assert len(set(pids)) == 3


def test_close_join_terminate_and_with():
    p = fiber.Pool(2)
    r = p.starmap_async(helpers.sleep_then, [(i, 0.05) for i in range(4)])
    p.close()
    with pytest.raises(ValueError, match="not running"):
        p.apply(helpers.square, (1,))
    assert p.join(30)
    assert r.get(1) == [0, 1, 2, 3]
    with fiber.Pool(2) as p2:
        r = p2.apply_async(helpers.sleep_then, (1, 30))
    with pytest.raises(fiber.ClosedError):   # terminated by __exit__
        r.get(10)
    with pytest.raises(ValueError):
        fiber.Pool(0)


def test_start_workers_resize_and_stats():
    p = fiber.Pool(1)
    assert p.stats()["workers_alive"] == 0          # lazy, as Fiber's
    p.start_workers()
    assert p.wait_until_workers_up(timeout=30)
    assert not p.wait_until_workers_up(2, timeout=0.2)   # only one exists
    p.resize(2)
    assert p.wait_until_workers_up(2, timeout=30)
    p.map(helpers.square, range(100), chunksize=1)
    st = p.stats()
    assert st["tasks_done"] >= 100 and st["workers_target"] == 2
    p.terminate()


def test_a_task_that_keeps_killing_workers_fails_with_crash_error():
    with fiber.Pool(2) as p:
        rs = [p.apply_async(helpers.crash_on, (i, 5)) for i in range(10)]
        for i, r in enumerate(rs):
            if i == 5:
                with pytest.raises(fiber.TaskCrashedError):
                    r.get(60)
            else:
                assert r.get(60) == i
        with pytest.raises(fiber.TaskCrashedError):
            p.apply(helpers.exit_hard, (1,))
        with pytest.raises(fiber.TaskCrashedError):
            p.apply(helpers.segfault, (1,))
        assert p.apply(helpers.square, (4,)) == 16


def _worker_pids(prefix):
    """The pool workers named prefix-N that this process started, found
    through /proc."""
    pids = []
    flag = ("--fiber-job=%s-" % prefix).encode()
    parents = helpers.job_parents()
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % d, "rb") as f:
                cmd = f.read().split(b"\0")
            with open("/proc/%s/stat" % d) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) in parents and any(a.startswith(flag) for a in cmd):
            pids.append(int(d))
    return pids


def _kill_one(pids):
    """SIGKILLs one of pids, chosen at random: 1, or 0 if none (or it had
    already gone)."""
    if not pids:
        return 0
    try:
        os.kill(random.choice(pids), signal.SIGKILL)
        return 1
    except ProcessLookupError:
        return 0


@pytest.mark.local_only
def test_chaos_sigkill_a_worker_every_50ms_during_a_100k_map(tmp_path):
    n = 100_000
    task = functools.partial(helpers.spin_square_marking, str(tmp_path))
    with fiber.Pool(2, name="chaos") as p:
        r = p.map_async(task, range(n), chunksize=1)
        kills = 0
        while not r.ready():
            time.sleep(0.05)
            # Only a worker that took its first task at least 0.2 s ago
            # is killed: killing every new worker before its first task
            # is a broken pool, which fiber reports as such instead of
            # retrying for ever (on a loaded machine a worker can take
            # over a second to come up, so its age says nothing), and
            # the 0.2 s let the map go on between the kills.
            now = time.time()
            working = {int(f) for f in os.listdir(tmp_path)
                       if now - os.stat(tmp_path / f).st_mtime >= 0.2}
            kills += _kill_one([q for q in _worker_pids("chaos")
                                if q in working])
        out = r.get(10)
        st = p.stats()
    assert out == [x * x for x in range(n)]
    assert kills >= 2, "the map ended before the test could kill workers"
    assert st["workers_lost"] >= 1
    assert st["tasks_done"] >= n


def test_imap_of_an_endless_generator_puts_only_a_window_ahead():
    with fiber.Pool(2) as p:
        before = p.stats()["tasks_submitted"]
        it = p.imap(helpers.square, itertools.count())
        got = [next(it) for _ in range(1000)]
        assert got == [x * x for x in range(1000)]
        put = p.stats()["tasks_submitted"] - before
        # Taken 1,000, and at most the window (max(128, 8 x 2)) beyond.
        assert 1000 <= put <= 1000 + 128, put


def test_imap_started_before_close_runs_to_the_end():
    p = fiber.Pool(2)
    it = p.imap(helpers.square, range(2000))
    un = p.imap_unordered(helpers.square, range(2000))
    p.close()
    assert list(it) == [x * x for x in range(2000)]
    assert sorted(un) == [x * x for x in range(2000)]
    p.join()


@pytest.mark.local_only
def test_imap_reruns_what_a_killed_worker_held(tmp_path):
    n = 30_000
    task = functools.partial(helpers.spin_square_marking, str(tmp_path))
    with fiber.Pool(2, name="imapkill") as p:
        out, kills = [], 0
        for i, v in enumerate(p.imap(task, range(n))):
            out.append(v)
            if i % 3000 == 1500:
                kills += _kill_one(_worker_pids("imapkill"))
        st = p.stats()
    assert out == [x * x for x in range(n)]
    assert kills >= 3
    assert st["workers_lost"] >= 1


def _master_socket():
    base = os.path.join(os.environ.get("TMPDIR", "/tmp"),
                        "fiber-%d" % os.getuid(), fiber.run_id(), "master.sock")
    return base


@pytest.mark.local_only
def test_garbage_at_the_masters_port_while_a_pool_works():
    with fiber.Pool(2) as p:
        r = p.map_async(helpers.square, range(20000))
        path = _master_socket()
        assert os.path.exists(path)
        for blob in (b"\x00" * 64, os.urandom(4096), b"GET / HTTP/1.1\r\n\r\n"):
            s = socket.socket(socket.AF_UNIX)
            s.connect(path)
            try:
                s.sendall(blob)
                s.settimeout(5)
                s.recv(1)  # the master drops it
            except OSError:
                pass
            s.close()
        assert r.get(60) == [x * x for x in range(20000)]
        assert p.apply(helpers.square, (3,)) == 9


@pytest.mark.host_files
def test_ctrl_c_stops_the_run_and_raises_keyboard_interrupt(tmp_path):
    import subprocess
    import sys
    from conftest import HERE, PKG
    prog = tmp_path / "long.py"
    prog.write_text('''
import fiber, sys, time
def slow(x):
    time.sleep(0.2)
    return x
if __name__ == "__main__":
    with fiber.Pool(2) as pool:
        print(fiber.run_id(), flush=True)
        pool.map(slow, range(10000))
''')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([PKG, HERE]))
    # Ctrl-C as at a terminal: SIGINT at its default in the program.  A
    # test run started as a background job of a non-interactive shell
    # (`... &`) ignores SIGINT, the program inherited that, and Python
    # then leaves it ignored: the program ran on and this test hung.
    proc = subprocess.Popen([sys.executable, str(prog)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT,
                                                             signal.SIG_DFL))
    run = proc.stdout.readline().strip()
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode != 0
    assert "KeyboardInterrupt" in err
    time.sleep(0.5)
    leftovers = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open("/proc/%s/environ" % d, "rb") as f:
                    if run.encode() in f.read():
                        leftovers.append(d)
            except OSError:
                pass
    assert not leftovers, "jobs of the run still running: %s" % leftovers


# ---- the per-task paths in C (python/src/envelope.c) and the streamed map

def _envelope_values():
    import numpy as np
    return [0, -5, 2 ** 70, "text", b"\x00" * 100, (1, [2, 3]), {"k": None},
            np.arange(10), np.arange(100_000, dtype=np.float32),
            [np.zeros(3), np.ones(70_000)], bytearray(1 << 17), None]


def _joined(parts):
    return b"".join(bytes(x) for x in parts) if isinstance(parts, tuple) \
        else parts


def test_c_envelope_builds_the_bytes_the_python_one_does():
    from fiber import _envelope as env
    fb = env.dumps_callable(helpers.square)
    for obj in _envelope_values():
        for kind, flags in ((env.ONE, 0), (env.CHUNK, env.F_STAR),
                            (env.CALL, env.F_RETRY)):
            want = env._task_py(kind, fb, obj, "square", flags)
            assert env.task(kind, fb, obj, "square", flags) == want
            parts_py = env._task_py(kind, fb, obj, "square", flags, True)
            parts_c = env.task(kind, fb, obj, "square", flags, True)
            assert type(parts_c) is type(parts_py)
            if isinstance(parts_py, tuple):
                assert [bytes(x) for x in parts_c] == \
                    [bytes(x) for x in parts_py]
            else:
                assert parts_c == parts_py
        got = env.tasks(env.ONE, fb, [obj, obj])
        want = env._task_py(env.ONE, fb, obj, "?", 0, True)
        assert [_joined(g) for g in got] == [_joined(want)] * 2
    # Small values travel in fiber's codec (first byte 0xFB), the rest
    # pickled (0x80), in a task's body and in an answer's.
    for obj, first in ((-5, 0xFB), ((1, [2, 3]), 0xFB), ({"k": None}, 0xFB),
                       (2 ** 70, 0x80), (bytearray(3), 0x80)):
        assert env.task(env.ONE, fb, obj)[env._TASK.size + len(fb)] == first
        assert env.answer_ok(obj)[env._ANSWER.size] == first
    # What does not pickle is named, as before; what iterating the items
    # raises is not called a pickling error.
    with pytest.raises(fiber.PicklingError, match="arguments of task 'f'"):
        env.task(env.ONE, fb, threading.Lock(), "f")
    with pytest.raises(fiber.PicklingError, match="arguments of task 'f'"):
        env.tasks(env.ONE, fb, [1, threading.Lock()], "f")

    def bad_items():
        yield 1
        raise KeyError("from the iterable")
    with pytest.raises(KeyError, match="from the iterable"):
        env.tasks(env.ONE, fb, bad_items(), "f")


def test_c_decoder_reads_what_the_python_one_does():
    import numpy as np
    from fiber import _envelope as env
    for obj in _envelope_values():
        ans = env.answer_ok(obj)
        got, want = env.decode(ans), env._decode_py(ans)
        if isinstance(want, np.ndarray):
            assert np.array_equal(got, want)
        elif isinstance(want, list) and want and \
                isinstance(want[0], np.ndarray):
            assert all(np.array_equal(a, b) for a, b in zip(got, want))
        else:
            assert got == want
    err = env.answer_error(ValueError("from a task"), "the traceback")
    with pytest.raises(ValueError, match="from a task") as ei:
        env.decode(err)
    assert "the traceback" in str(ei.value.__cause__)
    with pytest.raises(ValueError, match="bad magic"):
        env.decode(b"XXXX" + bytes(12))
    # A map's list: failures (tuples) and errors go to the slow path.
    answers = [env.answer_ok(i) for i in range(5)]
    assert fiber.pool._fiber.decode_answers(
        answers, fiber.pool._decode_slow) == list(range(5))
    chunks = [env.answer_ok([1, 2]), env.answer_ok(range(3, 5))]
    assert fiber.pool._fiber.decode_chunks(
        chunks, fiber.pool._decode_slow) == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="from a task"):
        fiber.pool._fiber.decode_answers(answers + [err],
                                         fiber.pool._decode_slow)
    # Packed answers (a chunk's ints or floats): both decoders read them,
    # and both name a malformed one.
    import math
    import struct
    ints = [0, -1, 2 ** 63 - 1, -2 ** 63, 12345]
    floats = [1.5, -0.0, float("inf"), 1e-300]

    def packed(form, code, values):
        body = struct.pack("<%d%s" % (len(values), code), *values)
        return struct.pack("<4sBBHII", b"FPR1", 0, form, 0, len(body),
                           0) + body
    for ans, want in ((packed(1, "q", ints), ints),
                      (packed(2, "d", floats), floats)):
        for got in (env.decode(ans), env._decode_py(ans)):
            assert got == want
            assert [type(x) for x in got] == [type(x) for x in want]
            assert math.copysign(1, got[1]) == math.copysign(1, want[1])
    nan = env.decode(packed(2, "d", [float("nan")]))[0]
    assert math.isnan(nan)
    assert fiber.pool._fiber.decode_chunks(
        [packed(1, "q", [1, 2]), env.answer_ok([3]), packed(2, "d", [4.0])],
        fiber.pool._decode_slow) == [1, 2, 3, 4.0]
    for bad in (packed(3, "q", [1]), packed(1, "q", [1])[:-1],
                packed(1, "q", [1])[:16] + bytes(5)):
        with pytest.raises(ValueError):
            env.decode(bad)


def test_a_chunks_results_come_back_as_they_were(pool):
    # Ints and floats travel packed; anything else (a bool, an IntEnum
    # such as signal.SIGTERM, an int past 64 bits, a mix) is pickled, as
    # before.
    cases = [list(range(-5, 3000)), [0.5 * i for i in range(3000)],
             [True, False, 1], [2 ** 64, 1], [1, 2.5], [2.5, 1],
             [signal.SIGTERM, 1], [float("nan")] * 3]
    for items in cases:
        got = pool.map(helpers.noop, items, chunksize=len(items))
        assert [type(x) for x in got] == [type(x) for x in items], items
        assert [repr(x) for x in got] == [repr(x) for x in items]


def test_tasks_run_in_c_as_they_did_in_python(pool):
    # starmap's items may be lists; apply's keywords; a chunk of a range.
    assert pool.starmap(helpers.add, [[1, 2], (3, 4)], 1) == [3, 7]
    assert pool.starmap(helpers.add, [[1, 2], (3, 4)] * 40) == [3, 7] * 40
    assert pool.apply(helpers.kw, (1,), {"b": 2, "c": 3}) == \
        helpers.kw(1, b=2, c=3)
    assert pool.map(helpers.square, range(5, 9000, 3)) == \
        [x * x for x in range(5, 9000, 3)]
    assert pool.map(helpers.square, tuple(range(5000))) == \
        [x * x for x in range(5000)]
    # A task that raises: its exception, with the worker's traceback
    # (from the task's own frame) as the cause.
    with pytest.raises(ValueError, match="one item") as ei:
        pool.map(helpers.boom, ["one item"], 1)
    assert "in boom" in str(ei.value.__cause__)
    with pytest.raises(TypeError):
        pool.starmap(helpers.add, range(10))   # an int is no argument list
    # A result that does not pickle, and a callable that does not load.
    with pytest.raises(fiber.PicklingError, match="cannot be pickled"):
        pool.map(helpers.unpicklable_result, range(3), 1)


def test_map_streams_its_chunks_and_the_first_failure_raises(pool):
    n = 100_000
    items = list(range(n))
    assert pool.map(helpers.square, items) == [x * x for x in items]
    assert pool.map(helpers.square, iter(items), 7) == [x * x for x in items]
    assert pool.map(helpers.square, []) == []
    before = pool.stats()["tasks_submitted"]
    pool.map(helpers.square, items)
    # Automatic chunks of at most AUTO_CHUNK_MAX items.
    tasks = pool.stats()["tasks_submitted"] - before
    assert tasks == -(-n // fiber.Pool.AUTO_CHUNK_MAX), tasks
    with pytest.raises(ValueError, match="middle"):
        pool.map(helpers.boom_at, [(i, 5000, "middle") for i in range(9000)])
    # The pool goes on after a failed map.
    assert pool.map(helpers.square, range(3000)) == \
        [x * x for x in range(3000)]


@pytest.mark.local_only
def test_streamed_map_reruns_what_a_killed_worker_held(tmp_path):
    n = 100_000
    task = functools.partial(helpers.spin_square_marking, str(tmp_path))
    with fiber.Pool(2, name="mapkill") as p:
        done = threading.Event()
        kills = [0]

        def killer():
            # Only a worker that took its first task 0.2 s ago or more (see
            # test_chaos_sigkill_a_worker_every_50ms_during_a_100k_map).
            while not done.wait(0.1):
                now = time.time()
                working = {int(f) for f in os.listdir(tmp_path)
                           if now - os.stat(tmp_path / f).st_mtime >= 0.2}
                kills[0] += _kill_one([q for q in _worker_pids("mapkill")
                                       if q in working])
        t = threading.Thread(target=killer)
        t.start()
        try:
            out = p.map(task, range(n), 500)
        finally:
            done.set()
            t.join()
        st = p.stats()
    assert out == [x * x for x in range(n)]
    assert kills[0] >= 2, "the map ended before the test could kill workers"
    assert st["workers_lost"] >= 1


def _outcomes(it):
    """Each next() of an imap iterator: a value, or (type name, message)."""
    out = []
    while True:
        try:
            out.append(it.next(timeout=120))
        except StopIteration:
            return out
        except Exception as e:
            out.append((type(e).__name__, str(e)))


def _inputs_with_trouble():
    """Items 0..5, item 2 a lock (it does not pickle), then the iterable
    raises after item 5."""
    for i in range(6):
        yield threading.Lock() if i == 2 else i
    raise KeyError("the iterable broke")


def test_imap_goes_on_past_an_item_that_does_not_pickle_as_multiprocessing():
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as mp_pool, fiber.Pool(2) as pool:
        want = _outcomes(mp_pool.imap(helpers.square, _inputs_with_trouble()))
        got = _outcomes(pool.imap(helpers.square, _inputs_with_trouble()))
        # multiprocessing: 0, 1, an error at item 2, 9, 16, 25, then the
        # iterable's KeyError at its place, and the end.
        assert [x for x in want if not isinstance(x, tuple)] == \
            [0, 1, 9, 16, 25]
        assert [x for x in got if not isinstance(x, tuple)] == \
            [0, 1, 9, 16, 25]
        assert [i for i, x in enumerate(got) if isinstance(x, tuple)] == \
            [i for i, x in enumerate(want) if isinstance(x, tuple)] == [2, 6]
        assert got[2][0] == "PicklingError" and "lock" in got[2][1]
        assert got[6] == want[6] == ("KeyError", "'the iterable broke'")
        un = _outcomes(pool.imap_unordered(helpers.square,
                                           _inputs_with_trouble()))
        assert sorted(x for x in un if not isinstance(x, tuple)) == \
            [0, 1, 9, 16, 25]
        assert sorted(x[0] for x in un if isinstance(x, tuple)) == \
            ["KeyError", "PicklingError"]
        # A window's worth of inputs that do not pickle is no hang.
        many = [threading.Lock()] * 300 + [7]
        res = _outcomes(pool.imap(helpers.square, many))
        assert len(res) == 301 and res[-1] == 49
        assert all(r[0] == "PicklingError" for r in res[:300])


def _imaps_read_after_join(mod):
    """imap, imap_unordered and an imap with trouble, each started on a
    closed-then-joined pool before a single result is read."""
    pool = mod.Pool(2)
    try:
        ordered = pool.imap(helpers.square, range(1000))
        unordered = pool.imap_unordered(helpers.square, range(1000), 7)
        trouble = pool.imap(helpers.square, _inputs_with_trouble())
        failing = pool.imap(helpers.boom_at,
                           [(i, 500, "at 500") for i in range(600)])
        locks = pool.imap(helpers.square, [threading.Lock()] * 300 + [7])
        pool.close()
        pool.join()
        # (multiprocessing's imap with chunks is a generator: no next(t))
        return (_outcomes(ordered), sorted(unordered),
                _outcomes(trouble), _outcomes(failing), _outcomes(locks))
    finally:
        pool.terminate()


def test_join_runs_every_imap_input_before_it_returns_as_multiprocessing():
    # multiprocessing's join() waits for every input of every imap, read or
    # not, and the results are there after it: fiber's imap puts a window
    # ahead, so its join() feeds the rest (it raised ClosedError before).
    want = _imaps_read_after_join(multiprocessing.get_context("spawn"))
    got = _imaps_read_after_join(fiber)
    squares = [i * i for i in range(1000)]
    assert want[0] == got[0] == squares
    assert want[1] == got[1] == squares
    # (an item that does not pickle: multiprocessing's TypeError, fiber's
    # PicklingError naming the task)
    assert [x if not isinstance(x, tuple) else x[0] for x in got[2]] == \
        [0, 1, "PicklingError", 9, 16, 25, "KeyError"]
    assert [x if not isinstance(x, tuple) else x[0] for x in want[2]] == \
        [0, 1, "TypeError", 9, 16, 25, "KeyError"]
    assert len(got[3]) == len(want[3]) == 600
    assert [i for i, x in enumerate(got[3]) if isinstance(x, tuple)] == \
        [i for i, x in enumerate(want[3]) if isinstance(x, tuple)] == [500]
    assert got[3][:500] == want[3][:500]
    assert len(got[4]) == 301 and got[4][-1] == want[4][-1] == 49
    assert all(r[0] == "PicklingError" for r in got[4][:300])
    assert all(r[0] == "TypeError" for r in want[4][:300])


def test_join_after_terminate_does_not_feed_an_unread_imap():
    pool = fiber.Pool(2)
    it = pool.imap(helpers.square, range(1000))
    assert next(it) == 0   # one taken: the window has room for one more
    pool.terminate()
    assert pool.join() is True   # (it raised ClosedError from the feed)
    with pytest.raises(fiber.ClosedError):
        list(it)


def test_join_with_a_timeout_gives_up_on_an_imap_still_running():
    pool = fiber.Pool(1)
    try:
        it = pool.imap(functools.partial(helpers.sleep_then, seconds=0.5),
                       range(4))
        pool.close()
        t = time.monotonic()
        assert pool.join(timeout=0.3) is False
        assert time.monotonic() - t < 5
        assert pool.join() is True
        assert list(it) == [0, 1, 2, 3]
    finally:
        pool.terminate()


def test_a_malformed_task_gets_an_error_naming_it(pool):
    # Straight to the C pool, past fiber._envelope: a wrong magic, and a
    # header whose lengths run past the end (the worker's C path declines
    # both; the Python handler names the problem). The worker goes on.
    from fiber import _envelope as env
    assert pool.apply(helpers.square, (2,)) == 4   # the pool has started
    good = env.task(env.ONE, env.dumps_callable(helpers.square), 3, "square")
    for bad in (b"XXXX" + good[4:], good[:30], b"FPY1"):
        with pytest.raises(fiber.FiberError, match="cannot read a task"):
            pool._pool.apply_async(bad).get(-1)
    assert env.decode(pool._pool.apply_async(good).get(-1)) == 9


@pytest.mark.local_only
def test_a_dropped_pool_is_collected_and_its_workers_end():
    """``fiber.Pool(2).map(...)`` in a loop, never closed: each pool is
    collected when dropped, as multiprocessing's is, and its workers end
    (a shutdown hook held every pool, and its workers, until exit)."""
    import gc
    import warnings
    import weakref
    pids = set()
    refs = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        for _ in range(5):
            pool = fiber.Pool(2)
            pids.update(pool.map(helpers.getpid, range(8)))
            refs.append(weakref.ref(pool))
            del pool
            gc.collect()
    assert all(r() is None for r in refs)
    # multiprocessing's warning (recording it keeps that pool: its source)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        fiber.Pool(1).map(helpers.getpid, range(2))
        gc.collect()
    assert any("unclosed running multiprocessing pool" in str(w.message)
               for w in caught)
    del caught
    deadline = time.monotonic() + 30
    alive = set(pids)
    while alive and time.monotonic() < deadline:
        alive = {p for p in alive if helpers.process_running(p)}
        time.sleep(0.1)
    assert not alive, "workers of dropped pools still running: %s" % alive

