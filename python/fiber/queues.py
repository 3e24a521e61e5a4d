"""fiber.Queue, fiber.SimpleQueue and fiber.Pipe: multiprocessing's, over
fiber's queues and pipes (which live on the master's object server and
work between any processes of a run, on any backend).

They pickle: pass one to a Process or a pool task in its arguments and use
it there.  Only the master creates them.

Queue.put and get are the extension's (_fiber.Queue.put_mp and get_mp,
python/src/queue.c), which pickle there: on an unbounded queue put gathers
its messages and hands them to the C queue in batches; on a bounded one
every put is answered, so put blocks while the queue is full
(docs/python.md, "Queues").
"""
import errno
import os
import pickle
import queue as _stdqueue
import weakref

from . import _fiber, _runtime

_WOULD_WAIT = (_fiber.EAGAIN, _fiber.ETIMEDOUT)


def _ms(block, timeout):
    if not block:
        return 0
    if timeout is None:
        return -1
    if timeout < 0:
        raise ValueError("'timeout' must be a non-negative number")
    return max(1, int(timeout * 1000))


def _dumps(obj):
    return pickle.dumps(obj, protocol=5)


class Queue:
    """multiprocessing.Queue(maxsize=0): put/get with block and timeout,
    put_nowait, get_nowait, qsize, empty, full, close.  get raises
    queue.Empty and put queue.Full, as the standard library's do."""

    def __init__(self, maxsize=0, *, ctx=None, _handle=None):
        if _handle is None:
            _runtime.require_master("fiber.Queue()")
            _handle = _fiber.Queue.create(maxsize if maxsize > 0 else 0)
        self._q = _handle
        self._maxsize = maxsize if maxsize > 0 else 0
        # An unbounded queue pipelines puts (see the module's docstring);
        # a bounded one answers each put, so that put blocks while full.
        self._pipelined = not self._maxsize
        self._closed = False
        _runtime.used = True
        self._bind_fast_paths()

    def _bind_fast_paths(self):
        """Binds the extension's put_mp and get_mp as this queue's put and
        get (multiprocessing's arguments, queue.Full and queue.Empty), so
        that a message costs no frame of Python code; not on a subclass
        that overrides them.  close() and a fork unbind them, and then the
        methods below say why the queue is unusable."""
        if _runtime.forked_from is not None:
            return
        self._q.mp_mode(self._pipelined)
        cls = type(self)
        if cls.put is Queue.put:
            self.put = self._q.put_mp
        if cls.get is Queue.get:
            self.get = self._q.get_mp
        _bound.add(self)

    def _unbind_fast_paths(self):
        self.__dict__.pop("put", None)
        self.__dict__.pop("get", None)

    def _usable(self, what):
        if _runtime.forked_from is not None:
            _runtime.check_not_forked("Queue.%s()" % what)
        if self._closed:
            raise ValueError("Queue %r is closed" % self)
        return self._q

    # The queue's put and get are the extension's (put_mp, get_mp), bound
    # to the instance by _bind_fast_paths; these methods are what a
    # subclass's override calls (super().put), and what runs once close()
    # or a fork unbound them: they refuse with the reason.
    def put(self, obj, block=True, timeout=None):
        self._usable("put").put_mp(obj, block, timeout)

    def get(self, block=True, timeout=None):
        return self._usable("get").get_mp(block, timeout)

    def put_nowait(self, obj):
        return self.put(obj, False)

    def get_nowait(self):
        return self.get(False)

    def qsize(self):
        return self._q_size("qsize")

    def _q_size(self, what):
        if _runtime.forked_from is not None:
            _runtime.check_not_forked("Queue.%s()" % what)
        return self._q.size()

    def empty(self):
        return self._q_size("empty") == 0

    def full(self):
        return bool(self._maxsize) and self._q_size("full") >= self._maxsize

    def close(self):
        """As multiprocessing's: this process puts no more (the queue stays
        usable by the others).  Its puts already made still arrive."""
        self._closed = True
        self._unbind_fast_paths()

    def join_thread(self):
        """As multiprocessing's, after close(): waits until this process's
        puts are in the queue (a put that returned may still be on its
        way; the process's exit waits for them too)."""
        if not self._closed:
            # multiprocessing asserts the same
            raise AssertionError("Queue %r is not closed: join_thread() "
                                 "comes after close()" % self)
        if _runtime.forked_from is None:
            self._q.flush(-1)

    def cancel_join_thread(self):
        """Nothing to cancel: no feeder thread; a process's puts are
        delivered before it exits whatever this says (multiprocessing may
        drop them)."""

    def __reduce__(self):
        return (_rebuild_queue, (type(self), self._q.serialize(),
                                 self._maxsize))


# The queues whose put and get are the extension's (weakly held): a forked
# child unbinds them, so that its Python methods refuse with the reason.
_bound = weakref.WeakSet()


def _unbind_after_fork():
    for q in list(_bound):
        q._unbind_fast_paths()
    _bound.clear()


os.register_at_fork(after_in_child=_unbind_after_fork)


def _rebuild_queue(cls, ser, maxsize):
    q = cls.__new__(cls)
    Queue.__init__(q, maxsize, _handle=_fiber.Queue.open(ser))
    return q


class SimpleQueue(Queue):
    """multiprocessing.SimpleQueue: put, get, empty, close.  Also Uber
    Fiber's ``reader`` and ``writer``: the queue's two ends as
    connections (``reader.recv()``, ``writer.send(obj)``)."""

    def __init__(self, *, ctx=None, _handle=None):
        super().__init__(0, _handle=_handle)

    @property
    def reader(self):
        return _QueueEnd(self, True)

    @property
    def writer(self):
        return _QueueEnd(self, False)


class _QueueEnd:
    """One end of a SimpleQueue as Uber Fiber exposed it: the reader's
    recv() and poll(timeout), the writer's send(obj)."""

    def __init__(self, queue, reading):
        self._queue = queue
        self._reading = reading

    def _check(self, reading):
        if reading != self._reading:
            raise OSError("this is the queue's %s end"
                          % ("reading" if self._reading else "writing"))

    def recv(self):
        self._check(True)
        return self._queue.get()

    def poll(self, timeout=0.0):
        self._check(True)
        return self._queue._q.size() > 0 if not timeout else \
            _poll_size(self._queue, timeout)

    def send(self, obj):
        self._check(False)
        self._queue.put(obj)

    def __repr__(self):
        return "<%s end of %r>" % ("reading" if self._reading else "writing",
                                   self._queue)


def _poll_size(queue, timeout):
    """True once queue holds an item, checking until timeout seconds."""
    import time
    deadline = None if timeout is None else time.monotonic() + timeout
    while queue._q.size() == 0:
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(0.005)
    return True


class Connection:
    """One end of a Pipe: send/recv (pickled objects), send_bytes/recv_bytes,
    poll(timeout), close."""

    def __init__(self, handle, readable, writable):
        self._p = handle
        self._readable = readable
        self._writable = writable
        self._peeked = None
        self._closed = False
        self._handed_on = False   # pickled: other processes hold copies
        _runtime.used = True

    @property
    def closed(self):
        return self._closed

    @property
    def readable(self):
        return self._readable

    @property
    def writable(self):
        return self._writable

    def _check(self, reading):
        if _runtime.forked_from is not None:
            _runtime.check_not_forked("Connection.%s()" % (
                "recv" if reading else "send"))
        if self._closed:
            raise OSError("handle is closed")
        if reading and not self._readable:
            raise OSError("connection is write-only")
        if not reading and not self._writable:
            raise OSError("connection is read-only")

    def send_bytes(self, buf, offset=0, size=None):
        self._check(False)
        m = memoryview(buf).cast("B")
        if offset < 0 or offset > len(m):
            raise ValueError("offset is negative or too large")
        end = len(m) if size is None else offset + size
        if size is not None and (size < 0 or end > len(m)):
            raise ValueError("size is negative or buffer too small")
        self._send(m[offset:end])

    def send(self, obj):
        self._check(False)
        self._send(_dumps(obj))

    def _send(self, data):
        try:
            self._p.send(data, -1)
        except _fiber.ClosedError as e:
            # The other end is gone (its process died or closed it), as
            # multiprocessing's EPIPE; this end's own close raised OSError
            # in _check already.
            raise BrokenPipeError(errno.EPIPE, str(e)) from None

    def _next(self, timeout_ms):
        if self._peeked is not None:
            data, self._peeked = self._peeked, None
            return data
        try:
            return self._p.recv(timeout_ms)
        except _fiber.ClosedError:
            raise EOFError from None

    def recv_bytes(self, maxlength=None):
        self._check(True)
        data = self._next(-1)
        if maxlength is not None and len(data) > maxlength:
            raise OSError("bad message length")
        return data

    def recv_bytes_into(self, buf, offset=0):
        """As multiprocessing's: the message is written into buf at offset
        (in bytes) and its length returned; a message that does not fit
        raises multiprocessing.BufferTooShort with the whole message as its
        args[0] (it is consumed, as there)."""
        self._check(True)
        with memoryview(buf) as view:
            m = view.cast("B")
            if offset < 0:
                raise ValueError("negative offset")
            if offset > len(m):
                raise ValueError("offset too large")
            data = self._next(-1)
            if offset + len(data) > len(m):
                import multiprocessing
                raise multiprocessing.BufferTooShort(bytes(data))
            m[offset:offset + len(data)] = data
            m.release()
        return len(data)

    def recv(self):
        self._check(True)
        return pickle.loads(self._next(-1))

    def poll(self, timeout=0.0):
        """True when a message is waiting (waits up to timeout seconds;
        None waits forever)."""
        self._check(True)
        if self._peeked is not None:
            return True
        ms = -1 if timeout is None else int(max(0.0, timeout) * 1000)
        try:
            self._peeked = self._p.recv(ms)
            return True
        except _fiber.ClosedError:
            return True  # the next recv raises EOFError, as for a socket
        except _fiber.FiberError as e:
            if getattr(e, "code", None) in _WOULD_WAIT:
                return False
            raise

    def close(self):
        """Closes this copy of the end.  As with multiprocessing, the other
        end reads EOF once no process holds this end any more: closing an
        end that was never handed on says so at once (its sending
        direction is closed after what was sent); closing the master's
        copy of an end it handed to a child (the usual
        ``p.start(); child_end.close()``) only lets this copy go, and the
        child's copy carries on (its end comes when the child closes it or
        ends)."""
        if not self._closed:
            self._closed = True
            if _runtime.forked_from is not None:
                return     # the parent's handle: left alone (queue.c)
            if self._writable and not self._handed_on:
                try:
                    self._p.close()
                except _fiber.FiberError:
                    pass
            self._p = None   # the handle is freed

    def fileno(self):
        raise OSError("a fiber pipe end has no file descriptor")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __reduce__(self):
        if self._closed:
            raise OSError("cannot pickle a closed connection")
        self._handed_on = True
        return (_rebuild_connection, (self._p.serialize(), self._readable,
                                      self._writable))


def _rebuild_connection(ser, readable, writable):
    return Connection(_fiber.Pipe.open(ser), readable, writable)


def Pipe(duplex=True):
    """Returns two Connections.  With duplex both send and receive;
    otherwise the first receives and the second sends, as in
    multiprocessing."""
    _runtime.require_master("fiber.Pipe()")
    a, b = _fiber.Pipe.create(duplex)
    if duplex:
        return Connection(a, True, True), Connection(b, True, True)
    # fiber_pipe_create: a sends, b receives; multiprocessing: (reader, writer)
    return Connection(b, True, False), Connection(a, False, True)


# ---- Uber Fiber's SimpleQueuePush and SimpleQueuePull ---------------------

_DATA, _CONNECT = b"D", b"C"


class SimpleQueuePull(SimpleQueue):
    """Uber Fiber's SimpleQueuePull: a reader receives an item when it asks
    for one, so items go to whichever reader is free (load balanced by
    workload).  This is how every fiber queue works: it is SimpleQueue."""


class SimpleQueuePush:
    """Uber Fiber's SimpleQueuePush: items are pushed to the readers in
    turn (round robin), whether or not a reader is busy, as Fiber's
    nanomsg push sockets did.  put() and get() (block, timeout); it
    pickles, and every copy pickled in the master (a Process argument)
    is a reader of its own.

    How: the master (which creates the queue) keeps an inbox queue and one
    queue per reader, and a dealer thread that moves each item of the
    inbox to the next connected reader's queue.  A reader connects at its
    first get(); items put before any reader connected wait in the
    master.  When a reader connects, the items dealt to the others that
    they have not taken yet are dealt again, in their order, among all
    the readers: a reader whose job started late is not left without
    items (and without the message that tells it to stop) while the
    others hold a backlog.  The dealer lives as long as the master; the
    copies in jobs need the master."""

    def __init__(self, *, _state=None):
        if _state is not None:
            self._inbox, self._slot, self._slot_id = _state
            self._connected = False
            return
        _runtime.require_master("fiber.queues.SimpleQueuePush()")
        self._inbox = _fiber.Queue.create(0)
        self._slots = []
        self._slot, self._slot_id = self._new_slot()
        self._connected = False
        import threading
        self._dealer = threading.Thread(target=_deal, daemon=True,
                                        args=(self._inbox, self._slots),
                                        name="fiber-push-queue")
        self._dealer.start()

    def _new_slot(self):
        slot = _fiber.Queue.create(0)
        self._slots.append(slot)
        return slot, len(self._slots) - 1

    def put(self, obj, block=True, timeout=None):
        self._inbox.put(_DATA + _dumps(obj), -1)

    def get(self, block=True, timeout=None):
        if not self._connected:
            self._inbox.put(_CONNECT + str(self._slot_id).encode(), -1)
            self._connected = True
        try:
            data = self._slot.get(_ms(block, timeout))
        except _fiber.FiberError as e:
            if getattr(e, "code", None) in _WOULD_WAIT:
                raise _stdqueue.Empty from None
            raise
        return pickle.loads(memoryview(data)[_SEQ.size:])

    def empty(self):
        return self._slot.size() == 0

    def close(self):
        pass

    def __reduce__(self):
        if hasattr(self, "_slots"):       # the master: a new reader
            slot, slot_id = self._new_slot()
        else:                             # a job: this copy's reader
            slot, slot_id = self._slot, self._slot_id
        return (_rebuild_push, (self._inbox.serialize(), slot.serialize(),
                                slot_id))


def _rebuild_push(inbox, slot, slot_id):
    return SimpleQueuePush(_state=(_fiber.Queue.open(inbox),
                                   _fiber.Queue.open(slot), slot_id))


import struct as _struct  # noqa: E402

_SEQ = _struct.Struct("<Q")   # each dealt item: its sequence number, data


def _take_back(readers):
    """The items dealt to readers and not taken yet, in put order."""
    back = []
    for slot in readers:
        while True:
            try:
                back.append(slot.get(0))
            except _fiber.FiberError as e:
                if getattr(e, "code", None) in _WOULD_WAIT:
                    break
                raise
    back.sort(key=lambda item: _SEQ.unpack_from(item)[0])
    return [item[_SEQ.size:] for item in back]


def _deal(inbox, slots):
    """The dealer: the inbox's items to the connected readers in turn."""
    import collections
    readers = []
    waiting = collections.deque()   # items no reader holds yet
    turn = seq = 0
    try:
        while True:
            msg = inbox.get(-1)
            if msg[:1] == _CONNECT:
                waiting.extendleft(reversed(_take_back(readers)))
                readers.append(slots[int(msg[1:])])
                turn = 0
            else:
                waiting.append(msg[1:])
            while readers and waiting:
                readers[turn % len(readers)].put(
                    _SEQ.pack(seq) + waiting.popleft(), -1)
                turn += 1
                seq += 1
    except _fiber.FiberError:
        return                      # fiber is shutting down


def __getattr__(name):
    """multiprocessing.queues.JoinableQueue: fiber's (fiber.joinable, which
    imports this module, so it is looked up when first asked for)."""
    if name == "JoinableQueue":
        from .joinable import JoinableQueue
        return JoinableQueue
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
