"""fiber.Lock, RLock, Semaphore, BoundedSemaphore, Event, Condition and
Barrier: multiprocessing's synchronisation objects, shared by every
process of a run on any backend.

Each is an object of the run's default manager (fiber._shared): a lock
or rlock that a process on the manager's host uses is taken in shared
memory (one compare-and-swap), elsewhere over the manager's socket; the
waits of events, semaphores, conditions and barriers happen in the
manager.  They pickle: pass one to a Process, a pool task, or through a
Queue.  A process that dies while holding a Lock, an RLock or a
Condition's lock has it released by the manager (multiprocessing leaves
such a lock held forever); a Semaphore's unit taken by a dead process
stays taken, as in multiprocessing.

Built in Python on the manager's objects (the C core has no such kind):
Semaphore.get_value() and BoundedSemaphore's bound (an int64 value
counting free units beside the semaphore),
Condition(lock) with a lock of the caller's (three semaphores, the
textbook construction; Condition() with no lock is the core's native
condition), Barrier's action, default timeout, abort(), broken and
n_waiting (int64 values and a second native barrier).

In a job (not the master) the constructors return multiprocessing's own
objects: a job cannot start processes, so what it creates is used by its
own threads, and multiprocessing's objects refuse to be pickled to
another process, as they do under multiprocessing's spawn.
"""
import multiprocessing as _mp
import threading
import time

from . import _fiber, _runtime
from ._shared import WOULD_WAIT, Handle, code


def _ms(block, timeout):
    if not block:
        return 0
    if timeout is None:
        return -1
    return max(0, int(timeout * 1000))


def _in_job():
    return _runtime.child_mode


class _Object:
    """A wrapper of one or more manager objects; pickles as its handles
    plus what _extra() returns."""
    KIND = None

    def __init__(self, n=0):
        self._h = Handle.create(self.KIND, n)

    def _op(self, op, timeout_ms=-1, n=0):
        return self._h.mobj.op(op, timeout_ms, n)

    def _try(self, op, timeout_ms, n=0):
        """True when op succeeded, False when its wait gave up."""
        try:
            self._op(op, timeout_ms, n)
            return True
        except _fiber.FiberError as e:
            if code(e) in WOULD_WAIT:
                return False
            raise

    def _owned(self, op, text, n=0):
        try:
            return self._op(op, -1, n)
        except _fiber.FiberError as e:
            if code(e) == _fiber.ESTATE:
                raise RuntimeError(text) from None
            raise

    def __getstate__(self):
        return dict(self.__dict__)

    def __setstate__(self, state):
        self.__dict__.update(state)


# ---- locks -------------------------------------------------------------------

class Lock(_Object):
    """multiprocessing.Lock: acquire(block=True, timeout=None), release();
    any process may release it, as in multiprocessing."""
    KIND = _fiber.K_LOCK

    def __init__(self, *, ctx=None):
        super().__init__()

    def acquire(self, block=True, timeout=None):
        return self._try(_fiber.OP_LOCK_ACQUIRE, _ms(block, timeout))

    def release(self):
        self._owned(_fiber.OP_LOCK_RELEASE, "release unlocked lock")

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()

    def __repr__(self):
        return "<%s(fiber)>" % type(self).__name__


class RLock(Lock):
    """multiprocessing.RLock: re-entrant for the thread holding it, which
    must release it as many times as it acquired it."""
    KIND = _fiber.K_RLOCK

    def release(self):
        self._owned(_fiber.OP_LOCK_RELEASE,
                    "cannot release un-acquired lock")


# ---- semaphores ------------------------------------------------------------

class Semaphore(_Object):
    """multiprocessing.Semaphore(value=1): acquire(block, timeout),
    release(), get_value().  The units are the manager's semaphore; beside
    it an int64 of the manager counts the free units for get_value() and
    BoundedSemaphore's bound: an acquire records its unit after taking it,
    a release records it before giving it back, so the count never falls
    below the true one (it may be above it by the acquires in progress)."""
    KIND = _fiber.K_SEMAPHORE

    def __init__(self, value=1, *, ctx=None):
        if value < 0:
            raise ValueError("semaphore initial value must be >= 0")
        super().__init__(value)
        self._free = Handle.create(_fiber.K_VALUE, value)

    def acquire(self, block=True, timeout=None):
        ok = self._try(_fiber.OP_SEM_ACQUIRE, _ms(block, timeout))
        if ok:
            self._free.mobj.value(_fiber.VOP_ADD, -1)
        return ok

    def release(self):
        self._free.mobj.value(_fiber.VOP_ADD, 1)
        self._op(_fiber.OP_SEM_RELEASE)

    def get_value(self):
        """The number of free units (a snapshot, as multiprocessing's)."""
        return max(0, self._free.mobj.value(_fiber.VOP_GET))

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()

    def __repr__(self):
        return "<%s(fiber) value=%d>" % (type(self).__name__,
                                         self.get_value())


class BoundedSemaphore(Semaphore):
    """multiprocessing.BoundedSemaphore(value=1): release() beyond the
    initial value raises ValueError.  A release that matches an acquire
    never fails: the free count it checks is at most the true one plus
    the acquires in progress, and its own unit is not among those."""

    def __init__(self, value=1, *, ctx=None):
        super().__init__(value)
        self._bound = value

    def release(self):
        v = self._free.mobj
        while True:
            now = v.value(_fiber.VOP_GET)
            if now >= self._bound:
                raise ValueError("semaphore or lock released too many times")
            if v.value(_fiber.VOP_CAS, now, now + 1) == now:
                break
        self._op(_fiber.OP_SEM_RELEASE)


# ---- event ---------------------------------------------------------------------

class Event(_Object):
    """multiprocessing.Event: set(), clear(), is_set(), wait(timeout)."""
    KIND = _fiber.K_EVENT

    def __init__(self, *, ctx=None):
        super().__init__()

    def set(self):
        self._op(_fiber.OP_EVENT_SET)

    def clear(self):
        self._op(_fiber.OP_EVENT_CLEAR)

    def is_set(self):
        return bool(self._op(_fiber.OP_EVENT_IS_SET))

    def wait(self, timeout=None):
        return self._try(_fiber.OP_EVENT_WAIT, _ms(True, timeout))

    def __repr__(self):
        # multiprocessing's form, "<Event at 0x... set>"
        return "<%s at %#x %s>" % (type(self).__qualname__, id(self),
                                   "set" if self.is_set() else "unset")


# ---- condition -------------------------------------------------------------------

def _wait_for(cond, predicate, timeout):
    end = None if timeout is None else time.monotonic() + timeout
    result = predicate()
    while not result:
        left = None if end is None else end - time.monotonic()
        if left is not None and left <= 0:
            break
        cond.wait(left)
        result = predicate()
    return result


class _NativeCondition(_Object):
    """Condition() with its own re-entrant lock: the manager's condition."""
    KIND = _fiber.K_CONDITION

    def acquire(self, block=True, timeout=None):
        return self._try(_fiber.OP_COND_ACQUIRE, _ms(block, timeout))

    def release(self):
        self._owned(_fiber.OP_COND_RELEASE, "cannot release un-acquired lock")

    def wait(self, timeout=None):
        try:
            return self._try(_fiber.OP_COND_WAIT, _ms(True, timeout))
        except _fiber.FiberError as e:
            if code(e) == _fiber.ESTATE:
                raise RuntimeError("cannot wait on un-acquired lock") from None
            raise

    def wait_for(self, predicate, timeout=None):
        return _wait_for(self, predicate, timeout)

    def notify(self, n=1):
        self._owned(_fiber.OP_COND_NOTIFY, "cannot notify on un-acquired lock",
                    n)

    def notify_all(self):
        self._owned(_fiber.OP_COND_NOTIFY_ALL,
                    "cannot notify on un-acquired lock")

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()

    def __repr__(self):
        return "<Condition(fiber)>"


class _LockCondition:
    """Condition(lock) over a fiber Lock or RLock of the caller's.

    A waiter announces itself (sleepers += 1), releases the lock entirely
    and sleeps on `wakeup`; notify(n) hands out up to n wakeups, one per
    announced sleeper, and waits until each woken sleeper has confirmed
    (`woken`) before it returns, so a later notify cannot wake the same
    sleeper twice.  notify is called holding the lock, so notifiers run
    one at a time."""

    def __init__(self, lock, semaphore=None, reentrant=None):
        """semaphore and reentrant are for a manager's Condition(lock)
        (fiber.managers): its Semaphore factory, and whether its lock is
        an RLock.  Without them lock must be a fiber.Lock or RLock."""
        if semaphore is None:
            if not isinstance(lock, Lock):
                raise TypeError("fiber.Condition(lock) needs a fiber.Lock "
                                "or fiber.RLock, got %r" % (lock,))
            semaphore, reentrant = Semaphore, isinstance(lock, RLock)
        self._lock = lock
        self._reentrant = reentrant
        self._sleepers = semaphore(0)
        self._wakeup = semaphore(0)
        self._woken = semaphore(0)

    def acquire(self, block=True, timeout=None):
        return self._lock.acquire(block, timeout)

    def release(self):
        self._lock.release()

    def __enter__(self):
        return self._lock.__enter__()

    def __exit__(self, *exc):
        return self._lock.__exit__(*exc)

    def _release_all(self):
        """Releases the lock as many times as this thread holds it."""
        if not self._reentrant:
            self._lock.release()
            return 1
        depth = 0
        while True:
            try:
                self._lock.release()
            except RuntimeError:
                break
            depth += 1
        if depth == 0:
            raise RuntimeError("cannot wait on un-acquired lock")
        return depth

    def wait(self, timeout=None):
        self._sleepers.release()
        try:
            depth = self._release_all()
        except BaseException:
            # Leave as a sleeper that gave up at once: a notify that
            # counted it still gets its confirmation, never waits for it.
            self._woken.release()
            raise
        try:
            return self._wakeup.acquire(True, timeout)
        finally:
            self._woken.release()
            for _ in range(depth):
                self._lock.acquire()

    def wait_for(self, predicate, timeout=None):
        return _wait_for(self, predicate, timeout)

    def notify(self, n=1):
        # Sleepers that timed out confirmed without a wakeup: settle them.
        while self._woken.acquire(False):
            self._sleepers.acquire(False)
        woken = 0
        while woken < n and self._sleepers.acquire(False):
            self._wakeup.release()
            woken += 1
        for _ in range(woken):
            self._woken.acquire()
        # A sleeper that timed out after being counted left its wakeup.
        while self._wakeup.acquire(False):
            pass

    def notify_all(self):
        self.notify(1 << 62)

    def __repr__(self):
        return "<Condition(fiber, %r)>" % (self._lock,)


def Condition(lock=None, *, ctx=None):
    """multiprocessing.Condition(lock=None)."""
    if lock is None:
        return _NativeCondition()
    return _LockCondition(lock)


# ---- barrier ---------------------------------------------------------------------

class Barrier:
    """multiprocessing.Barrier(parties, action=None, timeout=None): wait
    returns an index from 0 to parties-1; a wait that times out, abort(),
    or an action that raises breaks it (threading.BrokenBarrierError)
    until reset().  The action (which must pickle) runs in the party that
    arrives last, before any party is released."""

    def __init__(self, parties, action=None, timeout=None, *, ctx=None):
        if parties < 1:
            raise ValueError("parties must be >= 1")
        self._parties = parties
        self._action = action
        self._timeout = timeout
        self._first = Handle.create(_fiber.K_BARRIER, parties)
        self._second = (Handle.create(_fiber.K_BARRIER, parties)
                        if action is not None else None)
        self._broken = Handle.create(_fiber.K_VALUE, 0)
        self._waiting = Handle.create(_fiber.K_VALUE, 0)

    @property
    def parties(self):
        return self._parties

    @property
    def n_waiting(self):
        return max(0, self._waiting.mobj.value(_fiber.VOP_GET))

    @property
    def broken(self):
        return bool(self._broken.mobj.value(_fiber.VOP_GET))

    def _phase(self, handle, timeout):
        try:
            return handle.mobj.op(_fiber.OP_BARRIER_WAIT, _ms(True, timeout),
                                  0)
        except _fiber.FiberError as e:
            if code(e) in WOULD_WAIT:
                self._broken.mobj.value(_fiber.VOP_SET, 1)
            if code(e) in WOULD_WAIT + (_fiber.ESTATE,):
                raise threading.BrokenBarrierError from None
            raise

    def wait(self, timeout=None):
        if timeout is None:
            timeout = self._timeout
        if self.broken:
            raise threading.BrokenBarrierError
        self._waiting.mobj.value(_fiber.VOP_ADD, 1)
        try:
            index = self._phase(self._first, timeout)
        finally:
            self._waiting.mobj.value(_fiber.VOP_ADD, -1)
        if self._second is not None:
            if index == self._parties - 1:
                try:
                    self._action()
                except BaseException:
                    self.abort()
                    raise
            self._phase(self._second, timeout)
        if self.broken:
            raise threading.BrokenBarrierError
        return index

    @staticmethod
    def _break(handle):
        """Breaks a native barrier: a wait that gives up at once breaks it
        (one that completes a round instead is repeated)."""
        for _ in range(3):
            try:
                handle.mobj.op(_fiber.OP_BARRIER_WAIT, 0, 0)
            except _fiber.FiberError:
                return

    def abort(self):
        self._broken.mobj.value(_fiber.VOP_SET, 1)
        if self._parties > 1:
            self._break(self._first)
            if self._second is not None:
                self._break(self._second)

    def reset(self):
        self._broken.mobj.value(_fiber.VOP_SET, 0)
        for h in (self._first, self._second):
            if h is not None:
                h.mobj.op(_fiber.OP_BARRIER_RESET, -1, 0)

    def __repr__(self):
        return "<Barrier(fiber) parties=%d>" % self._parties


# ---- the constructors fiber exports ----------------------------------------------
# multiprocessing's signatures; in a job, multiprocessing's own objects.

def make_lock():
    return _mp.Lock() if _in_job() else Lock()


def make_rlock():
    return _mp.RLock() if _in_job() else RLock()


def make_semaphore(value=1):
    return _mp.Semaphore(value) if _in_job() else Semaphore(value)


def make_bounded_semaphore(value=1):
    return (_mp.BoundedSemaphore(value) if _in_job()
            else BoundedSemaphore(value))


def make_event():
    return _mp.Event() if _in_job() else Event()


def make_condition(lock=None):
    return _mp.Condition(lock) if _in_job() else Condition(lock)


def make_barrier(parties, action=None, timeout=None):
    return (_mp.Barrier(parties, action, timeout) if _in_job()
            else Barrier(parties, action, timeout))
