"""Rings: N processes that each run the same function and exchange arrays
with collectives (Fiber 0.2.1's ``fiber.experimental.Ring``, over fiber's
C rings: include/fiber/fiber.h, "Rings"; docs/ring.md).

::

    import numpy as np
    from fiber.experimental import Ring
    from fiber.experimental import ring as fring

    def train(rank, size):
        grad = np.full(1000, rank, dtype=np.float32)
        fring.allreduce(grad, op="mean")        # in place, on every member
        assert grad[0] == sum(range(size)) / size

    if __name__ == "__main__":
        Ring(4, train).run()

``Ring(processes, func, initializer=None, initargs=None)``: ``run()`` starts
``processes`` fiber processes (jobs of the configured backend) and waits
for them.  Each member joins the ring (a rendezvous: every member has
joined before any goes on), calls ``initializer(ring)`` if given, then
``func(rank, size)``.  In a member, ``fiber.experimental.ring.current()``
is that member's Ring, whose ``allreduce(buffer, op)`` and
``broadcast(buffer, root)`` move the buffer's bytes member to member (never
through the master), in place and without a copy: any writable
C-contiguous buffer (numpy arrays; torch tensors through ``.numpy()``);
allreduce reduces float32 or float64 elements with "sum", "mean" or "max".
Every member must make the same calls in the same order with the same
sizes.

``ring.members`` is Fiber's list of ``RingNode(rank, connected, ip, port)``
for libraries that form their own group (``torch.distributed``'s
``init_method="tcp://%s:%d" % (members[0].ip, members[0].port)``): each
member fills in its node before the ring forms, so an initializer sees
every node filled.  ``ip`` is the address other members reach it at
(``listen_host`` with ``transport = tcp``, else 127.0.0.1: the members
are on this host) and ``port`` a free TCP port it found on that address.

What differs from Fiber: every member, rank 0 included, is a fiber
process (Fiber runs rank 0 as a local multiprocessing process), so a
ring's members run where the backend puts them; and a member that dies
makes the others' collectives raise (ClosedError, or FiberTimeoutError
after ``timeout``) instead of hanging; ``run()`` then raises naming the
members that failed.
"""
import socket

from .. import _fiber, _runtime

__all__ = ["Ring", "RingNode", "current", "allreduce", "broadcast"]

_current = None


class RingNode:
    """A member's entry in ``Ring.members``: its ``rank``, whether it has
    ``connected``, and the ``ip`` and ``port`` it offers to libraries that
    form groups of their own."""

    def __init__(self, rank):
        self.rank = rank
        self.connected = False
        self.ip = None
        self.port = None

    def __repr__(self):
        return "RingNode(rank=%d, connected=%r, ip=%r, port=%r)" % (
            self.rank, self.connected, self.ip, self.port)


def _timeout_ms(timeout):
    if timeout is None:
        return -1
    if timeout < 0:
        raise ValueError("timeout must be None or >= 0, not %r" % (timeout,))
    return max(1, int(timeout * 1000 + 0.5)) if timeout > 0 else 0


def _member_address():
    """(ip, port): where other members can reach this process, and a TCP
    port that was free there a moment ago."""
    host = "127.0.0.1"
    try:
        if _fiber.config_get("transport") == "tcp":
            host = _fiber.config_get("listen_host") or host
    except Exception:
        pass
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((host, 0))
        return host, s.getsockname()[1]
    finally:
        s.close()


class Ring:
    """A ring of ``processes`` members, each running ``func(rank, size)``
    after ``initializer(ring)`` (Fiber's signature; ``initargs`` is kept
    for it and, as in Fiber, not used).  Create it in the master; a Ring
    pickles into its members."""

    def __init__(self, processes, func, initializer=None, initargs=None,
                 members=True):
        if not isinstance(processes, int) or isinstance(processes, bool):
            raise TypeError("processes must be an int, not %s"
                            % type(processes).__name__)
        if processes < 1:
            raise ValueError("a ring needs at least 1 member, not %d"
                             % processes)
        if not callable(func):
            raise TypeError("func must be callable")
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be callable or None")
        _runtime.require_master("fiber.experimental.Ring()")
        _runtime.ensure()
        self.size = processes
        self.func = func
        self.initializer = initializer
        self.initargs = initargs
        self.rank = None          # set in each member
        meta = getattr(func, "__fiber_meta__", None)
        if meta:
            self.__fiber_meta__ = meta
        self._creator = _fiber.Ring.create(processes)
        self._ser = self._creator.serialize()
        self._member = None
        self.members = None
        self._manager = None
        if members:
            from .. import managers
            self._manager = managers.Manager()
            self.members = self._manager.list(
                [RingNode(i) for i in range(processes)])

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_creator"] = None
        state["_member"] = None
        state["_manager"] = None
        return state

    # -- in the master --
    def run(self, timeout=None):
        """Starts the members and waits for all of them (at most
        ``timeout`` seconds, None: as long as they run).  Raises
        RuntimeError naming the members that exited with a nonzero code
        (a failed collective, an exception in func), or TimeoutError with
        the members still running (which are terminated)."""
        from .. import process
        import time
        procs = []
        try:
            for rank in range(self.size):
                p = process.Process(target=self._target, args=(rank,),
                                    name="ring-%d" % rank)
                p.start()
                procs.append(p)
            deadline = None if timeout is None else time.monotonic() + timeout
            for p in procs:
                left = None if deadline is None else \
                    max(0.0, deadline - time.monotonic())
                p.join(left)
            late = [i for i, p in enumerate(procs) if p.exitcode is None]
            if late:
                raise TimeoutError("ring members %s still running after "
                                   "%s s" % (late, timeout))
        finally:
            for p in procs:
                if p.exitcode is None:
                    p.terminate()
                    p.join(10)
        failed = ["%d (exit code %s)" % (i, p.exitcode)
                  for i, p in enumerate(procs) if p.exitcode != 0]
        if failed:
            raise RuntimeError("ring members failed: %s" % ", ".join(failed))

    # -- in a member --
    def _target(self, rank):
        global _current
        self.rank = rank
        if self.members is not None:
            node = RingNode(rank)
            node.ip, node.port = _member_address()
            node.connected = True
            self.members[rank] = node
        self._member = _fiber.Ring.join(self._ser, rank, -1)
        _current = self
        try:
            if self.initializer is not None:
                self.initializer(self)
            self.func(rank, self.size)
        finally:
            _current = None
            self._member.close()
            self._member = None

    def join(self, rank, timeout=None):
        """Joins the ring as member ``rank`` in this process (for a program
        that starts its members itself, the master included); returns
        self.  Waits until all members have joined."""
        if self._member is not None:
            raise ValueError("this Ring object is already member %d"
                             % self.rank)
        self._member = _fiber.Ring.join(self._ser, rank, _timeout_ms(timeout))
        self.rank = rank
        return self

    def leave(self):
        """Leaves the ring (the other members' next collective fails)."""
        m, self._member = self._member, None
        if m is not None:
            m.close()

    def _handle(self):
        if self._member is None:
            raise ValueError("not a member of this ring: collectives run in "
                             "the ring's members (Ring.run's func, or after "
                             "Ring.join)")
        return self._member

    def allreduce(self, buffer, op="sum", timeout=None):
        """Reduces ``buffer`` (float32 or float64 elements, writable,
        C-contiguous) over every member with "sum", "mean" or "max", in
        place; returns it."""
        self._handle().allreduce(buffer, op, _timeout_ms(timeout))
        return buffer

    def broadcast(self, buffer, root=0, timeout=None):
        """Copies member ``root``'s bytes of ``buffer`` into every
        member's, in place; returns it."""
        self._handle().broadcast(buffer, root, _timeout_ms(timeout))
        return buffer


def current():
    """The Ring whose member this process is running (inside Ring.run's
    initializer and func), else None."""
    return _current


def _need_current():
    if _current is None:
        raise ValueError("not inside a ring member: fiber.experimental.ring"
                         ".allreduce() works in the func of Ring.run()")
    return _current


def allreduce(buffer, op="sum", timeout=None):
    """current().allreduce(buffer, op, timeout)."""
    return _need_current().allreduce(buffer, op, timeout)


def broadcast(buffer, root=0, timeout=None):
    """current().broadcast(buffer, root, timeout)."""
    return _need_current().broadcast(buffer, root, timeout)
