"""fiber.Process: multiprocessing.Process whose every process is a job of the
configured backend (a local process, a container, a Slurm job, a pod)."""
import itertools
import os
import threading

from . import _envelope as env
from . import _fiber, _runtime

_counter = itertools.count(1)
# Started and not yet joined or seen to have ended.  A strong reference, as
# multiprocessing's: a process started and then dropped
# (``Process(target=f).start()``) runs to its end, and active_children()
# lists it meanwhile; it leaves the set when joined, or when start() or
# active_children() finds it ended (_reap).
_children = set()
_lock = threading.Lock()


def _reap():
    """Forgets the children that have ended (multiprocessing's _cleanup)."""
    with _lock:
        ended = [p for p in _children
                 if p._handle is None or not p._handle.is_alive()]
        _children.difference_update(ended)


def _meta_of(target):
    """What a target's @fiber.meta (or its bound object's) asks for, or
    None."""
    return getattr(target, "__fiber_meta__", None) or \
        getattr(getattr(target, "__self__", None), "__fiber_meta__", None)


def _job_meta(target):
    """The resources a target's @fiber.meta asks for (else fiber.config's
    cpu_per_job and mem_per_job)."""
    meta = _meta_of(target) or {}
    # Without @fiber.meta: fiber.config's cpu_per_job and mem_per_job.
    from .config import job_defaults
    dflt = job_defaults()
    return {"cpu": int(meta.get("cpu") or dflt["cpu"]),
            "memory": int(meta.get("memory") or dflt["memory"]),
            "gpu": int(meta.get("gpu") or 0)}


class Process:
    """A process of the run, with multiprocessing.Process's API:
    ``Process(target=f, args=(1,)).start()``; ``join(timeout)``,
    ``terminate()``, ``kill()``, ``is_alive()``, ``exitcode`` (minus the
    signal number when killed), ``pid``, ``name``, ``daemon``.  Subclasses
    may override ``run()``.  The Process object itself is pickled to the
    job, so its target, arguments and attributes must pickle."""

    def __init__(self, group=None, target=None, name=None, args=(),
                 kwargs=None, *, daemon=None):
        if group is not None:
            raise ValueError("group must be None")
        self._target = target
        self._args = tuple(args)
        self._kwargs = dict(kwargs or {})
        self._name = name or "%s-%d" % (type(self).__name__, next(_counter))
        self._daemon = bool(daemon) if daemon is not None else False
        self._handle = None
        self._closed = False

    # -- what the job runs --
    def run(self):
        if self._target is not None:
            self._target(*self._args, **self._kwargs)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_handle"] = None
        state.pop("_sentinel_fd", None)
        state["_authkey"] = self.authkey  # the child inherits it
        return state

    # -- control --
    def start(self):
        if self._handle is not None:
            raise AssertionError("cannot start a process twice")
        if self._closed:
            raise ValueError("process object is closed")
        _runtime.require_master("Process.start()")
        _reap()
        payload = env.task(env.PROC, env.dumps_callable(self), None,
                           self._name)
        self._handle = _fiber.Process(payload, name=self._job_name(),
                                      **_job_meta(self._target))
        # As multiprocessing does (bpo-30775): the job has its own copy, and
        # the master no longer keeps the target and its arguments alive
        # (a large array, or a cycle back to this object).
        self._target, self._args, self._kwargs = None, (), {}
        with _lock:
            _children.add(self)

    def _job_name(self):
        # A job's name must be [A-Za-z0-9_.-]; keep the user's when it is.
        ok = all(c.isalnum() or c in "_.-" for c in self._name)
        return self._name if ok and self._name[0] != "." else None

    def _check(self):
        if self._closed:
            raise ValueError("process object is closed")
        if self._handle is None:
            raise AssertionError("can only use a started process")

    def join(self, timeout=None):
        self._check()
        ms = -1 if timeout is None else max(0, int(timeout * 1000))
        if self._handle.join(ms):
            with _lock:
                _children.discard(self)

    def terminate(self):
        self._check()
        self._handle.terminate()

    def kill(self):
        self._check()
        self._handle.kill()

    def _is_current(self):
        """This object is the Process the job running it was started for
        (multiprocessing's child sees itself as started and alive)."""
        if not _runtime.child_mode:
            return False
        from . import _worker
        return _worker.current is self

    def is_alive(self):
        if self._closed:
            raise ValueError("process object is closed")
        if self._is_current():
            return True
        if self._handle is None:
            return False
        return self._handle.is_alive()

    def close(self):
        if self._handle is not None and self._handle.is_alive():
            raise ValueError("cannot close a process while it is still "
                             "running; join or terminate it first")
        self._handle = None
        self._closed = True
        with _lock:
            _children.discard(self)
        fd = self.__dict__.pop("_sentinel_fd", None)
        if fd is not None:
            os.close(fd)

    @property
    def exitcode(self):
        if self._handle is None:
            return None
        return self._handle.exitcode()

    @property
    def pid(self):
        if self._is_current():
            return os.getpid()      # multiprocessing's child sees its own
        if self._handle is None:
            return None
        return self._handle.pid()

    ident = pid

    @property
    def name(self):
        return self._name

    @name.setter
    def name(self, value):
        self._name = str(value)

    @property
    def daemon(self):
        return self._daemon

    @daemon.setter
    def daemon(self, value):
        if self._handle is not None:
            raise AssertionError("process has already started")
        self._daemon = bool(value)

    # -- multiprocessing's sentinel and authkey (fiber._sentinel) --
    @property
    def sentinel(self):
        """A file descriptor that becomes readable when the process
        ends (for multiprocessing.connection.wait and select)."""
        if self._handle is None and not self._closed:
            raise ValueError("process not started")
        self._check()
        with _lock:
            fd = self.__dict__.get("_sentinel_fd")
            if fd is None:
                from . import _sentinel
                fd = self._sentinel_fd = _sentinel.make(self._handle,
                                                        self._name)
        return fd

    @property
    def authkey(self):
        """As multiprocessing's: bytes inherited from the process that
        created this one (the master's are random); settable."""
        key = self.__dict__.get("_authkey")
        return key if key is not None else current_process().authkey

    @authkey.setter
    def authkey(self, value):
        self._authkey = bytes(value)

    def __repr__(self):
        if self._is_current():
            status = "started"
        elif self._handle is None:
            status = "initial"
        elif self._handle.is_alive():
            status = "started"
        else:
            status = "stopped exitcode=%s" % self.exitcode
        return "<%s name=%r %s%s>" % (type(self).__name__, self._name, status,
                                      " daemon" if self._daemon else "")


class _MainProcess:
    name = "MainProcess"
    daemon = False
    exitcode = None

    # multiprocessing's own current process's key (random in the master;
    # in a Process job, the master's, set by fiber._worker), so that the
    # two modules agree on it.
    @property
    def authkey(self):
        import multiprocessing.process as mpp
        return bytes(mpp.current_process().authkey)

    @authkey.setter
    def authkey(self, value):
        import multiprocessing.process as mpp
        mpp.current_process().authkey = bytes(value)

    @property
    def pid(self):
        return os.getpid()

    ident = pid

    def is_alive(self):
        return True

    def __repr__(self):
        return "<_MainProcess name='MainProcess' parent=None started>"


class _JobProcess(_MainProcess):
    """current_process() in a pool worker or manager job."""

    def __init__(self, name):
        self.name = name


_main = _MainProcess()


def current_process():
    from . import _worker
    if _runtime.child_mode:
        if _worker.current is not None:
            return _worker.current
        return _JobProcess(_worker.job_name() or "job")
    return _main


def active_children():
    _reap()
    with _lock:
        return list(_children)


def _join_non_daemon():
    """At exit, as multiprocessing does: wait for non-daemon children,
    terminate daemon ones (fiber_shutdown ends whatever is left)."""
    for p in active_children():
        try:
            if p.daemon:
                p.terminate()
            else:
                p.join()
        except Exception:
            pass


_runtime.on_shutdown(_join_non_daemon)


# multiprocessing.process's other public names.  BaseProcess is the class
# a program subclasses (overriding run()) or checks with isinstance: here,
# fiber's Process.
BaseProcess = Process


def parent_process():
    """None in the master; in a job, the master (fiber.parent_process)."""
    from .context import parent_process as parent
    return parent()
