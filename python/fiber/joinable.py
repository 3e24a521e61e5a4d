"""fiber.JoinableQueue: multiprocessing.JoinableQueue over a fiber Queue.

The count of unfinished tasks is an int64 of the run's default manager
(fiber._shared) and join() waits on a manager condition, so task_done()
and join() work from any process of the run, on any backend.  put()
counts its item before the item can be taken, so task_done() for it never
finds the count at zero; a put that fails (queue.Full) takes its count
back.
"""
from . import _fiber, _runtime
from ._shared import Handle
from .queues import Queue
from . import synchronize


class JoinableQueue(Queue):
    """multiprocessing.JoinableQueue(maxsize=0): a Queue with task_done()
    and join()."""

    def __init__(self, maxsize=0, *, ctx=None, _handle=None):
        _runtime.require_master("fiber.JoinableQueue()")
        super().__init__(maxsize, _handle=_handle)
        self._unfinished = Handle.create(_fiber.K_VALUE, 0)
        self._cond = synchronize.Condition()

    def _add(self, n):
        return self._unfinished.mobj.value(_fiber.VOP_ADD, n)

    def put(self, obj, block=True, timeout=None):
        if self._closed:
            raise ValueError("Queue %r is closed" % self)
        self._add(1)
        try:
            super().put(obj, block, timeout)
        except BaseException:
            self._done()
            raise

    def _done(self):
        with self._cond:
            left = self._add(-1)
            if left < 0:
                self._add(1)
                raise ValueError("task_done() called too many times")
            if left == 0:
                self._cond.notify_all()

    def task_done(self):
        """Marks one item taken with get() as processed."""
        self._done()

    def join(self, timeout=None):
        """Waits until every item put has been marked done.  timeout is
        fiber's addition (multiprocessing's join has none): seconds to
        wait at most; returns True when the count reached zero, False when
        the timeout passed first."""
        with self._cond:
            return self._cond.wait_for(
                lambda: self._unfinished.mobj.value(_fiber.VOP_GET) == 0,
                timeout)

    def __reduce__(self):
        return (_rebuild, (self._q.serialize(), self._maxsize,
                           self._unfinished, self._cond))


def _rebuild(ser, maxsize, unfinished, cond):
    q = JoinableQueue.__new__(JoinableQueue)
    Queue.__init__(q, maxsize, _handle=_fiber.Queue.open(ser))
    q._unfinished = unfinished
    q._cond = cond
    return q
