"""fiber: multiprocessing's API (and Uber Fiber 0.2.1's) over fiber's C core.

Every process fiber starts is a job of the configured backend: local
processes by default, Docker containers, Slurm jobs or Kubernetes pods.
A program written for multiprocessing or Fiber runs on fiber by changing
its import::

    import fiber

    def square(x):
        return x * x

    if __name__ == "__main__":
        with fiber.Pool(4) as pool:
            print(pool.map(square, range(10)))

Configuration: ``fiber.init(backend="docker", image=...)``, ``FIBER_*``
environment variables, or ``.fiberconfig`` in the working directory (the C
library's keys; docs/configuration.md).  See docs/python.md.
"""
import os as _os

from . import _fiber
from ._envelope import PicklingError, RemoteError
from ._fiber import (ClosedError, ConfigError, FiberError, FiberTimeoutError,
                     NoTaskError, SpawnError, TaskCrashedError)
from .managers import AsyncManager, BaseManager, Manager, SyncManager
from .meta import meta
from .objects import ObjectRef, get, put
from .pool import AsyncResult, Pool, TimeoutError
from .process import Process, active_children, current_process
from .queues import Pipe, Queue, SimpleQueue
from .futures import Executor

__version__ = _fiber.VERSION

__all__ = [
    "init", "Process", "current_process", "active_children", "cpu_count",
    "Pool", "AsyncResult", "Queue", "SimpleQueue", "Pipe", "Manager",
    "BaseManager", "SyncManager", "AsyncManager", "meta", "FiberError",
    "ConfigError", "FiberTimeoutError", "TaskCrashedError", "ClosedError",
    "NoTaskError", "SpawnError", "PicklingError", "RemoteError", "TimeoutError",
    "run_id", "is_master", "on_stop_requested", "stop_requested", "resumed",
    "put", "get", "ObjectRef", "Executor",
]


def init(**config):
    """Starts fiber with configuration keys (``backend="slurm"``,
    ``log_level="info"``, ...), which win over ``FIBER_*`` variables and
    ``.fiberconfig``.  Optional: fiber starts by itself on first use.  An
    unknown key or a bad value raises ConfigError naming it.  In a job it
    does nothing (jobs run with their master's configuration)."""
    from . import _runtime
    if _runtime.child_mode:
        return
    _runtime.ensure(config)


def cpu_count():
    """The number of CPUs of this host (as multiprocessing.cpu_count())."""
    return _os.cpu_count() or 1


def run_id():
    """The run's name ("fiber-3f9a1c2e"), shared by the master and its jobs."""
    return _fiber.run_id()


def is_master():
    """True in the master, False in a job fiber started."""
    from . import _runtime
    return not _runtime.child_mode


def on_stop_requested(fn=None):
    """Calls fn(signum) once when the cluster asks this master to stop: the
    first SIGTERM (Slurm's time limit, pre-emption, scancel, scontrol
    requeue; a Kubernetes pod's deletion) or SIGUSR1 (Slurm's warning
    before the time limit, ``fiber run --signal``).  fn runs on fiber's
    stop thread, holding the GIL, while the main thread goes on; it may
    use fiber (a Pool's map, a Queue) and should save what the program
    needs to resume.  An exception it raises is printed and ignored, and
    so is SystemExit: to end the program, let the main thread see
    ``stop_requested()``.  A second SIGTERM ends the program as it always
    did, and SIGINT stays Python's KeyboardInterrupt.

    Until the first call fiber leaves SIGTERM and SIGUSR1 alone.  With no
    fn it only arms the event, for a program that polls stop_requested().
    Registered after the stop was delivered, fn runs at once.  Several
    callbacks (at most 16) run in the order they were registered.  Returns
    fn, so it can be used as a decorator.  Only in the master."""
    from . import _runtime
    _runtime.require_master("fiber.on_stop_requested()")
    _fiber.stop_arm(fn)
    return fn


def stop_requested():
    """0 until a stop was requested (see on_stop_requested), then the
    signal that asked: signal.SIGTERM or signal.SIGUSR1.  Always 0 while
    no on_stop_requested() call armed the event."""
    return _fiber.stop_requested()


def resumed():
    """How many times this run was restarted after its master was stopped
    (``fiber run --requeue``): FIBER_RESUMED, or on kubernetes the starts
    the master's Job counted before this one, else Slurm's
    SLURM_RESTART_COUNT; 0 for a fresh run.  A program that sees a
    nonzero count loads its checkpoint."""
    from . import _runtime
    if _runtime.child_mode:
        return 0
    _runtime.ensure()
    return _fiber.resumed()


# ---- multiprocessing's public API (fiber.context) ------------------------
# Every name of multiprocessing.__all__ (docs/python.md, "multiprocessing's
# names in fiber"): sync objects and shared ctypes served by the run's
# default manager (fiber._shared), the context and start-method calls,
# and multiprocessing's exceptions.
from .context import (AuthenticationError, BufferTooShort, ProcessError,
                      allow_connection_pickling, freeze_support,
                      get_all_start_methods, get_context, get_logger,
                      get_start_method, log_to_stderr, parent_process,
                      reducer, set_executable, set_forkserver_preload,
                      set_start_method)
from .context import (Array, Barrier, BoundedSemaphore, Condition, Event,
                      JoinableQueue, Lock, RLock, RawArray, RawValue,
                      Semaphore, Value)

__all__ += [
    "Lock", "RLock", "Semaphore", "BoundedSemaphore", "Event", "Condition",
    "Barrier", "Value", "Array", "RawValue", "RawArray", "JoinableQueue",
    "get_context", "set_start_method", "get_start_method",
    "get_all_start_methods", "freeze_support", "parent_process",
    "get_logger", "log_to_stderr", "ProcessError", "AuthenticationError",
    "BufferTooShort", "allow_connection_pickling", "reducer",
    "set_executable", "set_forkserver_preload",
]

# ---- Uber Fiber's names (its modules and configuration) ------------------
# fiber.config is Fiber's configuration module over fiber's live
# configuration; fiber.reset() is Fiber's: what code set goes back to the
# file's and the environment's values (docs/python.md, "Moving over from
# Uber's Fiber").
from . import config  # noqa: E402


def reset():
    """Uber Fiber's fiber.reset(): every key set by code (fiber.init,
    fiber.config) goes back to its value from .fiberconfig, the FIBER_*
    variables and the defaults."""
    config.reset()


__all__ += ["config", "reset"]
