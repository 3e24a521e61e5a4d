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
                     NoTaskError, TaskCrashedError)
from .managers import AsyncManager, BaseManager, Manager, SyncManager
from .meta import meta
from .pool import AsyncResult, Pool, TimeoutError
from .process import Process, active_children, current_process
from .queues import Pipe, Queue, SimpleQueue

__version__ = _fiber.VERSION

__all__ = [
    "init", "Process", "current_process", "active_children", "cpu_count",
    "Pool", "AsyncResult", "Queue", "SimpleQueue", "Pipe", "Manager",
    "BaseManager", "SyncManager", "AsyncManager", "meta", "FiberError",
    "ConfigError", "FiberTimeoutError", "TaskCrashedError", "ClosedError",
    "NoTaskError", "PicklingError", "RemoteError", "TimeoutError",
    "run_id", "is_master",
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
