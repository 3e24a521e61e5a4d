"""One pool, chosen on the command line, for the ES examples:

  fiber            fiber.Pool: every worker is a job of the configured
                   backend (FIBER_BACKEND, .fiberconfig; local by default)
  multiprocessing  multiprocessing's Pool with the spawn context
  ray              ray.util.multiprocessing.Pool on a local Ray instance
  none             no pool: tasks run in this process, one after another
                   (the one-process baseline of the benchmark)

Each is made with the same initializer and used through map(fn, tasks,
chunksize=1) and close()/join(), so the training code is the same.
"""
import os
import sys

KINDS = ("fiber", "multiprocessing", "ray", "none")
HERE = os.path.dirname(os.path.abspath(__file__))


class PoolError(RuntimeError):
    """The chosen pool cannot be made here (its package is missing)."""


class InProcessPool:
    """map() in this process: the serial baseline."""

    def __init__(self, initializer, initargs):
        initializer(*initargs)

    def map(self, fn, tasks, chunksize=1):
        return [fn(t) for t in tasks]

    def close(self):
        pass

    def join(self):
        pass

    def terminate(self):
        pass


def _fiber_pool(workers, initializer, initargs):
    try:
        import fiber
    except ImportError as e:
        raise PoolError("--pool fiber needs the fiber package: run `make python` "
                        "and PYTHONPATH=python, or pip install ./python (%s)" % e) from None
    fiber.init()   # the backend and the rest come from FIBER_* / .fiberconfig
    pool = fiber.Pool(workers, initializer=initializer, initargs=initargs)
    pool.start_workers()
    return pool


def _mp_pool(workers, initializer, initargs):
    import multiprocessing
    ctx = multiprocessing.get_context("spawn")
    return ctx.Pool(workers, initializer=initializer, initargs=initargs)


def _ray_pool(workers, initializer, initargs):
    try:
        import ray
        from ray.util.multiprocessing import Pool
    except ImportError as e:
        raise PoolError("--pool ray needs Ray: pip install \"ray[default]\" "
                        "(scripts/examples-env.sh installs it in "
                        "build/venv-examples) (%s)" % e) from None
    if not ray.is_initialized():
        # Ray's workers do not get the master's sys.path: hand it over, so
        # that they import es_worker (and numpy, gymnasium) as the master.
        path = os.pathsep.join([HERE] + [p for p in sys.path if p])
        ray.init(num_cpus=max(workers, os.cpu_count() or 1),
                 include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": path}})
    return Pool(workers, initializer=initializer, initargs=initargs)


def make_pool(kind, workers, initializer, initargs=()):
    """A pool of `workers` processes of `kind` (KINDS), each running
    initializer(*initargs) first.  Raises PoolError when kind's package
    is missing."""
    if kind == "fiber":
        return _fiber_pool(workers, initializer, initargs)
    if kind == "multiprocessing":
        return _mp_pool(workers, initializer, initargs)
    if kind == "ray":
        return _ray_pool(workers, initializer, initargs)
    if kind == "none":
        return InProcessPool(initializer, initargs)
    raise PoolError("unknown pool %r: choose one of %s" % (kind, ", ".join(KINDS)))


def map_tasks(kind, pool, fn, tasks):
    """pool.map(fn, tasks, chunksize=1).  On fiber, each policy array the
    tasks carry (a task is (kind, body) with the parameters at body[2])
    goes into the object store once (fiber.put) and the tasks carry its
    ref instead, so a worker receives the policy once per iteration, not
    once per task; released when the map is over (docs/python.md, "Shared
    objects").  es_worker resolves the ref.  Other pools get the arrays."""
    if kind != "fiber":
        return pool.map(fn, tasks, chunksize=1)
    import fiber
    refs = {}
    shared = []
    try:
        for what, body in tasks:
            theta = body[2]
            ref = refs.get(id(theta))
            if ref is None:
                ref = refs[id(theta)] = fiber.put(theta)
            shared.append((what, body[:2] + (ref,) + body[3:]))
        return pool.map(fn, shared, chunksize=1)
    finally:
        for ref in refs.values():
            ref.release()


def close_pool(kind, pool):
    """Closes the pool and waits for its workers (and Ray, when it made it)."""
    pool.close()
    pool.join()
    if kind == "ray":
        import ray
        ray.shutdown()
