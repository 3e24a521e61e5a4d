/*
 * object.c -- the run's object store from Python: _fiber.object_put,
 * object_get, object_release, object_stats (include/fiber/fiber.h,
 * "Shared objects").  fiber.objects builds fiber.put / ObjectRef on them;
 * this layer moves bytes only.
 *
 * object_put takes any C-contiguous buffer or a sequence of them (the
 * pickle and the out-of-band buffers of one object), joined into the
 * store with one copy per byte.  In a child, object_get returns a Blob:
 * a read-only buffer over libfiber's own copy of the blob (on the
 * master's host, the master's shared memory mapped), held with
 * fiber_object_hold and released when the Blob goes, so the Python value
 * and every array that views it never point into memory that libfiber
 * may unmap, and nothing is copied: 256 workers resolving a 400 KB
 * policy no longer make 256 private copies of it.  In the master it
 * returns a bytes copy (the master's blobs live while put's references
 * do, which a Python value must not depend on).
 *
 * The values a process resolved are cached here too (object_cached,
 * object_cache_add): at most OBJECT_CACHE_MAX of them and
 * object_cache_mb of blobs, least recently used going first, and on a
 * miss the values whose blob the master released going before that.
 * And Shared(func, ref), what the pool's shared= sends in place of func,
 * is a C type whose call looks its value up in that cache and calls
 * func(value, *args) with no Python frame in between: at 512 workers on
 * two cores each Python frame a task runs is paid in cold caches
 * (bench/python/es_cost.py).  A miss resolves through fiber.objects
 * (fetch, decode), which adds the value here.  Everything runs under the
 * GIL; values leave the cache before they are released, since releasing
 * one may run arbitrary code.
 */
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "binding.h"
#include "structmember.h"

static int ref_of(PyObject *obj, fiber_ref *ref)
{
    Py_buffer v;
    if (PyObject_GetBuffer(obj, &v, PyBUF_SIMPLE) != 0)
        return -1;
    if (v.len != FIBER_REF_LEN) {
        PyErr_Format(PyExc_ValueError,
                     "not an object ref: %zd bytes, want %d", v.len,
                     FIBER_REF_LEN);
        PyBuffer_Release(&v);
        return -1;
    }
    memcpy(ref->bytes, v.buf, FIBER_REF_LEN);
    PyBuffer_Release(&v);
    return 0;
}

/* Joins the buffers of parts (one buffer, or a list/tuple of them) into
 * one malloc'd block; *len its size.  NULL with an exception set. */
static unsigned char *join_parts(PyObject *parts, size_t *len)
{
    PyObject *seq = PyObject_CheckBuffer(parts)
                        ? PyTuple_Pack(1, parts)
                        : PySequence_Fast(parts, "object_put wants a buffer "
                                                 "or a sequence of buffers");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Py_buffer *views = PyMem_Calloc((size_t)(n ? n : 1), sizeof *views);
    unsigned char *out = NULL;
    Py_ssize_t got = 0;
    size_t total = 0;
    if (!views) {
        PyErr_NoMemory();
        goto done;
    }
    for (; got < n; got++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, got);
        if (PyObject_GetBuffer(item, &views[got], PyBUF_C_CONTIGUOUS) != 0)
            goto done;
        total += (size_t)views[got].len;
    }
    out = malloc(total ? total : 1);
    if (!out) {
        PyErr_NoMemory();
        goto done;
    }
    size_t at = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        memcpy(out + at, views[i].buf, (size_t)views[i].len);
        at += (size_t)views[i].len;
    }
    *len = total;
done:
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    Py_DECREF(seq);
    return out;
}

/* object_put(parts) -> the 40-byte ref (master only). */
static PyObject *py_object_put(PyObject *self, PyObject *parts)
{
    (void)self;
    size_t len = 0;
    unsigned char *data = join_parts(parts, &len);
    if (!data)
        return NULL;
    fiber_ref ref;
    int rc;
    char msg[1024] = "";
    FBP_CALL(rc, msg, fiber_object_put(data, len, &ref));
    free(data);
    if (rc)
        return fbp_raise(rc, msg);
    return PyBytes_FromStringAndSize((const char *)ref.bytes, FIBER_REF_LEN);
}

/* ---- Blob: a held blob as a read-only buffer ------------------------ */

typedef struct {
    PyObject_HEAD
    fiber_ref ref;
    const void *data;
    Py_ssize_t len;
    int held;      /* one fiber_object_hold to release */
} FbpBlob;

static int blob_getbuffer(PyObject *o, Py_buffer *view, int flags)
{
    FbpBlob *b = (FbpBlob *)o;
    /* read-only: the arrays that view it refuse writes */
    return PyBuffer_FillInfo(view, o, (void *)b->data, b->len, 1, flags);
}

static void blob_dealloc(PyObject *o)
{
    FbpBlob *b = (FbpBlob *)o;
    if (b->held)
        (void)fiber_object_release(&b->ref); /* a lock, no wait */
    Py_TYPE(o)->tp_free(o);
}

static Py_ssize_t blob_length(PyObject *o)
{
    return ((FbpBlob *)o)->len;
}

static PyBufferProcs blob_as_buffer = {blob_getbuffer, NULL};
static PySequenceMethods blob_as_sequence = {.sq_length = blob_length};

static PyTypeObject FbpBlobType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fiber._fiber.Blob",
    .tp_basicsize = sizeof(FbpBlob),
    .tp_dealloc = blob_dealloc,
    .tp_as_buffer = &blob_as_buffer,
    .tp_as_sequence = &blob_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A shared object's bytes held in this process (read-only "
              "buffer); released when the last reference goes.",
};

/* A Blob over ref's bytes, held in place (fiber_object_hold) until the
 * Blob goes.  NULL with *rc set (and msg) when the hold failed, or with
 * *rc 0 and a Python exception when the Blob could not be made. */
static PyObject *blob_held(const fiber_ref *ref, int *rc, char *msg,
                           size_t msg_size)
{
    const void *data = NULL;
    size_t len = 0;
    int r;
    Py_BEGIN_ALLOW_THREADS r = fiber_object_hold(ref, &data, &len);
    if (r)
        snprintf(msg, msg_size, "%s", fiber_last_error());
    Py_END_ALLOW_THREADS
    *rc = r;
    if (r)
        return NULL;
    FbpBlob *b = PyObject_New(FbpBlob, &FbpBlobType);
    if (!b) {
        (void)fiber_object_release(ref);
        return NULL;
    }
    b->ref = *ref;
    b->data = data;
    b->len = (Py_ssize_t)len;
    b->held = 1;
    return (PyObject *)b;
}

/* object_get(ref, child=False) -> Blob (child: the bytes in place, held
 * until the Blob goes) or bytes (the master: a copy). */
static PyObject *py_object_get(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *refobj;
    int child = 0;
    if (!PyArg_ParseTuple(args, "O|p", &refobj, &child))
        return NULL;
    fiber_ref ref;
    if (ref_of(refobj, &ref) != 0)
        return NULL;
    const void *data = NULL;
    size_t len = 0;
    int rc;
    char msg[1024] = "";
    if (child) {
        PyObject *b = blob_held(&ref, &rc, msg, sizeof msg);
        return b || rc == 0 ? b : fbp_raise(rc, msg);
    }
    FBP_CALL(rc, msg, fiber_object_get(&ref, &data, &len));
    if (rc)
        return fbp_raise(rc, msg);
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)len);
    if (out) {
        char *dst = PyBytes_AS_STRING(out);
        FB_NOGIL(memcpy(dst, data, len));
    }
    return out;
}

/* object_release(ref): the master drops one reference put counted. */
static PyObject *py_object_release(PyObject *self, PyObject *refobj)
{
    (void)self;
    fiber_ref ref;
    if (ref_of(refobj, &ref) != 0)
        return NULL;
    int rc;
    char msg[1024] = "";
    FBP_CALL(rc, msg, fiber_object_release(&ref));
    if (rc)
        return fbp_raise(rc, msg);
    Py_RETURN_NONE;
}

/* object_released(ref) -> bool: the master released the blob this
 * process cached (fiber_object_released). */
static PyObject *py_object_released(PyObject *self, PyObject *refobj)
{
    (void)self;
    fiber_ref ref;
    if (ref_of(refobj, &ref) != 0)
        return NULL;
    return PyBool_FromLong(fiber_object_released(&ref));
}

/* ---- the cache of resolved values ---------------------------------- */

#define VCACHE_MAX 16

struct ventry {
    fiber_ref ref;
    PyObject *value;
    size_t bytes;
};

/* Least recently used first. */
static struct ventry vcache[VCACHE_MAX];
static int vcache_n;
static size_t vcache_bytes;
static long long vcache_limit = -1; /* bytes; -1: read object_cache_mb */

void fbp_object_config_changed(const char *key)
{
    if (strcmp(key, "object_cache_mb") == 0)
        vcache_limit = -1;
}

static size_t cache_limit(void)
{
    if (vcache_limit < 0) {
        long long mb = fbp_config_int("object_cache_mb", 4096);
        if (mb < 0)
            mb = 4096;
        vcache_limit = (mb < (LLONG_MAX >> 20) ? mb : (LLONG_MAX >> 20)) << 20;
    }
    return (size_t)vcache_limit;
}

/* The cached value of ref (borrowed), made the most recently used; NULL
 * when it is not cached. */
static PyObject *cache_find(const fiber_ref *ref)
{
    for (int i = vcache_n - 1; i >= 0; i--) {
        if (memcmp(vcache[i].ref.bytes, ref->bytes, FIBER_REF_LEN) != 0)
            continue;
        if (i != vcache_n - 1) {
            struct ventry e = vcache[i];
            memmove(&vcache[i], &vcache[i + 1],
                    (size_t)(vcache_n - 1 - i) * sizeof e);
            vcache[vcache_n - 1] = e;
        }
        return vcache[vcache_n - 1].value;
    }
    return NULL;
}

/* Removes entry i into *gone (released by the caller once the cache is
 * consistent again). */
static void cache_take(int i, PyObject **gone, int *ngone)
{
    gone[(*ngone)++] = vcache[i].value;
    vcache_bytes -= vcache[i].bytes;
    memmove(&vcache[i], &vcache[i + 1],
            (size_t)(vcache_n - 1 - i) * sizeof vcache[0]);
    vcache_n--;
}

/* Adds value for ref (the caller's reference is not taken); returns the
 * cached value (borrowed): value, or the one cached first. */
static PyObject *cache_add(const fiber_ref *ref, PyObject *value,
                           size_t bytes)
{
    PyObject *have = cache_find(ref);
    if (have)
        return have;
    PyObject *gone[VCACHE_MAX + 1];
    int ngone = 0;
    /* Values whose blob the master released go first: nobody can resolve
     * them again, and on the master's host their place in its arena comes
     * back only when every process lets go (an ES run then reuses the
     * same few places, whose pages every worker already maps).  A value
     * still used elsewhere stays valid: this drops only the cache's
     * reference. */
    for (int i = vcache_n - 1; i >= 0; i--)
        if (fiber_object_released(&vcache[i].ref))
            cache_take(i, gone, &ngone);
    size_t limit = cache_limit();
    while (vcache_n > 0 &&
           (vcache_n == VCACHE_MAX || vcache_bytes + bytes > limit))
        cache_take(0, gone, &ngone);
    vcache[vcache_n].ref = *ref;
    vcache[vcache_n].value = Py_NewRef(value);
    vcache[vcache_n].bytes = bytes;
    vcache_n++;
    vcache_bytes += bytes;
    for (int i = 0; i < ngone; i++)
        Py_DECREF(gone[i]);
    return value;
}

/* object_cached(ref, default=None) -> the cached value, or default. */
static PyObject *py_object_cached(PyObject *self, PyObject *const *args,
                                  Py_ssize_t nargs)
{
    (void)self;
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError,
                        "object_cached(ref, default=None)");
        return NULL;
    }
    fiber_ref ref;
    if (ref_of(args[0], &ref) != 0)
        return NULL;
    PyObject *v = cache_find(&ref);
    return Py_NewRef(v ? v : nargs > 1 ? args[1] : Py_None);
}

/* object_cache_add(ref, value, nbytes) -> the cached value. */
static PyObject *py_object_cache_add(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *refobj, *value;
    Py_ssize_t bytes;
    if (!PyArg_ParseTuple(args, "OOn", &refobj, &value, &bytes))
        return NULL;
    fiber_ref ref;
    if (ref_of(refobj, &ref) != 0)
        return NULL;
    if (bytes < 0) {
        PyErr_SetString(PyExc_ValueError, "object_cache_add: nbytes < 0");
        return NULL;
    }
    return Py_NewRef(cache_add(&ref, value, (size_t)bytes));
}

/* object_cache_keys() -> [ref bytes], least recently used first. */
static PyObject *py_object_cache_keys(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    PyObject *out = PyList_New(vcache_n);
    for (int i = 0; out && i < vcache_n; i++) {
        PyObject *k = PyBytes_FromStringAndSize(
            (const char *)vcache[i].ref.bytes, FIBER_REF_LEN);
        if (!k)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, i, k);
    }
    return out;
}

/* ---- a plain array's blob, decoded without pickle ------------------ */

/* fiber.objects stores a bare numpy array as "FBA1", u32 dtype name
 * length, u32 ndim, the name, ndim u64 dimensions, padding to 64, the
 * bytes (objects._encode).  numpy is the program's: a blob of this form
 * exists only if the master imported it. */
#define ARR_HEAD 12
#define ARR_ALIGN 64
#define DTYPE_NAME_MAX 64

static PyObject *np_frombuffer, *np_dtype;
static struct {
    char name[DTYPE_NAME_MAX + 1];
    PyObject *dtype;
    Py_ssize_t itemsize;
} dtypes[8];
static int n_dtypes;

static uint32_t get_le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

static uint64_t get_le64(const unsigned char *p)
{
    return (uint64_t)get_le32(p) | (uint64_t)get_le32(p + 4) << 32;
}

static PyObject *malformed(const char *what)
{
    PyErr_Format(PyExc_ValueError, "a shared array's blob is malformed: %s",
                 what);
    return NULL;
}

/* numpy's dtype named name (a new reference; the first few names are
 * cached), its itemsize in *size;
 * NULL with ValueError for a name numpy does not take, or a dtype fiber
 * never stores this way. */
static PyObject *dtype_of(const char *name, size_t nlen, Py_ssize_t *size)
{
    for (int i = 0; i < n_dtypes; i++)
        if (strlen(dtypes[i].name) == nlen &&
            memcmp(dtypes[i].name, name, nlen) == 0) {
            *size = dtypes[i].itemsize;
            return Py_NewRef(dtypes[i].dtype);
        }
    if (!np_dtype) {
        PyObject *np = PyImport_ImportModule("numpy");
        if (!np)
            return NULL;
        np_dtype = PyObject_GetAttrString(np, "dtype");
        np_frombuffer = PyObject_GetAttrString(np, "frombuffer");
        Py_DECREF(np);
        if (!np_dtype || !np_frombuffer) {
            Py_CLEAR(np_dtype);
            Py_CLEAR(np_frombuffer);
            return NULL;
        }
    }
    PyObject *str = PyUnicode_DecodeUTF8(name, (Py_ssize_t)nlen, "strict");
    PyObject *dt = str ? PyObject_CallOneArg(np_dtype, str) : NULL;
    if (!dt) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyObject *text = value ? PyObject_Str(value) : NULL;
        PyErr_Format(PyExc_ValueError,
                     "a shared array's blob is malformed: %s: %s",
                     type ? ((PyTypeObject *)type)->tp_name : "error",
                     text ? PyUnicode_AsUTF8(text) : "?");
        Py_XDECREF(text);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        Py_XDECREF(str);
        return NULL;
    }
    PyObject *hasobj = PyObject_GetAttrString(dt, "hasobject");
    PyObject *isz = PyObject_GetAttrString(dt, "itemsize");
    Py_ssize_t itemsize = isz ? PyLong_AsSsize_t(isz) : -1;
    int bad = !hasobj || !isz || PyObject_IsTrue(hasobj) || itemsize <= 0;
    Py_XDECREF(hasobj);
    Py_XDECREF(isz);
    if (bad) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "a shared array's blob names dtype "
                     "%R, which fiber never stores this way", str);
        Py_DECREF(str);
        Py_DECREF(dt);
        return NULL;
    }
    Py_DECREF(str);
    if (n_dtypes < (int)(sizeof dtypes / sizeof dtypes[0])) {
        memcpy(dtypes[n_dtypes].name, name, nlen);
        dtypes[n_dtypes].name[nlen] = '\0';
        dtypes[n_dtypes].dtype = Py_NewRef(dt);
        dtypes[n_dtypes].itemsize = itemsize;
        n_dtypes++;
    }
    *size = itemsize;
    return dt;
}

/* The array a plain-array blob holds: a read-only view of owner's bytes
 * (p, len are owner's buffer), no copy.  NULL with ValueError naming what
 * is wrong with a malformed blob. */
static PyObject *array_of_blob(PyObject *owner, const unsigned char *p,
                               size_t len)
{
    if (len < ARR_HEAD)
        return malformed("its header is cut short");
    if (memcmp(p, "FBA1", 4) != 0)
        return malformed("it does not start with FBA1");
    uint32_t nlen = get_le32(p + 4), ndim = get_le32(p + 8);
    if (nlen == 0 || nlen > DTYPE_NAME_MAX || ndim > 32)
        return malformed("its header names no dtype or too many dimensions");
    size_t at = ARR_HEAD;
    if (len - at < nlen + 8 * (size_t)ndim)
        return malformed("its header is cut short");
    Py_ssize_t itemsize;
    PyObject *dt = dtype_of((const char *)p + at, nlen, &itemsize);
    if (!dt)
        return NULL;
    at += nlen;
    PyObject *shape = PyTuple_New(ndim);
    if (!shape) {
        Py_DECREF(dt);
        return NULL;
    }
    uint64_t count = 1;
    int overflow = 0;
    for (uint32_t i = 0; i < ndim; i++) {
        uint64_t d = get_le64(p + at + 8 * (size_t)i);
        if (d > (uint64_t)PY_SSIZE_T_MAX ||
            (d && count > (uint64_t)PY_SSIZE_T_MAX / d))
            overflow = 1;
        else
            count *= d;
        PyObject *dim = PyLong_FromUnsignedLongLong(d);
        if (!dim) {
            Py_DECREF(shape);
            Py_DECREF(dt);
            return NULL;
        }
        PyTuple_SET_ITEM(shape, i, dim);
    }
    at += 8 * (size_t)ndim;
    at += (ARR_ALIGN - at % ARR_ALIGN) % ARR_ALIGN;
    if (overflow || count > (uint64_t)PY_SSIZE_T_MAX / (uint64_t)itemsize ||
        at > len || len - at != count * (uint64_t)itemsize) {
        if (overflow || count > (uint64_t)PY_SSIZE_T_MAX / (uint64_t)itemsize)
            PyErr_Format(PyExc_ValueError, "a shared array's blob is %zu "
                         "bytes, its header says more than %zd", len,
                         PY_SSIZE_T_MAX);
        else
            PyErr_Format(PyExc_ValueError, "a shared array's blob is %zu "
                         "bytes, its header says %llu", len,
                         (unsigned long long)(at + count * (uint64_t)itemsize));
        Py_DECREF(shape);
        Py_DECREF(dt);
        return NULL;
    }
    PyObject *args[4] = {owner, dt, PyLong_FromUnsignedLongLong(count),
                         PyLong_FromSize_t(at)};
    PyObject *arr = args[2] && args[3]
                        ? PyObject_Vectorcall(np_frombuffer, args, 4, NULL)
                        : NULL;
    Py_XDECREF(args[2]);
    Py_XDECREF(args[3]);
    Py_DECREF(dt);
    if (arr && ndim != 1) {
        static PyObject *reshape;
        if (!reshape)
            reshape = PyUnicode_InternFromString("reshape");
        PyObject *r = reshape ? PyObject_CallMethodOneArg(arr, reshape, shape)
                              : NULL;
        Py_SETREF(arr, r);
    }
    Py_DECREF(shape);
    return arr;
}

/* decode_array(buffer) -> the array of a plain-array blob (a view of the
 * buffer; fiber.objects._decode's path for "FBA1"). */
static PyObject *py_decode_array(PyObject *self, PyObject *obj)
{
    (void)self;
    Py_buffer v;
    if (PyObject_GetBuffer(obj, &v, PyBUF_SIMPLE) != 0)
        return NULL;
    PyObject *r = array_of_blob(obj, v.buf, (size_t)v.len);
    PyBuffer_Release(&v);
    return r;
}

/* ---- Shared: func called with a shared value first ------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *func;
    PyObject *ref; /* an ObjectRef, made when first asked for */
    fiber_ref key;
    vectorcallfunc vectorcall;
} FbpShared;

static PyObject *shared_ref(FbpShared *s)
{
    if (!s->ref) {
        PyObject *mod = PyImport_ImportModule("fiber.objects");
        PyObject *cls = mod ? PyObject_GetAttrString(mod, "ObjectRef") : NULL;
        Py_XDECREF(mod);
        PyObject *k = cls ? PyBytes_FromStringAndSize(
                                (const char *)s->key.bytes, FIBER_REF_LEN)
                          : NULL;
        s->ref = k ? PyObject_CallOneArg(cls, k) : NULL;
        Py_XDECREF(k);
        Py_XDECREF(cls);
    }
    return s->ref;
}

/* A child's miss: the blob held in place and decoded, a plain array in C
 * (the rest by fiber.objects._decode), then cached.  A new reference, or
 * NULL with no exception set when only ref.get() can say what is wrong
 * (the master, or a failed fetch: KeyError for a released object). */
static PyObject *shared_fetch(FbpShared *s)
{
    if (fiber_is_master() != 0)
        return NULL;
    int rc;
    char msg[1024] = "";
    FbpBlob *b = (FbpBlob *)blob_held(&s->key, &rc, msg, sizeof msg);
    if (!b)
        return NULL; /* rc != 0: ref.get() says why; else the exception */
    const void *data = b->data;
    size_t len = (size_t)b->len;
    PyObject *value;
    if (len >= 4 && memcmp(data, "FBA1", 4) == 0) {
        value = array_of_blob((PyObject *)b, data, len);
    } else {
        PyObject *mod = PyImport_ImportModule("fiber.objects");
        value = mod ? PyObject_CallMethod(mod, "_decode", "O", (PyObject *)b)
                    : NULL;
        Py_XDECREF(mod);
    }
    Py_DECREF(b);
    if (!value)
        return NULL;
    PyObject *cached = Py_NewRef(cache_add(&s->key, value, len));
    Py_DECREF(value);
    return cached;
}

static PyObject *shared_vectorcall(PyObject *o, PyObject *const *args,
                                   size_t nargsf, PyObject *kwnames)
{
    FbpShared *s = (FbpShared *)o;
    PyObject *value = cache_find(&s->key);
    if (value) {
        Py_INCREF(value);
    } else if (!(value = shared_fetch(s))) {
        if (PyErr_Occurred())
            return NULL;
        PyObject *ref = shared_ref(s);
        if (!ref || !(value = PyObject_CallMethod(ref, "get", NULL)))
            return NULL;
    }
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    PyObject *small[8], **v = small;
    if (n + nkw + 1 > (Py_ssize_t)(sizeof small / sizeof small[0])) {
        v = PyMem_Malloc((size_t)(n + nkw + 1) * sizeof *v);
        if (!v) {
            Py_DECREF(value);
            return PyErr_NoMemory();
        }
    }
    v[0] = value;
    memcpy(v + 1, args, (size_t)(n + nkw) * sizeof *v);
    PyObject *r = PyObject_Vectorcall(s->func, v, (size_t)(n + 1), kwnames);
    if (v != small)
        PyMem_Free(v);
    Py_DECREF(value);
    return r;
}

static PyTypeObject FbpSharedType;

PyObject *fbp_shared_make(PyObject *func, const unsigned char *key)
{
    FbpShared *s = PyObject_GC_New(FbpShared, &FbpSharedType);
    if (!s)
        return NULL;
    s->func = Py_NewRef(func);
    s->ref = NULL;
    memcpy(s->key.bytes, key, FIBER_REF_LEN);
    s->vectorcall = shared_vectorcall;
    PyObject_GC_Track((PyObject *)s);
    return (PyObject *)s;
}

static PyObject *shared_new(PyTypeObject *type, PyObject *args,
                            PyObject *kwds)
{
    PyObject *func, *ref;
    static char *names[] = {"func", "ref", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO:Shared", names, &func,
                                     &ref))
        return NULL;
    PyObject *key = PyObject_GetAttrString(ref, "key");
    fiber_ref k;
    int rc = key ? ref_of(key, &k) : -1;
    Py_XDECREF(key);
    if (rc != 0) {
        PyErr_Format(PyExc_TypeError, "Shared(func, ref): ref must be an "
                     "ObjectRef, not %s", Py_TYPE(ref)->tp_name);
        return NULL;
    }
    FbpShared *s = (FbpShared *)type->tp_alloc(type, 0);
    if (!s)
        return NULL;
    s->func = Py_NewRef(func);
    s->ref = Py_NewRef(ref);
    s->key = k;
    s->vectorcall = shared_vectorcall;
    return (PyObject *)s;
}

static int shared_traverse(PyObject *o, visitproc visit, void *arg)
{
    FbpShared *s = (FbpShared *)o;
    Py_VISIT(s->func);
    Py_VISIT(s->ref);
    return 0;
}

static int shared_clear(PyObject *o)
{
    FbpShared *s = (FbpShared *)o;
    Py_CLEAR(s->func);
    Py_CLEAR(s->ref);
    return 0;
}

static void shared_dealloc(PyObject *o)
{
    PyObject_GC_UnTrack(o);
    shared_clear(o);
    Py_TYPE(o)->tp_free(o);
}

static PyObject *shared_reduce(PyObject *o, PyObject *unused)
{
    (void)unused;
    FbpShared *s = (FbpShared *)o;
    PyObject *ref = shared_ref(s);
    return ref ? Py_BuildValue("O(OO)", (PyObject *)Py_TYPE(o), s->func, ref)
               : NULL;
}

static PyObject *shared_get_ref(PyObject *o, void *unused)
{
    (void)unused;
    return Py_XNewRef(shared_ref((FbpShared *)o));
}

static PyObject *shared_get_key(PyObject *o, void *unused)
{
    (void)unused;
    return PyBytes_FromStringAndSize(
        (const char *)((FbpShared *)o)->key.bytes, FIBER_REF_LEN);
}

static PyGetSetDef shared_getset[] = {
    {"ref", shared_get_ref, NULL, "the ObjectRef of the value passed first",
     NULL},
    {"key", shared_get_key, NULL, "that ref's 40 bytes", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

/* func's attributes show through (@fiber.meta, __name__ for messages),
 * as the Python class did: a dunder other than __fiber_meta__ does not. */
static PyObject *shared_getattro(PyObject *o, PyObject *name)
{
    PyObject *r = PyObject_GenericGetAttr(o, name);
    if (r || !PyErr_ExceptionMatches(PyExc_AttributeError))
        return r;
    const char *n = PyUnicode_AsUTF8(name);
    if (!n)
        return NULL;
    if (strncmp(n, "__", 2) == 0 && strcmp(n, "__fiber_meta__") != 0)
        return NULL; /* the AttributeError stands */
    PyErr_Clear();
    return PyObject_GetAttr(((FbpShared *)o)->func, name);
}

static PyMemberDef shared_members[] = {
    {"func", T_OBJECT_EX, offsetof(FbpShared, func), READONLY,
     "the function called"},
    {NULL, 0, 0, 0, NULL},
};

static PyMethodDef shared_methods[] = {
    {"__reduce__", shared_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject FbpSharedType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fiber._fiber.Shared",
    .tp_basicsize = sizeof(FbpShared),
    .tp_new = shared_new,
    .tp_dealloc = shared_dealloc,
    .tp_traverse = shared_traverse,
    .tp_clear = shared_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(FbpShared, vectorcall),
    .tp_getattro = shared_getattro,
    .tp_members = shared_members,
    .tp_getset = shared_getset,
    .tp_methods = shared_methods,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC |
                Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Shared(func, ref)(*args) calls func(ref.get(), *args): what "
              "the pool's shared= argument sends in place of func.  Pickles "
              "as func and the ref's 40 bytes.",
};

/* object_stats() -> dict of this process's fiber_object_stats. */
static PyObject *py_object_stats(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    fiber_object_stats st;
    int rc = fiber_object_stats_get(&st);
    if (rc)
        return fbp_raise_last(rc);
    return Py_BuildValue(
        "{sKsKsKsKsKsKsKsKsKsKsK}", "objects",
        (unsigned long long)st.objects, "bytes_held",
        (unsigned long long)st.bytes_held, "bytes_served",
        (unsigned long long)st.bytes_served, "transfers",
        (unsigned long long)st.transfers, "redirects",
        (unsigned long long)st.redirects, "fetches",
        (unsigned long long)st.fetches, "fetch_retries",
        (unsigned long long)st.fetch_retries, "cache_hits",
        (unsigned long long)st.cache_hits, "evictions",
        (unsigned long long)st.evictions, "shm_bytes",
        (unsigned long long)st.shm_bytes, "maps",
        (unsigned long long)st.maps);
}

static PyMethodDef object_methods[] = {
    {"object_put", py_object_put, METH_O,
     "object_put(buffer or [buffers]) -> ref: the bytes, joined, into the "
     "run's object store (master only)."},
    {"object_get", py_object_get, METH_VARARGS,
     "object_get(ref, child=False) -> a Blob over the bytes, held until it "
     "goes (child), or a bytes copy (the master)."},
    {"object_release", py_object_release, METH_O,
     "object_release(ref): drops a reference object_put counted."},
    {"object_released", py_object_released, METH_O,
     "object_released(ref) -> bool: the master released the blob this "
     "process cached."},
    {"object_cached", (PyCFunction)(void (*)(void))py_object_cached,
     METH_FASTCALL,
     "object_cached(ref, default=None) -> the value this process cached "
     "for ref, or default."},
    {"object_cache_add", py_object_cache_add, METH_VARARGS,
     "object_cache_add(ref, value, nbytes) -> the cached value (value, or "
     "the one cached before it)."},
    {"object_cache_keys", py_object_cache_keys, METH_NOARGS,
     "object_cache_keys() -> the cached refs, least recently used first."},
    {"decode_array", py_decode_array, METH_O,
     "decode_array(buffer) -> the numpy array of a plain-array blob, a "
     "read-only view of the buffer."},
    {"object_stats", py_object_stats, METH_NOARGS,
     "object_stats() -> dict: this process's shared-object counters."},
    {NULL, NULL, 0, NULL},
};

int fbp_object_init(PyObject *m)
{
    if (PyType_Ready(&FbpBlobType) < 0 || PyType_Ready(&FbpSharedType) < 0 ||
        PyModule_AddFunctions(m, object_methods) != 0 ||
        PyModule_AddObjectRef(m, "Shared", (PyObject *)&FbpSharedType) != 0 ||
        PyModule_AddIntConstant(m, "OBJECT_CACHE_MAX", VCACHE_MAX) != 0)
        return -1;
    return PyModule_AddIntConstant(m, "REF_LEN", FIBER_REF_LEN);
}
