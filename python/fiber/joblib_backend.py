"""A joblib parallel backend named "fiber": joblib.Parallel, and so
scikit-learn's ``n_jobs``, runs its batches on fiber's pool, on whatever
backend fiber is configured for (local, docker, slurm, kubernetes).

    import joblib
    import fiber.joblib_backend          # registers "fiber"
    with joblib.parallel_backend("fiber", n_jobs=8):
        search.fit(X, y)                 # scikit-learn's GridSearchCV, ...

Importing the module registers the backend (``register()`` does it again,
for a joblib imported later or reloaded).

Large arrays: joblib's own ``max_nbytes`` (``Parallel(max_nbytes=...)`` or
``parallel_config``; joblib's default "1M", 1 MiB) is the
threshold: a numpy array of at least that many bytes in a batch's
arguments goes into fiber's object store once per Parallel call
(``fiber.put``) instead of into every task, and the workers resolve it by
reference (mapped from the master's shared memory on one host, cached per
worker).  Such arrays arrive read-only, as joblib's memmapped ones do.
``max_nbytes=None`` turns it off.  ``mmap_mode`` and ``temp_folder`` have
no effect: nothing is memmapped.

Backend keyword, ``parallel_backend("fiber", max_task_crashes=N)``: as
fiber.Pool's (workers a batch may kill before it fails with
fiber.TaskCrashedError; 0, the default, is fiber's default of 3).

The workers are a fiber pool kept between Parallel calls of the same
size (starting jobs is the slow part), closed at the program's exit or
by ``shutdown()``.  An array put for a call is released when the call
ends.  In a fiber job (not the master) the backend runs batches one after
another, as joblib does in a daemonic worker: a job cannot start jobs.
"""
import io
import pickle
import threading

import joblib
from joblib._parallel_backends import (AutoBatchingMixin, FallbackToBackend,
                                       ParallelBackendBase, SequentialBackend)
try:
    import cloudpickle
except ImportError:             # older joblib releases carry their own
    from joblib.externals import cloudpickle

from . import _runtime, objects
from .futures import ProcessPoolExecutor

__all__ = ["FiberBackend", "register", "shutdown"]

_REF = "fiber.ObjectRef"
_MiB = 1 << 20

_executor_lock = threading.Lock()
_executor = None          # (n_jobs, max_task_crashes, ProcessPoolExecutor)


def _shared_executor(n_jobs, max_task_crashes):
    """The pool of n_jobs workers, reused between Parallel calls."""
    global _executor
    with _executor_lock:
        if _executor is not None and _executor[:2] == (n_jobs,
                                                       max_task_crashes):
            return _executor[2]
        old, _executor = _executor, None
        if old is not None:
            old[2].shutdown(wait=True)
        ex = ProcessPoolExecutor(n_jobs, max_task_crashes=max_task_crashes)
        _executor = (n_jobs, max_task_crashes, ex)
        return ex


def shutdown():
    """Ends the backend's workers (they also end with the program)."""
    global _executor
    with _executor_lock:
        old, _executor = _executor, None
    if old is not None:
        old[2].shutdown(wait=True)


class _RefPickler(cloudpickle.Pickler):
    """cloudpickle (functions by value when they have no importable name,
    as joblib's own workers receive them), with each large numpy array
    replaced by an ObjectRef put once per Parallel call."""

    def __init__(self, f, backend):
        super().__init__(f, protocol=5)
        self._backend = backend

    def persistent_id(self, obj):
        limit = self._backend.max_nbytes
        if limit is None or type(obj).__name__ != "ndarray" or \
                type(obj).__module__ != "numpy":
            return None
        if obj.nbytes < limit or obj.dtype.hasobject:
            return None
        return (_REF, self._backend._ref_for(obj))


def _load(blob):
    """The worker's side: the batch, its arrays resolved by reference."""
    unpickler = pickle.Unpickler(io.BytesIO(blob))

    def persistent_load(pid):
        kind, ref = pid
        if kind != _REF:
            raise pickle.UnpicklingError("unknown persistent id %r" % kind)
        return ref.get()

    unpickler.persistent_load = persistent_load
    return unpickler.load()


def _run_batch(blob):
    return _load(blob)()


class FiberBackend(AutoBatchingMixin, ParallelBackendBase):
    """joblib's ParallelBackendBase over fiber.futures.ProcessPoolExecutor."""

    supports_retrieve_callback = True
    supports_sharedmem = False
    uses_threads = False

    def __init__(self, nesting_level=None, inner_max_num_threads=None,
                 max_task_crashes=0, **backend_kwargs):
        super().__init__(nesting_level=nesting_level,
                         inner_max_num_threads=inner_max_num_threads,
                         **backend_kwargs)
        if not isinstance(max_task_crashes, int) or max_task_crashes < 0:
            raise ValueError("fiber joblib backend: max_task_crashes must "
                             "be an int >= 0 (0: fiber's default), not %r"
                             % (max_task_crashes,))
        self.max_task_crashes = max_task_crashes
        self.max_nbytes = _MiB
        self._workers = None
        self._refs = {}          # id(array) -> (array, ObjectRef)
        self._refs_lock = threading.Lock()

    def effective_n_jobs(self, n_jobs):
        if n_jobs == 0:
            raise ValueError("n_jobs == 0 in Parallel has no meaning")
        if n_jobs is None or _runtime.child_mode:
            return 1
        if n_jobs < 0:
            from . import cpu_count
            n_jobs = max(cpu_count() + 1 + n_jobs, 1)
        return n_jobs

    def configure(self, n_jobs=1, parallel=None, prefer=None, require=None,
                  max_nbytes=_MiB, **backend_kwargs):
        """joblib's Parallel gives its max_nbytes (bytes, or None) here;
        its mmap_mode and temp_folder have no use (nothing is memmapped)."""
        self.max_nbytes = max_nbytes
        n = self.effective_n_jobs(n_jobs)
        if n == 1:
            raise FallbackToBackend(
                SequentialBackend(nesting_level=self.nesting_level))
        self._workers = _shared_executor(n, self.max_task_crashes)
        self.parallel = parallel
        return n

    def _ref_for(self, array):
        with self._refs_lock:
            held = self._refs.get(id(array))
            if held is None:
                held = (array, objects.put(array))
                self._refs[id(array)] = held
            return held[1]

    def submit(self, func, callback=None):
        buf = io.BytesIO()
        _RefPickler(buf, self).dump(func)
        future = self._workers.submit(_run_batch, buf.getvalue())
        if callback is not None:
            future.add_done_callback(callback)
        return future

    def retrieve_result_callback(self, future):
        return future.result()

    def _release_refs(self):
        with self._refs_lock:
            held, self._refs = self._refs, {}
        for _, ref in held.values():
            try:
                ref.release()
            except Exception:
                pass

    def stop_call(self):
        self._release_refs()

    def terminate(self):
        # The workers stay for the next call (see _shared_executor).
        self._release_refs()
        self._workers = None
        self.reset_batch_stats()

    def abort_everything(self, ensure_ready=True):
        """A batch raised: the calls not yet given to the pool are dropped;
        those running finish on their workers and are ignored."""
        workers, self._workers = self._workers, None
        if workers is not None:
            workers.cancel_pending()
        self._release_refs()
        if ensure_ready and self.parallel is not None:
            self.configure(n_jobs=self.parallel.n_jobs,
                           parallel=self.parallel)


def register():
    """Registers the backend as "fiber" with joblib."""
    joblib.register_parallel_backend("fiber", FiberBackend)


register()
