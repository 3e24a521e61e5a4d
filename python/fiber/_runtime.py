"""Starting fiber in a Python master, and what every job must be told.

``ensure()`` runs fiber_init() the first time anything needs the runtime
(``fiber.init()`` does it explicitly, with configuration).  Before that it
sets the job command: every job is ``<this interpreter> -m
fiber._bootstrap``, told in its environment which script or module is the
program's main one and which sys.path to use, so that it can import the
functions and classes the master sends it.
"""
import atexit
import json
import os
import sys
import threading

from . import _fiber

_lock = threading.RLock()
_started = False
child_mode = False     # set by fiber._bootstrap in a job
_shutdown_hooks = []   # callables run before fiber_shutdown() at exit
_executable = None     # set_executable(): the interpreter jobs run
master_pid = None      # in a job: the master's pid (parent_process())
used = False           # this process started fiber or opened a handle
forked_from = None     # the pid this process was fork()ed from, if that
                       # process had used fiber (its handles are not ours)


def _after_fork_in_child():
    global forked_from, used
    if used or _started:
        forked_from = os.getppid()
        used = False


os.register_at_fork(after_in_child=_after_fork_in_child)


def check_not_forked(what):
    """Raises at once, with the reason, in a process that fork() copied
    from one that had used fiber (multiprocessing's 'fork' start method):
    the handles it inherited are that process's connections (sharing them
    would mix two processes' messages on one socket), and fiber's threads
    were not copied.  A child started with 'spawn' or 'forkserver' is
    handed its queues and pipe ends by pickling, and opens its own."""
    if forked_from is not None:
        raise RuntimeError(
            "%s: this process was forked from process %d, which uses fiber; "
            "a fiber object inherited through fork() cannot be used here (its "
            "connections belong to process %d). Start the process with "
            "multiprocessing.get_context(\"spawn\") (or \"forkserver\"), "
            "which pickles the object so the child opens its own, or use "
            "fiber.Process" % (what, forked_from, forked_from))


def _main_info():
    """How a job finds the master's __main__: a module name (python -m),
    a script path, or nothing (an interactive session, python -c, a
    program read from standard input)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and getattr(spec, "name", None):
        name = spec.name
        if name.endswith(".__main__"):
            name = name[: -len(".__main__")]
        return {"FIBER_PY_MAIN_MODULE": name}
    path = getattr(main, "__file__", None)
    if path and not (path.startswith("<") and path.endswith(">")):
        return {"FIBER_PY_MAIN_PATH": os.path.abspath(path)}
    # No file to run again: python -c, a session, or a program read from
    # its standard input (python - < prog.py names it "<stdin>").  Tasks
    # defined elsewhere work; one defined in such a __main__ fails to
    # unpickle with a clear error, as in a `python -c` master.
    return {}


def job_environment():
    # PYTHONPATH lets `-m fiber._bootstrap` find this very package in a job
    # whose environment is not the master's (a container, a Slurm node);
    # the bootstrap then takes the master's whole sys.path.
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {"FIBER_PY_SYSPATH": json.dumps([p if p else os.getcwd()
                                           for p in sys.path]),
           # multiprocessing's spawn gives a child the parent's sys.argv
           "FIBER_PY_ARGV": json.dumps(list(sys.argv)),
           "PYTHONPATH": os.pathsep.join(
               [here] + [p for p in [os.environ.get("PYTHONPATH")] if p])}
    env.update(_main_info())
    env["FIBER_PY_MASTER_PID"] = str(os.getpid())  # parent_process().pid
    return env


def configure(config):
    """Sets configuration keys (before or after init): fiber's, or Uber
    Fiber's mapped onto them (fiber/config.py); an unknown key or a bad
    value raises fiber.ConfigError naming it."""
    from . import config as fiber_config  # fiber's keys and Fiber's
    for key, value in config.items():
        fiber_config.set(str(key), value)


def ensure(config=None):
    """Starts fiber in this process if it has not started (the master)."""
    global _started
    if child_mode:
        if config:
            raise RuntimeError("fiber.init() with configuration is for the "
                               "master; a job runs with its master's")
        return
    with _lock:
        if config:
            configure(config)
        if _started:
            return
        env = ["%s=%s" % kv for kv in job_environment().items()]
        _fiber.job_command_set(_job_argv(), env)
        _fiber.job_forkserver_set(_forkserver_argv())
        _fiber.init(sys.argv[0] if sys.argv and sys.argv[0] else "python")
        _started = True
        atexit.register(_at_exit)


def _job_argv():
    return [os.path.abspath(_executable or sys.executable), "-m",
            "fiber._bootstrap"]


def _forkserver_argv():
    """The fork server the local backend forks jobs from (fork_server)."""
    return [os.path.abspath(_executable or sys.executable), "-m",
            "fiber._forkserver"]


def set_executable(path):
    """multiprocessing.set_executable: the interpreter every job runs.
    Only in the master, before its first job starts (fiber_job_command_set
    refuses later: FIBER_ESTATE)."""
    global _executable
    if child_mode:
        raise RuntimeError("set_executable() is for the master")
    path = os.fsdecode(path)
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        raise ValueError("set_executable: %r is not an executable file"
                         % path)
    with _lock:
        old, _executable = _executable, path
        if _started:
            env = ["%s=%s" % kv for kv in job_environment().items()]
            try:
                _fiber.job_command_set(_job_argv(), env)
                _fiber.job_forkserver_set(_forkserver_argv())
            except Exception:
                _executable = old
                raise


def require_master(what):
    """Starts fiber if needed; in a job, raises a clear error: only the
    master starts jobs and creates the objects that live on its server."""
    check_not_forked(what)
    if child_mode:
        raise RuntimeError(
            "%s: only the master can do this, and this is a job of the run. "
            "If this happened while the job imported the program's main "
            "module, that module starts work at import time: put it under "
            "`if __name__ == \"__main__\":`, as multiprocessing requires"
            % what)
    ensure()


def started():
    return _started


def on_shutdown(fn):
    _shutdown_hooks.append(fn)


def on_shutdown_weak(method):
    """Runs the bound method at shutdown if its object is still alive,
    without keeping it alive: a Pool or Manager that the program drops is
    collected (and its workers or its manager job end then), as
    multiprocessing's are."""
    import weakref
    ref = weakref.WeakMethod(method)

    def hook():
        m = ref()
        if m is not None:
            m()
    with _lock:
        _shutdown_hooks[:] = [h for h in _shutdown_hooks
                              if getattr(h, "_fiber_ref", ref)() is not None]
        hook._fiber_ref = ref
        _shutdown_hooks.append(hook)


def _at_exit():
    for fn in reversed(_shutdown_hooks):
        try:
            fn()
        except Exception:
            pass
    _fiber.shutdown()
