"""Shared objects: a large read-only value put once and passed by reference
(the C core's object store: include/fiber/fiber.h, "Shared objects";
docs/python.md, "Shared objects").

::

    theta = np.zeros(100_000, dtype=np.float32)
    with fiber.Pool(32) as pool:
        # theta travels once per worker, not once per task
        returns = pool.map(evaluate, seeds, shared=theta)   # evaluate(theta, seed)

        ref = fiber.put(noise_table)      # an ObjectRef: 40 bytes
        pool.map(rollout, [(ref, s) for s in seeds])        # ref.get() in the task
        ref.release()

``put(obj)`` pickles obj with protocol 5, keeping numpy arrays' (and every
other PickleBuffer's) bytes out of band, and stores the pickle and the
raw buffers as one blob, named by its content.  A bare numpy array (exact
ndarray type, C-contiguous, a plain dtype: the usual policy or noise
table) is stored without pickle, as its dtype, shape and bytes, and
resolves with one ``numpy.frombuffer`` (bench/python/resolve_cost.py
compares the two decodes); other values, Fortran-order and structured
arrays included, take the pickle.  The ref pickles as its 40
bytes, so it can go in any task argument, queue message, pipe message or
manager value.  ``ref.get()`` resolves it: in the master, the object that
was put (no copy); in another process, the blob is fetched once (mapped
from the master's shared memory on one host, or relayed between workers
across hosts) and unpickled once, with the arrays as read-only views of
the fetched bytes (the C store's own copy, held while the value lives: on
the master's host every worker views the same pages, nothing is copied),
then cached in that process, so every later task of the same worker gets
the same object at no cost.  A process caches at most CACHE_OBJECTS (16)
values and object_cache_mb of blobs, least recently used going first (a
value still referenced elsewhere stays valid); when it resolves a new
one on the master's host, the values whose blob the master has released
leave the cache (across hosts a process cannot tell: the bound alone
applies).  Treat a shared value as
read-only: its arrays are (numpy raises on a write).

Lifetime: the value lives until the master calls ``ref.release()`` (or
leaves ``with fiber.put(obj) as ref:``); a process that resolves a ref
after that gets ``KeyError``.  Putting equal bytes again gives an equal ref
and counts one more reference.  ``Pool.map(..., shared=value)`` (and the
other map and apply methods) puts value, calls ``func(value, *args)`` in
the tasks, and releases it when the call's results are in.
"""
import pickle
import struct
import sys
import threading

from . import _fiber, _runtime

__all__ = ["ObjectRef", "put", "get", "Shared", "stats"]

_MAGIC = b"FBO1"
_HEAD = struct.Struct("<4sIQ")  # magic, out-of-band buffers, pickle bytes
_ALIGN = 64                     # each raw buffer starts at a multiple
# A plain numpy array (_plain_array) skips pickle: magic, dtype name
# length, ndim, then the name, ndim dimensions, padding, the bytes.
_AMAGIC = b"FBA1"
_AHEAD = struct.Struct("<4sII")

# The master: what it put, by key: [object, references] (_lock held to
# change it).  What a process resolved is cached in C (object_cached):
# an ES run puts a new policy each iteration, and the values a worker no
# longer uses must not pile up until object_cache_mb (each held blob is
# also a pin that keeps the C store from evicting it).
_lock = threading.Lock()
_held = {}
_MISS = object()
CACHE_OBJECTS = _fiber.OBJECT_CACHE_MAX


def _plain_array(obj):
    """obj when it is a bare numpy ndarray that _encode can store without
    pickle (exact type, C-contiguous, a dtype that its .str names
    exactly), else None.  numpy is not imported here: an obj of that type
    means the program already imported it."""
    t = type(obj)
    if t.__name__ != "ndarray" or t.__module__ != "numpy":
        return None
    try:
        dt = obj.dtype
        if (dt.hasobject or dt.fields is not None or dt.itemsize == 0 or
                not obj.flags.c_contiguous or obj.ndim > 32 or
                dt.metadata is not None):
            return None
        name = dt.str
        if sys.modules["numpy"].dtype(name) != dt or \
                len(name) > 64:
            return None
    except Exception:
        return None
    return obj


def _encode(obj):
    """The blob's parts: [header, pickle, padding, raw buffer, ...], or
    for a plain array [array header, padding, its bytes]."""
    arr = _plain_array(obj)
    if arr is not None:
        name = arr.dtype.str.encode()
        head = _AHEAD.pack(_AMAGIC, len(name), arr.ndim) + name + \
            struct.pack("<%dQ" % arr.ndim, *arr.shape)
        pad = -len(head) % _ALIGN
        return [head, bytes(pad), arr.reshape(-1).view("B")] if arr.size \
            else [head, bytes(pad)]
    buffers = []
    data = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    raws = [b.raw() for b in buffers]
    head = _HEAD.pack(_MAGIC, len(raws), len(data)) + \
        b"".join(struct.pack("<Q", r.nbytes) for r in raws)
    parts = [head, data]
    at = len(head) + len(data)
    for r in raws:
        pad = -at % _ALIGN
        if pad:
            parts.append(bytes(pad))
            at += pad
        parts.append(r)
        at += r.nbytes
    return parts


def _decode(blob):
    mv = memoryview(blob)
    if mv[:4] == _AMAGIC:
        # A plain array's blob (see _encode): a read-only array over mv's
        # bytes, no copy, no pickle; in C (python/src/object.c), which a
        # worker's Shared call also takes on a miss.  ValueError names
        # what is wrong with a malformed one.
        return _fiber.decode_array(mv)
    try:
        magic, n, plen = _HEAD.unpack_from(mv, 0)
        if magic != _MAGIC:
            raise ValueError("not a fiber shared object (magic %r)" % magic)
        sizes = struct.unpack_from("<%dQ" % n, mv, _HEAD.size)
        at = _HEAD.size + 8 * n
        data = mv[at:at + plen]
        at += plen
        bufs = []
        for size in sizes:
            at += -at % _ALIGN
            if at + size > len(mv):
                raise ValueError("a shared object's buffer runs past its "
                                 "blob")
            bufs.append(mv[at:at + size])
            at += size
    except struct.error as e:
        raise ValueError("a shared object's blob is truncated: %s" % e)
    return pickle.loads(data, buffers=bufs)


def _resolve(key):
    if key in _held:                 # the master: the object it put
        return _held[key][0]
    hit = _fiber.object_cached(key, _MISS)
    if hit is not _MISS:
        return hit
    if not _runtime.child_mode:
        _runtime.ensure()
    try:
        blob = _fiber.object_get(key, _runtime.child_mode)
    except _fiber.FiberError as e:
        if getattr(e, "errname", "") == "FIBER_ENOKEY":
            raise KeyError("shared object %s is gone: the master released "
                           "it (or never put it)" % key.hex()[:16]) from e
        raise
    # The C cache (python/src/object.c) keeps it, bounded, dropping first
    # the values whose blob the master released; if another thread cached
    # the key meanwhile, that value is the one returned.
    return _fiber.object_cache_add(key, _decode(blob), len(blob))


def _cached_keys():
    """The refs' keys this process caches, least recently used first."""
    return _fiber.object_cache_keys()


class ObjectRef:
    """A shared object's name: 40 bytes (its content's hash and length).
    ``get()`` resolves it in any process of the run; ``release()`` (master)
    drops the reference ``put`` counted."""

    __slots__ = ("key",)

    def __init__(self, key):
        if not isinstance(key, bytes) or len(key) != _fiber.REF_LEN:
            raise ValueError("an ObjectRef is %d bytes" % _fiber.REF_LEN)
        self.key = key

    def get(self):
        """The object (see the module's docs: cached per process; arrays
        read-only outside the master)."""
        return _resolve(self.key)

    def release(self):
        """Master only: drops one reference that put() counted; when none
        is left the store frees the blob."""
        _runtime.require_master("ObjectRef.release()")
        with _lock:
            entry = _held.get(self.key)
            if entry is None:
                raise ValueError("shared object %s: nothing to release"
                                 % self.key.hex()[:16])
            entry[1] -= 1
            if entry[1] == 0:
                del _held[self.key]
        _fiber.object_release(self.key)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __reduce__(self):
        return (ObjectRef, (self.key,))

    def __eq__(self, other):
        return isinstance(other, ObjectRef) and other.key == self.key

    def __hash__(self):
        return hash(self.key)

    def __repr__(self):
        return "ObjectRef(%s..., %d bytes)" % (
            self.key[:8].hex(), int.from_bytes(self.key[32:], "little"))


def put(obj):
    """Stores obj in the run's object store (master only) and returns its
    ObjectRef.  Release it with ``ref.release()`` or ``with``."""
    _runtime.require_master("fiber.put()")
    key = _fiber.object_put(_encode(obj))
    with _lock:
        entry = _held.get(key)
        if entry is None:
            _held[key] = [obj, 1]
        else:
            entry[1] += 1
    return ObjectRef(key)


def get(ref):
    """ref.get(): the object behind an ObjectRef."""
    if not isinstance(ref, ObjectRef):
        raise TypeError("fiber.get() wants an ObjectRef, not %s"
                        % type(ref).__name__)
    return ref.get()


# ``Shared(func, ref)(*args)`` calls ``func(ref.get(), *args)``: what the
# pool's ``shared=`` argument sends in place of func; it pickles as func
# and the ref's 40 bytes.  A C type (python/src/object.c), whose call finds
# a cached value without running Python.
Shared = _fiber.Shared


def stats():
    """This process's shared-object counters (fiber_object_stats): objects,
    bytes_held, fetches, cache_hits, shm_bytes, ..."""
    if not _runtime.child_mode:
        _runtime.ensure()
    return _fiber.object_stats()
