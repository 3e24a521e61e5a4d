"""Process.sentinel: a file descriptor that becomes readable when a
process ends, for multiprocessing.connection.wait(), select() and
selectors, as multiprocessing's sentinel is.

fiber's jobs are not children of the master's kernel process (a container,
a Slurm job, a pod), so there is no pidfd to hand out.  Instead the first
read of Process.sentinel makes a pipe and starts a daemon thread that
waits for the job to end (fiber_process_join, in slices, with the GIL
released) and then closes the pipe's write end: the read end becomes
readable (end of file).  The thread ends with the job or when the runtime
stops; the read end is closed by Process.close().
"""
import os
import threading


def make(handle, name):
    """Returns the read end of a new sentinel pipe for handle."""
    r, w = os.pipe()  # both close-on-exec (PEP 446)
    t = threading.Thread(target=_watch, args=(handle, w), daemon=True,
                         name="fiber-sentinel-%s" % name)
    t.start()
    return r


def _watch(handle, w):
    try:
        while True:
            try:
                if handle.join(500):
                    break
            except Exception:
                break  # the runtime stopped: the job is gone with it
    finally:
        os.close(w)
