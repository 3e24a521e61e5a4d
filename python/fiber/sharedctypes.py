"""fiber.Value, Array, RawValue and RawArray: multiprocessing's shared
ctypes objects, shared by every process of a run on any backend.

multiprocessing puts them in shared memory, which a job on another host
or in another container cannot map.  fiber keeps them in the run's
default manager (fiber._shared) instead:

- A Value (or RawValue) of a simple ctypes type (every typecode of the
  array module, and ctypes types such as ctypes.c_double or c_bool) is an
  int64 of the manager holding the C value's bytes; each read and write
  is one atomic operation, in shared memory for a process on the
  manager's host, over the socket for the others.  ``.value`` converts as
  ctypes does (c_int wraps around at 2**31, c_float rounds).
- An Array (or RawArray) is a dict of the manager whose entries are
  chunks of the array's bytes (4 KiB each).  A read of an item or a slice
  reads its chunks; a write changes its chunks under a lock of the array's
  own, so writes to different items never lose each other's, also in a
  RawArray.

What differs from multiprocessing: the objects are not ctypes instances
(``get_obj()`` returns the unsynchronised view, not a ctypes object;
``ctypes.addressof`` and ``memoryview`` do not apply); structures,
pointers and nested arrays as types raise NotImplementedError (a pointer
means nothing in another process, and a structure has no single value);
a RawValue or RawArray is not raw memory but the same atomic object
without a lock to take.  Value(lock=True) and Array(lock=True) carry an
RLock (get_lock(), acquire/release, a with block), taken around every
item access as multiprocessing does; ``v.value += 1`` is two operations,
so hold get_lock() for it, as with multiprocessing.

In a job (not the master), the constructors return multiprocessing's own
objects, for the job's own threads (see fiber.synchronize).
"""
import ctypes
import multiprocessing.sharedctypes as _mps

from . import _fiber, _runtime
from ._shared import Handle
from . import synchronize

_TYPECODES = {
    "c": ctypes.c_char, "u": ctypes.c_wchar, "b": ctypes.c_byte,
    "B": ctypes.c_ubyte, "h": ctypes.c_short, "H": ctypes.c_ushort,
    "i": ctypes.c_int, "I": ctypes.c_uint, "l": ctypes.c_long,
    "L": ctypes.c_ulong, "q": ctypes.c_longlong, "Q": ctypes.c_ulonglong,
    "f": ctypes.c_float, "d": ctypes.c_double,
}
_CHUNK = 4096


def _ctype(typecode_or_type):
    """The simple ctypes type of a typecode or a type, or an error naming
    why it is not supported."""
    t = _TYPECODES.get(typecode_or_type, typecode_or_type) \
        if isinstance(typecode_or_type, str) else typecode_or_type
    if isinstance(typecode_or_type, str) and t is typecode_or_type:
        raise TypeError("unknown typecode %r (one of %s)" %
                        (typecode_or_type, "".join(sorted(_TYPECODES))))
    if not (isinstance(t, type) and issubclass(t, ctypes._SimpleCData)):
        raise NotImplementedError(
            "fiber's shared ctypes hold simple C types (a typecode or a type "
            "like ctypes.c_double); %r is a structure, array or other "
            "compound type, which has no single value to share" % (t,))
    if t._type_ in "zZPO":
        raise NotImplementedError("a pointer (%s) means nothing in another "
                                  "process" % t.__name__)
    if ctypes.sizeof(t) > 8:
        raise NotImplementedError("%s is wider than the 8 bytes of a "
                                  "manager value" % t.__name__)
    return t


def _encode(ctype, value):
    raw = bytes(value if isinstance(value, ctype) else ctype(value))
    return int.from_bytes(raw.ljust(8, b"\0"), "little", signed=True)


def _decode(ctype, word):
    raw = (word & (2 ** 64 - 1)).to_bytes(8, "little")
    return ctype.from_buffer_copy(raw[:ctypes.sizeof(ctype)]).value


class _Locked:
    """The lock part of a synchronised Value or Array."""

    def get_lock(self):
        return self._lock

    def acquire(self, *args):
        return self._lock.acquire(*args)

    def release(self):
        return self._lock.release()

    def __enter__(self):
        return self._lock.__enter__()

    def __exit__(self, *exc):
        return self._lock.__exit__(*exc)


class RawValueProxy:
    """A RawValue: ``.value`` reads and writes one atomic manager int64."""

    def __init__(self, ctype, value):
        self._type = ctype
        self._h = Handle.create(_fiber.K_VALUE, _encode(ctype, value))

    @property
    def value(self):
        return _decode(self._type, self._h.mobj.value(_fiber.VOP_GET))

    @value.setter
    def value(self, value):
        self._h.mobj.value(_fiber.VOP_SET, _encode(self._type, value))

    @property
    def _type_(self):
        return self._type

    def __repr__(self):
        return "%s(%r)" % (self._type.__name__, self.value)


class SynchronizedValue(_Locked):
    """A Value with a lock: ``.value`` is read and written holding it."""

    def __init__(self, raw, lock):
        self._obj = raw
        self._lock = lock

    def get_obj(self):
        return self._obj

    @property
    def value(self):
        with self._lock:
            return self._obj.value

    @value.setter
    def value(self, value):
        with self._lock:
            self._obj.value = value

    def __repr__(self):
        return "<Synchronized wrapper for %r>" % (self._obj,)


class RawArrayProxy:
    """A RawArray: items and slices over chunks of a manager dict; every
    write changes whole chunks under the array's own lock."""

    def __init__(self, ctype, init):
        self._type = ctype
        self._size = ctypes.sizeof(ctype)
        self._len = len(init)
        self._per_chunk = max(1, _CHUNK // self._size)
        self._h = Handle.create(_fiber.K_DICT)
        self._wlock = synchronize.Lock()
        data = bytes((ctype * self._len)(*init))
        for c in range(0, self._nchunks()):
            self._put(c, data[c * self._chunk_bytes():
                              (c + 1) * self._chunk_bytes()])

    def _chunk_bytes(self):
        return self._per_chunk * self._size

    def _nchunks(self):
        return (self._len + self._per_chunk - 1) // self._per_chunk

    def _key(self, c):
        return c.to_bytes(4, "little")

    def _get(self, c):
        return self._h.mobj.dict_get(self._key(c))

    def _put(self, c, data):
        self._h.mobj.dict_set(self._key(c), data)

    def _read(self, start, stop):
        """Items start..stop-1 as a ctypes array."""
        n = max(0, stop - start)
        out = bytearray()
        first, last = start // self._per_chunk, (stop - 1) // self._per_chunk
        for c in range(first, last + 1) if n else ():
            out += self._get(c)
        skip = (start - first * self._per_chunk) * self._size
        return (self._type * n).from_buffer_copy(
            bytes(out[skip:skip + n * self._size]))

    def _write(self, start, values):
        """Writes values (a ctypes array) from item start on."""
        n = len(values)
        if n == 0:
            return
        data = bytes(values)
        with self._wlock:
            i = start
            while i < start + n:
                c = i // self._per_chunk
                c_start = c * self._per_chunk
                c_stop = min(c_start + self._per_chunk, self._len)
                upto = min(start + n, c_stop)
                src = data[(i - start) * self._size:(upto - start) * self._size]
                if i == c_start and upto == c_stop:
                    chunk = src
                else:
                    old = bytearray(self._get(c))
                    off = (i - c_start) * self._size
                    old[off:off + len(src)] = src
                    chunk = bytes(old)
                self._put(c, chunk)
                i = upto

    def __len__(self):
        return self._len

    def _index(self, i):
        if not isinstance(i, int):
            i = i.__index__()
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError("invalid index")
        return i

    def __getitem__(self, i):
        if isinstance(i, slice):
            start, stop, step = i.indices(self._len)
            if step == 1:
                return self._read(start, stop)[:]
            whole = self._read(0, self._len)
            return whole[i]
        return self._read(self._index(i), self._index(i) + 1)[0]

    def __setitem__(self, i, value):
        if isinstance(i, slice):
            start, stop, step = i.indices(self._len)
            if step != 1:
                idx = range(start, stop, step)
                value = list(value)
                if len(value) != len(idx):
                    raise ValueError("Can only assign sequence of same size")
                for j, v in zip(idx, value):
                    self[j] = v
                return
            if self._type is ctypes.c_char and isinstance(value, bytes):
                value = list(value)
            value = list(value)
            if len(value) != stop - start:
                raise ValueError("Can only assign sequence of same size")
            self._write(start, (self._type * len(value))(*value))
            return
        self._write(self._index(i), (self._type * 1)(value))

    def __iter__(self):
        return iter(self[:])

    def tolist(self):
        return list(self[:])

    @property
    def _type_(self):
        return self._type

    # multiprocessing's Array('c') has .value and .raw
    @property
    def raw(self):
        self._chars("raw")
        return bytes(self._read(0, self._len))

    @raw.setter
    def raw(self, data):
        self._chars("raw")
        if len(data) > self._len:
            raise ValueError("byte string too long")
        self._write(0, (ctypes.c_char * len(data)).from_buffer_copy(data))

    @property
    def value(self):
        self._chars("value")
        return self.raw.split(b"\0", 1)[0]

    @value.setter
    def value(self, data):
        self._chars("value")
        if len(data) > self._len:
            raise ValueError("byte string too long")
        if len(data) < self._len:
            data = data + b"\0"
        self.raw = data

    def _chars(self, what):
        if self._type is not ctypes.c_char:
            raise AttributeError("%s is for an Array of typecode 'c'" % what)

    def __repr__(self):
        return "<RawArray(fiber) of %d %s>" % (self._len, self._type.__name__)


class SynchronizedArray(_Locked):
    """An Array with a lock, taken around every access."""

    def __init__(self, raw, lock):
        self._obj = raw
        self._lock = lock

    def get_obj(self):
        return self._obj

    def __len__(self):
        return len(self._obj)

    def __getitem__(self, i):
        with self._lock:
            return self._obj[i]

    def __setitem__(self, i, value):
        with self._lock:
            self._obj[i] = value

    def __iter__(self):
        return iter(self[:])

    def tolist(self):
        return list(self[:])

    def __getattr__(self, name):
        if name in ("value", "raw"):
            with self._lock:
                return getattr(self._obj, name)
        raise AttributeError(name)

    def __setattr__(self, name, v):
        if name in ("value", "raw"):
            with self._lock:
                setattr(self._obj, name, v)
        else:
            object.__setattr__(self, name, v)

    def __repr__(self):
        return "<SynchronizedArray wrapper for %r>" % (self._obj,)


def _lock_of(lock):
    if lock is True or lock is None:
        return synchronize.RLock()
    if lock is False:
        return None
    if not hasattr(lock, "acquire"):
        raise AttributeError("%r has no method 'acquire'" % (lock,))
    return lock


def _raw_value(typecode_or_type, args):
    t = _ctype(typecode_or_type)
    if len(args) > 1:
        raise TypeError("Value takes at most one initial value")
    return RawValueProxy(t, args[0] if args else t().value)


def _initial(t, size_or_initializer):
    if isinstance(size_or_initializer, int):
        if size_or_initializer < 0:
            raise ValueError("array size must be >= 0")
        return [t().value] * size_or_initializer
    if t is ctypes.c_char and isinstance(size_or_initializer,
                                          (bytes, bytearray)):
        return [bytes([b]) for b in size_or_initializer]
    return list(size_or_initializer)


# ---- the constructors fiber exports (multiprocessing's signatures) ------------

def RawValue(typecode_or_type, *args):
    if _runtime.child_mode:
        return _mps.RawValue(typecode_or_type, *args)
    return _raw_value(typecode_or_type, args)


def RawArray(typecode_or_type, size_or_initializer):
    if _runtime.child_mode:
        return _mps.RawArray(typecode_or_type, size_or_initializer)
    t = _ctype(typecode_or_type)
    return RawArrayProxy(t, _initial(t, size_or_initializer))


def Value(typecode_or_type, *args, lock=True):
    if _runtime.child_mode:
        return _mps.Value(typecode_or_type, *args, lock=lock)
    raw = _raw_value(typecode_or_type, args)
    lock = _lock_of(lock)
    return raw if lock is None else SynchronizedValue(raw, lock)


def Array(typecode_or_type, size_or_initializer, *, lock=True):
    if _runtime.child_mode:
        return _mps.Array(typecode_or_type, size_or_initializer, lock=lock)
    raw = RawArray(typecode_or_type, size_or_initializer)
    lock = _lock_of(lock)
    return raw if lock is None else SynchronizedArray(raw, lock)


# ---- multiprocessing.sharedctypes' two helpers ------------------------------

def copy(obj):
    """multiprocessing.sharedctypes.copy: a new raw object holding obj's
    current contents (of a synchronized one, of its raw object); a ctypes
    object of this process is copied by multiprocessing."""
    if isinstance(obj, (SynchronizedValue, SynchronizedArray)):
        obj = obj.get_obj()
    if isinstance(obj, RawValueProxy):
        return RawValueProxy(obj._type_, obj.value)
    if isinstance(obj, RawArrayProxy):
        t = obj._type_
        return RawArrayProxy(t, _initial(t, obj.raw if t is ctypes.c_char
                                         else obj.tolist()))
    return _mps.copy(obj)


def synchronized(obj, lock=None, ctx=None):
    """multiprocessing.sharedctypes.synchronized: obj, a RawValue or
    RawArray, behind lock (an RLock when lock is None or False, as in
    multiprocessing), as Value and Array return them; a ctypes object of
    this process goes to multiprocessing's."""
    if isinstance(obj, (SynchronizedValue, SynchronizedArray)):
        raise TypeError("%r is already synchronized" % (obj,))
    if isinstance(obj, RawValueProxy):
        return SynchronizedValue(obj, _lock_of(lock or None))
    if isinstance(obj, RawArrayProxy):
        return SynchronizedArray(obj, _lock_of(lock or None))
    return _mps.synchronized(obj, lock, ctx)
