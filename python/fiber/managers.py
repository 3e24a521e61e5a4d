"""fiber.Manager(), BaseManager, SyncManager and Fiber's AsyncManager.

A manager is a job of the run that hosts objects; proxies to them pickle,
so they pass to other processes.  Two kinds of objects:

- Python objects (dict, list, Value, Array, Namespace, and every class
  given to ``register``) live in the manager's Python interpreter; a method
  call is one request whose method runs there, atomically with respect to
  every other call on the manager.
- Lock, RLock, Event, Semaphore, BoundedSemaphore, Barrier, Condition and
  Queue are fiber's native manager objects: their waits happen in the
  manager's C core, and a process that dies releases the locks it held.
"""
import array
import pickle
import threading
import types

from . import _envelope as env
from . import _fiber, _runtime
from .queues import Queue as _Queue

_WOULD_WAIT = (_fiber.EAGAIN, _fiber.ETIMEDOUT)


def _ms(blocking, timeout):
    if not blocking:
        return 0
    if timeout is None or timeout < 0:
        return -1
    return max(1, int(timeout * 1000))


# ---- proxies of Python objects -------------------------------------------

class _LazyMobj:
    """The handle of a proxy rebuilt from its pickle: it connects to the
    object's manager at its first call, not when it is unpickled.

    A proxy stored inside another managed object (a manager list holding
    a manager dict, as in multiprocessing's docs) is unpickled by the
    manager that hosts both, while that manager runs the call that stores
    it; connecting then would wait for the manager itself, which is busy
    with that very call (it timed out after connect_timeout_ms).  Stored,
    listed and returned again, such a proxy never connects; it does in the
    process that calls it.  (A method running in the manager that calls a
    proxy of the same manager still cannot be answered while it runs.)"""

    __slots__ = ("_ser", "_handle", "_lock")

    def __init__(self, ser):
        self._ser = bytes(ser)
        self._handle = None
        self._lock = threading.Lock()

    def _open(self):
        handle = self._handle
        if handle is None:
            with self._lock:
                if self._handle is None:
                    self._handle = _fiber.Mobj.open(self._ser)
                handle = self._handle
        return handle

    def op(self, *args):
        return self._open().op(*args)

    def serialize(self):
        return self._ser


class AsyncProxyResult:
    """What an AsyncManager proxy's call returns: get() waits for it."""

    def __init__(self, future):
        self._future = future

    def get(self, timeout=None):
        try:
            raw = self._future.get(-1 if timeout is None else int(timeout * 1000))
        except _fiber.FiberTimeoutError:
            raise TimeoutError from None
        return env.decode(raw)

    def ready(self):
        return self._future.ready()

    def wait(self, timeout=None):
        self._future.wait(-1 if timeout is None else int(timeout * 1000))


class BaseProxy:
    """A proxy of a Python object hosted by a manager."""
    _exposed_ = ()

    def __init__(self, mobj, exposed=None, asynchronous=False):
        object.__setattr__(self, "_mobj", mobj)
        object.__setattr__(self, "_async", asynchronous)
        object.__setattr__(self, "_exposed", tuple(exposed or self._exposed_))

    def _callmethod(self, name, args=(), kwds=None):
        data = pickle.dumps((name, tuple(args), dict(kwds or {})), protocol=5)
        if self._async:
            return AsyncProxyResult(self._mobj.op(_fiber.OP_CALL, -1, 0, data,
                                                  True))
        return env.decode(self._mobj.op(_fiber.OP_CALL, -1, 0, data))

    def _getvalue(self):
        return self._callmethod("copy") if "copy" in self._exposed else None

    def __reduce__(self):
        cls = type(self)
        if cls.__dict__.get("_auto"):
            return (_rebuild_auto, (cls.__name__, self._mobj.serialize(),
                                    self._exposed, self._async))
        return (_rebuild_proxy, (cls, self._mobj.serialize(), self._exposed,
                                 self._async))

    def __repr__(self):
        return "<%s object of a fiber manager>" % type(self).__name__

    def __str__(self):
        return self._callmethod("#repr") if not self._async else repr(self)


def _rebuild_proxy(cls, ser, exposed, asynchronous):
    return cls(_LazyMobj(ser), exposed, asynchronous)


def _rebuild_auto(name, ser, exposed, asynchronous):
    return MakeProxyType(name, exposed)(_LazyMobj(ser), exposed,
                                        asynchronous)


def _method(name):
    def call(self, *args, **kwds):
        return self._callmethod(name, args, kwds)
    call.__name__ = name
    return call


def MakeProxyType(name, exposed, _cache={}):
    """A proxy class whose methods are the names in exposed."""
    exposed = tuple(exposed)
    key = (name, exposed)
    if key not in _cache:
        ns = {n: _method(n) for n in exposed}
        ns["_exposed_"] = exposed
        ns["_auto"] = True
        _cache[key] = type(name, (BaseProxy,), ns)
    return _cache[key]


class _IterableProxy(BaseProxy):
    def __iter__(self):
        return iter(self._callmethod("copy"))


_DICT_METHODS = ("__contains__", "__delitem__", "__getitem__", "__len__",
                 "__setitem__", "clear", "copy", "get", "items", "keys",
                 "pop", "popitem", "setdefault", "update", "values")
_LIST_METHODS = ("__contains__", "__delitem__", "__getitem__", "__len__",
                 "__setitem__", "append", "count", "extend", "index",
                 "insert", "pop", "remove", "reverse", "sort", "copy")

DictProxy = type("DictProxy", (_IterableProxy,),
                 dict({n: _method(n) for n in _DICT_METHODS},
                      _exposed_=_DICT_METHODS,
                      __iter__=lambda self: iter(self._callmethod("keys"))))
ListProxy = type("ListProxy", (_IterableProxy,),
                 dict({n: _method(n) for n in _LIST_METHODS},
                      _exposed_=_LIST_METHODS))


def _list_iadd(self, value):
    self._callmethod("extend", (value,))
    return self


ListProxy.__iadd__ = _list_iadd


class _ValueBox:
    """A manager's Value: a typecode and a value."""

    def __init__(self, typecode, value, lock=True):
        self._typecode = typecode
        self._value = value

    def get(self):
        return self._value

    def set(self, value):
        self._value = value

    def copy(self):
        return self._value


class ValueProxy(BaseProxy):
    _exposed_ = ("get", "set")

    def get(self):
        return self._callmethod("get")

    def set(self, value):
        return self._callmethod("set", (value,))

    value = property(get, set)


class ArrayProxy(BaseProxy):
    _exposed_ = ("__len__", "__getitem__", "__setitem__", "tolist")
    __len__ = _method("__len__")
    __getitem__ = _method("__getitem__")
    __setitem__ = _method("__setitem__")

    def __iter__(self):
        return iter(self._callmethod("tolist"))


class NamespaceProxy(BaseProxy):
    _exposed_ = ("#getattr", "#setattr", "#delattr")

    def __getattr__(self, key):
        if key[0] == "_":
            return object.__getattribute__(self, key)
        try:
            return self._callmethod("#getattr", (key,))
        except AttributeError:
            raise AttributeError(key) from None

    def __setattr__(self, key, value):
        if key[0] == "_":
            return object.__setattr__(self, key, value)
        return self._callmethod("#setattr", (key, value))

    def __delattr__(self, key):
        if key[0] == "_":
            return object.__delattr__(self, key)
        return self._callmethod("#delattr", (key,))


def _array(typecode, sequence, lock=True):
    return array.array(typecode, sequence)


# ---- native objects ---------------------------------------------------------

class _Native:
    KIND = None

    def __init__(self, mobj):
        self._mobj = mobj

    def __reduce__(self):
        return (_rebuild_native, (type(self), self._mobj.serialize(),
                                  self._extra()))

    def _extra(self):
        return None

    def _op(self, op, timeout_ms=-1, n=0):
        return self._mobj.op(op, timeout_ms, n)

    def _owned(self, op, text, n=0, timeout_ms=-1):
        """An operation the caller must hold the lock for: FIBER_ESTATE
        (it does not) is Python's RuntimeError(text)."""
        try:
            return self._mobj.op(op, timeout_ms, n)
        except _fiber.FiberError as e:
            if getattr(e, "code", None) == _fiber.ESTATE:
                raise RuntimeError(text) from None
            raise

    def _wait(self, op, blocking, timeout, n=0):
        try:
            self._mobj.op(op, _ms(blocking, timeout), n)
            return True
        except _fiber.FiberError as e:
            if getattr(e, "code", None) in _WOULD_WAIT:
                return False
            raise


def _rebuild_native(cls, ser, extra):
    obj = cls.__new__(cls)
    _Native.__init__(obj, _LazyMobj(ser))
    obj._restore(extra)
    return obj


class _LockBase(_Native):
    def _restore(self, extra):
        pass

    def acquire(self, blocking=True, timeout=None):
        return self._wait(_fiber.OP_LOCK_ACQUIRE, blocking, timeout)

    def release(self):
        self._owned(_fiber.OP_LOCK_RELEASE, "release unlocked lock")

    def __enter__(self):
        self.acquire()
        return True

    def __exit__(self, *exc):
        self.release()


class LockProxy(_LockBase):
    KIND = _fiber.K_LOCK


class RLockProxy(_LockBase):
    KIND = _fiber.K_RLOCK


class EventProxy(_Native):
    KIND = _fiber.K_EVENT

    def _restore(self, extra):
        pass

    def set(self):
        self._op(_fiber.OP_EVENT_SET)

    def clear(self):
        self._op(_fiber.OP_EVENT_CLEAR)

    def is_set(self):
        return bool(self._op(_fiber.OP_EVENT_IS_SET))

    def wait(self, timeout=None):
        return self._wait(_fiber.OP_EVENT_WAIT, True, timeout)


class SemaphoreProxy(_Native):
    KIND = _fiber.K_SEMAPHORE

    def _restore(self, extra):
        pass

    def acquire(self, blocking=True, timeout=None):
        return self._wait(_fiber.OP_SEM_ACQUIRE, blocking, timeout)

    def release(self):
        self._op(_fiber.OP_SEM_RELEASE)

    def __enter__(self):
        self.acquire()
        return True

    def __exit__(self, *exc):
        self.release()


class _Counter:
    """The bound of a BoundedSemaphore, kept in the manager."""

    def __init__(self, value):
        self.value = value
        self.bound = value

    def take(self):
        self.value -= 1

    def give(self):
        if self.value >= self.bound:
            raise ValueError("Semaphore released too many times")
        self.value += 1


class BoundedSemaphoreProxy(SemaphoreProxy):
    def _extra(self):
        return self._count._mobj.serialize()

    def _restore(self, extra):
        self._count = BaseProxy(_LazyMobj(extra))

    def acquire(self, blocking=True, timeout=None):
        ok = super().acquire(blocking, timeout)
        if ok:
            self._count._callmethod("take")
        return ok

    def release(self):
        self._count._callmethod("give")
        super().release()


class BarrierProxy(_Native):
    KIND = _fiber.K_BARRIER

    def _extra(self):
        return self._parties

    def _restore(self, extra):
        self._parties = extra

    @property
    def parties(self):
        return self._parties

    def wait(self, timeout=None):
        try:
            return self._mobj.op(_fiber.OP_BARRIER_WAIT, _ms(True, timeout), 0)
        except _fiber.FiberError as e:
            if getattr(e, "code", None) in _WOULD_WAIT + (_fiber.ESTATE,):
                raise threading.BrokenBarrierError from None
            raise

    def reset(self):
        self._op(_fiber.OP_BARRIER_RESET)

    def abort(self):
        """Breaks the barrier (a wait that gives up at once, as Python's
        abort does for every waiter)."""
        try:
            self._mobj.op(_fiber.OP_BARRIER_WAIT, 0, 0)
        except _fiber.FiberError:
            pass


class ConditionProxy(_Native):
    KIND = _fiber.K_CONDITION

    def _restore(self, extra):
        pass

    def acquire(self, blocking=True, timeout=None):
        return self._wait(_fiber.OP_COND_ACQUIRE, blocking, timeout)

    def release(self):
        self._owned(_fiber.OP_COND_RELEASE, "cannot release un-acquired lock")

    def wait(self, timeout=None):
        try:
            return self._wait(_fiber.OP_COND_WAIT, True, timeout)
        except _fiber.FiberError as e:
            if getattr(e, "code", None) == _fiber.ESTATE:
                raise RuntimeError("cannot wait on un-acquired lock") from None
            raise

    def wait_for(self, predicate, timeout=None):
        import time
        end = None if timeout is None else time.monotonic() + timeout
        result = predicate()
        while not result:
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                break
            self.wait(left)
            result = predicate()
        return result

    def notify(self, n=1):
        self._owned(_fiber.OP_COND_NOTIFY, "cannot notify on un-acquired lock", n)

    def notify_all(self):
        self._owned(_fiber.OP_COND_NOTIFY_ALL, "cannot notify on un-acquired lock")

    def __enter__(self):
        self.acquire()
        return True

    def __exit__(self, *exc):
        self.release()


# ---- managers -----------------------------------------------------------------

class BaseManager:
    """multiprocessing.managers.BaseManager: ``register(typeid, callable)``
    adds a method ``typeid(*args)`` that creates an object of that type in
    the manager and returns its proxy."""
    _registry = {}
    _asynchronous = False

    def __init__(self, address=None, authkey=None, serializer="pickle",
                 ctx=None):
        if address is not None:
            raise ValueError("fiber starts its manager as a job of the run; "
                             "connecting to an address is not supported")
        self._m = None

    def start(self, initializer=None, initargs=()):
        if self._m is not None:
            raise RuntimeError("manager already started")
        _runtime.require_master("starting a Manager")
        self._m = _fiber.Manager()
        _runtime.on_shutdown_weak(self.shutdown)

    def _check(self):
        if self._m is None:
            raise RuntimeError("manager is not started (call start() or use "
                               "fiber.Manager())")

    def shutdown(self):
        if self._m is not None:
            m, self._m = self._m, None
            m.shutdown()

    def __enter__(self):
        if self._m is None:
            self.start()
        return self

    def __exit__(self, *exc):
        self.shutdown()

    def _create_python(self, factory, args, kwds, proxytype, exposed):
        self._check()
        state = b"C" + pickle.dumps((factory, args, kwds), protocol=5)
        mobj = self._m.create(_fiber.K_CUSTOM, None, 0, state)
        if exposed is None and proxytype is None:
            exposed = BaseProxy(mobj)._callmethod("#exposed")
        if proxytype is None:
            proxytype = MakeProxyType("AutoProxy[%s]" % getattr(
                factory, "__name__", "object"), exposed)
        return proxytype(mobj, exposed, self._asynchronous)

    @classmethod
    def register(cls, typeid, callable=None, proxytype=None, exposed=None,
                 method_to_typeid=None, create_method=True):
        if "_registry" not in cls.__dict__:
            cls._registry = dict(cls._registry)
        cls._registry[typeid] = (callable, proxytype, exposed)
        if create_method and callable is not None:
            def create(self, *args, **kwds):
                return self._create_python(callable, args, kwds, proxytype,
                                           exposed)
            create.__name__ = typeid
            setattr(cls, typeid, create)

    def _native(self, cls, n=0):
        self._check()
        obj = cls(self._m.create(cls.KIND, None, n))
        return obj


class SyncManager(BaseManager):
    """The manager fiber.Manager() starts: dict, list, Value, Array,
    Namespace, Lock, RLock, Event, Semaphore, BoundedSemaphore, Barrier,
    Condition, Queue."""

    def Lock(self):
        return self._native(LockProxy)

    def RLock(self):
        return self._native(RLockProxy)

    def Event(self):
        return self._native(EventProxy)

    def Semaphore(self, value=1):
        if value < 0:
            raise ValueError("semaphore initial value must be >= 0")
        return self._native(SemaphoreProxy, value)

    def BoundedSemaphore(self, value=1):
        s = self._native(BoundedSemaphoreProxy, value)
        s._count = self._create_python(_Counter, (value,), {}, BaseProxy,
                                       ("take", "give"))
        s._count._async = False
        return s

    def Barrier(self, parties, action=None, timeout=None):
        if action is not None:
            raise NotImplementedError("a fiber manager's Barrier has no "
                                      "action; call it after wait() in the "
                                      "party that gets index 0")
        b = self._native(BarrierProxy, parties)
        b._parties = parties
        return b

    def Condition(self, lock=None):
        """Condition() is the manager's native condition, with its own
        re-entrant lock; Condition(lock) takes a Lock or RLock of this
        manager and is built on three of its semaphores (as
        fiber.Condition(lock) is, see fiber.synchronize)."""
        if lock is None:
            return self._native(ConditionProxy)
        if not isinstance(lock, (LockProxy, RLockProxy)):
            raise TypeError("a manager's Condition(lock) needs a Lock or "
                            "RLock of a fiber manager, got %r" % (lock,))
        from .synchronize import _LockCondition
        return _LockCondition(lock, self.Semaphore,
                              isinstance(lock, RLockProxy))

    def Queue(self, maxsize=0):
        self._check()
        return _Queue(maxsize, _handle=self._m.queue(max(0, maxsize)))

    JoinableQueue = None

    def Value(self, typecode, value, lock=True):
        return self._create_python(_ValueBox, (typecode, value), {},
                                   ValueProxy, None)

    def Array(self, typecode, sequence, lock=True):
        return self._create_python(_array, (typecode, list(sequence)), {},
                                   ArrayProxy, None)


SyncManager.register("dict", dict, DictProxy)
SyncManager.register("list", list, ListProxy)
SyncManager.register("Namespace", types.SimpleNamespace, NamespaceProxy)


class AsyncManager(SyncManager):
    """Fiber's AsyncManager: calls on its Python objects' proxies return an
    AsyncProxyResult at once (its get() waits), so many calls can be in
    flight.  Its native objects (locks, events, ...) are synchronous."""
    _asynchronous = True


def Manager():
    """Starts and returns a SyncManager."""
    m = SyncManager()
    m.start()
    return m


class SharedMemoryManager(BaseManager):
    """multiprocessing.managers.SharedMemoryManager: ``SharedMemory(size)``
    and ``ShareableList(sequence)`` create blocks of this host's shared
    memory (fiber.shared_memory) that live until the manager shuts down,
    which unlinks every one of them.  The blocks are created in the master,
    not in the manager's job (which may run on another host): jobs on the
    master's host (the local backend) open them by name.  ``register``
    works as on BaseManager."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._blocks = []
        self._blocks_lock = threading.Lock()

    def _keep(self, block_of):
        self._check()
        with self._blocks_lock:
            obj = block_of()
            self._blocks.append(getattr(obj, "shm", obj))
        return obj

    def SharedMemory(self, size):
        """A new block of size bytes, unlinked at shutdown."""
        from .shared_memory import SharedMemory
        return self._keep(lambda: SharedMemory(create=True, size=size))

    def ShareableList(self, sequence):
        """A new ShareableList holding sequence, unlinked at shutdown."""
        from .shared_memory import ShareableList
        return self._keep(lambda: ShareableList(sequence))

    def shutdown(self):
        with self._blocks_lock:
            blocks, self._blocks = self._blocks, []
        for shm in blocks:
            try:
                shm.unlink()
            except FileNotFoundError:
                pass            # unlinked by its user already
        super().shutdown()
