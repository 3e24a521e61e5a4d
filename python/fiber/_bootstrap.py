"""What a job of a Python fiber program runs: ``python -m fiber._bootstrap``.

1. Take the master's sys.path and sys.argv and import its main module
   under the name ``__mp_main__`` (as multiprocessing's spawn does), so
   that functions and classes defined there unpickle here, module-level
   code that reads sys.argv (an argparse at import time) sees the
   master's arguments, and ``if __name__ == "__main__":`` blocks do not
   run again.
2. Install the worker-side handlers (fiber._worker), and keep the
   job's resource tracker off shared memory blocks (fiber.shared_memory:
   a job that opened the master's block must not unlink it as it ends).
3. Call fiber_init(), which dials the master, proves the job belongs to
   the run, runs its assignment (a Process target, a pool's tasks, a
   manager's objects) and ends the process.  It does not return.
"""
import json
import os
import sys
import types


def _main_code(module, path):
    """The code of the master's main module, and its file name."""
    if module:
        import importlib.util
        spec = importlib.util.find_spec(module)
        if spec is None:
            raise ImportError("no module named %r" % module)
        if spec.submodule_search_locations:  # a package run with -m
            spec = importlib.util.find_spec(module + ".__main__")
        return spec.loader.get_code(spec.name), spec.origin
    with open(path, "rb") as f:
        return compile(f.read(), path, "exec"), path


def _import_main():
    """Runs the master's main module as __mp_main__.  It is registered as
    __main__ first, so that what it defined before a failure stays usable,
    as after a failed import."""
    paths = os.environ.pop("FIBER_PY_SYSPATH", None)
    if paths:
        sys.path[:] = json.loads(paths)
    argv = os.environ.pop("FIBER_PY_ARGV", None)
    if argv is not None:
        sys.argv[:] = json.loads(argv)
    module = os.environ.pop("FIBER_PY_MAIN_MODULE", None)
    path = os.environ.pop("FIBER_PY_MAIN_PATH", None)
    if not module and not path:
        return
    main = types.ModuleType("__mp_main__")
    sys.modules["__main__"] = sys.modules["__mp_main__"] = main
    code, origin = _main_code(module, path)
    main.__file__ = origin
    if path and argv is None:
        sys.argv[:] = [path]
    exec(code, main.__dict__)


def main():
    from . import _runtime
    _runtime.child_mode = True
    # Not a configuration key: taken out before fiber_init() reads FIBER_*.
    _runtime.master_pid = os.environ.pop("FIBER_PY_MASTER_PID", None)
    name = os.environ.get("FIBER_BOOT_NAME", "job")
    if os.environ.get("FIBER_BOOT_ADDR") is None:
        sys.exit("fiber._bootstrap runs jobs that a fiber master started; "
                 "it is not a program of its own")
    from .shared_memory import untrack_in_job
    untrack_in_job()    # before the main module: it may open a block
    try:
        _import_main()
    except BaseException:
        import traceback
        sys.stderr.write("fiber job %s: cannot import the program's main "
                         "module:\n%s" % (name, traceback.format_exc()))
        sys.stderr.flush()
        # Carry on: tasks whose functions live elsewhere still work, and
        # those that need __main__ fail with a clear error.
    run_job(name)


def run_job(name):
    """Steps 2 and 3, for a job this module started or one that
    fiber._forkserver forked (which has done step 1 once for all)."""
    from . import _fiber, _runtime, _worker
    _runtime.child_mode = True
    if "FIBER_PY_MASTER_PID" in os.environ:
        _runtime.master_pid = os.environ.pop("FIBER_PY_MASTER_PID")
    _worker.name = name
    _worker.tell_multiprocessing(name)
    _worker.install()
    _fiber.init(name)
    sys.exit("fiber job %s: fiber_init() returned in a job" % name)


if __name__ == "__main__":
    main()
