"""fiber.futures.ProcessPoolExecutor: a concurrent.futures Executor over
fiber's pool, so libraries that take an executor (anything written with
``submit``, ``as_completed``, ``wait``) run their tasks as fiber jobs on
the configured backend.

    from fiber.futures import ProcessPoolExecutor   # also fiber.Executor
    with ProcessPoolExecutor(max_workers=8) as ex:
        futures = [ex.submit(evaluate, x) for x in population]
        for f in concurrent.futures.as_completed(futures):
            ...

It has the standard library's signature and behaviour, with these
differences, each because the tasks run in fiber's pool:

- ``submit`` returns a real ``concurrent.futures.Future``.  Up to a window
  of tasks per worker (``4 * max_workers + 16``) are handed to the pool at
  once; a future is RUNNING from then on and can no longer be cancelled.
  Futures beyond the window stay PENDING in the executor, in submission
  order, and ``cancel()`` or ``shutdown(cancel_futures=True)`` cancels
  them, as the standard library does for the calls it has not yet queued.
- A worker that dies (SIGKILL, a segfault, OOM) does not break the
  executor: its task runs again on another worker, and a task that has
  killed ``max_task_crashes`` workers (default 3) fails its own future
  with ``fiber.TaskCrashedError``.  The standard library instead marks the
  whole executor broken (``BrokenProcessPool``) and fails every future.
- ``mp_context`` may be None or fiber's context (``fiber.get_context()``);
  another context raises ValueError: the workers are fiber's jobs.
- ``max_tasks_per_child`` is the pool's ``maxtasksperchild``.

``concurrent.futures.ProcessPoolExecutor(mp_context=fiber.get_context())``
cannot work: the standard executor moves its calls through OS pipes that a
job on another host cannot open.  fiber says so when it is tried
(fiber.process) and names this class.
"""
import collections
import concurrent.futures as _cf
import itertools
import threading

from . import _runtime
from .pool import Pool

__all__ = ["ProcessPoolExecutor", "Executor"]


def _call_chunk(fn, chunk):
    """One task of map(chunksize > 1): fn over a list of argument tuples."""
    return [fn(*args) for args in chunk]


class ProcessPoolExecutor(_cf.Executor):
    """concurrent.futures.ProcessPoolExecutor over a fiber Pool."""

    def __init__(self, max_workers=None, mp_context=None, initializer=None,
                 initargs=(), *, max_tasks_per_child=None,
                 max_task_crashes=0):
        if max_workers is not None and max_workers <= 0:
            raise ValueError("max_workers must be greater than 0")
        if mp_context is not None:
            from . import context
            if not isinstance(mp_context, context.FiberContext):
                raise ValueError(
                    "fiber's ProcessPoolExecutor runs its workers as fiber "
                    "jobs; mp_context must be None or fiber.get_context(), "
                    "not %r" % (mp_context,))
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be a callable")
        if max_tasks_per_child is not None:
            if not isinstance(max_tasks_per_child, int):
                raise TypeError("max_tasks_per_child must be an integer")
            if max_tasks_per_child <= 0:
                raise ValueError("max_tasks_per_child must be >= 1")
        _runtime.require_master("fiber.futures.ProcessPoolExecutor()")
        self._pool = Pool(max_workers, initializer, initargs,
                          maxtasksperchild=max_tasks_per_child,
                          max_task_crashes=max_task_crashes)
        self._max_workers = self._pool._processes
        self._window = 4 * self._max_workers + 16
        self._lock = threading.Lock()
        self._backlog = collections.deque()   # (future, fn, args, kwargs)
        self._running = 0
        self._shutdown = False
        self._idle = threading.Condition(self._lock)

    # -- submitting --
    def submit(self, fn, /, *args, **kwargs):
        future = _cf.Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after "
                                   "shutdown")
            if self._running >= self._window:
                self._backlog.append((future, fn, args, kwargs))
                return future
            self._running += 1
        self._dispatch(future, fn, args, kwargs)
        return future

    submit.__doc__ = _cf.Executor.submit.__doc__

    def _dispatch(self, future, fn, args, kwargs):
        """Hands one call to the pool; the future is RUNNING from here."""
        if not future.set_running_or_notify_cancel():
            self._finished()
            return

        def done(value):
            future.set_result(value)
            self._finished()

        def failed(error):
            future.set_exception(error)
            self._finished()

        try:
            self._pool.apply_async(fn, args, kwargs, callback=done,
                                   error_callback=failed)
        except BaseException as e:   # could not pickle fn or its arguments
            future.set_exception(e)
            self._finished()

    def _finished(self):
        """A running call ended: start the next pending one, if any."""
        with self._lock:
            nxt = None
            while self._backlog:
                nxt = self._backlog.popleft()
                if not nxt[0].cancelled():
                    break
                nxt = None
            if nxt is None:
                self._running -= 1
                self._idle.notify_all()
                return
        self._dispatch(*nxt)

    # -- map --
    def map(self, fn, *iterables, timeout=None, chunksize=1):
        """As the standard library's: results in input order, computed
        chunksize calls per task; TimeoutError when a result is not ready
        timeout seconds after map was called."""
        if chunksize < 1:
            raise ValueError("chunksize must be >= 1.")
        if chunksize == 1:
            return super().map(fn, *iterables, timeout=timeout)
        args = zip(*iterables)
        chunks = iter(lambda: list(itertools.islice(args, chunksize)), [])
        results = super().map(_call_chunk, itertools.repeat(fn), chunks,
                              timeout=timeout)
        return itertools.chain.from_iterable(results)

    def cancel_pending(self):
        """Cancels the calls not yet given to the pool (PENDING); returns
        how many.  The executor stays usable."""
        with self._lock:
            pending, self._backlog = self._backlog, collections.deque()
        return sum(f.cancel() for f, _, _, _ in pending)

    # -- ending --
    def shutdown(self, wait=True, *, cancel_futures=False):
        with self._lock:
            self._shutdown = True
            if cancel_futures:
                pending, self._backlog = self._backlog, collections.deque()
                for f, _, _, _ in pending:
                    f.cancel()
            if wait:
                while self._running or self._backlog:
                    self._idle.wait()
        if wait:
            self._pool.close()
            self._pool.join()
        else:
            # The calls already given run to their end; the pool closes
            # itself when the last one is in.
            threading.Thread(target=self._close_when_idle, daemon=True,
                             name="fiber-executor-shutdown").start()

    shutdown.__doc__ = _cf.Executor.shutdown.__doc__

    def _close_when_idle(self):
        with self._lock:
            while self._running or self._backlog:
                self._idle.wait()
        self._pool.close()
        self._pool.join()


Executor = ProcessPoolExecutor
