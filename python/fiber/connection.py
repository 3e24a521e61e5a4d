"""fiber.connection: the names of multiprocessing.connection for programs
that changed their import.

``wait(object_list, timeout=None)`` waits, as multiprocessing's does, until
one or more of the objects is ready and returns those: fiber's Pipe ends
(``fiber.connection.Connection``) and the reading end of a SimpleQueue
(``queue.reader``) when a message (or the end of the stream) is waiting,
and what multiprocessing's ``wait`` takes (its Connections, sockets, file
descriptors, a Process's ``sentinel``, fiber's included) when it is
readable.  multiprocessing's own ``wait`` cannot take a fiber Pipe end: an
end is not a file descriptor (its messages may come over the master's
object server or over a direct socket, whichever the pipe uses), so its
``fileno()`` raises OSError.

How it waits: it asks each fiber end whether a message is waiting, then
waits on the other objects (or sleeps) for a slice of time, and asks
again; the slice starts at 0.1 ms and doubles up to 5 ms while nothing is
ready, so a message on a fiber end is seen within about 5 ms of its
arrival when the ends have been idle, at once when they are busy.  With no
fiber end in the list it is multiprocessing's ``wait`` itself.

``Listener``, ``Client``, ``Connection`` of multiprocessing's sockets and
``answer_challenge``/``deliver_challenge`` are multiprocessing's own
(``from multiprocessing.connection import ...``): they are plain sockets
with an authentication key, reach any host, and need nothing of fiber.
``Connection`` here is fiber's pipe end, the type ``fiber.Pipe()`` returns.
"""
import time as _time
from multiprocessing import connection as _mpc

from .queues import Connection, Pipe, _QueueEnd

Listener = _mpc.Listener
Client = _mpc.Client
answer_challenge = _mpc.answer_challenge
deliver_challenge = _mpc.deliver_challenge
families = _mpc.families    # the address families Listener and Client take

__all__ = ["Client", "Listener", "Pipe", "wait", "Connection"]

_FIRST_SLICE = 0.0001
_LAST_SLICE = 0.005


def _is_fiber_end(obj):
    return isinstance(obj, (Connection, _QueueEnd))


def wait(object_list, timeout=None):
    """The objects of object_list that are ready, in their order; an empty
    list when timeout (seconds; None: no limit) passes first."""
    objects = list(object_list)
    ends = [o for o in objects if _is_fiber_end(o)]
    others = [o for o in objects if not _is_fiber_end(o)]
    if not ends:
        return _mpc.wait(others, timeout)
    deadline = None if timeout is None else _time.monotonic() + max(0.0,
                                                                   timeout)
    slice_s = _FIRST_SLICE
    while True:
        ready = {id(o) for o in ends if o.poll(0)}
        left = None if deadline is None else deadline - _time.monotonic()
        expired = left is not None and left <= 0
        # Nothing ready and time left: wait a slice on the other objects.
        pause = 0.0 if ready or expired else \
            slice_s if left is None else min(slice_s, left)
        if others:
            ready.update(id(o) for o in _mpc.wait(others, pause))
        elif pause > 0:
            _time.sleep(pause)
        if ready or expired:
            return [o for o in objects if id(o) in ready]
        slice_s = min(slice_s * 2, _LAST_SLICE)
