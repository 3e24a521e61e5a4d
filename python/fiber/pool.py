"""fiber.Pool: multiprocessing.Pool (and Fiber's) over fiber's C pool.

Dispatch, chunking, retries after a worker dies, heartbeats and exactly-once
delivery all happen in the C core; Python only pickles the function and its
arguments, runs the function in the worker and unpickles the answer.

As in Fiber, the workers start with the first task (or ``start_workers()``),
so that the first function's ``@fiber.meta`` resources can apply to them.
"""
import collections
import itertools
import multiprocessing
import threading
import time
import warnings
import weakref
# multiprocessing.pool's states (its strings), so that code that reads or
# sets a pool's _state as multiprocessing's tests do means the same here.
from multiprocessing.pool import CLOSE, RUN, TERMINATE

from . import _envelope as env
from . import _fiber, _runtime
from .process import _job_meta, _meta_of

_NO_SHARED = object()   # shared= not given (None is a value to share)


def _with_shared(func, shared):
    """(func, None) without shared=; else (Shared(func, ref), ref): the
    value put once into the object store, func called as func(value,
    *args) in the tasks (fiber.objects)."""
    if shared is _NO_SHARED:
        return func, None
    from . import objects
    ref = objects.put(shared)
    return objects.Shared(func, ref), ref


class TimeoutError(multiprocessing.TimeoutError):
    """AsyncResult.get() gave up waiting (multiprocessing.TimeoutError)."""


def _ms(timeout):
    return -1 if timeout is None else max(0, int(timeout * 1000))


def _raise_failure(code, msg):
    """A task the C core failed (crashed its workers, no worker could start)
    raises fiber's error for its code: the extension's one mapping of
    codes to exceptions (_fiber.ERRORS), the one its own calls raise by."""
    raise _fiber.error(code, msg)


class AsyncResult:
    """The result of apply_async (and, as MapResult, of map_async)."""

    def __init__(self, pool, future, callback=None, error_callback=None):
        self._pool = pool
        self._future = future
        self._callback = callback
        self._error_callback = error_callback
        self._event = threading.Event() if (callback or error_callback) else None
        self._done = False
        self._value = None
        self._error = None
        self._shared_ref = None   # released once the results are in

    def _release_shared(self):
        ref, self._shared_ref = self._shared_ref, None
        if ref is not None:
            try:
                ref.release()
            except Exception:
                pass

    def __del__(self):
        self._release_shared()

    def _decode(self, raw):
        return env.decode(raw)

    def _take(self, timeout):
        """Waits for the C future and decodes it (once)."""
        if self._done:
            return
        try:
            raw = self._future.get(_ms(timeout))
        except _fiber.FiberTimeoutError:
            raise TimeoutError from None
        except _fiber.FiberError as e:
            self._set(None, e)
            return
        try:
            self._set(self._decode(raw), None)
        except BaseException as e:
            self._set(None, e)

    def _set(self, value, error):
        self._value, self._error = value, error
        self._done = True
        self._future = None
        self._release_shared()

    def _complete(self, rc, raw):
        """The callback thread's path: decode, run the callback, wake get()."""
        if not self._done:
            if rc != 0:
                try:
                    _raise_failure(rc, raw.decode("utf-8", "replace"))
                except BaseException as e:
                    self._set(None, e)
            else:
                try:
                    self._set(self._decode(raw), None)
                except BaseException as e:
                    self._set(None, e)
        try:
            if self._error is None and self._callback:
                self._callback(self._value)
            elif self._error is not None and self._error_callback:
                self._error_callback(self._error)
        finally:
            self._event.set()

    def ready(self):
        if self._event is not None:
            return self._event.is_set()
        return self._done or self._future.ready()

    def successful(self):
        if not self.ready():
            raise ValueError("%r not ready" % self)
        if self._event is None:
            self._take(None)
        return self._error is None

    def wait(self, timeout=None):
        if self._event is not None:
            self._event.wait(timeout)
        elif not self._done:
            self._future.wait(_ms(timeout))

    def get(self, timeout=None):
        if self._event is not None:
            if not self._event.wait(timeout):
                raise TimeoutError
        else:
            self._take(timeout)
        if self._error is not None:
            raise self._error
        return self._value


ApplyResult = AsyncResult


class MapResult(AsyncResult):
    """The result of map_async/starmap_async: a list in input order."""

    def _decode(self, answers):
        return _fiber.decode_answers(answers, _decode_slow)


class ChunkedMapResult(MapResult):
    """A map whose tasks are chunks: each answer is a list of results."""

    def _decode(self, answers):
        return _fiber.decode_chunks(answers, _decode_slow)


def _decode_slow(a):
    """A map's answer that the C decoder leaves to Python: a task that
    failed in the pool (a tuple), raised, or holds out-of-band buffers."""
    if isinstance(a, tuple):
        _raise_failure(a[0], a[1])
    return env._decode_py(a)


class Pool:
    """A pool of worker jobs (multiprocessing.Pool's API, and Fiber's).

    ``Pool(processes=None, initializer=None, initargs=(),
    maxtasksperchild=None)``; apply, apply_async, map, map_async, imap,
    imap_unordered, starmap, starmap_async; close, join, terminate, and
    ``with``.  Fiber's ``start_workers()`` and ``wait_until_workers_up()``;
    fiber's own ``resize(n)`` and ``stats()``.  fiber's keywords:
    ``max_task_crashes`` (workers a task may kill before it fails with
    TaskCrashedError; default 3) and ``name`` (workers' job names are
    ``<name>-<n>``; default ``Pool<k>-Worker-<n>``).
    """

    def __init__(self, processes=None, initializer=None, initargs=(),
                 maxtasksperchild=None, context=None, error_handling=False,
                 *, max_task_crashes=0, name=None):
        if processes is not None and processes < 1:
            raise ValueError("Number of processes must be at least 1")
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be a callable")
        if maxtasksperchild is not None and (
                not isinstance(maxtasksperchild, int) or maxtasksperchild <= 0):
            raise ValueError("maxtasksperchild must be a positive int or None")
        _runtime.require_master("fiber.Pool()")
        self._processes = processes or _fiber_cpu_count()
        self._initializer = initializer
        self._initargs = tuple(initargs)
        self._maxtasks = maxtasksperchild or 0
        self._max_crashes = max_task_crashes
        # Fiber's Pool(error_handling=True) (its ResilientZPool): a task
        # that raises ends its worker and runs again on another, as when a
        # worker dies, instead of raising in the caller.  Retries stop
        # after max_task_crashes workers (default here _RETRIES), so a
        # task that always raises fails with TaskCrashedError, never loops.
        self._error_handling = bool(error_handling)
        self._flags = env.F_RETRY if error_handling else 0
        if error_handling and not max_task_crashes:
            self._max_crashes = _RETRIES
        self._name = name
        self._state = RUN
        self._pool = None
        self._meta = None
        self._lock = threading.Lock()
        self._tokens = itertools.count(1)
        self._pending = {}            # token -> handler(rc, raw)
        self._maps = []               # map results with callbacks, in order
        self._imaps = weakref.WeakSet()  # imap iterators join() drains
        self._cb_thread = None
        _runtime.on_shutdown_weak(self._at_exit)

    def __del__(self, _warn=warnings.warn):
        # A pool dropped while running (``Pool(4).map(f, xs)`` in a loop):
        # multiprocessing's warning, and its C pool's collection ends the
        # workers (it stayed alive until exit, with every worker).
        if getattr(self, "_state", None) == RUN:
            _warn("unclosed running multiprocessing pool %r" % self,
                  ResourceWarning, source=self)

    # -- starting --
    def _start(self, func=None):
        if self._pool is not None and (
                func is None or not _meta_of(func)):
            return   # the common call: a running pool, a plain function
        meta = _job_meta(func)
        if self._pool is not None:
            if func is not None and any(meta.values()) and \
                    meta != self._meta:
                raise RuntimeError(
                    "%r asks for other resources (%s) than this pool's "
                    "workers have (%s); create another Pool for it"
                    % (func, meta, self._meta))
            return
        with self._lock:
            if self._pool is not None:
                return
            if self._state != RUN:
                raise ValueError("Pool not running")
            init = None
            if self._initializer is not None:
                init = env.call(env.INIT, self._initializer, self._initargs, {})
            self._meta = meta
            self._pool = _fiber.Pool(
                workers=self._processes, initializer=init,
                maxtasksperchild=self._maxtasks,
                max_task_crashes=self._max_crashes, name=self._name,
                **self._meta)

    def start_workers(self):
        """Starts the workers now instead of with the first task."""
        self._start()

    def wait_until_workers_up(self, n=None, timeout=None):
        """Waits until n workers (default: the pool's size) are connected
        and ready for tasks (fiber_pool_wait_ready); returns True, or False
        after timeout seconds."""
        self._start()
        want = self._processes if n is None else n
        return self._pool.wait_ready(want, _ms(timeout))

    def _check_running(self):
        if self._state != RUN:
            raise ValueError("Pool not running")

    # -- callbacks --
    # One thread a pool, "fiber-pool-callbacks", runs every callback and
    # error_callback (apply_async's, map_async's, starmap_async's), one at
    # a time in the order the results come in, as multiprocessing's result
    # handler does (imap and imap_unordered need none: the iterating thread
    # takes its results itself).  It starts
    # with the first result that needs it and ends once the pool is closed
    # and none is pending (join() waits for it).  A task's completion comes
    # as a record from the C pool (next_done); a map has no such record,
    # so while one with a callback is pending the thread also looks at its
    # future every MAP_POLL_MS and completes it once ready.
    MAP_POLL_MS = 5

    def _ensure_callback_thread(self):
        """Starts the callback thread if it is not running; lock held."""
        if self._cb_thread is None:
            self._cb_thread = threading.Thread(
                target=self._callback_loop, name="fiber-pool-callbacks",
                daemon=True)
            self._cb_thread.start()

    def _register(self, handler):
        token = next(self._tokens)
        with self._lock:
            self._pending[token] = handler
            self._ensure_callback_thread()
        return token

    def _watch_map(self, res):
        """Has the callback thread complete map result res once ready."""
        with self._lock:
            self._maps.append(res)
            self._ensure_callback_thread()

    def _callback_loop(self):
        while True:
            with self._lock:
                if not self._pending and not self._maps and \
                        self._state != RUN:
                    self._cb_thread = None
                    return
                pool = self._pool
                maps = list(self._maps)
            if pool is None:
                return
            wait_ms = self.MAP_POLL_MS if maps else 100
            for token, rc, raw in pool.next_done(wait_ms):
                with self._lock:
                    handler = self._pending.pop(token, None)
                if handler is not None:
                    _run_callback(handler, rc, raw)
            for res in maps:
                if res._future is None or res._future.ready():
                    with self._lock:
                        self._maps.remove(res)
                    _run_callback(_complete_map, res)

    # -- one task --
    def apply_async(self, func, args=(), kwds={}, callback=None,
                    error_callback=None, *, shared=_NO_SHARED):
        """multiprocessing's apply_async; with shared=value, func is
        called as func(value, *args, **kwds), value put once into the
        object store (fiber.objects) and released when the result is in."""
        self._check_running()
        self._start(func)
        func, ref = _with_shared(func, shared)
        res = None
        try:
            payload = env.call(env.CALL, func, args, kwds, self._flags)
            if callback is None and error_callback is None:
                res = AsyncResult(self, None)
                res._shared_ref = ref
                res._future = self._pool.apply_async(payload)
            else:
                res = AsyncResult(self, None, callback, error_callback)
                # Before the submission: the callback thread may complete
                # (and release) the result before apply_async returns.
                res._shared_ref = ref
                token = self._register(res._complete)
                res._future = self._pool.apply_async(payload, token)
        except BaseException:
            if res is not None:
                res._shared_ref = None
            if ref is not None:
                ref.release()
            raise
        return res

    def apply(self, func, args=(), kwds={}, *, shared=_NO_SHARED):
        return self.apply_async(func, args, kwds, shared=shared).get()

    # -- maps --
    def _payloads(self, func, iterable, star):
        fb = env.dumps_callable(func)
        name = getattr(func, "__qualname__", repr(func))
        kind = env.STAR if star else env.ONE
        return env.tasks(kind, fb, iterable, name, self._flags)

    def _map_async(self, func, iterable, chunksize, callback, error_callback,
                   star, shared=_NO_SHARED):
        self._check_running()
        if chunksize is not None and chunksize < 1:
            raise ValueError("Chunksize must be 1+, not {0:n}".format(chunksize))
        self._start(func)
        func, ref = _with_shared(func, shared)
        try:
            return self._map_submit(func, iterable, chunksize, callback,
                                    error_callback, star, ref)
        except BaseException:
            if ref is not None:
                ref.release()
            raise

    # An automatic chunk holds at most this many items: more chunks than
    # multiprocessing's four a worker when there are many items, so that a
    # map's pickling, its tasks and the reading of its results overlap
    # (see _map_stream); 2,048 no-op items take about 1 ms.
    AUTO_CHUNK_MAX = 2048

    def _auto_chunksize(self, iterable):
        """(chunksize, items) for chunksize=None: as multiprocessing's, about
        four chunks a worker, each pickled as one list so that tiny tasks
        cost little each, and at most AUTO_CHUNK_MAX items."""
        items = iterable if hasattr(iterable, "__len__") else list(iterable)
        chunksize, extra = divmod(len(items), self._processes * 4)
        chunksize += 1 if extra else 0
        return max(1, min(chunksize, self.AUTO_CHUNK_MAX)), items

    def _map_submit(self, func, iterable, chunksize, callback, error_callback,
                    star, ref):
        if chunksize is None:
            chunksize, iterable = self._auto_chunksize(iterable)
        if chunksize > 1:
            payloads = [p for _, p in self._chunks(func, iterable, chunksize,
                                                   star, True)]
            fut = self._pool.map_async(payloads, 0)
            res = ChunkedMapResult(self, fut, callback, error_callback)
        else:
            payloads = self._payloads(func, iterable, star)
            fut = self._pool.map_async(payloads, 0)
            res = MapResult(self, fut, callback, error_callback)
        res._shared_ref = ref   # before the callback thread completes it
        if res._event is not None:
            self._watch_map(res)
        return res

    def map_async(self, func, iterable, chunksize=None, callback=None,
                  error_callback=None, *, shared=_NO_SHARED):
        """multiprocessing's map_async; shared=value: func(value, item),
        value moved once per worker (see apply_async)."""
        return self._map_async(func, iterable, chunksize, callback,
                               error_callback, False, shared)

    def starmap_async(self, func, iterable, chunksize=None, callback=None,
                      error_callback=None, *, shared=_NO_SHARED):
        return self._map_async(func, iterable, chunksize, callback,
                               error_callback, True, shared)

    def map(self, func, iterable, chunksize=None, *, shared=_NO_SHARED):
        return self._map(func, iterable, chunksize, False, shared)

    def starmap(self, func, iterable, chunksize=None, *, shared=_NO_SHARED):
        return self._map(func, iterable, chunksize, True, shared)

    def _map(self, func, iterable, chunksize, star, shared):
        """map and starmap: tasks of one item go to the C pool's map at
        once (it chooses how many travel together); chunks of several are
        streamed (_map_stream)."""
        if chunksize is None:
            chunksize, iterable = self._auto_chunksize(iterable)
        if chunksize <= 1:
            return self._map_async(func, iterable, chunksize, None, None,
                                   star, shared).get()
        self._check_running()
        self._start(func)
        func, ref = _with_shared(func, shared)
        try:
            return self._map_stream(func, iterable, chunksize, star)
        finally:
            if ref is not None:
                ref.release()

    # Chunks a streamed map keeps out at most (at least 4 a worker), and
    # puts between two looks at the results.  8, not 16: the C stream
    # sends its inputs a quarter window at a time, and with 2 workers a
    # window of 16 sent 4 chunks (8,192 items) together, which left the
    # workers idle at each map's end (100,000 no-op items: 17.6-19.0 M/s
    # with 16, 20.4-22.4 with 8, in alternated runs on 2026-12-06).
    STREAM_MIN_WINDOW = 8
    STREAM_LEAD = 2

    def _map_stream(self, func, iterable, chunksize, star):
        """A map in chunks over the C pool's streamed imap, in the caller's
        thread: a chunk is pickled and put while the workers run the ones
        before it, and the results that came in are read between two
        puts, so that the master's pickling, the workers and the master's
        reading overlap instead of following each other.  At most a
        window of chunks is out.  The first task that raised raises here
        (the chunks already put still run; the rest are never pickled);
        a worker's death reruns its chunk on another (the pool's retry,
        per chunk)."""
        chunks = self._chunks(func, iterable, chunksize, star, True)
        window = max(self.STREAM_MIN_WINDOW, 4 * self._processes)
        stream = self._pool.imap_stream(0, True, window)
        out = []
        put = taken = 0
        more = True
        first = min(window, 2 * self._processes)
        while True:
            if more and put - taken < window:
                want = min(window - (put - taken),
                           self.STREAM_LEAD if put else first)
                batch = [p for _, p in itertools.islice(chunks, want)]
                more = len(batch) == want
                if batch:
                    put += _put_all(stream, batch)
                if not more:
                    stream.end()
            if taken == put and not more:
                return out
            try:
                _, rc, raw = stream.next(
                    0 if more and put - taken < window else -1)
            except _fiber.FiberTimeoutError:
                continue   # nothing in yet: pickle the next chunk
            taken += 1
            if rc:
                _raise_failure(rc, raw.decode("utf-8", "replace"))
            out.extend(env.decode(raw))

    # -- iterators --
    def _chunks(self, func, iterable, chunksize, star, parts=False,
                keep_going=False):
        """(count, payload) per chunk; parts: the payloads of a map
        (env.task's parts form), else bytes.  keep_going (imap's): a
        chunk that does not pickle is yielded as an _Unpicklable holding
        the error, and the chunks after it follow."""
        fb = env.dumps_callable(func)
        name = getattr(func, "__qualname__", repr(func))
        it = iter(iterable)
        task = env.task
        if keep_going:
            def task(*a):
                try:
                    return env.task(*a)
                except env.PicklingError as e:
                    return _Unpicklable(e)
        if chunksize == 1:
            kind = env.STAR if star else env.ONE
            for item in it:
                yield 1, task(kind, fb, item, name, self._flags, parts)
            return
        flags = (env.F_STAR if star else 0) | self._flags
        if type(iterable) in (list, tuple, range):
            # Sliced, not iterated: a list's slice is a list made in one
            # step, and a range's is a range (its items are made in the
            # worker, which makes them anyway).
            n = len(iterable)
            for i in range(0, n, chunksize):
                chunk = iterable[i:i + chunksize]
                if type(chunk) is tuple:
                    chunk = list(chunk)
                yield len(chunk), task(env.CHUNK, fb, chunk, name, flags,
                                       parts)
            return
        while True:
            chunk = list(itertools.islice(it, chunksize))
            if not chunk:
                return
            yield len(chunk), task(env.CHUNK, fb, chunk, name, flags, parts)

    def imap(self, func, iterable, chunksize=1):
        """Results in input order, computed ahead within a bounded window:
        an IMapIterator (``next(timeout)``; an item that raised raises at
        its place and the iteration goes on)."""
        return self._imap(func, iterable, chunksize, True)

    def imap_unordered(self, func, iterable, chunksize=1):
        """Results in order of completion (an IMapIterator)."""
        return self._imap(func, iterable, chunksize, False)

    def _imap(self, func, iterable, chunksize, ordered):
        self._check_running()
        if chunksize < 1:
            raise ValueError("Chunksize must be 1+, not {0:n}".format(chunksize))
        self._start(func)
        cls = IMapIterator if ordered else IMapUnorderedIterator
        it = cls(self, self._chunks(func, iterable, chunksize, False, True,
                                    True), chunksize)
        self._imaps.add(it)
        return it

    # -- life --
    def close(self):
        if self._state == RUN:
            self._state = CLOSE
            if self._pool is not None:
                self._pool.close()

    def terminate(self):
        self._state = TERMINATE
        if self._pool is not None:
            self._pool.terminate()

    def join(self, timeout=None):
        if self._state == RUN:
            raise ValueError("Pool is still running")
        if self._pool is None:
            return True
        # As multiprocessing's join, every imap's inputs run before it
        # returns, read or not: each stream is fed to its end and its
        # results kept for the iterator (not after terminate(), which
        # drops what has not run).
        deadline = None if timeout is None else time.monotonic() + timeout
        for it in list(self._imaps) if self._state != TERMINATE else ():
            left = None if deadline is None else \
                max(0.0, deadline - time.monotonic())
            if not it._drain(left):
                return False
        left = None if deadline is None else \
            max(0.0, deadline - time.monotonic())
        done = self._pool.join(_ms(left))
        thread = self._cb_thread
        if done and thread is not None and thread is not threading.current_thread():
            thread.join(1.0 if timeout is None else timeout)
        return done

    def resize(self, n):
        """Grows or shrinks the pool to n workers while tasks run."""
        if n < 1:
            raise ValueError("a pool needs at least one worker")
        self._processes = n
        if self._pool is not None:
            self._pool.resize(n)

    def stats(self):
        """The C pool's counters: tasks submitted, done, failed, retried,
        crashed; workers started, lost, alive; tasks queued, in flight."""
        if self._pool is None:
            return {"workers_alive": 0, "workers_target": self._processes,
                    "tasks_submitted": 0, "tasks_done": 0}
        return self._pool.stats()

    def _at_exit(self):
        if self._pool is not None and self._state != TERMINATE:
            self.terminate()

    def __enter__(self):
        self._check_running()
        return self

    def __exit__(self, *exc):
        self.terminate()

    def __reduce__(self):
        raise NotImplementedError("pool objects cannot be passed between "
                                  "processes or pickled")


_RETRIES = 10


# Uber Fiber's pool classes: ZPool was its Pool without error handling,
# ResilientZPool (fiber.pool.Pool there) its Pool(error_handling=True).
ZPool = Pool


class ResilientZPool(Pool):
    """Uber Fiber's ResilientZPool: Pool(error_handling=True)."""

    def __init__(self, processes=None, initializer=None, initargs=(),
                 maxtasksperchild=None, cluster=None, **kwargs):
        if cluster is not None:
            raise NotImplementedError(
                "ResilientZPool(cluster=...): Fiber never used it; fiber's "
                "jobs go to the configured backend")
        kwargs.setdefault("error_handling", True)
        super().__init__(processes, initializer, initargs, maxtasksperchild,
                         **kwargs)


class IMapIterator:
    """What imap returns: iterate it, or call ``next(timeout)``, which
    raises fiber.TimeoutError (a multiprocessing.TimeoutError) when no
    result came within timeout seconds; the result is not lost, a later
    next() returns it.  As multiprocessing's: an item whose task raised
    raises that exception at its place, and the next call goes on with
    the following item.  With chunksize > 1 an exception stands for its
    whole chunk (raised once, at the chunk's place), then the iteration
    goes on with the next chunk.

    An item that does not pickle raises its PicklingError at its place
    (in completion order: at the next call), and the iteration goes on
    with the items after it; an exception from the iterable itself raises
    at its place and ends the input, as multiprocessing's imap does.

    It is the C pool's streamed imap (fiber_pool_imap_stream): the pool
    chooses how many tasks travel together from their measured times, as
    for a map, and retries each task alone when a worker dies.  Tasks are
    put as results are taken, at most a window ahead (max(128, 8 x
    workers) tasks, each a chunk of chunksize items), so that memory
    stays bounded; the first window is put when imap is called.  A
    ``join()`` of the closed pool runs the inputs not yet put, as
    multiprocessing's does, and keeps their results for the iterator."""

    _ordered = True

    def __init__(self, pool, chunks, chunksize=1):
        self._pool = pool
        self._chunksize = chunksize
        self._chunks = iter(chunks)
        self._exhausted = False
        self._ready = collections.deque()   # values of a chunk taken
        self._lock = threading.Lock()
        self._window = max(128, 8 * pool._processes)
        self._put = self._taken = 0
        # The inputs in order, while their results are due: None for one
        # in the stream, an exception for one that never reached it (it
        # did not pickle, or the iterable raised there).  Unordered, only
        # the exceptions are kept, raised first come first.
        self._slots = collections.deque()
        self._failures = 0
        self._taken_raw = collections.deque()  # (rc, raw) join() drained
        self._draining = False
        self._stream = pool._pool.imap_stream(0, self._ordered, self._window)
        self._fill()

    def __iter__(self):
        return self

    def _failed(self, e):
        self._slots.append(e)
        self._failures += 1

    def _fill(self):
        """Puts what the window has room for (lock held, or in __init__);
        an input that failed holds a place of the window too, until its
        exception is raised."""
        room = self._window - (self._put - self._taken)
        if not self._draining:   # a drain keeps every result: no room held
            room -= self._failures
        if self._exhausted or room <= 0:
            return
        batch = []
        try:
            for _ in range(room):
                p = next(self._chunks)[1]
                if isinstance(p, _Unpicklable):
                    self._failed(p.error)
                    continue
                batch.append(p)
                if self._ordered:
                    self._slots.append(None)
        except StopIteration:
            self._exhausted = True
        except Exception as e:   # from the iterable: raised at its place
            self._exhausted = True
            self._failed(e)
        finally:
            if batch:
                self._put += _put_all(self._stream, batch)
        if self._exhausted:
            self._stream.end()

    def _raise_failed(self):
        """Raises the exception of the next input that never reached the
        stream, if it is due: at the head of the inputs in order, or any
        unordered."""
        slots = self._slots
        if slots and slots[0] is not None:
            self._failures -= 1
            raise slots.popleft()

    def next(self, timeout=None):
        ready = self._ready
        if ready:   # the rest of a chunk already taken: no lock needed
            try:
                return ready.popleft()
            except IndexError:
                pass  # another thread took the last one
        with self._lock:
            while not self._ready:
                self._fill()
                self._raise_failed()
                drained = self._taken_raw
                if drained:
                    rc, raw = drained.popleft()
                elif self._taken == self._put and self._exhausted:
                    raise StopIteration
                else:
                    try:
                        _, rc, raw = self._stream.next(_ms(timeout))
                    except _fiber.FiberTimeoutError:
                        raise TimeoutError from None
                    self._taken += 1
                if self._ordered:
                    self._slots.popleft()   # this result's place
                if rc:
                    _raise_failure(rc, raw.decode("utf-8", "replace"))
                value = env.decode(raw)   # the task's exception, at its place
                if self._chunksize == 1:
                    return value
                self._ready.extend(value)
            return self._ready.popleft()

    __next__ = next

    def _drain(self, timeout):
        """join()'s part: puts every input left and takes every result
        into _taken_raw, which next() reads first.  False when timeout
        seconds (None: no limit) ran out first; a pool that failed ends
        the drain (next() raises its error)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._draining = True
            while True:
                try:
                    self._fill()
                except _fiber.FiberError:
                    return True   # the pool failed: next() raises it
                if self._taken == self._put:   # nothing out
                    if self._exhausted:
                        return True
                    continue   # (the inputs taken all failed to pickle)
                left = None if deadline is None else \
                    max(0.0, deadline - time.monotonic())
                try:
                    _, rc, raw = self._stream.next(_ms(left))
                except _fiber.FiberTimeoutError:
                    return False
                except _fiber.FiberError:
                    return True
                self._taken += 1
                self._taken_raw.append((rc, raw))


class IMapUnorderedIterator(IMapIterator):
    """What imap_unordered returns (see IMapIterator): results in the order
    they finish, taken from the C pool's unordered stream, so that a slow
    item holds one place of the window, not the ones after it."""

    _ordered = False


def _put_all(stream, batch):
    """Puts batch, which the caller made to fit the stream's window, into
    a streamed imap; returns its length.  The pool taking fewer means the
    two counts of the window differ: a bug, said rather than a result
    silently lost."""
    took = stream.put(batch)
    if took != len(batch):
        raise RuntimeError("fiber: the pool took %d of %d inputs that fit "
                           "its window" % (took, len(batch)))
    return took


class _Unpicklable:
    """An imap input that did not pickle: its error, raised at its place."""

    __slots__ = ("error",)

    def __init__(self, error):
        self.error = error


def _run_callback(fn, *args):
    """Runs a completion on the callback thread: what it raises is printed,
    and the thread goes on with the next."""
    try:
        fn(*args)
    except Exception:
        import traceback
        traceback.print_exc()


def _complete_map(res):
    """A map result whose future is ready: decoded (a failure becomes its
    error), then its callback or error_callback, then get() wakes."""
    try:
        res._take(None)
    except BaseException:
        pass
    res._complete(0, None)


def _fiber_cpu_count():
    import os
    return os.cpu_count() or 1


# multiprocessing.pool's ThreadPool: its threads run in this process, never
# as jobs of the run (``from fiber.pool import ThreadPool`` works where the
# multiprocessing import did; fiber.dummy.Pool is the same class's cousin).
from multiprocessing.pool import ThreadPool  # noqa: E402,F401
