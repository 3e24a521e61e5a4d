"""What a job of a Python fiber program runs: ``python -m fiber._bootstrap``.

1. Take the master's sys.path and import its main module under the name
   ``__mp_main__`` (as multiprocessing's spawn does), so that functions and
   classes defined there unpickle here while ``if __name__ == "__main__":``
   blocks do not run again.
2. Install the worker-side handlers (fiber._worker).
3. Call fiber_init(), which dials the master, proves the job belongs to
   the run, runs its assignment (a Process target, a pool's tasks, a
   manager's objects) and ends the process.  It does not return.
"""
import json
import os
import runpy
import sys
import types


def _import_main():
    paths = os.environ.pop("FIBER_PY_SYSPATH", None)
    if paths:
        sys.path[:] = json.loads(paths)
    module = os.environ.pop("FIBER_PY_MAIN_MODULE", None)
    path = os.environ.pop("FIBER_PY_MAIN_PATH", None)
    main = types.ModuleType("__mp_main__")
    if module:
        sys.modules["__mp_main__"] = main
        main.__dict__.update(runpy.run_module(module, run_name="__mp_main__",
                                              alter_sys=False))
    elif path:
        sys.modules["__mp_main__"] = main
        sys.argv[:] = [path]
        main.__file__ = path
        main.__dict__.update(runpy.run_path(path, run_name="__mp_main__"))
    else:
        return
    sys.modules["__main__"] = sys.modules["__mp_main__"] = main


def main():
    from . import _runtime, _worker
    _runtime.child_mode = True
    name = os.environ.get("FIBER_BOOT_NAME", "job")
    _worker.name = name
    if os.environ.get("FIBER_BOOT_ADDR") is None:
        sys.exit("fiber._bootstrap runs jobs that a fiber master started; "
                 "it is not a program of its own")
    try:
        _import_main()
    except BaseException:
        import traceback
        sys.stderr.write("fiber job %s: cannot import the program's main "
                         "module:\n%s" % (name, traceback.format_exc()))
        sys.stderr.flush()
        # Carry on: tasks whose functions live elsewhere still work, and
        # those that need __main__ fail with a clear error.
    _worker.install()
    from . import _fiber
    _fiber.init(name)
    sys.exit("fiber job %s: fiber_init() returned in a job" % name)


if __name__ == "__main__":
    main()
