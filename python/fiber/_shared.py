"""The default manager: the one job per master that hosts the objects of
fiber's multiprocessing-style constructors (fiber.Lock(), fiber.Value(),
fiber.Array(), fiber.JoinableQueue(), ...; fiber.synchronize,
fiber.sharedctypes, fiber.joinable).

It is started lazily, by the first such object, as a job of the run's
backend (named "Shared-objects"), and serves until the master exits, after
the master has joined its children.  Its objects are the C core's manager
objects (docs/manager.md): a process on the manager's host changes locks,
rlocks, int64 values and dicts in shared memory; any other process (a
container, a Slurm node, a pod) reaches them over the manager's socket.
Their handles pickle, so an object passes to any job of the run.

If the manager dies, every call on its objects raises fiber.ClosedError
(a wait in progress too: nothing hangs), and the next object created
starts a new manager.

Lifetime: an object that was never pickled is released (its memory in the
manager freed) when the master's last reference to it goes.  One that was
pickled, so that another process may hold it, lives until the run ends.
"""
import threading
import weakref

from . import _fiber, _runtime

_lock = threading.Lock()
_manager = None

# Codes that mean "a wait gave up" (timeout, or would block).
WOULD_WAIT = (_fiber.EAGAIN, _fiber.ETIMEDOUT)


def manager():
    """The default manager, started on first use (only in the master)."""
    global _manager
    with _lock:
        if _manager is None:
            _runtime.require_master("creating a shared object "
                                    "(fiber.Lock(), fiber.Value(), ...)")
            _manager = _fiber.Manager(name="Shared-objects")
            if _stop not in _runtime._shutdown_hooks:
                # First in the list, so it runs last at exit: after the
                # children using its objects have been joined.
                _runtime._shutdown_hooks.insert(0, _stop)
        return _manager


def _stop():
    global _manager
    with _lock:
        m, _manager = _manager, None
    if m is not None:
        m.shutdown()


def _forget(dead):
    global _manager
    with _lock:
        if _manager is dead:
            _manager = None
    try:
        dead.shutdown()
    except Exception:
        pass


def code(e):
    return getattr(e, "code", None)


class Handle:
    """One manager object as fiber's wrappers hold it: the _fiber.Mobj and
    whether it may be released when its creator forgets it."""
    __slots__ = ("mobj", "_state", "__weakref__")

    def __init__(self, mobj, state=None):
        self.mobj = mobj
        self._state = state

    @classmethod
    def create(cls, kind, n=0):
        m = manager()
        try:
            mobj = m.create(kind, None, n)
        except _fiber.FiberError as e:
            # The default manager died (killed, out of memory): its
            # objects are gone (their calls raise ClosedError), but new
            # ones get a new manager.  Until the master has seen the job
            # end, a create fails to reconnect instead (EUNREACHABLE).
            if not (isinstance(e, _fiber.ClosedError) or
                    str(getattr(e, "errname", "")).endswith("EUNREACHABLE")):
                raise
            _forget(m)
            mobj = manager().create(kind, None, n)
        state = {"shared": False}
        h = cls(mobj, state)
        f = weakref.finalize(h, _release_if_private, mobj, state)
        f.atexit = False
        return h

    def serialize(self):
        if self._state is not None:
            self._state["shared"] = True
        return self.mobj.serialize()

    def __reduce__(self):
        return (_open_handle, (self.serialize(),))


def _open_handle(ser):
    return Handle(_fiber.Mobj.open(ser))


def _release_if_private(mobj, state):
    if state["shared"] or _manager is None:
        return
    try:
        mobj.release()
    except Exception:
        pass
