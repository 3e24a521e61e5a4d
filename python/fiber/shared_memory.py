"""``fiber.shared_memory``: multiprocessing.shared_memory for fiber programs.

``SharedMemory`` and ``ShareableList`` are multiprocessing's own: a block
of the host's memory (POSIX shared memory, /dev/shm) that processes of the
same host open by name.  With the local backend every job is a process of
the master's host, so a block the master creates is the jobs' too, as with
multiprocessing.  On the other backends a job runs in a container (docker,
kubernetes) or on another machine (slurm), which has its own /dev/shm:
opening the master's block by name there raises FileNotFoundError, and
the message says why and what to use instead (``fiber.put`` or a pool's
``shared=`` argument, which reach every host).

What fiber changes is who unlinks a block.  A multiprocessing child shares
its parent's resource tracker, which unlinks leftover blocks when the
parent ends.  A fiber job is a fresh process with a tracker of its own,
which (on Python < 3.13, where opening a block always registers it)
unlinked the master's block as soon as a job that had merely opened it
ended: the next job's open failed, and so did the master's unlink.  So in
a job (``untrack_in_job``, called as the job starts, whether or not the
program uses shared memory) the tracker ignores shared memory: a block
lives until whoever created it unlinks it, as blocks opened with
``track=False`` do on 3.13.  A block that a job creates and nobody
unlinks therefore stays in /dev/shm after the run (multiprocessing
unlinks it when the parent ends, with a warning about the leak): unlink
what you create.
"""
from multiprocessing import shared_memory as _mp_shm

from . import _runtime

__all__ = ["SharedMemory", "ShareableList"]


def _not_here(name, err):
    """The FileNotFoundError of a job that cannot open a block, naming
    the reason when the job is not on the master's host."""
    backend = None
    if _runtime.child_mode:
        try:
            from . import _fiber
            backend = _fiber.config_get("backend")
        except Exception:
            backend = None
    if not backend or backend == "local":
        return err
    return FileNotFoundError(
        err.errno,
        "shared memory block %r does not exist here: this job runs on the "
        "%s backend, whose jobs do not share the master's /dev/shm (a "
        "SharedMemory is one host's memory); send the value with "
        "fiber.put() or Pool.map(..., shared=value), which reach every "
        "host" % (name, backend))


class SharedMemory(_mp_shm.SharedMemory):
    __doc__ = _mp_shm.SharedMemory.__doc__

    def __init__(self, name=None, create=False, size=0, **kwargs):
        try:
            super().__init__(name, create, size, **kwargs)
        except FileNotFoundError as e:
            raise _not_here(name, e) from None


class ShareableList(_mp_shm.ShareableList):
    __doc__ = _mp_shm.ShareableList.__doc__

    def __init__(self, sequence=None, *, name=None):
        try:
            super().__init__(sequence, name=name)
        except FileNotFoundError as e:
            raise _not_here(name, e) from None


def untrack_in_job():
    """In a job: the resource tracker leaves shared memory blocks alone
    (see the module's docstring).  Other resources (semaphores, folders)
    are tracked as before."""
    from multiprocessing import resource_tracker as rt
    if getattr(rt.register, "_fiber_untracked", False):
        return
    register, unregister = rt.register, rt.unregister

    def fiber_register(name, rtype):
        if rtype != "shared_memory":
            register(name, rtype)

    def fiber_unregister(name, rtype):
        if rtype != "shared_memory":
            unregister(name, rtype)

    fiber_register._fiber_untracked = True
    rt.register, rt.unregister = fiber_register, fiber_unregister
