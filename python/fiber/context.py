"""fiber's context: multiprocessing's context API (get_context,
set_start_method, ...) and the module-level names fiber takes from it.

fiber has one way to start a process: its backend launches a job that
runs a fresh interpreter, which imports the program's main module under
another name and unpickles the target, as multiprocessing's "spawn" does.
So fiber's one start method is "spawn":

- get_start_method() returns "spawn"; get_all_start_methods() ["spawn"].
- set_start_method("spawn") is accepted (once, unless force=True, as in
  multiprocessing); "fork" and "forkserver" raise ValueError saying why:
  a job may run on another host or in a container, where the master's
  memory cannot be forked.  set_start_method(None, force=True) resets.
- get_context() and get_context("spawn") return the one context object,
  whose attributes are fiber's names (ctx.Pool, ctx.Queue, ctx.Lock, ...).

Every name of multiprocessing.__all__ exists on the context and in the
fiber module; docs/python.md lists what each does in fiber.
"""
import logging
import multiprocessing as _mp
import multiprocessing.reduction as _reduction
import os
import sys

from . import _runtime
from . import synchronize as _sync
from . import sharedctypes as _shc

# The exceptions are multiprocessing's own, so that an `except
# multiprocessing.ProcessError` clause catches fiber's too.
ProcessError = _mp.ProcessError
BufferTooShort = _mp.BufferTooShort
AuthenticationError = _mp.AuthenticationError

_METHOD = "spawn"
_WHY_NOT = ("fiber starts every process as a job of its backend (a fresh "
            "interpreter, possibly on another host or in a container), as "
            "multiprocessing's 'spawn' does; %r cannot be honoured")


def _check_method(method):
    if method is None or method == _METHOD:
        return
    if method in ("fork", "forkserver"):
        raise ValueError(_WHY_NOT % method)
    raise ValueError("cannot find context for %r (fiber's one start method "
                     "is 'spawn')" % (method,))


class _ParentProcess:
    """parent_process() in a job: the master.  is_alive() is True while
    the job runs (a job ends within seconds of losing its master)."""
    name = "MainProcess"
    daemon = False
    exitcode = None

    @property
    def pid(self):
        value = _runtime.master_pid
        return int(value) if value else None

    ident = pid

    def is_alive(self):
        return True

    def join(self, timeout=None):
        raise AssertionError("a job cannot join its master")

    def __repr__(self):
        return "<_ParentProcess name='MainProcess' parent=None>"


class FiberContext:
    """What fiber.get_context() returns: multiprocessing's context API,
    every name of multiprocessing.__all__, over fiber."""
    ProcessError = ProcessError
    BufferTooShort = BufferTooShort
    AuthenticationError = AuthenticationError
    _name = _METHOD
    _start_method_set = False

    @property
    def Process(self):
        from .process import Process
        return Process

    @property
    def TimeoutError(self):
        from .pool import TimeoutError
        return TimeoutError

    # -- processes --
    def current_process(self):
        from .process import current_process
        return current_process()

    def parent_process(self):
        return _ParentProcess() if _runtime.child_mode else None

    def active_children(self):
        from .process import active_children
        return active_children()

    def cpu_count(self):
        """The number of CPUs of this host (multiprocessing.cpu_count();
        a job on another host may see another number)."""
        n = os.cpu_count()
        if n is None:
            raise NotImplementedError("cannot determine number of cpus")
        return n

    # -- managers, queues, pipes, pools --
    def Manager(self):
        from .managers import Manager
        return Manager()

    def Pipe(self, duplex=True):
        from .queues import Pipe
        return Pipe(duplex)

    def Queue(self, maxsize=0):
        from .queues import Queue
        return Queue(maxsize)

    def JoinableQueue(self, maxsize=0):
        from .joinable import JoinableQueue
        return JoinableQueue(maxsize)

    def SimpleQueue(self):
        from .queues import SimpleQueue
        return SimpleQueue()

    def Pool(self, processes=None, initializer=None, initargs=(),
             maxtasksperchild=None):
        from .pool import Pool
        return Pool(processes, initializer, initargs, maxtasksperchild)

    # -- synchronisation --
    def Lock(self):
        return _sync.make_lock()

    def RLock(self):
        return _sync.make_rlock()

    def Condition(self, lock=None):
        return _sync.make_condition(lock)

    def Semaphore(self, value=1):
        return _sync.make_semaphore(value)

    def BoundedSemaphore(self, value=1):
        return _sync.make_bounded_semaphore(value)

    def Event(self):
        return _sync.make_event()

    def Barrier(self, parties, action=None, timeout=None):
        return _sync.make_barrier(parties, action, timeout)

    # -- shared ctypes --
    def RawValue(self, typecode_or_type, *args):
        return _shc.RawValue(typecode_or_type, *args)

    def RawArray(self, typecode_or_type, size_or_initializer):
        return _shc.RawArray(typecode_or_type, size_or_initializer)

    def Value(self, typecode_or_type, *args, lock=True):
        return _shc.Value(typecode_or_type, *args, lock=lock)

    def Array(self, typecode_or_type, size_or_initializer, *, lock=True):
        return _shc.Array(typecode_or_type, size_or_initializer, lock=lock)

    # -- the program's set-up --
    def freeze_support(self):
        """Nothing to do: a fiber job runs the interpreter with
        ``-m fiber._bootstrap``, never a frozen executable's main."""

    def get_logger(self):
        """multiprocessing's logger (named "multiprocessing"): for the
        program's own messages; fiber's core logs to its own log
        (docs/configuration.md, log_level)."""
        return _mp.get_logger()

    def log_to_stderr(self, level=None):
        return _mp.log_to_stderr(level)

    def allow_connection_pickling(self):
        """Nothing to do: fiber's Connection objects always pickle."""

    def set_executable(self, executable):
        """The Python interpreter jobs run (default sys.executable).  Must
        be called in the master before its first job starts; it must
        have fiber importable (fiber puts its own path on PYTHONPATH)."""
        _runtime.set_executable(executable)

    def set_forkserver_preload(self, module_names):
        """Accepted and ignored, as multiprocessing does when the start
        method is not "forkserver" (fiber's never is)."""
        if not all(type(m) is str for m in module_names):
            raise TypeError("module_names must be a list of strings")

    def get_context(self, method=None):
        _check_method(method)
        return _default_context

    def get_start_method(self, allow_none=False):
        if allow_none and not FiberContext._start_method_set:
            return None
        return _METHOD

    def set_start_method(self, method, force=False):
        if FiberContext._start_method_set and not force:
            raise RuntimeError("context has already been set")
        if method is None and force:
            FiberContext._start_method_set = False
            return
        _check_method(method)
        if method is None:
            raise ValueError("set_start_method(None) needs force=True")
        FiberContext._start_method_set = True

    def get_all_start_methods(self):
        return [_METHOD]

    @property
    def reducer(self):
        """multiprocessing.reduction, for reading.  fiber pickles with the
        standard pickle module (protocol 5), so copyreg registrations
        apply to what it sends and ForkingPickler.register ones do not;
        replacing the reducer raises NotImplementedError."""
        return _reduction

    @reducer.setter
    def reducer(self, reduction):
        raise NotImplementedError("fiber pickles with the standard pickle "
                                  "module; register reductions with copyreg "
                                  "instead of replacing the reducer")

    def __repr__(self):
        return "<fiber context (start method 'spawn')>"


_default_context = FiberContext()


def get_context(method=None):
    """The context object (multiprocessing.get_context): method None or
    "spawn"; "fork" and "forkserver" raise ValueError."""
    return _default_context.get_context(method)


# The module-level names fiber exports, bound to the one context, as
# multiprocessing's are to its default context.
def _export():
    names = {}
    for name in ("Lock", "RLock", "Condition", "Semaphore", "BoundedSemaphore",
                 "Event", "Barrier", "RawValue", "RawArray", "Value", "Array",
                 "JoinableQueue", "freeze_support", "get_logger",
                 "log_to_stderr", "allow_connection_pickling",
                 "set_executable", "set_forkserver_preload",
                 "get_start_method", "set_start_method",
                 "get_all_start_methods", "parent_process"):
        names[name] = getattr(_default_context, name)
    names["reducer"] = _reduction
    return names


globals().update(_export())
