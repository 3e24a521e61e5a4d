"""The bytes a Python task travels in, and the bytes its answer comes back in.

A task (master to worker)::

    "FPY1" kind:u8 flags:u8 0:u16 func_len:u32 body_len:u32 nbufs:u32
    func   (the pickled callable)
    body   (the arguments; what they are depends on kind)
    nbufs x len:u64, then the out-of-band buffers back to back

An answer (worker to master)::

    "FPR1" status:u8 form:u8 0:u16 body_len:u32 nbufs:u32
    body   (the value, or for status ERROR (exception, traceback text))
    nbufs x len:u64, then the buffers

A body (a task's, or an answer's of form 0) is the value in fiber's
compact encoding (python/src/codec.c: None, bool, int of 64 bits, float,
str, bytes, and tuples, lists and dicts of these; its first byte is 0xFB,
and it has no buffer) or, for any other value, a pickle (first byte
0x80).  A chunk's results that are all ints that
fit in 64 bits (form 1) or all floats (form 2) travel packed instead, as
body_len / 8 little-endian int64s or float64s, with no buffer: the worker
packs them and the master makes the list with no pickle opcode between
(int and float exactly: a bool, an IntEnum or a float subclass is
pickled).

Pickles use protocol 5: a buffer of OOB_MIN bytes or more (a numpy array's
data) travels out of band, copied once into the message instead of once
into the pickle and again into the message.
"""
import pickle
import struct
import types

from . import _fiber

_TASK = struct.Struct("<4sBBHIII")
_ANSWER = struct.Struct("<4sBBHII")
_LEN = struct.Struct("<Q")
TASK_MAGIC = b"FPY1"
ANSWER_MAGIC = b"FPR1"

CALL = 0    # body: (args, kwargs)              -> func(*args, **kwargs)
ONE = 1     # body: item                        -> func(item)
STAR = 2    # body: tuple                       -> func(*item)
INIT = 3    # a pool initializer, as CALL; a failure ends the worker
PROC = 4    # func: a Process object            -> its run(); an exit code
CHUNK = 5   # body: list (or range) of items, flags STAR -> [func(item) ...]

F_STAR = 1
F_RETRY = 2  # Pool(error_handling=True): a task that raises ends its worker

OK = 0
ERROR = 1

FORM_PICKLE, FORM_INT64S, FORM_FLOAT64S = 0, 1, 2

OOB_MIN = 1 << 16
CODEC_MAGIC = 0xFB   # a body's first byte in the codec; a pickle's is 0x80


def _dumps(obj, bufs):
    """A body: obj in fiber's compact encoding when it is one of its values
    (python/src/codec.c), else pickled, its large buffers into bufs."""
    body = _fiber.codec_dumps(obj)
    if body is not None:
        return body

    def keep(pb):
        if pb.raw().nbytes < OOB_MIN:
            return True  # in band
        bufs.append(pb)
        return False
    return pickle.dumps(obj, protocol=5, buffer_callback=keep)


def _loads(view, bufs=()):
    """The value of a body _dumps made (told apart by its first byte)."""
    if len(view) and view[0] == CODEC_MAGIC:
        return _fiber.codec_loads(view)
    return pickle.loads(view, buffers=bufs)


def _pack_bufs(bufs):
    if not bufs:
        return b""
    views = [b.raw() for b in bufs]
    return b"".join([_LEN.pack(v.nbytes) for v in views] + views)


def _unpack_bufs(view, off, n):
    """Copies n buffers out of view from off; returns (buffers, end)."""
    lens = []
    for _ in range(n):
        lens.append(_LEN.unpack_from(view, off)[0])
        off += 8
    out = []
    for ln in lens:
        out.append(bytearray(view[off:off + ln]))
        off += ln
    return out, off


class PicklingError(pickle.PicklingError):
    """An argument, a result or a callable that cannot be pickled."""


# Plain functions pickled by reference (a module and a name, nothing that
# can change) are pickled once: a pool sends the same one again and again.
_BY_REFERENCE = (types.FunctionType, types.BuiltinFunctionType)
_func_bytes = {}
_FUNC_BYTES_MAX = 256


# A Shared (the pool's shared=) is sent as this, its value's 40-byte ref,
# then its function's bytes: a worker loads the function once, however
# many values come (python/src/envelope.c, callable_of).
SHARED_MAGIC = b"FSH1"


def dumps_callable(func):
    """Pickles func by reference, or by value with cloudpickle when it has no
    importable name (a lambda, a closure, a function defined in another)."""
    if type(func) is _fiber.Shared:
        return SHARED_MAGIC + func.key + dumps_callable(func.func)
    fb = _func_bytes.get(func) if type(func) in _BY_REFERENCE else None
    if fb is not None:
        return fb
    try:
        fb = pickle.dumps(func, protocol=5)
        if type(func) in _BY_REFERENCE:
            if len(_func_bytes) >= _FUNC_BYTES_MAX:
                _func_bytes.clear()
            _func_bytes[func] = fb
        return fb
    except (pickle.PicklingError, AttributeError, TypeError) as e:
        first = e
    except RuntimeError as e:
        if "through inheritance" not in str(e):
            raise
        # A multiprocessing queue, lock or pipe (OS objects) in a Process's
        # arguments, most often concurrent.futures.ProcessPoolExecutor
        # given fiber's context.
        raise RuntimeError(
            "cannot send %r to a fiber job: %s. multiprocessing's own "
            "queues, locks and pipes cannot reach a job (it may run on "
            "another host); use fiber's (fiber.Queue, fiber.Lock, ...). "
            "For concurrent.futures.ProcessPoolExecutor(mp_context="
            "fiber.get_context()), use fiber.futures.ProcessPoolExecutor "
            "(fiber.Executor) instead" % (func, e)) from None
    try:
        import cloudpickle
    except ImportError:
        raise PicklingError(
            "cannot send %r to a worker: %s. It has no importable name (a "
            "lambda, a closure or a function defined inside another); define "
            "it at module level, or install cloudpickle (pip install "
            "cloudpickle) and fiber will send it by value" % (func, first)
        ) from None
    try:
        return cloudpickle.dumps(func, protocol=5)
    except Exception as e:
        raise PicklingError("cannot send %r to a worker, even with "
                            "cloudpickle: %s" % (func, e)) from None


def _name(func):
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", None) \
        or repr(func)


def _task_py(kind, func_bytes, body_obj, func_name="?", flags=0, parts=False):
    """The envelope of one task: bytes, or with parts=True and out-of-band
    buffers, a tuple (the bytes up to the buffers, then each buffer's
    memoryview) that the pool's map sends back to back without joining
    them here (the buffers are read when the task is sent)."""
    bufs = []
    try:
        body = _dumps(body_obj, bufs)
    except Exception as e:
        raise PicklingError("cannot pickle the arguments of task %r: %s: %s"
                            % (func_name, type(e).__name__, e)) from None
    head = _TASK.pack(TASK_MAGIC, kind, flags, 0, len(func_bytes), len(body),
                      len(bufs))
    if not bufs:
        return head + func_bytes + body
    if parts:
        views = [b.raw() for b in bufs]
        return (b"".join([head, func_bytes, body] +
                         [_LEN.pack(v.nbytes) for v in views]),) + \
            tuple(views)
    return b"".join((head, func_bytes, body, _pack_bufs(bufs)))


def call(kind, func, args, kwargs, flags=0):
    return task(kind, dumps_callable(func), (tuple(args), dict(kwargs)),
                _name(func), flags)


def parse_task(view):
    """(kind, flags, func_bytes, body_obj) from a task's memoryview."""
    magic, kind, flags, _, flen, blen, nbufs = _TASK.unpack_from(view, 0)
    if magic != TASK_MAGIC:
        raise ValueError("not a fiber Python task (bad magic %r)" % magic)
    off = _TASK.size
    func_bytes = bytes(view[off:off + flen])
    off += flen
    body_view = view[off:off + blen]
    off += blen
    bufs, _ = _unpack_bufs(view, off, nbufs) if nbufs else ((), off)
    body = _loads(body_view, bufs)
    body_view.release()
    return kind, flags, func_bytes, body


def answer_ok(value, func_name="?"):
    bufs = []
    try:
        body = _dumps(value, bufs)
    except Exception as e:
        err = PicklingError("the result of task %r cannot be pickled: %s: %s"
                            % (func_name, type(e).__name__, e))
        return answer_error(err, "")
    head = _ANSWER.pack(ANSWER_MAGIC, OK, 0, 0, len(body), len(bufs))
    if not bufs:
        return head + body
    return b"".join((head, body, _pack_bufs(bufs)))


class RemoteError(Exception):
    """A task raised an exception that could not be pickled: its type's name,
    message and traceback text."""


def answer_error(exc, tb_text):
    bufs = []
    try:
        body = _dumps((exc, tb_text), bufs)
        _loads(memoryview(body), bufs)  # it must also come back
    except Exception:
        bufs = []
        body = _dumps((RemoteError("%s: %s" % (type(exc).__name__, exc)),
                       tb_text), bufs)
    head = _ANSWER.pack(ANSWER_MAGIC, ERROR, 0, 0, len(body), len(bufs))
    return b"".join((head, body, _pack_bufs(bufs)))


# The traceback of an exception raised in a worker, as text, attached to
# the exception the caller gets as its __cause__: multiprocessing's own
# class, so that code that checks for it (or CPython's tests) finds it.
from multiprocessing.pool import RemoteTraceback  # noqa: E402


def _decode_py(data):
    """The value an answer holds; raises the task's exception, with the
    worker's traceback attached as its __cause__."""
    magic, status, form, _, blen, nbufs = _ANSWER.unpack_from(data, 0)
    if magic != ANSWER_MAGIC:
        raise ValueError("not a fiber Python answer (bad magic %r)" % magic)
    off = _ANSWER.size
    view = memoryview(data)
    if form != FORM_PICKLE:
        if status != OK or nbufs or blen % 8 or form not in (
                FORM_INT64S, FORM_FLOAT64S) or off + blen > len(view):
            raise ValueError("a malformed packed answer (form %d, %d bytes)"
                             % (form, blen))
        code = "q" if form == FORM_INT64S else "d"
        return list(struct.unpack_from("<%d%s" % (blen // 8, code), view, off))
    bufs, _ = _unpack_bufs(view, off + blen, nbufs) if nbufs else ((), 0)
    obj = _loads(view[off:off + blen], bufs)
    if status == OK:
        return obj
    exc, tb_text = obj
    if tb_text:
        exc.__cause__ = RemoteTraceback('\n"""\n%s"""' % tb_text)
    raise exc


# The per-task paths in C (python/src/envelope.c): the same bytes as the
# Python versions above (a test compares them), without their frames and
# struct packing.  The Python versions stay the reference, and the slow
# path the C decoder hands an error or out-of-band buffers to.
def _cannot_pickle(func_name, e):
    return PicklingError("cannot pickle the arguments of task %r: %s: %s"
                         % (func_name, type(e).__name__, e))


_task_c = _fiber.task_envelope
_fiber.envelope_setup(_decode_py)
decode = _fiber.decode_answer


def task(kind, func_bytes, body_obj, func_name="?", flags=0, parts=False):
    """The envelope of one task (as _task_py, built in C)."""
    try:
        return _task_c(kind, func_bytes, body_obj, flags, parts)
    except Exception as e:
        raise _cannot_pickle(func_name, e) from None


def tasks(kind, func_bytes, items, func_name="?", flags=0):
    """One envelope (parts form) per item of items."""
    if type(items) not in (list, tuple):
        items = list(items)   # what iterating raises is not a pickling error
    try:
        return _fiber.task_envelopes(kind, func_bytes, items, flags)
    except Exception as e:
        raise _cannot_pickle(func_name, e) from None
