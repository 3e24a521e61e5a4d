"""The worker side: what a job runs for each task and each manager method.

fiber._fiber runs a call, a map's task and a chunk itself (envelope.c),
calling ``_callable``, ``task_raised`` and ``answer_ok`` for their rare
paths; it calls ``run_task`` with any other task's envelope (a memoryview
valid during the call) and ``run_method`` for each method call on a Python
object that a manager hosts.  Both run on the job's own threads with the
GIL held.
"""
import os
import pickle
import sys
import traceback

from . import _envelope as env

_funcs = {}          # pickled callable -> callable (a worker's cache)
_FUNC_CACHE_MAX = 256

current = None       # the Process object this job runs, if any


def _callable(func_bytes):
    f = _funcs.get(func_bytes)
    if f is None:
        if func_bytes[:4] == env.SHARED_MAGIC:   # see env.dumps_callable
            from .objects import ObjectRef, Shared
            return Shared(_callable(func_bytes[44:]),
                          ObjectRef(bytes(func_bytes[4:44])))
        f = pickle.loads(func_bytes)
        if len(_funcs) >= _FUNC_CACHE_MAX:
            _funcs.clear()
        _funcs[func_bytes] = f
    return f


def _flush():
    for s in (sys.stdout, sys.stderr):
        try:
            if s is not None:
                s.flush()
        except Exception:
            pass


def _run_process(proc):
    """A Process target: returns the exit code as multiprocessing's
    children do (0; 1 and a traceback on stderr if run() raised; the code
    of a SystemExit)."""
    global current
    current = proc
    tell_multiprocessing(proc.name, proc.authkey)
    code = 0
    try:
        proc.run()
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            sys.stderr.write(str(e.code) + "\n")
            code = 1
    except BaseException:
        sys.stderr.write("Process %s:\n" % proc.name)
        traceback.print_exc()
        code = 1
    _join_threads()
    _flush()
    return code


def tell_multiprocessing(name, authkey=None):
    """What multiprocessing's own functions say in a job, for code that
    still calls them (a library, logging's processName): its
    current_process() gets the job's name (and a Process job's inherited
    authkey), its parent_process() the master, as in a multiprocessing
    child."""
    try:
        import multiprocessing.process as mpp
        from .context import _ParentProcess
        me = mpp.current_process()
        me.name = name
        if authkey is not None:
            me.authkey = authkey
        mpp._parent_process = _ParentProcess()
    except Exception:
        pass


def _join_threads():
    """Before the job ends, as a multiprocessing child does (its bootstrap
    calls threading._shutdown): runs threading's exit hooks (which tell a
    concurrent.futures ThreadPoolExecutor's idle workers to end), then
    waits for the non-daemon threads that the target started, which would
    otherwise be cut off mid-work.  Daemon threads end with the process.
    A Process target runs on the job's main thread (fiber_init is called
    there), the one thread threading._shutdown may be called from."""
    import threading
    if threading.current_thread() is threading.main_thread():
        threading._shutdown()


def _unloadable_process(e):
    """A Process whose target (or the Process object) does not unpickle
    here: says why on the job's stderr, as a multiprocessing child prints
    its traceback, and exits with 1 (the message also travels to the
    master in the job's EXIT).  On the local backend the job's stderr is
    the master's; elsewhere it is in the job's log (fiber logs RUN)."""
    hint = ""
    if "__mp_main__" in str(e) or "__main__" in str(e):
        hint = (" (a target defined only under `if __name__ == "
                "\"__main__\":` does not exist in a job, which imports the "
                "main module without running that block: define it at the "
                "top level of the module, as multiprocessing requires)")
    text = ("fiber: this process cannot load its target: %s: %s%s"
            % (type(e).__name__, e, hint))
    try:
        sys.stderr.write(traceback.format_exc())
        sys.stderr.write(text + "\n")
    except Exception:
        pass
    _flush()
    return text


def _end_for_retry(name, tb_text):
    """Pool(error_handling=True), Uber Fiber's resilient pool: a task that
    raises ends its worker, as it did in Fiber, so that the C pool sends
    the task to another worker (up to the pool's max_task_crashes) and
    starts a replacement.  The traceback goes to the job's log."""
    sys.stderr.write("task %s raised (Pool(error_handling=True)): ending "
                     "this worker so that the task runs again elsewhere\n"
                     % name)
    sys.stderr.write(tb_text)
    _flush()
    os._exit(_RETRY_EXIT)


_RETRY_EXIT = 1


def _load_hint(e):
    """What to check when a task's function does not load here."""
    main = sys.modules.get("__main__")
    if (isinstance(e, AttributeError) and
            getattr(main, "__name__", None) != "__mp_main__"):
        # No main module was run in this job: the master's has no file.
        return ("the master's __main__ has no file to run here (python -c, "
                "a program read from standard input, a session): define "
                "the function in a file")
    if isinstance(e, AttributeError) and "__mp_main__" in str(e):
        return ("is it defined at the top level of the script, not under "
                "`if __name__ == \"__main__\":`?")
    return "is its module importable here, with the same sys.path?"


def run_task(view):
    try:
        kind, flags, func_bytes, body = env.parse_task(view)
    except Exception as e:
        return "cannot read a task sent to this worker: %s: %s" % (
            type(e).__name__, e)
    try:
        func = _callable(func_bytes)
    except Exception as e:
        err = env.PicklingError(
            "this worker cannot load the task's function: %s: %s (%s)"
            % (type(e).__name__, e, _load_hint(e)))
        if kind == env.PROC:
            return _unloadable_process(e)
        if kind == env.INIT:
            return str(err)
        return env.answer_error(err, traceback.format_exc())
    if kind == env.PROC:
        return _run_process(func)
    try:
        if kind == env.ONE:
            value = func(body)
        elif kind == env.STAR:
            value = func(*body)
        elif kind == env.CHUNK:
            if flags & env.F_STAR:
                value = [func(*item) for item in body]
            else:
                value = [func(item) for item in body]
        else:
            args, kwargs = body
            value = func(*args, **kwargs)
    except BaseException as e:
        return task_raised(kind, flags, func, e)
    if kind == env.INIT:
        return b""
    return env.answer_ok(value, getattr(func, "__qualname__", "?"))


def task_raised(kind, flags, func, e):
    """What a task whose call raised e answers (run_task's, and the C
    path's in fiber._fiber: a call, a map's task or a chunk run there)."""
    name = getattr(func, "__qualname__", "?")
    tb_text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    if kind == env.INIT:
        _flush()
        return "the pool's initializer %s raised %s: %s\n%s" % (
            name, type(e).__name__, e, tb_text)
    if flags & env.F_RETRY:
        _end_for_retry(name, tb_text)
    return env.answer_error(e, tb_text)


# ---- objects a manager hosts ------------------------------------------

_VIEWS = (type({}.keys()), type({}.values()), type({}.items()))
_objects = {}
_next_id = [0]

_LIVE = b"L"
_CONSTRUCT = b"C"


def _public_methods(obj):
    names = []
    for name in dir(obj):
        if name[0] == "_":
            continue
        try:
            if callable(getattr(obj, name)):
                names.append(name)
        except Exception:
            pass
    return names


def run_method(state, view):
    """One method call: state is the object's state as the manager keeps it
    (at first its constructor, then the id of the live object in this
    process); returns (new state or None, answer)."""
    new_state = None
    try:
        if state[:1] == _CONSTRUCT:
            factory, args, kwargs = pickle.loads(state[1:])
            obj = factory(*args, **kwargs)
            _next_id[0] += 1
            oid = _next_id[0]
            _objects[oid] = obj
            new_state = _LIVE + str(oid).encode()
        elif state[:1] == _LIVE:
            obj = _objects[int(state[1:])]
        else:
            raise RuntimeError("not a fiber Python object")
        name, args, kwargs = pickle.loads(view)
    except BaseException as e:
        return new_state, env.answer_error(e, traceback.format_exc())
    try:
        if name == "#exposed":
            value = _public_methods(obj)
        elif name == "#getattr":
            value = getattr(obj, args[0])
        elif name == "#setattr":
            value = setattr(obj, args[0], args[1])
        elif name == "#delattr":
            value = delattr(obj, args[0])
        elif name == "#repr":
            value = repr(obj)
        else:
            value = getattr(obj, name)(*args, **kwargs)
            if isinstance(value, _VIEWS):
                value = list(value)  # keys(), values(), items(): as lists
    except BaseException as e:
        return new_state, env.answer_error(e, traceback.format_exc())
    return new_state, env.answer_ok(value, name)


def install():
    """Tasks of a call, a map or a chunk run in C (fiber._fiber), which
    calls _callable, task_raised and env.answer_ok for the rare paths; a
    Process, an initializer and a task whose callable or arguments do not
    load come to run_task."""
    from . import _fiber
    _fiber.set_handlers(run_task, run_method, _callable, task_raised,
                        env.answer_ok)


name = ""            # this job's name (fiber._bootstrap sets it)


def job_name():
    return name
